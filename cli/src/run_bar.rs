//! The live progress bar of a run on a terminal (`indicatif`): requests answered of those
//! planned, elapsed time, TTFT so far, errors and workers alive. Hidden when stdout or stderr
//! is not a terminal, so CI logs and redirected output stay clean.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use coordinator::RunSnapshot;
use coordinator::SearchProgress;

/// The bar of one replay. Every method is a no-op when it is hidden.
pub struct RunBar {
    bar: ProgressBar,
}

impl RunBar {
    /// A bar out of `planned` requests (a spinner when the run is open-ended), drawn on
    /// stderr only when both stdout and stderr are terminals.
    pub fn new(planned: Option<u64>) -> RunBar {
        let on_terminal = std::io::stdout().is_terminal() && std::io::stderr().is_terminal();
        RunBar::with_target(
            planned,
            if on_terminal {
                ProgressDrawTarget::stderr()
            } else {
                ProgressDrawTarget::hidden()
            },
        )
    }

    fn with_target(planned: Option<u64>, target: ProgressDrawTarget) -> RunBar {
        let (bar, template) = match planned {
            Some(total) => (
                ProgressBar::with_draw_target(Some(total), target),
                "{prefix}{elapsed:>4} [{bar:28}] {pos}/{len} {msg}",
            ),
            None => (
                ProgressBar::with_draw_target(None, target),
                "{prefix}{spinner} {elapsed:>4} {pos} answered {msg}",
            ),
        };
        // The templates are constants: a bad one is a bug caught by the tests below.
        let style = ProgressStyle::with_template(template)
            .expect("the progress templates are valid")
            .progress_chars("=> ");
        bar.set_style(style);
        if !bar.is_hidden() {
            bar.enable_steady_tick(Duration::from_millis(250));
        }
        RunBar { bar }
    }

    /// Show the run's state.
    pub fn update(&self, state: &RunSnapshot) {
        self.bar.set_position(state.answered);
        self.bar.set_message(message(state));
    }

    /// Lead the line with where a `--find-max` search stands (the probe under way, its
    /// load, the verdicts so far, the bracket).
    pub fn set_search(&self, search: &SearchProgress) {
        self.bar.set_prefix(search_prefix(search));
    }

    /// Stop the bar, leaving its last state on screen.
    pub fn finish(&self) {
        self.bar.finish();
    }
}

/// `TTFT p50/p95 12.0/30.5 ms  in flight 4  errors 0  workers 2/2`.
fn message(state: &RunSnapshot) -> String {
    let ttft = state
        .ttft_ms
        .map(|(p50, p95)| format!("{p50:.1}/{p95:.1} ms"))
        .unwrap_or_else(|| "-".into());
    format!(
        "TTFT p50/p95 {ttft}  in flight {}  errors {}  workers {}/{}",
        state.in_flight, state.errors, state.alive, state.workers
    )
}

/// `search: probe 3 at 4 · held 1, 2 · bracket: 2 holds, nothing failed yet │ `.
fn search_prefix(search: &SearchProgress) -> String {
    format!("search: {} │ ", search.line())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_names_every_number() {
        let state = RunSnapshot {
            answered: 7,
            errors: 1,
            in_flight: 3,
            ttft_ms: Some((12.04, 30.5)),
            alive: 1,
            workers: 2,
            ..Default::default()
        };
        assert_eq!(
            message(&state),
            "TTFT p50/p95 12.0/30.5 ms  in flight 3  errors 1  workers 1/2"
        );
    }

    #[test]
    fn both_bar_kinds_build_and_track_progress() {
        for planned in [Some(10), None] {
            let progress = RunBar::with_target(planned, ProgressDrawTarget::hidden());
            progress.update(&RunSnapshot {
                answered: 4,
                alive: 1,
                workers: 1,
                ..Default::default()
            });
            assert_eq!(progress.bar.position(), 4);
            progress.set_search(&SearchProgress {
                probe: 3,
                load: "4".into(),
                verdicts: "held 1, 2".into(),
                bracket: "2 holds, nothing failed yet".into(),
            });
            assert_eq!(
                progress.bar.prefix(),
                "search: probe 3 at 4 · held 1, 2 · bracket: 2 holds, nothing failed yet │ "
            );
            assert!(progress.bar.message().contains("workers 1/1"));
            progress.finish();
            assert!(progress.bar.is_finished());
        }
    }
}
