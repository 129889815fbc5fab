//! A name mismatch names the names the certificate holds (issue 33, item 7): with
//! `--target-ca` given and the server's certificate valid for another name, trusting a CA is
//! not the fix. Against the real `llm-replay mock` serving https with a certificate for
//! `localhost` only, targeted as `https://127.0.0.1:PORT`, the report (JSON and terminal) and
//! the verdict name `localhost` and do not suggest `--target-ca`.

use std::path::{Path, PathBuf};

use fixtures::{MockServer, TempDir, llm_replay, num, parallel_lock, write_chat_recording};

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// A self-signed `CA:TRUE` certificate (as `openssl req -x509` makes it) for `localhost`
/// alone, valid 2020–2099: its PEM and key files in `dir`.
fn localhost_certificate(dir: &TempDir) -> (PathBuf, PathBuf) {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(2099, 1, 1);
    let cert = params.self_signed(&key).expect("certificate");
    let (cert_path, key_path) = (dir.join("localhost.pem"), dir.join("localhost.key"));
    std::fs::write(&cert_path, cert.pem()).expect("write certificate");
    std::fs::write(&key_path, key.serialize_pem()).expect("write key");
    (cert_path, key_path)
}

#[test]
fn a_name_mismatch_names_the_certificates_names_and_does_not_suggest_target_ca() {
    let _parallel = parallel_lock();
    let dir = TempDir::new("ingress-name-mismatch");
    let (cert, key) = localhost_certificate(&dir);
    let mock = MockServer::start(&[
        "--ttft",
        "2ms",
        "--tokens",
        "3",
        "--tls-cert",
        path_str(&cert),
        "--tls-key",
        path_str(&key),
    ]);
    let port = mock
        .url
        .rsplit(':')
        .next()
        .and_then(|rest| rest.split('/').next())
        .expect("a port in the mock's URL");
    let target = format!("https://127.0.0.1:{port}");
    let rec = dir.join("rec.jsonl");
    write_chat_recording(&rec, 3, 3, None);
    let out = llm_replay(
        &[
            "run",
            path_str(&rec),
            "--target",
            &target,
            "--target-ca",
            path_str(&cert),
            "--schedule",
            "asap",
            "--concurrency",
            "1",
        ],
        Some(&dir.join("report.json")),
    );
    let output = format!("{}\n{}", out.stdout, out.stderr);
    assert_eq!(out.code, 3, "every request fails in TLS: {output}");
    let report = out.report.expect("a report");
    let problems = &report["requests"]["failed_by_kind"]["tls_problems"];
    assert_eq!(
        num(problems, &["name mismatch (certificate for localhost)"]),
        3.0,
        "{problems}"
    );
    // The verdict: the certificate's name, and what to do with it; not `--target-ca`.
    let verdict = output
        .lines()
        .find(|line| line.contains(&format!("TLS with the target {target} failed")))
        .unwrap_or_else(|| panic!("no TLS verdict: {output}"));
    assert!(
        verdict.contains("the certificate is for localhost")
            && verdict.contains("target URL's host"),
        "{verdict}"
    );
    assert!(!verdict.contains("--target-ca"), "{verdict}");
    // The terminal report's failure line names it too, besides the verdict.
    assert!(
        output
            .matches("name mismatch (certificate for localhost)")
            .count()
            >= 2,
        "{output}"
    );
}
