//! The recording writer: a dedicated thread that owns the output ([`crate::sink`]) and
//! appends finished exchanges as whole lines — a batch of what is queued at once in one write
//! (one gzip member in a `.gz` file) — so a crash or SIGKILL can at worst leave a torn end
//! (which readers report and skip), never a broken line in the middle.
//!
//! Recording never breaks the traffic it records: under `--on-record-error skip` (the
//! default) a write that fails (a full disk, EFBIG past a file size limit, any I/O error), an
//! exchange that cannot be serialized, or a full queue (a slow disk) leaves the proxied
//! exchange untouched and unrecorded; the drop is counted by reason ([`RecordMetrics`]) and
//! the gap marked in the recording (a `{"gap": ...}` line, rewritten in place as it grows).
//! Under `refuse` a write error is reported at once through [`WriterHealth`] — the proxy then
//! answers `503` and the command prints the cause. The file is `fsync`ed at most every
//! [`SYNC_INTERVAL`] while lines are written, so a host crash loses at most about that much.
//!
//! Credentials are removed here, on the one path to disk: the built-in credential headers
//! (`common::recording::is_credential_header`: by name and by credential word) and every
//! `--redact-header`, on both sides, plus `set-cookie`, and credential query parameters
//! (percent-decoded names); `--redact-body` matches are replaced in the path, header values,
//! the request body and the response frames.
//!
//! Every line stays readable: JSON escaping can make a line six times the bytes it holds, so
//! a line is kept under [`MAX_WRITTEN_LINE_BYTES`] (half the readers' cap) by storing what
//! does not fit cut and marked `truncated` (`common::recording::write_line_within`).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::recording::{
    Exchange, MAX_WRITTEN_LINE_BYTES, is_credential_header, strip_credential_query,
    write_line_within,
};
use common::redact::Redactor;
use tokio::sync::mpsc;

use crate::metrics::{DropReason, RecordMetrics};
use crate::sink::{OutputPlan, Sink, unix_now, utc_millis};

/// Exchanges waiting for the writer. When it is full, an exchange is dropped from the
/// recording (counted, gap marked), or under `--on-record-error refuse` waits in a task of its
/// own (see [`WriterHandle::submit`]).
pub const WRITER_QUEUE: usize = 1024;

/// How often written lines are `fsync`ed (when any were written since the last sync).
pub const SYNC_INTERVAL: Duration = Duration::from_secs(1);

/// Whether the writer can still write, shared by the writer thread (which reports a failure),
/// the proxy (which then refuses requests) and the command (which prints the cause at once).
#[derive(Debug, Clone)]
pub struct WriterHealth {
    failure: Arc<tokio::sync::watch::Sender<Option<String>>>,
}

impl Default for WriterHealth {
    fn default() -> WriterHealth {
        WriterHealth {
            failure: Arc::new(tokio::sync::watch::channel(None).0),
        }
    }
}

impl WriterHealth {
    /// The write error, once there has been one (the first one is kept).
    pub fn failure(&self) -> Option<String> {
        self.failure.borrow().clone()
    }

    /// Wait until the writer has failed; returns the cause.
    pub async fn failed(&self) -> String {
        let mut changes = self.failure.subscribe();
        // The sender lives in `self`, so the wait cannot end without a failure.
        let cause = changes
            .wait_for(Option::is_some)
            .await
            .map(|failure| failure.clone().unwrap_or_default());
        cause.unwrap_or_default()
    }

    fn fail(&self, cause: String) {
        self.failure.send_if_modified(|failure| {
            if failure.is_some() {
                return false;
            }
            *failure = Some(cause);
            true
        });
    }
}

/// What to remove before anything is written.
#[derive(Debug, Clone, Default)]
pub struct Scrub {
    /// Extra header names to drop (any case), from `--redact-header`.
    pub redact_headers: Vec<String>,
    /// `--redact-body` patterns.
    pub redactor: Redactor,
}

impl Scrub {
    fn drops_header(&self, name: &str) -> bool {
        is_credential_header(name)
            || name.eq_ignore_ascii_case("set-cookie")
            || self
                .redact_headers
                .iter()
                .any(|h| h.eq_ignore_ascii_case(name))
    }

