//! llm-replay binary.
fn main() {}
