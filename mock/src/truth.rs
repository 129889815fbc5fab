//! `--write-log`: the mock's own account of when things happened, for benchmarks that compare
//! a client's measurements with server truth.
//!
//! Per request, in CLOCK_REALTIME nanoseconds since the Unix epoch (one machine, one clock
//! the client can read too): when the request head reached the service, when the first frame,
//! the frame of the first token (after a role/preamble frame, as clients count TTFT) and the
//! last frame were handed to hyper, and — on HTTP/1 connections — when the socket writes
//! carrying them returned. For the first token's frame and the last frame it also logs when
//! they were *due* (the body's start plus the frame's planned offset): `write − due` is how
//! late the server itself was (its pacer waking from an idle core, a busy runtime), which a
//! test of the client subtracts instead of charging it to the client. Write instants come from [`StampedIo`], which wraps
//! the accepted `TcpStream` (under TLS, if any): a successful write while the connection's
//! current response has frames handed but not yet written stamps them. HTTP/1 carries one
//! response at a time, so this attribution is exact; on HTTP/2 streams share a connection and
//! only the hand-over instants are logged.
//!
//! A request whose client left mid-response (its body dropped before the last frame was
//! handed over, not by the mock's own fault or shutdown) gets `cancelled_ns`, and `frames`
//! stays the count handed over. Model responses log `input_tokens` and `output_tokens`: the
//! counts their usage reports (or would, with `--usage off`).
//!
//! The hot path is a few atomics per frame and one uncontended lock per socket write; each
//! finished request pushes one fixed-size record to a `Vec` behind a mutex, and the file is
//! written once, when the server stops (memory: ~100 bytes a request).

use std::fs::File;
use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// CLOCK_REALTIME now, in nanoseconds since the Unix epoch (0 if the clock is before 1970).
pub(crate) fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// `instant` in Unix nanoseconds, given `now_ns` read just before: the monotonic distance
/// from now carried over to the real-time clock (the two are read within a microsecond).
fn unix_ns_of(instant: Instant, now_ns: u64) -> u64 {
    let now = Instant::now();
    match instant.checked_duration_since(now) {
        Some(ahead) => now_ns.saturating_add(ahead.as_nanos() as u64),
        None => now_ns.saturating_sub(now.duration_since(instant).as_nanos() as u64),
    }
}

/// The records of every finished request, written to one file when the server stops.
pub(crate) struct TruthLog {
    path: PathBuf,
    file: Mutex<Option<File>>,
    records: Mutex<Vec<TruthRecord>>,
}

/// One finished request, as logged.
struct TruthRecord {
    id: u64,
    exchange: Option<Box<str>>,
    http2: bool,
    status: u16,
    head_ns: u64,
    frames: u32,
    first_handed_ns: u64,
    token_handed_ns: u64,
    last_handed_ns: u64,
    token_due_ns: u64,
    last_due_ns: u64,
    first_write_ns: u64,
    token_write_ns: u64,
    last_write_ns: u64,
    /// When the client cancelled (the body was dropped before its last frame); 0: it did not.
    cancelled_ns: u64,
    /// What the response's usage reports, or would (`--usage off`); model responses only.
    tokens: Option<(u64, u64)>,
}

