//! What failed requests were told, summed up: a bounded, mergeable summary of the failures
//! by failure kind, HTTP status and message (the message made safe to show by
//! [`crate::error_text`]).
//!
//! An [`ErrorSummary`] keeps at most [`MAX_MESSAGES_PER_GROUP`] distinct messages per (kind,
//! status), so a report stays small whatever the server says and however many workers merge.

use crate::error_text::clean_message;
use crate::measure::FailureKind;

/// Distinct messages kept per (kind, status); further ones count under no message.
pub const MAX_MESSAGES_PER_GROUP: usize = 3;

/// Entries an [`ErrorSummary`] holds at most (a peer's report holding more is refused).
pub const MAX_ERROR_SAMPLES: usize = 256;

/// One line of the error summary: `count` failures of `kind` (with HTTP `status` when one
/// came) that said `message` (`None`: no message, or one past the per-group limit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorSample {
    pub kind: FailureKind,
    pub status: Option<u16>,
    pub message: Option<String>,
    pub count: u64,
}

/// Failures by kind, status and message; bounded (see the module header) and mergeable.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ErrorSummary {
    samples: Vec<ErrorSample>,
}

impl ErrorSummary {
    /// Count `count` failures of `kind`/`status` that said `message`.
    pub fn add(
        &mut self,
        kind: FailureKind,
        status: Option<u16>,
        message: Option<&str>,
        count: u64,
    ) {
        let same_group = |s: &ErrorSample| s.kind == kind && s.status == status;
        if let Some(sample) = self
            .samples
            .iter_mut()
            .find(|s| same_group(s) && s.message.as_deref() == message)
        {
            sample.count = sample.count.saturating_add(count);
            return;
        }
        let messages_in_group = self
            .samples
            .iter()
            .filter(|s| same_group(s) && s.message.is_some())
            .count();
        let message = message.filter(|_| messages_in_group < MAX_MESSAGES_PER_GROUP);
        if message.is_none()
            && let Some(sample) = self
                .samples
                .iter_mut()
                .find(|s| same_group(s) && s.message.is_none())
        {
            sample.count = sample.count.saturating_add(count);
            return;
        }
        if self.samples.len() >= MAX_ERROR_SAMPLES {
            // Past the bound (hundreds of distinct statuses): counted under the last entry's
            // group would misstate it, so the failure stays in the counters only.
            return;
        }
        self.samples.push(ErrorSample {
            kind,
            status,
            message: message.map(str::to_owned),
            count,
        });
    }

    /// Add every sample of `other` (exact counts; messages past the limits as in [`add`]).
    ///
    /// [`add`]: ErrorSummary::add
    pub fn merge(&mut self, other: &ErrorSummary) {
        for s in &other.samples {
            self.add(s.kind, s.status, s.message.as_deref(), s.count);
        }
    }

    /// The samples, most frequent first (then by kind, status and message, so the order is
    /// stable).
    pub fn samples(&self) -> Vec<&ErrorSample> {
        let mut sorted: Vec<&ErrorSample> = self.samples.iter().collect();
        sorted.sort_by(|a, b| {
            b.count
                .cmp(&a.count)
                .then_with(|| a.kind.name().cmp(b.kind.name()))
                .then_with(|| a.status.cmp(&b.status))
                .then_with(|| a.message.cmp(&b.message))
        });
        sorted
    }

    /// The most frequent message any failure carried, with its count.
    pub fn most_frequent_message(&self) -> Option<&ErrorSample> {
        self.samples().into_iter().find(|s| s.message.is_some())
    }

    /// True when nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Rebuild a summary from a peer's samples, checked: at most [`MAX_ERROR_SAMPLES`], each
    /// message cleaned again (a peer's text is shown to a user).
    pub fn from_samples(
        samples: impl IntoIterator<Item = ErrorSample>,
    ) -> Result<ErrorSummary, String> {
        let mut summary = ErrorSummary::default();
        for (i, sample) in samples.into_iter().enumerate() {
            if i >= MAX_ERROR_SAMPLES {
                return Err(format!("more than {MAX_ERROR_SAMPLES} error samples"));
            }
            let message = sample.message.as_deref().map(clean_message);
            summary.add(sample.kind, sample.status, message.as_deref(), sample.count);
        }
        Ok(summary)
    }
}

impl FailureKind {
    /// Every failure kind, in report order.
    pub const ALL: [FailureKind; 5] = [
        FailureKind::Status,
        FailureKind::ErrorFrame,
        FailureKind::Transport,
        FailureKind::Timeout,
        FailureKind::Empty,
    ];

    /// The kind named `name` ([`FailureKind::name`]).
    pub fn from_name(name: &str) -> Option<FailureKind> {
        FailureKind::ALL.into_iter().find(|k| k.name() == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_keeps_a_few_messages_per_group_and_merges_exactly() {
        let mut a = ErrorSummary::default();
        for i in 0..5 {
            a.add(FailureKind::Status, Some(400), Some(&format!("m{i}")), 2);
        }
        a.add(FailureKind::Status, Some(400), Some("m0"), 1);
        a.add(FailureKind::Transport, None, None, 7);
        let total = |s: &ErrorSummary| s.samples().iter().map(|s| s.count).sum::<u64>();
        assert_eq!(total(&a), 18);
        let in_400: Vec<_> = a
            .samples()
            .into_iter()
            .filter(|s| s.status == Some(400))
            .map(|s| (s.message.clone(), s.count))
            .collect();
        assert_eq!(
            in_400,
            vec![
                (None, 4),
                (Some("m0".into()), 3),
                (Some("m1".into()), 2),
                (Some("m2".into()), 2)
            ]
        );
        let mut b = ErrorSummary::default();
        b.add(FailureKind::Status, Some(400), Some("m1"), 10);
        b.merge(&a);
        assert_eq!(total(&b), 28);
        assert_eq!(
            b.most_frequent_message().and_then(|s| s.message.as_deref()),
            Some("m1")
        );
    }
}
