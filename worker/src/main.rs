//! llm-replay-worker binary.
fn main() {}
