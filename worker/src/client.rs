//! The HTTP client of the replay: TLS trust (Mozilla roots, `--target-ca`, `--insecure`),
//! HTTP/2 by ALPN or prior knowledge (`--target-h2c`), SigV4 signing, one resend on a fresh
//! connection when a reused connection closed before any response byte, and the cause of
//! every transport failure.
//!
//! Servers such as llama.cpp close a keep-alive connection after each streamed response
//! without saying `Connection: close`; the next request written on that pooled connection
//! then fails before any response byte. Such a request never reached the model, so it is
//! sent once more on a connection of its own, and counted as resent.

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::measure::{TlsProblem, TransportCause};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

use crate::config::TransportConfig;

/// Why the HTTP client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("target CA #{index}: not a PEM certificate: {source}")]
    CaPem {
        index: usize,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("target CA #{index}: holds no certificate")]
    CaEmpty { index: usize },
    #[error("target CA #{index}: {source}")]
    CaRejected {
        index: usize,
        #[source]
        source: rustls::Error,
    },
    #[error("TLS configuration: {0}")]
    Tls(#[source] rustls::Error),
    #[error("could not build the HTTP client: {0}")]
    Build(#[source] reqwest::Error),
}

/// The clients of one run: a pooled one for every request, and one that never reuses a
/// connection, for resends.
#[derive(Clone)]
pub struct TargetClient {
    pooled: reqwest::Client,
    fresh: reqwest::Client,
    signer: Option<crate::sigv4::SigV4Signer>,
}

/// Why sending failed before a response head arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendFailure {
    /// The deadline passed first.
    Timeout,
    /// The transport failed, for this cause.
    Transport(TransportCause),
}

/// What happened to one request up to its response head.
pub struct Sent {
    /// Just before the first attempt was written (for schedule lag).
    pub first_t0: Instant,
    /// Just before the (last) attempt was written: the request's t0.
    pub t0: Instant,
    /// `t0` in wall-clock time, microseconds since the Unix epoch.
    pub sent_unix_us: u64,
    /// The first attempt's t0 plus the request time limit: the end of the whole request.
    pub deadline: tokio::time::Instant,
    /// The request was sent a second time, on a fresh connection.
    pub resent: bool,
    pub result: Result<reqwest::Response, SendFailure>,
}

/// The rustls configuration for https targets: Mozilla roots plus the extra CAs (or no
/// verification at all with `insecure`), ring, ALPN `h2` then `http/1.1`.
pub fn tls_config(transport: &TransportConfig) -> Result<rustls::ClientConfig, ClientError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(ClientError::Tls)?;
    let mut config = if transport.insecure {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification(provider)))
            .with_no_client_auth()
    } else {
        let mut roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        for (index, pem) in transport.extra_ca_pem.iter().enumerate() {
            let mut any = false;
            for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                let cert = cert.map_err(|source| ClientError::CaPem { index, source })?;
                roots
                    .add(cert)
                    .map_err(|source| ClientError::CaRejected { index, source })?;
                any = true;
            }
            if !any {
                return Err(ClientError::CaEmpty { index });
            }
        }
        builder.with_root_certificates(roots).with_no_client_auth()
    };
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

impl TargetClient {
    /// Build the clients for `transport`.
    pub fn new(transport: &TransportConfig) -> Result<TargetClient, ClientError> {
        let tls = tls_config(transport)?;
        let build = |idle_per_host: usize| {
            let mut builder = reqwest::Client::builder()
                .tcp_nodelay(true)
                .pool_max_idle_per_host(idle_per_host)
                .pool_idle_timeout(Duration::from_secs(90))
                .tls_backend_preconfigured(tls.clone());
            if transport.h2c {
                // Cleartext HTTP/2 with prior knowledge; https negotiates by ALPN either way.
                builder = builder.http2_prior_knowledge();
            }
            builder.build().map_err(ClientError::Build)
        };
        Ok(TargetClient {
            pooled: build(4096)?,
            fresh: build(0)?,
            signer: transport.sigv4.clone(),
        })
    }

    /// Start a request (headers and body are added by the caller).
    pub fn request(&self, method: reqwest::Method, url: &str) -> reqwest::RequestBuilder {
        self.pooled.request(method, url)
    }

