//! A user-space wide-area link between two processes: a TCP forwarder with per-direction
//! delay and jitter, and stalls and cuts the test switches on. It stands where a real WAN
//! stands (between each worker and the coordinator), so the programs under test speak their
//! real protocol through it.
//!
//! Each direction of each connection is a reader thread and a writer thread. The reader
//! stamps every chunk with its release instant, `arrival + delay ± jitter`, never earlier
//! than the chunk before it (a TCP stream is delivered in order, so jitter stretches and
//! squeezes gaps but cannot reorder bytes). The writer sleeps until the release instant and
//! holds everything while its direction is stalled; what was held is delivered when the stall
//! ends, as TCP's retransmissions would. A stall holds both directions (`set_stalled`) or one
//! (`set_stalled_up`, `set_stalled_down`: a path that drops one way only). A cut closes every
//! open connection at once.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// One direction's timing.
#[derive(Debug, Clone, Copy, Default)]
pub struct Direction {
    /// Added to every chunk.
    pub delay: Duration,
    /// Each chunk's delay is drawn uniformly from `delay ± jitter` (never below zero).
    pub jitter: Duration,
}

impl Direction {
    /// A fixed one-way delay.
    pub fn delay(delay: Duration) -> Direction {
        Direction {
            delay,
            jitter: Duration::ZERO,
        }
    }

    /// A one-way delay with uniform jitter.
    pub fn jittery(delay: Duration, jitter: Duration) -> Direction {
        Direction { delay, jitter }
    }
}

/// Which directions are held: `up` (dialler → upstream) and `down` (the way back).
#[derive(Debug, Clone, Copy, Default)]
struct Stalls {
    up: bool,
    down: bool,
}

impl Stalls {
    fn holds(self, way: Way) -> bool {
        match way {
            Way::Up => self.up,
            Way::Down => self.down,
        }
    }
}

/// The direction a pipe carries.
#[derive(Debug, Clone, Copy)]
enum Way {
    Up,
    Down,
}

/// Links started by this process, for their seeds.
static LINKS: AtomicU64 = AtomicU64::new(1);

struct Shared {
    stalled: Mutex<Stalls>,
    resumed: Condvar,
    closed: AtomicBool,
    /// Every socket opened through the link (both ends), for `cut`.
    sockets: Mutex<Vec<TcpStream>>,
    connections: AtomicU64,
    seed: AtomicU64,
}

/// A running link: dial `addr()` instead of the upstream.
pub struct DelayLink {
    addr: String,
    shared: Arc<Shared>,
}

impl DelayLink {
    /// Listen on a free loopback port and forward to `upstream` (`host:port`, or a URL whose
    /// authority is that): `up` times the dialler → upstream direction, `down` the way back.
    pub fn start(upstream: &str, up: Direction, down: Direction) -> DelayLink {
        let upstream = upstream
            .trim_start_matches("http://")
            .trim_start_matches("https://")
            .trim_end_matches('/')
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").expect("the link binds");
        let addr = listener.local_addr().expect("bound").to_string();
        let shared = Arc::new(Shared {
            stalled: Mutex::new(Stalls::default()),
            resumed: Condvar::new(),
            closed: AtomicBool::new(false),
            sockets: Mutex::new(Vec::new()),
            connections: AtomicU64::new(0),
            // Each link draws its own delays: two links with one seed would jitter in
            // step, and their errors would cancel.
            seed: AtomicU64::new(
                0x9E37_79B9_7F4A_7C15
                    ^ LINKS
                        .fetch_add(1, Ordering::Relaxed)
                        .wrapping_mul(0xBF58_476D_1CE4_E5B9),
            ),
        });
        let accept = shared.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if accept.closed.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(&upstream) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                accept.connections.fetch_add(1, Ordering::Relaxed);
                if let (Ok(a), Ok(b)) = (client.try_clone(), server.try_clone()) {
                    let mut sockets = accept.sockets.lock().expect("link lock");
                    sockets.push(a);
                    sockets.push(b);
                }
                pipe(&accept, &client, &server, up, Way::Up);
                pipe(&accept, &server, &client, down, Way::Down);
            }
        });
        DelayLink { addr, shared }
    }

    /// The address to dial (`127.0.0.1:PORT`).
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Hold (true) or release (false) every byte in both directions; connections stay open.
    pub fn set_stalled(&self, stalled: bool) {
        self.set_stalls(Stalls {
            up: stalled,
            down: stalled,
        });
    }

    /// Hold (true) or release (false) the dialler → upstream direction only (the worker's
    /// messages, when a worker dials a coordinator through the link).
    pub fn set_stalled_up(&self, stalled: bool) {
        let down = self.shared.stalled.lock().expect("link lock").down;
        self.set_stalls(Stalls { up: stalled, down });
    }

    /// Hold (true) or release (false) the upstream → dialler direction only.
    pub fn set_stalled_down(&self, stalled: bool) {
        let up = self.shared.stalled.lock().expect("link lock").up;
        self.set_stalls(Stalls { up, down: stalled });
    }

    /// Stall both directions for `how_long` from now, in the background.
    pub fn stall_for(&self, how_long: Duration) {
        self.set_stalled(true);
        self.release_after(how_long);
    }

    /// Stall the dialler → upstream direction for `how_long` from now, in the background.
    pub fn stall_up_for(&self, how_long: Duration) {
        self.set_stalled_up(true);
        self.release_after(how_long);
    }

    /// Release every stall after `how_long`, in the background.
    fn release_after(&self, how_long: Duration) {
        let shared = self.shared.clone();
        std::thread::spawn(move || {
            std::thread::sleep(how_long);
            *shared.stalled.lock().expect("link lock") = Stalls::default();
            shared.resumed.notify_all();
        });
    }

    fn set_stalls(&self, stalls: Stalls) {
        *self.shared.stalled.lock().expect("link lock") = stalls;
        self.shared.resumed.notify_all();
    }

    /// Close every connection open through the link (new ones are still accepted).
    pub fn cut(&self) {
        for socket in self.shared.sockets.lock().expect("link lock").drain(..) {
            let _ = socket.shutdown(Shutdown::Both);
        }
    }

    /// How many connections the link has carried.
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::Relaxed)
    }
}

