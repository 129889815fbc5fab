//! The one accept loop of every server of the project: the mock, the recording proxy and its
//! health port, the live metrics endpoint and the worker's health port.
//!
//! The caller owns the listener and the shutdown signal ([`serve`] takes both, mini-redis's
//! `server::run(listener, shutdown)`). The loop's rules, written once:
//! - at most [`AcceptLimits::max_connections`] connections at once: a semaphore permit is
//!   taken before `accept` and held by the connection's task, so past the cap connections
//!   wait in the kernel's backlog, holding no descriptor of this process;
//! - a failed accept (EMFILE, ENFILE, ECONNABORTED, ...) is logged once per burst of
//!   failures and retried after [`ACCEPT_BACKOFF`]: the error would come back at once, and
//!   retrying without a pause spins a core;
//! - every accepted stream gets `TCP_NODELAY` (a frame leaves at once, not after Nagle);
//! - with [`AcceptLimits::head_timeout`], a connection that sends no byte within it is closed
//!   before the caller sees it (whatever its protocol: a TLS handshake and HTTP/2's preface
//!   start with the client's bytes too); [`http_builder`] gives hyper's builder the same
//!   limit for the rest of each request head, and [`http_io`] bounds what comes between
//!   the two: the bytes that tell HTTP/1 from HTTP/2's preface, which hyper reads without
//!   a timer (a connection that sends `P` and stalls would otherwise hold its slot for
//!   good);
//! - shutdown stops accepting (the listener is closed) and hands back the open connections
//!   ([`Connections`]) for the caller to drain with a grace of its choosing, abort, or leave
//!   running.

use std::future::Future;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// The pause after a failed accept before the next try.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// What one server allows its clients.
#[derive(Debug, Clone)]
pub struct AcceptLimits {
    /// The server's name in the log (`--metrics-listen`, `health port`, ...).
    pub name: &'static str,
    /// Connections served at once; more wait in the kernel's backlog until one ends.
    pub max_connections: usize,
    /// The longest a new connection may stay silent: one without a byte by then is closed
    /// unseen. `None`: the caller's handler waits for the first byte itself.
    pub head_timeout: Option<Duration>,
}

/// The connections still open when the loop stopped accepting. Dropping this aborts them.
#[derive(Debug)]
pub struct Connections {
    tasks: JoinSet<()>,
}

/// An HTTP/1 and HTTP/2 (auto-detected) connection builder whose HTTP/1 request heads must
/// arrive within `head_timeout`, counted from the start of each head's read: a connection's
/// first request, and each next one on a kept-alive connection (so it is also the idle limit
/// of a kept-alive connection, and should exceed the clients' pool idle times).
pub fn http_builder(
    head_timeout: Duration,
) -> hyper_util::server::conn::auto::Builder<TokioExecutor> {
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(head_timeout);
    builder
}

/// HTTP/2's connection preface: hyper's auto-detection reads until the bytes leave it (HTTP/1)
/// or all of it came (HTTP/2).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// `io` for hyper, with [`HeadDeadline`]: what every server gives [`http_builder`]'s
/// `serve_connection`.
pub fn http_io<I>(io: I, patience: Duration) -> hyper_util::rt::TokioIo<HeadDeadline<I>> {
    hyper_util::rt::TokioIo::new(HeadDeadline::new(io, patience))
}

/// A connection whose opening bytes have a deadline: while what it sent is still the start
/// of HTTP/2's [`PREFACE`] (hyper cannot tell the protocol yet, and has no timer for it), a
/// read still waiting `patience` after the connection was wrapped fails as timed out, which
/// ends the connection. Once the bytes leave the preface (HTTP/1: hyper's head timeout takes
/// over), all of it came (HTTP/2), or the server wrote, the deadline is gone.
pub struct HeadDeadline<I> {
    inner: I,
    /// `None` once disarmed.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    read: usize,
}

