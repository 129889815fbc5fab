//! `llm-replay healthcheck URL`: one HTTP GET of a cleartext health endpoint, exit 0 on a
//! 2xx answer and 1 otherwise. The image is built on `scratch` (no shell, no curl), so a
//! Compose `healthcheck:` or a Docker `HEALTHCHECK` runs the binary itself against the
//! recorder's `/readyz` or a worker's health port (Kubernetes probes need no command).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

/// `llm-replay healthcheck` arguments.
#[derive(Debug, clap::Args)]
pub struct HealthcheckArgs {
    /// The endpoint to ask, e.g. http://127.0.0.1:9091/readyz (cleartext HTTP only).
    pub url: String,
    /// How long to wait for the answer.
    #[arg(long, default_value = "2s")]
    pub timeout: String,
}

pub fn healthcheck_command(args: HealthcheckArgs) -> ExitCode {
    let timeout = match common::duration::parse_duration(&args.timeout) {
        Ok(timeout) if !timeout.is_zero() => timeout,
        Ok(_) => return crate::fail(common::exit::USAGE, "--timeout must be more than 0"),
        Err(e) => return crate::fail(common::exit::USAGE, format!("--timeout: {e}")),
    };
    let Some((authority, path)) = split_url(&args.url) else {
        return crate::fail(
            common::exit::USAGE,
            format!("{}: expected http://HOST:PORT/PATH", args.url),
        );
    };
    match status_of(authority, path, timeout) {
        Ok(status) if (200..300).contains(&status) => ExitCode::SUCCESS,
        Ok(status) => crate::fail(1, format!("{}: HTTP {status}", args.url)),
        Err(e) => crate::fail(1, format!("{}: {e}", args.url)),
    }
}

/// `("host:port", "/path")` of a cleartext URL.
fn split_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("http://")?;
    let (authority, path) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, "/"),
    };
    (!authority.is_empty() && authority.contains(':')).then_some((authority, path))
}

/// The status code of `GET path` on `authority`.
fn status_of(authority: &str, path: &str, timeout: Duration) -> std::io::Result<u16> {
    let address = authority
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::other("the name resolves to no address"))?;
    let mut stream = TcpStream::connect_timeout(&address, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    // One write of the whole request (a peer that answers and closes before reading a
    // second piece would reset it).
    let request = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes())?;
    // The status line is all that is read: at most 64 bytes of it.
    let mut head = [0u8; 64];
    let mut filled = 0;
    while filled < head.len() {
        let n = stream.read(&mut head[filled..])?;
        if n == 0 {
            break;
        }
        filled += n;
        if head[..filled].contains(&b'\n') {
            break;
        }
    }
    parse_status(&head[..filled])
        .ok_or_else(|| std::io::Error::other("the answer is not an HTTP response"))
}

fn parse_status(head: &[u8]) -> Option<u16> {
    let line = std::str::from_utf8(head).ok()?.lines().next()?;
    let mut parts = line.split(' ');
    parts.next().filter(|v| v.starts_with("HTTP/1."))?;
    parts.next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_status_lines_parse() {
        assert_eq!(
            split_url("http://127.0.0.1:9091/readyz"),
            Some(("127.0.0.1:9091", "/readyz"))
        );
        assert_eq!(split_url("http://h:1"), Some(("h:1", "/")));
        assert_eq!(split_url("https://h:1/x"), None);
        assert_eq!(split_url("http://host/x"), None);
        assert_eq!(
            parse_status(b"HTTP/1.1 503 Service Unavailable\r\n"),
            Some(503)
        );
        assert_eq!(parse_status(b"HTTP/1.0 200 OK\r\n"), Some(200));
        assert_eq!(parse_status(b"SSH-2.0-x\r\n"), None);
    }

    /// A real listener answering 200 then 503: exit codes 0 and 1.
    #[test]
    fn answers_decide_the_exit_code() {
        use std::net::TcpListener;
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let authority = listener.local_addr().expect("addr").to_string();
        let server = std::thread::spawn(move || {
            for answer in ["200 OK", "503 Service Unavailable"] {
                let (mut conn, _) = listener.accept().expect("accept");
                // The whole head is read before answering and closing: closing with unread
                // bytes would reset the connection.
                let mut request = Vec::new();
                let mut byte = [0u8; 1];
                while !request.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap_or(0) == 1 {
                    request.push(byte[0]);
                }
                let _ = write!(conn, "HTTP/1.1 {answer}\r\nContent-Length: 0\r\n\r\n");
            }
        });
        let timeout = Duration::from_secs(5);
        assert_eq!(status_of(&authority, "/readyz", timeout).expect("200"), 200);
        assert_eq!(status_of(&authority, "/readyz", timeout).expect("503"), 503);
        server.join().expect("server thread");
        // Nothing listens any more: an error, never a 2xx.
        assert!(status_of(&authority, "/readyz", timeout).is_err());
    }
}