    /// Remove credentials and redact bodies in place.
    pub fn apply(&self, exchange: &mut Exchange) {
        if let std::borrow::Cow::Owned(path) = strip_credential_query(&exchange.request.path) {
            exchange.request.path = path;
        }
        exchange
            .request
            .headers
            .retain(|name, _| !self.drops_header(name));
        if let Some(response) = exchange.response.as_mut() {
            response.headers.retain(|name, _| !self.drops_header(name));
        }
        if self.redactor.is_empty() {
            return;
        }
        let r = &self.redactor;
        exchange.request.path = r.redact_str(&exchange.request.path).into_owned();
        for value in exchange.request.headers.values_mut() {
            *value = r.redact_str(value).into_owned();
        }
        let body = exchange.request.body_bytes().into_owned();
        if !body.is_empty() {
            let redacted = r.redact(&body).into_owned();
            exchange.request.set_body(&redacted);
        }
        if let Some(response) = exchange.response.as_mut() {
            for value in response.headers.values_mut() {
                *value = r.redact_str(value).into_owned();
            }
            let mut segments: Vec<Vec<u8>> = response
                .frames
                .iter()
                .map(|f| f.bytes().into_owned())
                .collect();
            r.redact_segments(&mut segments);
            for (frame, bytes) in response.frames.iter_mut().zip(segments) {
                *frame = common::recording::Frame::from_bytes(frame.t_ms, &bytes);
            }
        }
    }
}

/// A problem with the output file.
#[derive(Debug, thiserror::Error)]
pub enum WriterError {
    #[error("{}: cannot open for writing: {source}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: cannot write: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the writer thread stopped unexpectedly")]
    Panicked,
}

/// What to do when the recording cannot be written (`--on-record-error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OnRecordError {
    /// Proxy the exchange untouched, leave it out of the recording, count it and mark the gap.
    #[default]
    Skip,
    /// Stop recording and answer 503 to every request from then on.
    Refuse,
}

/// Cheap handle to the writer thread.
#[derive(Clone)]
pub struct WriterHandle {
    tx: mpsc::Sender<Exchange>,
    health: WriterHealth,
    on_error: OnRecordError,
    metrics: Arc<RecordMetrics>,
}

/// The writer thread; `join` after every handle is dropped.
pub struct Writer {
    thread: JoinHandle<Result<u64, WriterError>>,
}

/// What the writer thread needs besides the queue.
pub struct WriterSetup {
    pub plan: OutputPlan,
    pub scrub: Scrub,
    pub health: WriterHealth,
    pub on_error: OnRecordError,
    pub metrics: Arc<RecordMetrics>,
}

/// Open the output (a file created or truncated, or a directory's first file) and start the
/// writer thread. Under `--on-record-error refuse` a write error is reported to `health` the
/// moment it happens and the thread stops (the error is also returned by [`Writer::join`]);
/// under `skip` it is counted, the gap marked, and writing goes on when it can.
pub fn start(setup: WriterSetup) -> Result<(WriterHandle, Writer), WriterError> {
    let WriterSetup {
        plan,
        scrub,
        health,
        on_error,
        metrics,
    } = setup;
    let out = plan.path.clone();
    let sink = Sink::open(plan).map_err(|source| WriterError::Open {
        path: out.clone(),
        source,
    })?;
    let (tx, rx) = mpsc::channel::<Exchange>(WRITER_QUEUE);
    let thread_health = health.clone();
    let thread_metrics = metrics.clone();
    let thread = std::thread::Builder::new()
        .name("record-writer".into())
        .spawn(move || {
            let mut state = WriteState {
                sink,
                scrub,
                on_error,
                metrics: thread_metrics,
                gap: None,
                written: 0,
            };
            let result = write_loop(&mut state, rx).map_err(|source| WriterError::Write {
                path: state.sink.path.clone(),
                source,
            });
            if let Err(error) = &result {
                tracing::error!(%error, "the recording cannot be written; answering 503 from now on");
                thread_health.fail(error.to_string());
            }
            result
        })
        .map_err(|source| WriterError::Open {
            path: PathBuf::from("(writer thread)"),
            source,
        })?;
    Ok((
        WriterHandle {
            tx,
            health,
            on_error,
            metrics,
        },
        Writer { thread },
    ))
}

/// Most uncompressed bytes gathered into one write (one gzip member).
const BATCH_BYTES: usize = 1 << 20;

/// Exchanges serialized and waiting to be written together.
#[derive(Default)]
struct Batch {
    lines: Vec<u8>,
    exchanges: u64,
    from_ms: Option<f64>,
    to_ms: Option<f64>,
}

/// An open gap: exchanges not recorded since the last write that succeeded.
struct Gap {
    reason: DropReason,
    exchanges: u64,
    from_ms: Option<f64>,
    to_ms: Option<f64>,
    from: Duration,
    to: Duration,
    /// Where its marker is, once written.
    marker: Option<u64>,
}

impl Gap {
    fn json(&self) -> String {
        serde_json::json!({ common::recording::GAP_KEY: {
            "reason": self.reason.name(),
            "exchanges": self.exchanges,
            "from_ms": self.from_ms,
            "to_ms": self.to_ms,
            "from": utc_millis(self.from),
            "to": utc_millis(self.to),
        }})
        .to_string()
    }
}

