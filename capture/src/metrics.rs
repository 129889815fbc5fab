//! The recorder's own figures: what it saw, recorded and dropped (by reason), requests it
//! refused itself (no route), bytes written, rotations, open streams and each upstream's
//! status codes and readiness, rendered as Prometheus text for `--health-listen`'s
//! `/metrics`, and summed up at exit.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Why an exchange was proxied but not recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// The disk (or the file size limit) is full.
    DiskFull,
    /// Any other write error.
    WriteError,
    /// The writer's queue was full (a slow disk).
    WriterBehind,
    /// The exchange could not be serialized.
    Unserializable,
}

impl DropReason {
    pub const ALL: [DropReason; 4] = [
        DropReason::DiskFull,
        DropReason::WriteError,
        DropReason::WriterBehind,
        DropReason::Unserializable,
    ];

    /// The label value (`reason="disk_full"`), also the gap marker's `reason`.
    pub fn name(self) -> &'static str {
        match self {
            DropReason::DiskFull => "disk_full",
            DropReason::WriteError => "write_error",
            DropReason::WriterBehind => "writer_behind",
            DropReason::Unserializable => "unserializable",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// The reason of a write error.
    pub fn of_io(error: &std::io::Error) -> DropReason {
        // EFBIG (27): over RLIMIT_FSIZE or the file system's largest file.
        if error.kind() == std::io::ErrorKind::StorageFull
            || error.kind() == std::io::ErrorKind::FileTooLarge
            || error.raw_os_error() == Some(27)
        {
            DropReason::DiskFull
        } else {
            DropReason::WriteError
        }
    }
}

/// Why the proxy answered a request itself, without forwarding it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalReason {
    /// No `--upstream` route matched the request, and there is no default.
    NoRoute,
}

impl RefusalReason {
    pub const ALL: [RefusalReason; 1] = [RefusalReason::NoRoute];

