//! The `llm-replay-test-gateway` process (`src/bin/gateway.rs`): a forwarding gateway with
//! LiteLLM's metric families and its own concurrency limit, killed on drop.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use crate::bin;

/// A running gateway in front of `upstream`.
pub struct Gateway {
    child: Child,
    pub url: String,
}

impl Gateway {
    /// Start the gateway on 127.0.0.1:0 in front of `upstream` with `args` (`--limit N`,
    /// `--slow-request N --slow-by MS`) and wait for its readiness line.
    pub fn start(upstream: &str, args: &[&str]) -> Gateway {
        let mut child = Command::new(bin("llm-replay-test-gateway"))
            .args(["--upstream", upstream, "--listen", "127.0.0.1:0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the gateway starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the gateway prints a readiness line");
        let url = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("no URL in the gateway's readiness line {line:?}"))
            .to_owned();
        Gateway { child, url }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
