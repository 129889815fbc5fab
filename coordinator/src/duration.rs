//! Duration and rate parsing for CLI flags: the one parser lives in `common::duration`.

pub use common::duration::{parse_duration, parse_rate};
