//! The timed response body: plays pre-encoded frames at absolute deadlines.
//!
//! Every frame is a zero-copy slice of one buffer encoded when the request arrived, so the
//! per-frame work is one pacer registration and one `Bytes` clone. Deadlines are absolute
//! (`start + offset`), never accumulated sleeps, so scheduling delays do not add up.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::OwnedSemaphorePermit;

use common::pacer::Pacer;

use crate::metrics::StreamMetrics;
use crate::truth::RequestTrace;

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

    /// Log this body's frames in the truth log.
    pub(crate) fn set_trace(&mut self, trace: Arc<RequestTrace>) {
        self.trace = Some(trace);
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
