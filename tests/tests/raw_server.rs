//! A raw HTTP/1.1 server on a real socket, for the gateway behaviours `llm-replay mock` does not
//! have (a stream mislabelled or held open) and to see exactly what a replayed request carried.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How the raw server answers.
#[derive(Clone, Copy)]
pub struct Gateway {
    /// `Content-Type` of the stream, if any.
    pub content_type: Option<&'static str>,
    /// Keep the connection open (no end of body) for this long after `[DONE]`.
    pub hold_after_done: Duration,
    /// Instead of a stream, answer this status with a JSON body this many bytes long
    /// (generated as it is written, never held).
    pub big_body: Option<(u16, usize)>,
}

/// A running raw server.
pub struct RawServer {
    pub url: String,
    /// Request line and headers of every request received, as sent.
    pub heads: Arc<Mutex<Vec<String>>>,
}

/// Start a raw HTTP/1.1 server on 127.0.0.1:0 that answers every request with a chunked
/// OpenAI chat SSE stream of 5 tokens, 10 ms apart, labelled as `gateway` says.
pub fn start_gateway(gateway: Gateway) -> RawServer {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { break };
            let seen = seen.clone();
            std::thread::spawn(move || serve_connection(stream, gateway, &seen));
        }
    });
    RawServer { url, heads }
}

fn serve_connection(stream: TcpStream, gateway: Gateway, seen: &Mutex<Vec<String>>) {
    let _ = stream.set_nodelay(true);
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut writer = stream;
    loop {
        // Request line and headers.
        let mut content_length = 0usize;
        let mut head = String::new();
        let mut line = String::new();
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if line == "\r\n" {
                break;
            }
            head.push_str(&line);
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                content_length = value.trim().parse().unwrap_or(0);
            }
        }
        seen.lock().expect("heads lock").push(head);
        let mut body = vec![0; content_length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        if let Some((status, size)) = gateway.big_body {
            if write_big_body(&mut writer, status, size).is_err() {
                return;
            }
            continue;
        }
        let mut head = String::from("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n");
        if let Some(content_type) = gateway.content_type {
            head.push_str(&format!("Content-Type: {content_type}\r\n"));
        }
        head.push_str("\r\n");
        if writer.write_all(head.as_bytes()).is_err() {
            return;
        }
        let chunk = |w: &mut TcpStream, data: &str| -> std::io::Result<()> {
            w.write_all(format!("{:x}\r\n{data}\r\n", data.len()).as_bytes())?;
            w.flush()
        };
        for _ in 0..5 {
            std::thread::sleep(Duration::from_millis(10));
            if chunk(
                &mut writer,
                "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi \"}}]}\n\n",
            )
            .is_err()
            {
                return;
            }
        }
        if chunk(&mut writer, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":5}}\n\ndata: [DONE]\n\n").is_err() {
            return;
        }
        std::thread::sleep(gateway.hold_after_done);
        if writer.write_all(b"0\r\n\r\n").is_err() {
            return;
        }
    }
}

/// `{"choices":[{"message":{"content":"xxxx…"}}]}` of `size` bytes, written 1 MiB at a time.
fn write_big_body(w: &mut TcpStream, status: u16, size: usize) -> std::io::Result<()> {
    let open = br#"{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":""#;
    let close = br#""}}]}"#;
    let filler = size.saturating_sub(open.len() + close.len());
    w.write_all(
        format!(
            "HTTP/1.1 {status} Status\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            open.len() + filler + close.len()
        )
        .as_bytes(),
    )?;
    w.write_all(open)?;
    let block = vec![b'x'; 1 << 20];
    let mut left = filler;
    while left > 0 {
        let n = left.min(block.len());
        w.write_all(&block[..n])?;
        left -= n;
    }
    w.write_all(close)?;
    w.flush()
}
