//! The recording writer: a dedicated thread that owns the output file and appends each
//! finished exchange as ONE `write` of a whole line, so a crash or SIGKILL can at worst leave
//! a torn last line (which readers report and skip), never a broken line in the middle.
//!
//! Credentials are removed here, on the one path to disk: the built-in credential headers
//! and every `--redact-header`, on both sides, plus `set-cookie`; `--redact-body` matches are
//! replaced in the path, header values, the request body and the response frames.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use common::recording::{Exchange, is_credential_header, strip_credential_query};
use tokio::sync::mpsc;

use super::redact::Redactor;

/// Exchanges waiting for the writer. When it is full, finishing streams wait in their own
/// tasks (see [`WriterHandle::submit`]); the proxy never drops an exchange.
pub const WRITER_QUEUE: usize = 1024;

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
}

/// The writer thread; `join` after every handle is dropped.
pub struct Writer {
    thread: JoinHandle<Result<u64, WriterError>>,
}

/// Open `path` (created or truncated) and start the writer thread.
pub fn start(path: &Path, scrub: Scrub) -> Result<(WriterHandle, Writer), WriterError> {
    let file = File::create(path).map_err(|source| WriterError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let (tx, mut rx) = mpsc::channel::<Exchange>(WRITER_QUEUE);
    let path = path.to_path_buf();
    let thread = std::thread::Builder::new()
        .name("record-writer".into())
        .spawn(move || {
            let mut file = file;
            let mut written = 0u64;
            let mut line = Vec::with_capacity(64 << 10);
            while let Some(mut exchange) = rx.blocking_recv() {
                scrub.apply(&mut exchange);
                line.clear();
                if let Err(error) = serde_json::to_writer(&mut line, &exchange) {
                    tracing::error!(%error, "cannot serialize an exchange; skipped");
                    continue;
                }
                line.push(b'\n');
                // One write of the whole line (a regular file takes it whole), no user-space
                // buffer: what the kernel has survives a SIGKILL of this process.
                file.write_all(&line).map_err(|source| WriterError::Write {
                    path: path.clone(),
                    source,
                })?;
                written += 1;
            }
            file.flush().map_err(|source| WriterError::Write {
                path: path.clone(),
                source,
            })?;
            Ok(written)
        })
        .map_err(|source| WriterError::Open {
            path: PathBuf::from("(writer thread)"),
            source,
        })?;
    Ok((WriterHandle { tx }, Writer { thread }))
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
                tracing::warn!("the recording writer has stopped; an exchange was not written");
            }
        }
    }
}

impl Writer {
    /// Wait for the thread to write everything queued; returns the lines written.
    pub fn join(self) -> Result<u64, WriterError> {
        self.thread.join().map_err(|_| WriterError::Panicked)?
    }
}
