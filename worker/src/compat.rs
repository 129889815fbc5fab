//! Temporary shims until `common::formats` exposes them.

use common::formats::{Family, Usage};

pub struct Unstreamed {
    pub content: bool,
    pub usage: Option<Usage>,
    pub error: bool,
}

pub fn is_streaming_content_type(ct: &str) -> bool {
    let ct = ct.to_ascii_lowercase();
    ct.starts_with("text/event-stream")
        || ct.starts_with("application/x-ndjson")
        || ct.starts_with("application/vnd.amazon.eventstream")
}

pub fn unstreamed(_family: Family, _body: &[u8]) -> Unstreamed {
    Unstreamed {
        content: true,
        usage: None,
        error: false,
    }
}
