//! Coordinator library.

pub mod goals;
pub mod report;
