//! Coordinator library.

pub mod duration;
pub mod mock;