    /// The label value (`reason="no_route"`).
    pub fn name(self) -> &'static str {
        match self {
            RefusalReason::NoRoute => "no_route",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One upstream's figures (by route name).
#[derive(Debug, Clone, Copy, Default)]
struct UpstreamFigures {
    /// Responses by status class: index 1..=5 for 1xx..5xx, 0 for no response at all.
    status: [u64; 6],
    /// It answered once, or a probe reached it.
    ready: bool,
}

/// Drops the writer did not see (the queue was full): marked in the recording by the writer
/// at its next chance.
#[derive(Debug, Clone, Copy, Default)]
pub struct UnseenDrops {
    pub exchanges: u64,
    pub from_ms: Option<f64>,
    pub to_ms: Option<f64>,
}

/// Counters shared by the proxy, the writer and the health endpoint.
#[derive(Debug, Default)]
pub struct RecordMetrics {
    /// Exchanges proxied (scrapes of `/metrics` through the proxy are not counted).
    pub seen: AtomicU64,
    /// Exchanges left out by `--sample`.
    pub sampled_out: AtomicU64,
    /// Exchanges written to the recording.
    pub recorded: AtomicU64,
    dropped: [AtomicU64; 4],
    /// Bytes written to recording files (compressed, when compressed).
    pub bytes_written: AtomicU64,
    /// Files closed and new ones opened.
    pub rotations: AtomicU64,
    /// Requests the proxy answered itself, by [`RefusalReason`].
    refused: [AtomicU64; 1],
    /// Each upstream's status classes and readiness, by route name. A lock per response:
    /// uncontended next to the work of an exchange.
    upstreams: Mutex<BTreeMap<String, UpstreamFigures>>,
    /// Every upstream answered once, or a probe reached it.
    pub ready: AtomicBool,
    unseen: Mutex<Option<UnseenDrops>>,
}

impl RecordMetrics {
    pub fn dropped(&self, reason: DropReason) -> u64 {
        self.dropped[reason.index()].load(Ordering::Relaxed)
    }

    pub fn dropped_total(&self) -> u64 {
        DropReason::ALL.iter().map(|r| self.dropped(*r)).sum()
    }

    pub fn add_dropped(&self, reason: DropReason, n: u64) {
        self.dropped[reason.index()].fetch_add(n, Ordering::Relaxed);
    }

    /// An exchange dropped before it reached the writer, arriving at `at_ms`.
    pub fn dropped_unseen(&self, at_ms: Option<f64>) {
        self.add_dropped(DropReason::WriterBehind, 1);
        if let Ok(mut unseen) = self.unseen.lock() {
            let drops = unseen.get_or_insert_with(UnseenDrops::default);
            drops.exchanges += 1;
            drops.from_ms = drops.from_ms.or(at_ms);
            drops.to_ms = at_ms.or(drops.to_ms);
        }
    }

    /// The unseen drops since the last call.
    pub fn take_unseen(&self) -> Option<UnseenDrops> {
        self.unseen.lock().ok().and_then(|mut unseen| unseen.take())
    }

    /// Name the upstreams (route names), so each has its series before any traffic and
    /// readiness waits for all of them.
    pub fn register_upstreams<'n>(&self, names: impl IntoIterator<Item = &'n str>) {
        if let Ok(mut upstreams) = self.upstreams.lock() {
            for name in names {
                upstreams.entry(name.to_owned()).or_default();
            }
        }
    }

    /// Count a response's status from `upstream` (`None`: the upstream gave none).
    pub fn status(&self, upstream: &str, status: Option<u16>) {
        let class = status.map_or(0, |s| usize::from(s / 100).clamp(1, 5));
        if let Ok(mut upstreams) = self.upstreams.lock() {
            upstreams.entry(upstream.to_owned()).or_default().status[class] += 1;
        }
    }

    /// `upstream` answered, or a probe reached it; the proxy is ready once every one has.
    pub fn upstream_ready(&self, upstream: &str) {
        if self.ready.load(Ordering::Relaxed) {
            return;
        }
        if let Ok(mut upstreams) = self.upstreams.lock() {
            upstreams.entry(upstream.to_owned()).or_default().ready = true;
            if upstreams.values().all(|figures| figures.ready) {
                self.ready.store(true, Ordering::Relaxed);
            }
        }
    }

    /// The upstreams (route names) not reached yet.
    pub fn unready_upstreams(&self) -> Vec<String> {
        self.upstreams
            .lock()
            .map(|upstreams| {
                upstreams
                    .iter()
                    .filter(|(_, figures)| !figures.ready)
                    .map(|(name, _)| name.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Count a request the proxy answered itself.
    pub fn refused(&self, reason: RefusalReason) {
        self.refused[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Requests refused for `reason` so far.
    pub fn refused_count(&self, reason: RefusalReason) -> u64 {
        self.refused[reason.index()].load(Ordering::Relaxed)
    }

    /// Drops by reason, `disk_full=3, writer_behind=1`, for messages.
    pub fn dropped_summary(&self) -> String {
        DropReason::ALL
            .iter()
            .filter(|r| self.dropped(**r) > 0)
            .map(|r| format!("{}={}", r.name(), self.dropped(*r)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Prometheus text exposition (format 0.0.4).
    pub fn render(&self, open_streams: u64) -> String {
        let mut out = String::with_capacity(2048);
        let mut counter = |name: &str, help: &str, value: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
            );
        };
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        counter(
            "llm_replay_record_exchanges_seen_total",
            "Exchanges proxied.",
            load(&self.seen),
        );
        counter(
            "llm_replay_record_exchanges_recorded_total",
            "Exchanges written to the recording.",
            load(&self.recorded),
        );
        counter(
            "llm_replay_record_exchanges_sampled_out_total",
            "Exchanges left out by --sample.",
            load(&self.sampled_out),
        );
        counter(
            "llm_replay_record_bytes_written_total",
            "Bytes written to recording files.",
            load(&self.bytes_written),
        );
        counter(
            "llm_replay_record_rotations_total",
            "Recording files closed and new ones opened.",
            load(&self.rotations),
        );
        let _ = writeln!(
            out,
            "# HELP llm_replay_record_exchanges_dropped_total Exchanges proxied but not recorded, by reason.\n# TYPE llm_replay_record_exchanges_dropped_total counter"
        );
        for reason in DropReason::ALL {
            let _ = writeln!(
                out,
                "llm_replay_record_exchanges_dropped_total{{reason=\"{}\"}} {}",
                reason.name(),
                self.dropped(reason)
            );
        }
        let _ = writeln!(
            out,
            "# HELP llm_replay_record_requests_refused_total Requests the proxy answered itself, by reason (no_route: no --upstream route matched).\n# TYPE llm_replay_record_requests_refused_total counter"
        );
        for reason in RefusalReason::ALL {
            let _ = writeln!(
                out,
                "llm_replay_record_requests_refused_total{{reason=\"{}\"}} {}",
                reason.name(),
                self.refused_count(reason)
            );
        }
        self.render_upstreams(&mut out);
        let _ = writeln!(
            out,
            "# HELP llm_replay_record_open_streams Exchanges in flight.\n# TYPE llm_replay_record_open_streams gauge\nllm_replay_record_open_streams {open_streams}"
        );
        let _ = writeln!(
            out,
            "# HELP llm_replay_record_ready 1 once every upstream answered or a probe reached it.\n# TYPE llm_replay_record_ready gauge\nllm_replay_record_ready {}",
            u8::from(self.ready.load(Ordering::Relaxed))
        );
        out
    }

    /// Each upstream's status classes and readiness, labelled with its route name.
    fn render_upstreams(&self, out: &mut String) {
        let upstreams = self
            .upstreams
            .lock()
            .map(|upstreams| upstreams.clone())
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "# HELP llm_replay_record_upstream_responses_total Upstream responses by upstream (route name) and status class (none: no response).\n# TYPE llm_replay_record_upstream_responses_total counter"
        );
        for (name, figures) in &upstreams {
            let name = label_value(name);
            for (i, class) in ["none", "1xx", "2xx", "3xx", "4xx", "5xx"]
                .iter()
                .enumerate()
            {
                let _ = writeln!(
                    out,
                    "llm_replay_record_upstream_responses_total{{upstream=\"{name}\",class=\"{class}\"}} {}",
                    figures.status[i]
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP llm_replay_record_upstream_ready 1 once the upstream answered or a probe reached it.\n# TYPE llm_replay_record_upstream_ready gauge"
        );
        for (name, figures) in &upstreams {
            let _ = writeln!(
                out,
                "llm_replay_record_upstream_ready{{upstream=\"{}\"}} {}",
                label_value(name),
                u8::from(figures.ready)
            );
        }
    }
}

/// A Prometheus label value: `\`, `"` and newlines escaped.
fn label_value(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_readiness_are_labelled_by_upstream_and_ready_waits_for_all() {
        let metrics = RecordMetrics::default();
        metrics.register_upstreams(["openai", "anthropic"]);
        metrics.status("openai", Some(200));
        metrics.status("openai", Some(503));
        metrics.status("anthropic", None);
        metrics.refused(RefusalReason::NoRoute);
        metrics.upstream_ready("openai");
        assert!(!metrics.ready.load(Ordering::Relaxed));
        assert_eq!(metrics.unready_upstreams(), ["anthropic"]);
        let text = metrics.render(0);
        for line in [
            "llm_replay_record_upstream_responses_total{upstream=\"openai\",class=\"2xx\"} 1",
            "llm_replay_record_upstream_responses_total{upstream=\"openai\",class=\"5xx\"} 1",
            "llm_replay_record_upstream_responses_total{upstream=\"anthropic\",class=\"none\"} 1",
            "llm_replay_record_upstream_responses_total{upstream=\"anthropic\",class=\"2xx\"} 0",
            "llm_replay_record_upstream_ready{upstream=\"openai\"} 1",
            "llm_replay_record_upstream_ready{upstream=\"anthropic\"} 0",
            "llm_replay_record_requests_refused_total{reason=\"no_route\"} 1",
            "llm_replay_record_ready 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
        metrics.upstream_ready("anthropic");
        assert!(metrics.ready.load(Ordering::Relaxed));
        assert!(metrics.unready_upstreams().is_empty());
        assert_eq!(label_value("a\"b\\c"), "a\\\"b\\\\c");
    }
}