    /// Send `request` (signing it when asked), resending it once on a fresh connection when
    /// the first attempt failed on its connection before any response byte. The whole
    /// request, resend included, ends at the first attempt's t0 + `timeout`.
    pub async fn send(&self, request: reqwest::RequestBuilder, timeout: Duration) -> Sent {
        let first_t0 = Instant::now();
        let deadline = tokio::time::Instant::from_std(first_t0 + timeout);
        let mut sent = Sent {
            first_t0,
            t0: first_t0,
            sent_unix_us: unix_micros(SystemTime::now()),
            deadline,
            resent: false,
            result: Err(SendFailure::Transport(TransportCause::Other)),
        };
        let request = match request.build() {
            Ok(request) => request,
            Err(error) => {
                tracing::debug!(error = %chain(&error), "the request could not be built");
                return sent;
            }
        };
        let spare = request.try_clone();
        // Logged redacted: a target URL may carry credentials in its query.
        let url = common::recording::redact_url(request.url().as_str());
        let error = match self.attempt(&self.pooled, request, &mut sent).await {
            Ok(response) => {
                sent.result = Ok(response);
                return sent;
            }
            Err(AttemptError::Timeout) => {
                sent.result = Err(SendFailure::Timeout);
                return sent;
            }
            Err(AttemptError::Unsigned) => return sent,
            Err(AttemptError::Http(error)) => error,
        };
        let cause = classify(&error);
        match spare {
            Some(spare) if resendable(&error, cause) => {
                tracing::debug!(
                    cause = cause.name(),
                    error = %chain(&error),
                    url,
                    "connection closed before a response; resending once on a fresh connection"
                );
                sent.resent = true;
                sent.result = match self.attempt(&self.fresh, spare, &mut sent).await {
                    Ok(response) => Ok(response),
                    Err(AttemptError::Timeout) => Err(SendFailure::Timeout),
                    Err(AttemptError::Unsigned) => {
                        Err(SendFailure::Transport(TransportCause::Other))
                    }
                    Err(AttemptError::Http(error)) => Err(failure(&error, &url)),
                };
            }
            _ => sent.result = Err(failure(&error, &url)),
        }
        sent
    }

    /// One attempt: sign, stamp t0, send until the deadline.
    async fn attempt(
        &self,
        client: &reqwest::Client,
        mut request: reqwest::Request,
        sent: &mut Sent,
    ) -> Result<reqwest::Response, AttemptError> {
        if let Some(signer) = &self.signer
            && let Err(error) = signer.sign(&mut request, SystemTime::now())
        {
            // Signing only fails on a malformed URL or header; count it as a transport
            // failure of this request rather than stopping the run.
            tracing::warn!(%error, "SigV4 signing failed");
            return Err(AttemptError::Unsigned);
        }
        sent.sent_unix_us = unix_micros(SystemTime::now());
        sent.t0 = Instant::now();
        tokio::select! {
            response = client.execute(request) => response.map_err(AttemptError::Http),
            _ = tokio::time::sleep_until(sent.deadline) => Err(AttemptError::Timeout),
        }
    }
}

/// How one attempt failed.
enum AttemptError {
    Timeout,
    /// Signing failed (a malformed URL or header): a transport failure of this request.
    Unsigned,
    Http(reqwest::Error),
}

fn failure(error: &reqwest::Error, url: &str) -> SendFailure {
    if error.is_timeout() {
        return SendFailure::Timeout;
    }
    let cause = classify(error);
    tracing::debug!(cause = cause.name(), error = %chain(error), url, "request failed before a response");
    SendFailure::Transport(cause)
}

/// A request that failed this way never got a byte of response on a connection that was
/// open: it is safe to send again, once.
fn resendable(error: &reqwest::Error, cause: TransportCause) -> bool {
    !error.is_connect()
        && matches!(
            cause,
            TransportCause::ClosedBeforeResponse | TransportCause::Reset
        )
}

