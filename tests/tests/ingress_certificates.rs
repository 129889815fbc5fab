//! Certificates like curl (issue 33, item 6): a self-signed `CA:TRUE` server certificate
//! listed in `--target-ca` is trusted as the server's own only within its validity dates. An
//! expired one is refused by the worker and by the coordinator's scraper, with the dates named
//! in the wording of any expired chain — against the real `llm-replay mock` serving https.

use std::path::{Path, PathBuf};

use fixtures::{MockServer, TempDir, llm_replay, num, parallel_lock, write_chat_recording};
use serde_json::Value;

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// `openssl req -x509 -addext subjectAltName=...` as people make it: one self-signed
/// certificate with `CA:TRUE`, for `localhost` and 127.0.0.1, valid from `not_before` to
/// `not_after` (year, month, day). Its PEM and key files in `dir`, prefixed `tag`.
fn self_signed_ca(
    dir: &TempDir,
    tag: &str,
    not_before: (i32, u8, u8),
    not_after: (i32, u8, u8),
) -> (PathBuf, PathBuf) {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params =
        rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .expect("params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "llm-replay pinned test");
    params.not_before = rcgen::date_time_ymd(not_before.0, not_before.1, not_before.2);
    params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
    let cert = params.self_signed(&key).expect("certificate");
    let (cert_path, key_path) = (
        dir.join(&format!("{tag}.pem")),
        dir.join(&format!("{tag}.key")),
    );
    std::fs::write(&cert_path, cert.pem()).expect("write certificate");
    std::fs::write(&key_path, key.serialize_pem()).expect("write key");
    (cert_path, key_path)
}

/// Replay 4 requests against an https mock serving `cert`, with `--target-ca cert`.
fn run_pinned(dir: &TempDir, tag: &str, cert: &Path, key: &Path) -> (i32, Value, String) {
    let mock = MockServer::start(&[
        "--ttft",
        "2ms",
        "--itl",
        "1ms",
        "--tokens",
        "3",
        "--tls-cert",
        path_str(cert),
        "--tls-key",
        path_str(key),
    ]);
    assert!(mock.url.starts_with("https://"), "{}", mock.url);
    let rec = dir.join(&format!("{tag}.jsonl"));
    write_chat_recording(&rec, 4, 3, None);
    let out = llm_replay(
        &[
            "run",
            path_str(&rec),
            "--target",
            &mock.url,
            "--target-ca",
            path_str(cert),
            "--schedule",
            "asap",
            "--concurrency",
            "1",
        ],
        Some(&dir.join(&format!("{tag}-report.json"))),
    );
    let report = out.report.unwrap_or_else(|| {
        panic!(
            "no report: exit {}\nstdout:\n{}\nstderr:\n{}",
            out.code, out.stdout, out.stderr
        )
    });
    (out.code, report, format!("{}\n{}", out.stdout, out.stderr))
}

/// 2021-01-01T00:00:00Z, the expired certificate's `notAfter`, as rustls names it (UNIX).
const EXPIRED_NOT_AFTER_UNIX: u64 = 1_609_459_200;

#[test]
fn an_expired_self_signed_certificate_in_target_ca_is_refused_by_worker_and_scraper() {
    let _parallel = parallel_lock();
    let dir = TempDir::new("ingress-expired");

    // The control: the same kind of certificate, within its dates, is trusted by both.
    let (cert, key) = self_signed_ca(&dir, "valid", (2020, 1, 1), (2099, 1, 1));
    let (code, report, output) = run_pinned(&dir, "valid", &cert, &key);
    assert_eq!(code, 0, "{output}");
    assert_eq!(num(&report, &["requests", "succeeded"]), 4.0, "{output}");
    let endpoint = &report["server"]["endpoints"][0];
    assert!(num(endpoint, &["scrapes"]) >= 2.0, "{endpoint}");
    assert!(endpoint.get("note").is_none(), "{endpoint}");

    // Expired: every request fails in TLS, the run cannot complete (exit 3).
    let (cert, key) = self_signed_ca(&dir, "expired", (2020, 1, 1), (2021, 1, 1));
    let (code, report, output) = run_pinned(&dir, "expired", &cert, &key);
    assert_eq!(code, 3, "{output}");
    assert_eq!(num(&report, &["requests", "succeeded"]), 0.0, "{output}");
    assert_eq!(num(&report, &["requests", "failed"]), 4.0, "{output}");
    let dates = format!("but certificate is not valid after {EXPIRED_NOT_AFTER_UNIX}");
    // The worker: its failures are counted as expired certificates, and its log names the
    // date in the words of an expired chain.
    assert_eq!(
        num(
            &report,
            &["requests", "failed_by_kind", "tls_problems", "expired"]
        ),
        4.0,
        "{}",
        report["requests"]
    );
    assert!(
        output.contains("certificate expired") && output.contains(&dates),
        "the worker's log names the dates: {output}"
    );
    // The scraper: the endpoint is dropped with the same words.
    let endpoint = &report["server"]["endpoints"][0];
    let note = endpoint["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("certificate expired") && note.contains(&dates),
        "scrape: {endpoint}"
    );
    assert_eq!(num(endpoint, &["scrapes"]), 0.0, "{endpoint}");
}
