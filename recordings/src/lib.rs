//! The recording tools: `import` (recordings and traces of other tools into recording format
//! v1), `export` (a recording for AIPerf), `stats` (`recording stats`: what a recording
//! holds) and `filter` (`recording filter`: the exchanges one upstream served).
//!
//! Each returns values and typed errors; the CLI prints them and picks the exit code. What a
//! recorded exchange means (its measurement, its request body, its family) comes from
//! `common`, as it does for the replay.

pub mod export;
pub mod filter;
pub mod import;
pub mod stats;