impl Drop for DelayLink {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Relaxed);
        self.set_stalled(false);
        self.cut();
        // Wake the accept loop so it sees `closed`.
        let _ = TcpStream::connect(&self.addr);
    }
}

/// A uniform draw in `[-jitter, +jitter]` from a shared xorshift state (deterministic per run
/// order; good enough for spreading delays).
fn draw(shared: &Shared, jitter: Duration) -> f64 {
    if jitter.is_zero() {
        return 0.0;
    }
    let mut x = shared.seed.load(Ordering::Relaxed);
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    shared.seed.store(x, Ordering::Relaxed);
    let unit = (x >> 11) as f64 / (1u64 << 53) as f64;
    (unit * 2.0 - 1.0) * jitter.as_secs_f64()
}

/// Chunks read and not yet delivered, each with its release instant (`None`: the end of
/// the stream), and the condition its writer waits on.
type ChunkQueue = (Mutex<VecDeque<Option<(Instant, Vec<u8>)>>>, Condvar);

/// Forward `from` → `to` with `timing`: a reader thread queues stamped chunks, a writer thread
/// delivers them at their instants unless the link is stalled.
fn pipe(shared: &Arc<Shared>, from: &TcpStream, to: &TcpStream, timing: Direction, way: Way) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    let queue: Arc<ChunkQueue> = Arc::new((Mutex::new(VecDeque::new()), Condvar::new()));
    let reader_queue = queue.clone();
    let reader_shared = shared.clone();
    std::thread::spawn(move || {
        let mut last = Instant::now();
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buffer) {
                Ok(0) | Err(_) => 0,
                Ok(n) => n,
            };
            let (lock, ready) = &*reader_queue;
            let mut chunks = lock.lock().expect("link lock");
            if n == 0 {
                chunks.push_back(None);
                ready.notify_all();
                return;
            }
            let delay = (timing.delay.as_secs_f64() + draw(&reader_shared, timing.jitter)).max(0.0);
            let release = (Instant::now() + Duration::from_secs_f64(delay)).max(last);
            last = release;
            chunks.push_back(Some((release, buffer[..n].to_vec())));
            ready.notify_all();
        }
    });
    let writer_shared = shared.clone();
    std::thread::spawn(move || {
        loop {
            let next = {
                let (lock, ready) = &*queue;
                let mut chunks = lock.lock().expect("link lock");
                while chunks.is_empty() {
                    chunks = ready.wait(chunks).expect("link lock");
                }
                chunks.pop_front().expect("not empty")
            };
            let Some((release, bytes)) = next else {
                let _ = to.shutdown(Shutdown::Write);
                return;
            };
            let now = Instant::now();
            if release > now {
                std::thread::sleep(release - now);
            }
            {
                let mut stalled = writer_shared.stalled.lock().expect("link lock");
                while stalled.holds(way) {
                    stalled = writer_shared.resumed.wait(stalled).expect("link lock");
                }
            }
            if to.write_all(&bytes).is_err() {
                let _ = to.shutdown(Shutdown::Both);
                return;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on loopback: every byte read is written back.
    fn echo() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("bound").to_string();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                std::thread::spawn(move || {
                    let mut buffer = [0u8; 1024];
                    while let Ok(n) = stream.read(&mut buffer) {
                        if n == 0 || stream.write_all(&buffer[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    fn round_trip(stream: &mut TcpStream) -> Duration {
        let started = Instant::now();
        stream.write_all(b"ping").expect("write");
        let mut answer = [0u8; 4];
        stream.read_exact(&mut answer).expect("echo");
        assert_eq!(&answer, b"ping");
        started.elapsed()
    }

    /// Each direction adds its own delay: a round trip through 30 ms up and 20 ms down takes
    /// at least 50 ms (and, on an idle machine, not much more: under 150 ms).
    #[test]
    fn a_round_trip_takes_both_delays() {
        let link = DelayLink::start(
            &echo(),
            Direction::delay(Duration::from_millis(30)),
            Direction::delay(Duration::from_millis(20)),
        );
        let mut stream = TcpStream::connect(link.addr()).expect("dial the link");
        for _ in 0..3 {
            let rtt = round_trip(&mut stream);
            assert!(
                rtt >= Duration::from_millis(50) && rtt < Duration::from_millis(150),
                "{rtt:?}"
            );
        }
        assert_eq!(link.connections(), 1);
    }

    /// A stall holds every byte until it ends; nothing is lost.
    #[test]
    fn a_stall_holds_bytes_until_it_ends() {
        let link = DelayLink::start(&echo(), Direction::default(), Direction::default());
        let mut stream = TcpStream::connect(link.addr()).expect("dial the link");
        round_trip(&mut stream);
        link.stall_for(Duration::from_millis(300));
        let rtt = round_trip(&mut stream);
        assert!(rtt >= Duration::from_millis(250), "{rtt:?}");
    }

    /// A cut closes the connection: the next read sees its end.
    #[test]
    fn a_cut_closes_open_connections() {
        let link = DelayLink::start(&echo(), Direction::default(), Direction::default());
        let mut stream = TcpStream::connect(link.addr()).expect("dial the link");
        round_trip(&mut stream);
        link.cut();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut buffer = [0u8; 4];
        let read = stream.read(&mut buffer);
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    }
}