impl<I> HeadDeadline<I> {
    pub fn new(inner: I, patience: Duration) -> HeadDeadline<I> {
        HeadDeadline {
            inner,
            deadline: Some(Box::pin(tokio::time::sleep(patience))),
            read: 0,
        }
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for HeadDeadline<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        let Some(deadline) = this.deadline.as_mut() else {
            return polled;
        };
        match polled {
            Poll::Ready(result) => {
                let fresh = &buf.filled()[before..];
                let still_preface = fresh
                    .iter()
                    .zip(&PREFACE[this.read.min(PREFACE.len())..])
                    .all(|(got, want)| got == want);
                this.read += fresh.len();
                if !still_preface || this.read >= PREFACE.len() {
                    this.deadline = None;
                }
                Poll::Ready(result)
            }
            Poll::Pending => match deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the connection's opening bytes did not arrive in time",
                ))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for HeadDeadline<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.deadline = None;
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.deadline = None;
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Accept connections on `listener` until `shutdown` resolves, each served by the future
/// `handle(stream, peer)` returns on a task of its own, under `limits`. Returns the
/// connections still open; the listener is closed on return (new connections are refused).
pub async fn serve<H, F>(
    listener: TcpListener,
    limits: &AcceptLimits,
    shutdown: impl Future<Output = ()>,
    handle: H,
) -> Connections
where
    H: Fn(TcpStream, SocketAddr) -> F + Send + Sync + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let handle = Arc::new(handle);
    let mut tasks = JoinSet::new();
    let mut failing = false;
    tokio::pin!(shutdown);
    loop {
        // A slot first: past the cap, connections wait in the backlog, not in our table.
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => slot.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(error) => {
                if !failing {
                    failing = true;
                    tracing::warn!(server = limits.name, %error, "accepting a connection failed; retrying every {} ms (logged once until one succeeds)", ACCEPT_BACKOFF.as_millis());
                }
                tokio::select! {
                    () = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                    () = &mut shutdown => break,
                }
            }
        };
        if failing {
            failing = false;
            tracing::info!(server = limits.name, "accepting connections again");
        }
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(server = limits.name, %error, %peer, "set_nodelay failed");
        }
        // Finished connections leave the table here, so it holds at most the cap (plus the
        // ones that ended since the last accept).
        while tasks.try_join_next().is_some() {}
        let handle = Arc::clone(&handle);
        let head_timeout = limits.head_timeout;
        tasks.spawn(async move {
            let _slot = slot;
            if let Some(patience) = head_timeout
                && !first_byte_within(&stream, patience).await
            {
                return;
            }
            let connection = (*handle)(stream, peer);
            // The handler (and what it holds) is not kept alive by a long connection.
            drop(handle);
            connection.await;
        });
    }
    Connections { tasks }
}

/// Whether `stream` has a byte to read within `patience` (false: silent, or closed).
async fn first_byte_within(stream: &TcpStream, patience: Duration) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(patience, stream.peek(&mut byte)).await,
        Ok(Ok(n)) if n > 0
    )
}

