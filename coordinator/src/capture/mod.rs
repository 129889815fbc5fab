//! Capture: the recording reverse proxy (`llm-replay record`), body redaction, and response
//! completeness shared with the importers.

pub mod complete;
pub mod redact;
