//! The recording writer: a dedicated thread that owns the output file and appends each
//! finished exchange as ONE `write` of a whole line, so a crash or SIGKILL can at worst leave
//! a torn last line (which readers report and skip), never a broken line in the middle.
//!
//! A write (or fsync) error is reported at once through [`WriterHealth`] — the proxy then
//! answers `503` and the command prints the cause — instead of only at exit. The file is
//! `fsync`ed at most every [`SYNC_INTERVAL`] while lines are written, so a host crash loses at
//! most about that much.
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

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::recording::{
    Exchange, MAX_WRITTEN_LINE_BYTES, is_credential_header, strip_credential_query,
    write_line_within,
};
use common::redact::Redactor;
use tokio::sync::mpsc;

/// Exchanges waiting for the writer. When it is full, finishing streams wait in their own
/// tasks (see [`WriterHandle::submit`]); the proxy never drops an exchange.
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

/// Cheap handle to the writer thread.
#[derive(Clone)]
pub struct WriterHandle {
    tx: mpsc::Sender<Exchange>,
    health: WriterHealth,
}

/// The writer thread; `join` after every handle is dropped.
pub struct Writer {
    thread: JoinHandle<Result<u64, WriterError>>,
}

/// Open `path` (created or truncated) and start the writer thread, which reports a write
/// error to `health` the moment it happens and then stops (the error is also returned by
/// [`Writer::join`]).
pub fn start(
    path: &Path,
    scrub: Scrub,
    health: WriterHealth,
) -> Result<(WriterHandle, Writer), WriterError> {
    let file = File::create(path).map_err(|source| WriterError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let (tx, rx) = mpsc::channel::<Exchange>(WRITER_QUEUE);
    let path = path.to_path_buf();
    let thread_health = health.clone();
    let thread = std::thread::Builder::new()
        .name("record-writer".into())
        .spawn(move || {
            let result = write_loop(file, rx, &scrub).map_err(|source| WriterError::Write {
                path: path.clone(),
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
    Ok((WriterHandle { tx, health }, Writer { thread }))
}

/// Write every exchange received as one line; `fsync` when lines were written and
/// [`SYNC_INTERVAL`] has passed (also while idle), and once at the end.
fn write_loop(
    mut file: File,
    mut rx: mpsc::Receiver<Exchange>,
    scrub: &Scrub,
) -> std::io::Result<u64> {
    // A timed receive needs a timer: a one-thread runtime of its own, on this thread only.
    let timer = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    let mut written = 0u64;
    let mut line = Vec::with_capacity(64 << 10);
    let mut unsynced = false;
    let mut last_sync = Instant::now();
    loop {
        let received = if unsynced {
            let wait = SYNC_INTERVAL.saturating_sub(last_sync.elapsed());
            timer.block_on(async { tokio::time::timeout(wait, rx.recv()).await })
        } else {
            Ok(rx.blocking_recv())
        };
        match received {
            Ok(Some(mut exchange)) => {
                scrub.apply(&mut exchange);
                // Cut and marked when too long for one readable line (logged there).
                if let Err(error) =
                    write_line_within(&mut exchange, &mut line, MAX_WRITTEN_LINE_BYTES)
                {
                    tracing::error!(%error, "cannot serialize an exchange; skipped");
                    continue;
                }
                // One write of the whole line (a regular file takes it whole), no user-space
                // buffer: what the kernel has survives a SIGKILL of this process.
                file.write_all(&line)?;
                written += 1;
                // A huge exchange must not keep its buffer for the life of the proxy.
                if line.capacity() > 1 << 20 {
                    line = Vec::with_capacity(64 << 10);
                }
                unsynced = true;
            }
            Ok(None) => break,
            Err(_elapsed) => {}
        }
        if unsynced && last_sync.elapsed() >= SYNC_INTERVAL {
            sync(&file)?;
            unsynced = false;
            last_sync = Instant::now();
        }
    }
    file.flush()?;
    if unsynced {
        sync(&file)?;
    }
    Ok(written)
}

/// `fsync` the data; a file that cannot be synced at all (a pipe, `/dev/stdout`) is not an
/// error — there is nothing more durable to wait for.
fn sync(file: &File) -> std::io::Result<()> {
    match file.sync_data() {
        Err(error) if error.kind() == std::io::ErrorKind::InvalidInput => Ok(()),
        other => other,
    }
}

impl WriterHandle {
    /// Queue a finished exchange. Never blocks: when the queue is full, a task waits for
    /// room (one per finishing stream, so the wait is bounded by the open streams).
    pub fn submit(&self, exchange: Exchange) {
        match self.tx.try_send(exchange) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(exchange)) => {
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

    /// The writer's write error, if it has had one.
    pub fn failure(&self) -> Option<String> {
        self.health.failure()
    }
}

impl Writer {
    /// Wait for the thread to write everything queued; returns the lines written.
    pub fn join(self) -> Result<u64, WriterError> {
        self.thread.join().map_err(|_| WriterError::Panicked)?
    }
}