impl Connections {
    /// Connections whose task has not been reaped yet (an upper bound of the open ones).
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether no connection task is left.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Wait up to `grace` for every connection to end, then abort the rest; returns how many
    /// were aborted. Nothing of them is running when this returns.
    pub async fn drain(mut self, grace: Duration) -> usize {
        let drained = tokio::time::timeout(grace, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_ok() {
            return 0;
        }
        let open = self.tasks.len();
        self.tasks.shutdown().await;
        open
    }

    /// Abort every connection at once and wait until they are gone.
    pub async fn abort(mut self) {
        self.tasks.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::oneshot;

    use super::*;

    /// Bound on anything that should happen at once on loopback: only a broken loop waits it
    /// out.
    const PATIENCE: Duration = Duration::from_secs(10);

    /// A running loop: its address, its stop, and what it hands back.
    struct Server {
        addr: SocketAddr,
        stop: oneshot::Sender<()>,
        done: tokio::task::JoinHandle<Connections>,
    }

    async fn start<H, F>(limits: AcceptLimits, handle: H) -> Server
    where
        H: Fn(TcpStream, SocketAddr) -> F + Send + Sync + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let done = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.await;
            };
            serve(listener, &limits, shutdown, handle).await
        });
        Server { addr, stop, done }
    }

    fn limits(max_connections: usize, head_timeout: Option<Duration>) -> AcceptLimits {
        AcceptLimits {
            name: "test",
            max_connections,
            head_timeout,
        }
    }

    /// Answer every byte with itself until the client closes.
    async fn echo(mut stream: TcpStream, _peer: SocketAddr) {
        let mut buf = [0u8; 64];
        while let Ok(n @ 1..) = stream.read(&mut buf).await {
            if stream.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }

    /// Send one byte and wait (up to `patience`) for it to come back.
    async fn round_trip(stream: &mut TcpStream, patience: Duration) -> bool {
        stream.write_all(b"x").await.expect("write");
        let mut byte = [0u8; 1];
        matches!(
            tokio::time::timeout(patience, stream.read(&mut byte)).await,
            Ok(Ok(1))
        )
    }

    /// Whether the server closed `stream` within [`PATIENCE`] (EOF or reset, no data).
    async fn closed_by_server(stream: &mut TcpStream) -> bool {
        let mut buf = [0u8; 256];
        matches!(
            tokio::time::timeout(PATIENCE, stream.read(&mut buf)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    #[tokio::test]
    async fn past_the_cap_a_connection_waits_until_one_closes() {
        let server = start(limits(2, None), echo).await;
        let mut first = TcpStream::connect(server.addr).await.expect("connect");
        let mut second = TcpStream::connect(server.addr).await.expect("connect");
        assert!(round_trip(&mut first, PATIENCE).await);
        assert!(round_trip(&mut second, PATIENCE).await);
        // The third is connected by the kernel (backlog) but not served: its byte is not
        // answered in 300 ms, when a served one is answered in well under a millisecond.
        let mut third = TcpStream::connect(server.addr).await.expect("connect");
        assert!(!round_trip(&mut third, Duration::from_millis(300)).await);
        drop(first);
        // Its byte (sent above) is answered once a slot is free.
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(PATIENCE, third.read(&mut byte)).await;
        assert!(matches!(read, Ok(Ok(1))), "{read:?}");
        assert!(round_trip(&mut second, PATIENCE).await);
    }

    #[tokio::test]
    async fn shutdown_stops_accepting_and_hands_back_the_open_connections() {
        let server = start(limits(8, None), echo).await;
        let mut kept = TcpStream::connect(server.addr).await.expect("connect");
        let mut leaving = TcpStream::connect(server.addr).await.expect("connect");
        assert!(round_trip(&mut kept, PATIENCE).await);
        assert!(round_trip(&mut leaving, PATIENCE).await);
        server.stop.send(()).expect("the loop runs");
        let connections = server.done.await.expect("the loop returns");
        // The listener is closed: a new connection is refused.
        let refused = TcpStream::connect(server.addr).await;
        assert!(refused.is_err(), "{refused:?}");
        // The open ones are still served until the caller drains them.
        assert!(round_trip(&mut kept, PATIENCE).await);
        assert_eq!(connections.len(), 2);
        drop(leaving);
        // One ends by itself within the grace, the other is aborted (and closed).
        assert_eq!(connections.drain(Duration::from_millis(500)).await, 1);
        assert!(closed_by_server(&mut kept).await);
    }

    #[tokio::test]
    async fn a_silent_connection_is_closed_after_the_head_timeout_unseen() {
        let seen = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&seen);
        let server = start(
            limits(8, Some(Duration::from_millis(200))),
            move |stream, peer| {
                counted.fetch_add(1, Ordering::SeqCst);
                echo(stream, peer)
            },
        )
        .await;
        let mut silent = TcpStream::connect(server.addr).await.expect("connect");
        assert!(closed_by_server(&mut silent).await);
        assert_eq!(seen.load(Ordering::SeqCst), 0, "the handler never saw it");
        // A connection that speaks within the limit is served.
        let mut speaking = TcpStream::connect(server.addr).await.expect("connect");
        assert!(round_trip(&mut speaking, PATIENCE).await);
        assert_eq!(seen.load(Ordering::SeqCst), 1);
    }

    /// A server as the project's are: [`http_builder`] over [`http_io`], both with
    /// `patience`, answering "ok" to every request `answer_after` it came.
    async fn http_server(patience: Duration, answer_after: Duration) -> Server {
        let builder = http_builder(patience);
        start(limits(8, None), move |stream, _peer| {
            let builder = builder.clone();
            async move {
                let service = hyper::service::service_fn(move |_request| async move {
                    tokio::time::sleep(answer_after).await;
                    Ok::<_, Infallible>(hyper::Response::new(String::from("ok")))
                });
                let _ = builder
                    .serve_connection(http_io(stream, patience), service)
                    .await;
            }
        })
        .await
    }

    #[tokio::test]
    async fn the_http_builder_closes_a_connection_whose_head_does_not_end_in_time() {
        let server = http_server(Duration::from_millis(200), Duration::ZERO).await;
        let mut whole = TcpStream::connect(server.addr).await.expect("connect");
        whole
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut response = String::new();
        tokio::time::timeout(PATIENCE, whole.read_to_string(&mut response))
            .await
            .expect("a response")
            .expect("read");
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        // Half a head, then silence: closed without an answer.
        let mut partial = TcpStream::connect(server.addr).await.expect("connect");
        partial
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n")
            .await
            .expect("write");
        let mut answer = Vec::new();
        let read = tokio::time::timeout(PATIENCE, partial.read_to_end(&mut answer)).await;
        assert!(read.is_ok(), "the half-sent head is still waited for");
        assert!(
            !String::from_utf8_lossy(&answer).contains(" 200 "),
            "{answer:?}"
        );
    }

    /// hyper reads the opening bytes without a timer until they tell HTTP/1 from HTTP/2's
    /// preface: a connection that stops inside the preface is closed by [`http_io`]'s
    /// deadline (without it, it is held until the client leaves).
    #[tokio::test]
    async fn a_connection_that_stalls_inside_the_http2_preface_is_closed() {
        let server = http_server(Duration::from_millis(200), Duration::ZERO).await;
        for opening in [&b"P"[..], b"PRI * HTTP/2.0\r\n"] {
            let mut stream = TcpStream::connect(server.addr).await.expect("connect");
            stream.write_all(opening).await.expect("write");
            assert!(
                closed_by_server(&mut stream).await,
                "{:?} was held open",
                String::from_utf8_lossy(opening)
            );
        }
    }

    /// The deadline is for the opening bytes only: a head that left the preface at its first
    /// or second byte (GET, PUT) is answered however long the answer takes.
    #[tokio::test]
    async fn a_short_head_outside_the_preface_waits_for_a_slow_answer() {
        let server = http_server(Duration::from_millis(200), Duration::from_millis(600)).await;
        for head in [&b"GET / HTTP/1.0\r\n\r\n"[..], b"PUT / HTTP/1.0\r\n\r\n"] {
            let mut stream = TcpStream::connect(server.addr).await.expect("connect");
            stream.write_all(head).await.expect("write");
            let mut response = String::new();
            tokio::time::timeout(PATIENCE, stream.read_to_string(&mut response))
                .await
                .expect("a response")
                .expect("read");
            assert!(
                response.contains(" 200 ") && response.ends_with("ok"),
                "{response:?}"
            );
        }
    }
}