struct WriteState {
    sink: Sink,
    scrub: Scrub,
    on_error: OnRecordError,
    metrics: Arc<RecordMetrics>,
    gap: Option<Gap>,
    written: u64,
}

/// Write what arrives in batches (everything queued at the time, up to [`BATCH_BYTES`]);
/// `fsync` when lines were written and [`SYNC_INTERVAL`] has passed (also while idle), and
/// once at the end; rotate when due.
fn write_loop(state: &mut WriteState, mut rx: mpsc::Receiver<Exchange>) -> std::io::Result<u64> {
    // A timed receive needs a timer: a one-thread runtime of its own, on this thread only.
    let timer = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    let mut line = Vec::with_capacity(64 << 10);
    let mut unsynced = false;
    let mut last_sync = Instant::now();
    loop {
        let mut wait = state
            .sink
            .age_deadline()
            .map(|at| at.saturating_duration_since(Instant::now()));
        if unsynced {
            let sync_wait = SYNC_INTERVAL.saturating_sub(last_sync.elapsed());
            wait = Some(wait.map_or(sync_wait, |w| w.min(sync_wait)));
        }
        let received = match wait {
            Some(wait) => timer.block_on(async { tokio::time::timeout(wait, rx.recv()).await }),
            None => Ok(rx.blocking_recv()),
        };
        match received {
            Ok(Some(first)) => {
                let mut batch = Batch::default();
                state.add(first, &mut batch, &mut line);
                while batch.lines.len() < BATCH_BYTES {
                    match rx.try_recv() {
                        Ok(next) => state.add(next, &mut batch, &mut line),
                        Err(_) => break,
                    }
                }
                state.commit(batch)?;
                unsynced = true;
            }
            Ok(None) => break,
            Err(_elapsed) => {}
        }
        state.mark_unseen_drops();
        if state.sink.rotation_due() {
            state.rotate()?;
            unsynced = false;
            last_sync = Instant::now();
        }
        if unsynced && last_sync.elapsed() >= SYNC_INTERVAL {
            state.sync()?;
            unsynced = false;
            last_sync = Instant::now();
        }
    }
    state.mark_unseen_drops();
    state.sync()?;
    state.close_gap();
    Ok(state.written)
}

impl WriteState {
    /// Scrub and serialize one exchange into the batch (or count it dropped).
    fn add(&mut self, mut exchange: Exchange, batch: &mut Batch, line: &mut Vec<u8>) {
        self.scrub.apply(&mut exchange);
        // Cut and marked when too long for one readable line (logged there).
        if let Err(error) = write_line_within(&mut exchange, line, MAX_WRITTEN_LINE_BYTES) {
            tracing::error!(%error, "cannot serialize an exchange; skipped");
            self.dropped(
                DropReason::Unserializable,
                1,
                exchange.at_ms,
                exchange.at_ms,
            );
            return;
        }
        batch.lines.extend_from_slice(line);
        batch.exchanges += 1;
        batch.from_ms = batch.from_ms.or(exchange.at_ms);
        batch.to_ms = exchange.at_ms.or(batch.to_ms);
        // A huge exchange must not keep its buffer for the life of the proxy.
        if line.capacity() > 1 << 20 {
            *line = Vec::with_capacity(64 << 10);
        }
    }

    /// Write a batch as one unit; a failure drops it (counted, gap marked) or, under
    /// `refuse`, ends the writer.
    fn commit(&mut self, batch: Batch) -> std::io::Result<()> {
        if batch.exchanges == 0 {
            return Ok(());
        }
        match self.sink.append(&batch.lines, batch.exchanges) {
            Ok(bytes) => {
                self.written += batch.exchanges;
                self.metrics
                    .recorded
                    .fetch_add(batch.exchanges, Ordering::Relaxed);
                self.metrics
                    .bytes_written
                    .fetch_add(bytes, Ordering::Relaxed);
                self.close_gap();
                Ok(())
            }
            Err(error) if self.on_error == OnRecordError::Refuse => Err(error),
            Err(error) => {
                let reason = DropReason::of_io(&error);
                if self.gap.is_none() {
                    tracing::error!(%error, reason = reason.name(), file = %self.sink.path.display(),
                        "the recording cannot be written: exchanges are proxied and not recorded until it can");
                }
                self.dropped(reason, batch.exchanges, batch.from_ms, batch.to_ms);
                Ok(())
            }
        }
    }