impl TruthLog {
    /// Create (truncate) `path` now, so a bad path fails at start, not at shutdown.
    pub(crate) fn create(path: &Path) -> std::io::Result<TruthLog> {
        let file = File::create(path)?;
        Ok(TruthLog {
            path: path.to_owned(),
            file: Mutex::new(Some(file)),
            records: Mutex::new(Vec::with_capacity(16 * 1024)),
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Write every record pushed so far as JSON lines, sorted by arrival, and close the file.
    pub(crate) fn finish(&self) -> std::io::Result<u64> {
        let mut records =
            std::mem::take(&mut *self.records.lock().unwrap_or_else(|p| p.into_inner()));
        records.sort_by_key(|r| (r.head_ns, r.id));
        let Some(file) = self.file.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return Ok(0);
        };
        let mut out = BufWriter::with_capacity(256 << 10, file);
        let ns = |v: u64| (v != 0).then_some(v);
        for r in &records {
            let line = serde_json::json!({
                "id": r.id,
                "exchange": r.exchange.as_deref(),
                "version": if r.http2 { "HTTP/2.0" } else { "HTTP/1.1" },
                "status": r.status,
                "head_ns": r.head_ns,
                "frames": r.frames,
                "first_handed_ns": ns(r.first_handed_ns),
                "first_token_handed_ns": ns(r.token_handed_ns),
                "last_handed_ns": ns(r.last_handed_ns),
                "first_token_due_ns": ns(r.token_due_ns),
                "last_due_ns": ns(r.last_due_ns),
                "first_write_ns": ns(r.first_write_ns),
                "first_token_write_ns": ns(r.token_write_ns),
                "last_write_ns": ns(r.last_write_ns),
                "cancelled_ns": ns(r.cancelled_ns),
                "input_tokens": r.tokens.map(|(input, _)| input),
                "output_tokens": r.tokens.map(|(_, output)| output),
            });
            serde_json::to_writer(&mut out, &line)?;
            out.write_all(b"\n")?;
        }
        out.flush()?;
        Ok(records.len() as u64)
    }
}

/// The timing of one response while it is served; logged when the last holder drops it
/// (the body when it ends, or the connection's [`StampedIo`] after its last write).
pub(crate) struct RequestTrace {
    log: Arc<TruthLog>,
    id: u64,
    exchange: Option<Box<str>>,
    http2: bool,
    head_ns: u64,
    status: AtomicU16,
    handed: AtomicU32,
    written: AtomicU32,
    /// The `handed` count once the first token's frame was handed (0: not yet).
    token_frame: AtomicU32,
    first_handed_ns: AtomicU64,
    token_handed_ns: AtomicU64,
    last_handed_ns: AtomicU64,
    token_due_ns: AtomicU64,
    last_due_ns: AtomicU64,
    first_write_ns: AtomicU64,
    token_write_ns: AtomicU64,
    last_write_ns: AtomicU64,
    cancelled_ns: AtomicU64,
    tokens: OnceLock<(u64, u64)>,
}

impl RequestTrace {
    pub(crate) fn new(
        log: Arc<TruthLog>,
        id: u64,
        exchange: Option<&str>,
        http2: bool,
        head_ns: u64,
    ) -> RequestTrace {
        RequestTrace {
            log,
            id,
            exchange: exchange.map(Box::from),
            http2,
            head_ns,
            status: AtomicU16::new(0),
            handed: AtomicU32::new(0),
            written: AtomicU32::new(0),
            token_frame: AtomicU32::new(0),
            first_handed_ns: AtomicU64::new(0),
            token_handed_ns: AtomicU64::new(0),
            last_handed_ns: AtomicU64::new(0),
            token_due_ns: AtomicU64::new(0),
            last_due_ns: AtomicU64::new(0),
            first_write_ns: AtomicU64::new(0),
            token_write_ns: AtomicU64::new(0),
            last_write_ns: AtomicU64::new(0),
            cancelled_ns: AtomicU64::new(0),
            tokens: OnceLock::new(),
        }
    }

    /// The response's input and output tokens (set once, when its body is known).
    pub(crate) fn set_tokens(&self, input: u64, output: u64) {
        let _ = self.tokens.set((input, output));
    }

    /// The client left at `unix_ns`, before the last frame was handed over.
    pub(crate) fn cancelled(&self, unix_ns: u64) {
        self.cancelled_ns.store(unix_ns, Ordering::Relaxed);
    }

    pub(crate) fn set_status(&self, status: u16) {
        self.status.store(status, Ordering::Relaxed);
    }

    /// A frame with data, due at `due`, was handed to hyper; `first_token` when it carries
    /// token 0.
    pub(crate) fn frame_handed(&self, first_token: bool, due: Instant) {
        let now = unix_ns();
        let due_ns = unix_ns_of(due, now);
        let count = self.handed.fetch_add(1, Ordering::Relaxed) + 1;
        if count == 1 {
            self.first_handed_ns.store(now, Ordering::Relaxed);
        }
        if first_token {
            self.token_frame.store(count, Ordering::Relaxed);
            self.token_handed_ns.store(now, Ordering::Relaxed);
            self.token_due_ns.store(due_ns, Ordering::Relaxed);
        }
        self.last_handed_ns.store(now, Ordering::Relaxed);
        self.last_due_ns.store(due_ns, Ordering::Relaxed);
    }

    /// A socket write returned: every frame handed before it has now (begun to) be written.
    fn wrote(&self, now: u64) {
        let handed = self.handed.load(Ordering::Relaxed);
        if handed > self.written.load(Ordering::Relaxed) {
            let before = self.written.swap(handed, Ordering::Relaxed);
            if before == 0 {
                self.first_write_ns.store(now, Ordering::Relaxed);
            }
            let token = self.token_frame.load(Ordering::Relaxed);
            if token > before && token <= handed {
                self.token_write_ns.store(now, Ordering::Relaxed);
            }
            self.last_write_ns.store(now, Ordering::Relaxed);
        }
    }
}

impl Drop for RequestTrace {
    fn drop(&mut self) {
        let record = TruthRecord {
            id: self.id,
            exchange: self.exchange.take(),
            http2: self.http2,
            status: *self.status.get_mut(),
            head_ns: self.head_ns,
            frames: *self.handed.get_mut(),
            first_handed_ns: *self.first_handed_ns.get_mut(),
            token_handed_ns: *self.token_handed_ns.get_mut(),
            last_handed_ns: *self.last_handed_ns.get_mut(),
            token_due_ns: *self.token_due_ns.get_mut(),
            last_due_ns: *self.last_due_ns.get_mut(),
            first_write_ns: *self.first_write_ns.get_mut(),
            token_write_ns: *self.token_write_ns.get_mut(),
            last_write_ns: *self.last_write_ns.get_mut(),
            cancelled_ns: *self.cancelled_ns.get_mut(),
            tokens: self.tokens.get().copied(),
        };
        self.log
            .records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(record);
    }
}

/// The response an HTTP/1 connection is writing now, shared by its service and its IO.
pub(crate) type CurrentResponse = Arc<Mutex<Option<Arc<RequestTrace>>>>;

/// A transport that stamps each successful write for the connection's current response.
pub(crate) struct StampedIo<T> {
    inner: T,
    current: CurrentResponse,
}

impl<T> StampedIo<T> {
    pub(crate) fn new(inner: T, current: CurrentResponse) -> StampedIo<T> {
        StampedIo { inner, current }
    }

    fn stamp(&self) {
        let now = unix_ns();
        if let Some(trace) = &*self.current.lock().unwrap_or_else(|p| p.into_inner()) {
            trace.wrote(now);
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for StampedIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for StampedIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_write(cx, buf);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            this.stamp();
        }
        result
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            this.stamp();
        }
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
