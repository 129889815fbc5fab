//! What a search shows while it runs (issue 32, item 5): the probe under way and its load,
//! the verdicts so far and the bracket they establish. The CLI draws it on the terminal's
//! progress line; without a terminal the per-probe lines say the same once each probe is
//! decided.

use super::{Answer, Dimension, FindMax};

/// The search's state as the probe at `load` starts.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchProgress {
    /// 1-based index of the probe under way.
    pub probe: usize,
    /// Its load, as the search shows it (`4`, `12 requests/s`, `×2`).
    pub load: String,
    /// The loads decided so far: `held 1, 2 · failed 8`, or `none decided yet`.
    pub verdicts: String,
    /// The bracket the decided loads establish.
    pub bracket: String,
}

impl SearchProgress {
    /// The progress as probe `index` at `value` starts, after `decided` — each earlier
    /// probe's load and what the search decided of it (`None`: undecided by that run).
    pub fn of(
        find_max: FindMax,
        index: usize,
        value: f64,
        decided: &[(f64, Option<bool>)],
        answer: &Answer,
    ) -> SearchProgress {
        let dimension = find_max.dimension;
        let loads = |passed: bool| -> Vec<String> {
            decided
                .iter()
                .filter(|(_, d)| *d == Some(passed))
                .map(|(v, _)| super::show_number(*v))
                .collect()
        };
        let (held, failed) = (loads(true), loads(false));
        let mut parts = Vec::new();
        if !held.is_empty() {
            parts.push(format!("held {}", held.join(", ")));
        }
        if !failed.is_empty() {
            parts.push(format!("failed {}", failed.join(", ")));
        }
        SearchProgress {
            probe: index,
            load: dimension.show(value),
            verdicts: if parts.is_empty() {
                "none decided yet".to_owned()
            } else {
                parts.join(" · ")
            },
            bracket: bracket_text(dimension, answer),
        }
    }

    /// `probe 3 at 4 · held 1, 2 · bracket: 2 holds, nothing failed yet`.
    pub fn line(&self) -> String {
        format!(
            "probe {} at {} · {} · bracket: {}",
            self.probe, self.load, self.verdicts, self.bracket
        )
    }
}

/// The bracket decided so far, in words.
pub fn bracket_text(dimension: Dimension, answer: &Answer) -> String {
    match (answer.max, answer.min_failing) {
        (Some(max), Some(fail)) => format!(
            "{} holds, {} fails",
            dimension.show(max),
            dimension.show(fail)
        ),
        (Some(max), None) => format!("{} holds, nothing failed yet", dimension.show(max)),
        (None, Some(fail)) => format!("nothing held yet, {} fails", dimension.show(fail)),
        (None, None) => "nothing decided yet".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_names_the_probe_the_verdicts_and_the_bracket() {
        let find_max = FindMax::from_options(Some("concurrency"), None, None)
            .expect("valid")
            .expect("asked");
        let answer = Answer {
            max: Some(2.0),
            min_failing: Some(8.0),
            stopped: String::new(),
        };
        let progress = SearchProgress::of(
            find_max,
            4,
            4.0,
            &[
                (1.0, Some(true)),
                (2.0, Some(true)),
                (8.0, None),
                (8.0, Some(false)),
            ],
            &answer,
        );
        assert_eq!(
            progress.line(),
            "probe 4 at 4 · held 1, 2 · failed 8 · bracket: 2 holds, 8 fails"
        );
        let first = SearchProgress::of(
            find_max,
            1,
            1.0,
            &[],
            &Answer {
                max: None,
                min_failing: None,
                stopped: String::new(),
            },
        );
        assert_eq!(
            first.line(),
            "probe 1 at 1 · none decided yet · bracket: nothing decided yet"
        );
    }
}