    /// Count `exchanges` not recorded and mark them in the open gap (opened if needed).
    fn dropped(
        &mut self,
        reason: DropReason,
        exchanges: u64,
        from_ms: Option<f64>,
        to_ms: Option<f64>,
    ) {
        self.metrics.add_dropped(reason, exchanges);
        let now = unix_now();
        let gap = self.gap.get_or_insert(Gap {
            reason,
            exchanges: 0,
            from_ms,
            to_ms,
            from: now,
            to: now,
            marker: None,
        });
        gap.exchanges += exchanges;
        gap.from_ms = gap.from_ms.or(from_ms);
        gap.to_ms = to_ms.or(gap.to_ms);
        gap.to = now;
        self.write_gap_marker();
    }

    /// Write (or rewrite in place) the open gap's marker. When even the marker does not fit,
    /// the newest recorded units are taken back (and counted in the gap) to make room — a
    /// gap is always marked when anything can be.
    fn write_gap_marker(&mut self) {
        let Some(gap) = self.gap.as_mut() else { return };
        if let Some(offset) = gap.marker {
            if let Err(error) = self.sink.rewrite_marker(offset, &gap.json()) {
                tracing::warn!(%error, "cannot update the gap marker");
            }
            return;
        }
        for _ in 0..4 {
            match self.sink.append_marker(&gap.json()) {
                Ok(offset) => {
                    gap.marker = Some(offset);
                    return;
                }
                Err(_) => {
                    let Some(taken) = self.sink.remove_last_unit() else {
                        return;
                    };
                    self.written = self.written.saturating_sub(taken);
                    self.metrics.recorded.fetch_sub(taken, Ordering::Relaxed);
                    self.metrics.add_dropped(gap.reason, taken);
                    gap.exchanges += taken;
                }
            }
        }
    }

    /// The writer is writing again (or stopping): the gap is over.
    fn close_gap(&mut self) {
        if let Some(gap) = self.gap.take() {
            tracing::warn!(
                exchanges = gap.exchanges,
                reason = gap.reason.name(),
                from = %utc_millis(gap.from),
                to = %utc_millis(gap.to),
                marked = gap.marker.is_some(),
                "exchanges proxied but not recorded"
            );
        }
    }

    /// Mark the exchanges dropped before they reached the writer (its queue was full).
    fn mark_unseen_drops(&mut self) {
        if let Some(unseen) = self.metrics.take_unseen() {
            self.close_gap();
            let now = unix_now();
            self.gap = Some(Gap {
                reason: DropReason::WriterBehind,
                exchanges: unseen.exchanges,
                from_ms: unseen.from_ms,
                to_ms: unseen.to_ms,
                from: now,
                to: now,
                marker: None,
            });
            self.write_gap_marker();
            self.close_gap();
        }
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        self.close_gap();
        match self.sink.rotate() {
            Ok(()) => {
                self.metrics.rotations.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(error) if self.on_error == OnRecordError::Refuse => Err(error),
            Err(error) => {
                // Keep writing to the file already open.
                tracing::error!(%error, "cannot open the next recording file; the current one goes on");
                Ok(())
            }
        }
    }

    fn sync(&mut self) -> std::io::Result<()> {
        match self.sink.sync() {
            Err(error) if self.on_error == OnRecordError::Refuse => Err(error),
            Err(error) => {
                tracing::warn!(%error, "cannot sync the recording");
                Ok(())
            }
            Ok(()) => Ok(()),
        }
    }
}

impl WriterHandle {
    /// Queue a finished exchange. Never blocks. When the queue is full, under `skip` the
    /// exchange is dropped (counted, and its gap marked by the writer); under `refuse` a task
    /// waits for room (one per finishing stream, so the wait is bounded by the open streams).
    pub fn submit(&self, exchange: Exchange) {
        match self.tx.try_send(exchange) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(exchange)) => {
                if self.on_error == OnRecordError::Skip {
                    self.metrics.dropped_unseen(exchange.at_ms);
                    return;
                }
                let tx = self.tx.clone();
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(async move {
                        let _ = tx.send(exchange).await;
                    });
                } else {
                    let _ = tx.blocking_send(exchange);
                }
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                // After a write error the cause was logged once, when it happened.
                if self.health.failure().is_none() {
                    tracing::warn!("the recording writer has stopped; an exchange was not written");
                }
            }
        }
    }

    /// The writer's write error, if it has had one (only under `--on-record-error refuse`).
    pub fn failure(&self) -> Option<String> {
        self.health.failure()
    }
}

impl Writer {
    /// Wait for the thread to write everything queued; returns the exchanges written.
    pub fn join(self) -> Result<u64, WriterError> {
        self.thread.join().map_err(|_| WriterError::Panicked)?
    }
}