/// The cause of a transport failure, from the error's source chain (rustls, I/O and hyper
/// errors are recognised; DNS failures by their message, as the resolver's type is private).
pub fn classify(error: &(dyn StdError + 'static)) -> TransportCause {
    let mut current: Option<&(dyn StdError + 'static)> = Some(error);
    let mut fallback = TransportCause::Other;
    while let Some(e) = current {
        // An I/O error's `source()` skips its own payload, where rustls (and connectors
        // wrapping rustls's I/O error in another) put theirs: walk into the payload instead.
        let mut next = e.source();
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return TransportCause::Tls(tls_problem(tls));
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            match io.kind() {
                std::io::ErrorKind::ConnectionRefused => return TransportCause::Refused,
                std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::BrokenPipe => return TransportCause::Reset,
                std::io::ErrorKind::UnexpectedEof => {
                    fallback = TransportCause::ClosedBeforeResponse
                }
                _ => {}
            }
            if let Some(payload) = io.get_ref() {
                next = Some(payload as &(dyn StdError + 'static));
            }
        }
        if let Some(hyper) = e.downcast_ref::<hyper::Error>()
            && (hyper.is_incomplete_message() || hyper.is_canceled() || hyper.is_closed())
        {
            fallback = TransportCause::ClosedBeforeResponse;
        }
        let text = e.to_string();
        if text.starts_with("dns error") || text.contains("failed to lookup address") {
            return TransportCause::Dns;
        }
        current = next;
    }
    fallback
}

fn tls_problem(error: &rustls::Error) -> TlsProblem {
    use rustls::CertificateError as C;
    match error {
        rustls::Error::InvalidCertificate(certificate) => match certificate {
            C::UnknownIssuer => TlsProblem::UnknownIssuer,
            C::NotValidForName | C::NotValidForNameContext { .. } => TlsProblem::NameMismatch,
            C::Expired | C::ExpiredContext { .. } => TlsProblem::Expired,
            C::NotValidYet | C::NotValidYetContext { .. } => TlsProblem::NotYetValid,
            C::Revoked => TlsProblem::Revoked,
            C::BadSignature => TlsProblem::BadSignature,
            _ => TlsProblem::Other,
        },
        rustls::Error::AlertReceived(_)
        | rustls::Error::InvalidMessage(_)
        | rustls::Error::PeerIncompatible(_)
        | rustls::Error::PeerMisbehaved(_)
        | rustls::Error::NoApplicationProtocol => TlsProblem::Handshake,
        _ => TlsProblem::Other,
    }
}

/// `outer: inner: innermost`, for logs, without the URL reqwest puts in its own message
/// (the caller logs it redacted).
fn chain(error: &reqwest::Error) -> String {
    let mut text = String::from(if error.is_connect() {
        "connect"
    } else if error.is_builder() {
        "building the request"
    } else {
        "request"
    });
    let mut current = error.source();
    while let Some(e) = current {
        let more = e.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        current = e.source();
    }
    text
}

fn unix_micros(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// `--insecure`: accept any certificate, but still check the handshake signatures so the
/// connection is at least consistent with the certificate presented.
#[derive(Debug)]
struct NoVerification(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_closed_port_is_refused() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        drop(listener);
        let client = TargetClient::new(&TransportConfig::default()).expect("client");
        let sent = client
            .send(
                client.request(reqwest::Method::GET, &format!("http://{addr}/")),
                Duration::from_secs(5),
            )
            .await;
        assert_eq!(
            sent.result.err(),
            Some(SendFailure::Transport(TransportCause::Refused))
        );
        assert!(!sent.resent);
    }

    #[test]
    fn a_ca_without_certificates_is_refused() {
        let transport = TransportConfig {
            extra_ca_pem: vec!["not a certificate".into()],
            ..TransportConfig::default()
        };
        assert!(matches!(
            tls_config(&transport),
            Err(ClientError::CaEmpty { index: 0 })
        ));
    }

    #[test]
    fn rustls_errors_inside_io_errors_are_found() {
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        assert_eq!(
            classify(&io),
            TransportCause::Tls(TlsProblem::UnknownIssuer)
        );
        // As hyper-rustls wraps it: an I/O error holding rustls's I/O error.
        let wrapped = std::io::Error::other(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName),
        ));
        assert_eq!(
            classify(&wrapped),
            TransportCause::Tls(TlsProblem::NameMismatch)
        );
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert_eq!(classify(&reset), TransportCause::Reset);
    }
}
