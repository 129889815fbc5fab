//! Coordinator library.
