//! The timed response body: plays pre-encoded frames at absolute deadlines.
//!
//! Every frame is a zero-copy slice of one buffer encoded when the request arrived, so the
//! per-frame work is one pacer registration and one `Bytes` clone. Deadlines are absolute
//! (`start + offset`), never accumulated sleeps, so scheduling delays do not add up.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::OwnedSemaphorePermit;

use common::pacer::Pacer;

use crate::metrics::StreamMetrics;
use crate::request_log::RequestLog;
use crate::truth::{self, RequestTrace};

/// One frame of a planned response and when to write it, relative to the stream's start.
#[derive(Debug, Clone)]
pub(crate) struct PlannedFrame {
    pub(crate) bytes: Bytes,
    pub(crate) offset: Duration,
}

/// What the body does after its last frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// End normally (HTTP/1.1: the terminating chunk).
    Clean,
    /// Fail the body at this offset, so hyper cuts the connection without a terminating
    /// chunk (an injected drop).
    Abort(Duration),
}

/// The body errors; either makes hyper abort the stream without its proper end.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    #[error("connection dropped on purpose (fault injection)")]
    InjectedDrop,
    #[error("the mock is shutting down")]
    ShuttingDown,
}

/// What a model response's body reports when its client leaves before the last frame was
/// handed over (a user pressing stop): a `cancelled` line in the request log and the
/// instant in the truth log. Not a cancel: the mock's own injected cut or error, and
/// shutdown.
pub(crate) struct CancelWatch {
    pub(crate) request_log: Option<Arc<RequestLog>>,
    /// Set when the server begins to stop: bodies dropped from then on were not cancelled.
    pub(crate) stopping: Arc<AtomicBool>,
    pub(crate) exchange: Option<String>,
    pub(crate) path: String,
    /// When the request head arrived.
    pub(crate) arrival: Instant,
}

/// The token counts of a response: what its usage reports (or would, with `--usage off`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TokenCounts {
    pub(crate) input: u64,
    pub(crate) output: u64,
}

/// A response body that writes each frame as its own chunk at `start + offset`.
pub(crate) struct TimedBody {
    frames: Vec<PlannedFrame>,
    next: usize,
    start: Instant,
    ending: Ending,
    /// Wakes the task at frame deadlines; `None` only for bodies that are due at once.
    pacer: Option<Pacer>,
    /// The deadline a wake-up is registered for.
    registered_for: Option<Instant>,
    /// A data frame was handed to hyper since the body last returned `Pending`. hyper buffers
    /// the frames of one write pass and flushes them when the body is pending; an error in
    /// the same pass closes the connection with them still buffered.
    unflushed: bool,
    /// `Some` for a body known whole up front, so hyper sends `content-length`.
    exact_len: Option<u64>,
    /// Holds the concurrent-stream slot until the body is done or dropped.
    _permit: Option<OwnedSemaphorePermit>,
    /// `--write-log`: stamps each data frame as it is handed to hyper.
    trace: Option<Arc<RequestTrace>>,
    /// Index of the frame that carries the first token (after a role/preamble frame).
    first_token: usize,
    /// `/metrics`: counts this response running and its tokens as frames are handed over.
    metrics: Option<StreamMetrics>,
    /// Reports a client that leaves mid-response (model responses only).
    cancel: Option<CancelWatch>,
    /// The body failed on purpose (an injected cut, shutdown): being dropped is no cancel.
    ended_by_server: bool,
    /// For the truth log.
    tokens: Option<TokenCounts>,
}

impl TimedBody {
    /// A streamed body (chunked on HTTP/1.1).
    pub(crate) fn stream(
        frames: Vec<PlannedFrame>,
        start: Instant,
        ending: Ending,
        pacer: Pacer,
        permit: Option<OwnedSemaphorePermit>,
    ) -> TimedBody {
        TimedBody {
            frames,
            next: 0,
            start,
            ending,
            pacer: Some(pacer),
            registered_for: None,
            unflushed: false,
            exact_len: None,
            _permit: permit,
            trace: None,
            first_token: 0,
            metrics: None,
            cancel: None,
            ended_by_server: false,
            tokens: None,
        }
    }

    /// A whole body written at `start + offset` with a `content-length`.
    pub(crate) fn full_at(
        bytes: Bytes,
        start: Instant,
        offset: Duration,
        pacer: Pacer,
        permit: Option<OwnedSemaphorePermit>,
    ) -> TimedBody {
        let len = bytes.len() as u64;
        let mut body = TimedBody::stream(
            vec![PlannedFrame { bytes, offset }],
            start,
            Ending::Clean,
            pacer,
            permit,
        );
        body.exact_len = Some(len);
        body
    }

