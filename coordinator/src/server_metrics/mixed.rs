//! The signs that one endpoint's scrapes are not one server's, beside counters stepping
//! back (`mixed_series` in the parent): the replica its labels name changing between
//! scrapes, and the target's generated-token counters growing far from what the run itself
//! received. Such an endpoint is `mixed`: its numbers are left out, never stated as fact.

use std::time::SystemTime;

use super::{Kind, Role, ScrapeLog, counter_increase, number_text, role_of};

/// How far the server's count of generated tokens may be from the run's own (either way)
/// before the endpoint's series are taken as not one server's: more than 3× or less than a
/// third. Tokenizers, estimates from frames and a request in flight at a window's edge move
/// the two by percents, not by a factor of three.
pub const TOKEN_RATIO_LIMIT: f64 = 3.0;

/// Below this many tokens on both sides, a ratio says nothing (a handful of short requests,
/// another client's one request).
pub const TOKEN_FLOOR: f64 = 100.0;

/// The replica labels of one endpoint's consecutive scrapes (those that named one): a
/// change means a balancer answers from different replicas.
pub(super) fn replica_changed(replicas: &[&str]) -> Option<String> {
    let changes = replicas
        .windows(2)
        .filter(|pair| pair[0] != pair[1])
        .count();
    let first_change = replicas.windows(2).find(|pair| pair[0] != pair[1])?;
    Some(format!(
        "mixed series: the replica its labels name changed in {changes} of {} intervals \
         between scrapes ({} then {}): the scrapes reach more than one server (a load balancer \
         in front of replicas?), so this endpoint's numbers are left out, never differenced as \
         one server's; scrape each replica with --server-metrics URL",
        replicas.len() - 1,
        first_change[0],
        first_change[1],
    ))
}

/// The finding for generated-token counters that grew by `server` tokens while the run
/// received `client`: `Some` when they are more than [`TOKEN_RATIO_LIMIT`] apart.
pub fn token_mismatch(server: f64, client: f64) -> Option<String> {
    if !(server.is_finite() && client.is_finite()) || server.max(client) < TOKEN_FLOOR {
        return None;
    }
    let far = server > TOKEN_RATIO_LIMIT * client || server * TOKEN_RATIO_LIMIT < client;
    far.then(|| {
        let ratio = if client > 0.0 {
            format!("{:.1}×", server / client)
        } else {
            "with none".to_owned()
        };
        format!(
            "mixed series: the server counted {} generated tokens over the run, {ratio} the \
             {} the run received: these scrapes are not of the one server that answered the \
             run (a load balancer in front of replicas, or a server shared with other \
             traffic), so this endpoint's numbers are left out, never stated as the run's; \
             scrape each replica with --server-metrics URL",
            number_text(server),
            number_text(client),
        )
    })
}

impl ScrapeLog {
    /// Mark the target's endpoint `mixed` (where it is not already) when its generated-token
    /// counters grew, over the rounds that bound `[from, to]`, far from the run's own
    /// `client` output tokens ([`token_mismatch`]).
    pub(super) fn check_token_counts(
        &self,
        mixed: &mut [Option<String>],
        from: SystemTime,
        to: SystemTime,
        client: f64,
    ) {
        let (Some(start), Some(end)) = (self.bounding(from, false), self.bounding(to, true)) else {
            return;
        };
        if start >= end {
            return;
        }
        for (e, endpoint) in self.endpoints.iter().enumerate() {
            if !endpoint.target || mixed.get(e).is_none_or(Option::is_some) {
                continue;
            }
            if let Some(server) = self.generated_tokens(e, start, end)
                && let Some(finding) = token_mismatch(server, client)
            {
                mixed[e] = Some(finding);
            }
        }
    }

    /// Endpoint `e`'s generated-token counters' increase from round `start` to `end`
    /// (every known family of that role, summed), `None` when it exposes none.
    fn generated_tokens(&self, e: usize, start: usize, end: usize) -> Option<f64> {
        let others: Vec<Option<String>> = (0..self.endpoints.len())
            .map(|other| (other != e).then(String::new))
            .collect();
        let filled = self.filled(&others);
        let names: Vec<&String> = self.rounds[start..=end]
            .iter()
            .filter_map(|round| round.values.get(e).and_then(Option::as_ref))
            .flat_map(|families| families.iter())
            .filter(|(name, value)| {
                role_of(name) == Some(Role::GenerationTokens) && Kind::of(value) == Kind::Counter
            })
            .map(|(name, _)| name)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        if names.is_empty() {
            return None;
        }
        Some(
            names
                .iter()
                .map(|name| counter_increase(&filled, name, start, end))
                .sum(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_count_far_from_the_runs_is_mixed_either_way() {
        assert_eq!(token_mismatch(1_000.0, 1_000.0), None);
        assert_eq!(token_mismatch(2_900.0, 1_000.0), None);
        assert_eq!(token_mismatch(400.0, 1_000.0), None);
        let high = token_mismatch(55_000.0, 1_000.0).expect("55×");
        assert!(high.contains("55.0×"), "{high}");
        assert!(high.contains("--server-metrics"), "{high}");
        assert!(token_mismatch(200.0, 1_000.0).is_some(), "a fifth");
        // Too few tokens on both sides to say anything.
        assert_eq!(token_mismatch(90.0, 5.0), None);
    }

    #[test]
    fn a_replica_label_that_changes_is_mixed() {
        assert_eq!(replica_changed(&["pod=\"a\"", "pod=\"a\""]), None);
        assert_eq!(replica_changed(&[]), None);
        let finding = replica_changed(&["pod=\"a\"", "pod=\"b\"", "pod=\"a\""]).expect("changed");
        assert!(finding.contains("2 of 2 intervals"), "{finding}");
        assert!(finding.contains("pod=\"a\" then pod=\"b\""), "{finding}");
    }
}
