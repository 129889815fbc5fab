//! The exit codes of the contract, shared by both binaries (`llm-replay` and
//! `llm-replay-worker`): only their CLI layers pick one.

/// Ran and every goal held.
pub const OK: u8 = 0;
/// A goal failed.
pub const GOAL_FAILED: u8 = 1;
/// Bad usage or bad input.
pub const USAGE: u8 = 2;
/// The run could not complete.
pub const RUN_FAILED: u8 = 3;