    /// A whole body written at once.
    pub(crate) fn full(bytes: Bytes) -> TimedBody {
        let len = bytes.len() as u64;
        TimedBody {
            frames: vec![PlannedFrame {
                bytes,
                offset: Duration::ZERO,
            }],
            next: 0,
            start: Instant::now(),
            ending: Ending::Clean,
            pacer: None,
            registered_for: None,
            unflushed: false,
            exact_len: Some(len),
            _permit: None,
            trace: None,
            first_token: 0,
            metrics: None,
            cancel: None,
            ended_by_server: false,
            tokens: None,
        }
    }

    /// Which frame carries the first token (default: the first frame).
    pub(crate) fn with_first_token(mut self, index: usize) -> TimedBody {
        self.first_token = index;
        self
    }

    /// Count this body in `/metrics` (running from now on).
    pub(crate) fn with_metrics(mut self, metrics: StreamMetrics) -> TimedBody {
        self.metrics = Some(metrics);
        self
    }

    /// The response's token counts, for the truth log.
    pub(crate) fn with_tokens(mut self, tokens: TokenCounts) -> TimedBody {
        self.tokens = Some(tokens);
        self
    }

    /// Log this body's frames in the truth log.
    pub(crate) fn set_trace(&mut self, trace: Arc<RequestTrace>) {
        if let Some(tokens) = self.tokens {
            trace.set_tokens(tokens.input, tokens.output);
        }
        self.trace = Some(trace);
    }

    /// Report a client leaving before the last frame, if this body is timed (a model
    /// response; bodies written at once are not watched).
    pub(crate) fn watch_cancel(&mut self, watch: CancelWatch) {
        if self.pacer.is_some() {
            self.cancel = Some(watch);
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        match self.frames.get(self.next) {
            Some(frame) => Some(self.start + frame.offset),
            None => match self.ending {
                Ending::Clean => None,
                Ending::Abort(offset) => Some(self.start + offset),
            },
        }
    }
}

impl Body for TimedBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        let Some(deadline) = this.next_deadline() else {
            if let Some(metrics) = &mut this.metrics {
                metrics.ended(Instant::now());
            }
            this._permit = None;
            return Poll::Ready(None);
        };
        let now = Instant::now();
        if now < deadline
            && let Some(pacer) = &this.pacer
        {
            // Register once per deadline; a spurious poll before it just waits again.
            if this.registered_for != Some(deadline) {
                if !pacer.wake_at(deadline, cx.waker().clone()) {
                    this.ended_by_server = true;
                    this._permit = None;
                    return Poll::Ready(Some(Err(BodyError::ShuttingDown)));
                }
                this.registered_for = Some(deadline);
            }
            this.unflushed = false;
            return Poll::Pending;
        }
        this.registered_for = None;
        match this.frames.get(this.next) {
            Some(frame) => {
                let bytes = frame.bytes.clone();
                if let Some(trace) = &this.trace {
                    trace.frame_handed(this.next == this.first_token, deadline);
                }
                if let Some(metrics) = &mut this.metrics {
                    let last = this.next + 1 >= this.frames.len() && this.ending == Ending::Clean;
                    metrics.frame_handed(this.next, now, last);
                }
                this.next += 1;
                this.unflushed = true;
                Poll::Ready(Some(Ok(Frame::data(bytes))))
            }
            None if this.unflushed => {
                // The cut is due in the same write pass as frames before it (the task ran
                // late, or they share an offset): yield once so hyper writes them out first.
                // Otherwise a drop would lose the frames it keeps, depending on scheduling.
                this.unflushed = false;
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            None => {
                this.ended_by_server = true;
                this._permit = None;
                Poll::Ready(Some(Err(BodyError::InjectedDrop)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.next >= self.frames.len() && self.ending == Ending::Clean
    }

    fn size_hint(&self) -> SizeHint {
        match self.exact_len {
            Some(len) if self.next == 0 => SizeHint::with_exact(len),
            _ => SizeHint::default(),
        }
    }
}

impl Drop for TimedBody {
    /// hyper drops a body before its end when the client is gone: an HTTP/1 client closing
    /// its socket is noticed at once (hyper reads the connection while the body waits, and
    /// a read of 0 mid-response ends it), an HTTP/2 client's `RST_STREAM` too.
    fn drop(&mut self) {
        if self.next >= self.frames.len() || self.ended_by_server {
            return;
        }
        let Some(watch) = &self.cancel else {
            return;
        };
        // Stamped first, before the work of reporting it.
        let now_ns = truth::unix_ns();
        if watch.stopping.load(Ordering::SeqCst) {
            return;
        }
        let after = watch.arrival.elapsed();
        if let Some(trace) = &self.trace {
            trace.cancelled(now_ns);
        }
        if let Some(log) = &watch.request_log {
            log.cancelled(
                now_ns,
                watch.exchange.as_deref(),
                &watch.path,
                self.next as u64,
                after,
            );
        }
        tracing::debug!(
            path = %watch.path,
            frames_sent = self.next,
            after_ms = after.as_secs_f64() * 1e3,
            "client cancelled"
        );
    }
}
