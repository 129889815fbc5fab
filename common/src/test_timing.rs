//! The timing lock of the unit tests of `common` and of the crates that take the
//! `test-timing` feature (the mock, the importers).
//!
//! `cargo test` runs the unit tests of a crate on several threads of one process. A test
//! that asserts on measured time (frame offsets to a few ms, wake-up order) holds the lock
//! for its whole run, and so do the CPU-heavy tests (tokenizing a corpus), so that no
//! measurement shares the cores with another one or with heavy work. Every other test runs
//! in parallel with them. The lock is tokio's, so async tests hold it across `.await`.

use tokio::sync::{Mutex, MutexGuard};

static TIMING: Mutex<()> = Mutex::const_new(());

/// Take the lock in an async test (`let _timing = timing_lock().await;`).
pub async fn timing_lock() -> MutexGuard<'static, ()> {
    TIMING.lock().await
}

/// Take the lock in a plain `#[test]` (not inside a runtime).
pub fn timing_lock_blocking() -> MutexGuard<'static, ()> {
    TIMING.blocking_lock()
}
