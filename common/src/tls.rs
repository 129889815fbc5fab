//! The one TLS module: every client llm-replay opens to a server it does not run — the
//! replay's client (`worker::client`), the server-metrics scraper
//! (`coordinator::server_metrics::scrape`) and the recording proxy's upstream client
//! (`capture::upstream`) — builds its `rustls::ClientConfig` here, so that what is trusted,
//! what is refused and how a refusal is named are one rule.
//!
//! It owns: the roots (Mozilla's, from webpki-roots, plus the PEM files of `--target-ca` /
//! `--upstream-ca`; a file holding no certificate is an error naming it), the verifier that
//! trusts a webpki chain *or* a pinned self-signed certificate listed in those files (name
//! and validity dates still checked), the `--insecure` verifier, the ALPN choice, and the
//! reading of a rustls error as the report's [`TlsProblem`] (with the names a certificate
//! holds, for the name-mismatch hint). rustls 0.23 with the ring provider.
//!
//! Behind the feature `tls` (which `transport-errors` implies): the rest of `common` knows
//! nothing of TLS.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

use crate::measure::TlsProblem;

/// Why a TLS client configuration could not be built. `source` names the CA file (or the
/// flag and the file's position when only its contents travelled, as to a worker).
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{source_name}: not a PEM certificate: {error}")]
    CaPem {
        source_name: String,
        #[source]
        error: rustls::pki_types::pem::Error,
    },
    #[error("{source_name}: holds no PEM certificate (expected -----BEGIN CERTIFICATE-----)")]
    CaEmpty { source_name: String },
    #[error("{source_name}: {error}")]
    CaRejected {
        source_name: String,
        #[source]
        error: rustls::Error,
    },
    #[error("{source_name}: cannot read: {error}")]
    CaRead {
        source_name: String,
        #[source]
        error: std::io::Error,
    },
    #[error("TLS configuration: {0}")]
    Config(#[source] rustls::Error),
}

/// One CA file's PEM text and what to call it in an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaPem {
    /// `--target-ca /path/ca.pem`, or `target CA #0` where only the contents travelled.
    pub source_name: String,
    pub pem: String,
}

impl CaPem {
    /// Read the PEM file at `path`, named `flag path` in errors. Its certificates are checked
    /// when the configuration is built ([`client_config`]).
    pub fn read(flag: &str, path: &std::path::Path) -> Result<CaPem, TlsError> {
        let source_name = format!("{flag} {}", path.display());
        match std::fs::read_to_string(path) {
            Ok(pem) => Ok(CaPem { source_name, pem }),
            Err(error) => Err(TlsError::CaRead { source_name, error }),
        }
    }

    /// The contents of CA files that travelled without their names (a worker's assignment):
    /// named `what #index`.
    pub fn numbered(what: &str, pems: &[String]) -> Vec<CaPem> {
        pems.iter()
            .enumerate()
            .map(|(index, pem)| CaPem {
                source_name: format!("{what} #{index}"),
                pem: pem.clone(),
            })
            .collect()
    }
}

/// Whom a client trusts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trust {
    /// Extra CAs (each also trusted as a pinned self-signed server certificate).
    pub ca: Vec<CaPem>,
    /// `--insecure`: no certificate verification (the handshake's signatures still are).
    pub insecure: bool,
}

/// The application protocols offered in the ClientHello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alpn {
    /// `h2`, then `http/1.1`: the server chooses (the replay, the scraper).
    H2ThenHttp1,
    /// None set here: the caller's connector sets its own (hyper-rustls's
    /// `enable_all_versions` does).
    ByConnector,
}

/// The certificates of `ca`, checked: each file must hold at least one, each must parse.
fn certificates(ca: &[CaPem]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let mut all = Vec::new();
    for file in ca {
        let before = all.len();
        for cert in CertificateDer::pem_slice_iter(file.pem.as_bytes()) {
            all.push(cert.map_err(|error| TlsError::CaPem {
                source_name: file.source_name.clone(),
                error,
            })?);
        }
        if all.len() == before {
            return Err(TlsError::CaEmpty {
                source_name: file.source_name.clone(),
            });
        }
    }
    Ok(all)
}

/// The rustls configuration of a client: ring; Mozilla's roots plus `trust.ca` (each also
/// pinned), or no verification with `trust.insecure`; the ALPN of `alpn`.
pub fn client_config(trust: &Trust, alpn: Alpn) -> Result<rustls::ClientConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?;
    let mut config = if trust.insecure {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification(provider)))
            .with_no_client_auth()
    } else {
        let mut roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        let pinned = certificates(&trust.ca)?;
        // Added one file at a time, so that a refusal names its file.
        for file in &trust.ca {
            for cert in CertificateDer::pem_slice_iter(file.pem.as_bytes()).flatten() {
                roots.add(cert).map_err(|error| TlsError::CaRejected {
                    source_name: file.source_name.clone(),
                    error,
                })?;
            }
        }
        let webpki =
            rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|error| TlsError::Config(rustls::Error::General(error.to_string())))?;
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(WebPkiOrPinned { webpki, pinned }))
            .with_no_client_auth()
    };
    if alpn == Alpn::H2ThenHttp1 {
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    }
    Ok(config)
}

/// What webpki trusts (Mozilla's roots and the extra CAs as roots), plus a server whose
/// certificate *is* one of the extra CA certificates. The certificate most people make for a
/// private server (`openssl req -x509 ... -addext subjectAltName=...`) is self-signed with
/// `CA:TRUE`: webpki refuses a CA certificate as the server's own, while curl `--cacert` and
/// Python's `ssl` accept it as given. Such a pinned certificate must still name the target's
/// host and be within its validity dates (webpki's refusal for the dates is kept, with them
/// named, as curl does), and the handshake's signatures are still checked against it.
#[derive(Debug)]
struct WebPkiOrPinned {
    webpki: Arc<rustls::client::WebPkiServerVerifier>,
    pinned: Vec<CertificateDer<'static>>,
}

impl rustls::client::danger::ServerCertVerifier for WebPkiOrPinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        match self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Ok(verified) => Ok(verified),
            // webpki checks the end certificate's validity dates before refusing a CA
            // certificate as a server's own: an expired (or not yet valid) pinned certificate
            // keeps that refusal, worded as for any chain, with its dates.
            Err(error) if refused_for_dates(&error) => Err(error),
            Err(error)
                if self
                    .pinned
                    .iter()
                    .any(|pinned| pinned.as_ref() == end_entity.as_ref()) =>
            {
                let parsed =
                    rustls::server::ParsedCertificate::try_from(end_entity).map_err(|_| error)?;
                rustls::client::verify_server_name(&parsed, server_name)?;
                Ok(rustls::client::danger::ServerCertVerified::assertion())
            }
            Err(error) => Err(error),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// True when the certificate was refused for its validity dates (expired, not yet valid).
fn refused_for_dates(error: &rustls::Error) -> bool {
    use rustls::CertificateError as C;
    matches!(
        error,
        rustls::Error::InvalidCertificate(
            C::Expired | C::ExpiredContext { .. } | C::NotValidYet | C::NotValidYetContext { .. }
        )
    )
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

/// What a rustls error says about the handshake.
pub fn problem(error: &rustls::Error) -> TlsProblem {
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

/// At most this many of a certificate's names are carried to the report.
const MAX_NAMES: usize = 3;
/// A name longer than this is cut (with `…`).
const MAX_NAME_CHARS: usize = 64;

/// The names a certificate refused for its name holds (DNS names and IP addresses of its
/// subjectAltName, in its order), found anywhere in `error`'s source chain: at most
/// [`MAX_NAMES`], each at most [`MAX_NAME_CHARS`] characters, joined by `, ` (`+N more` when
/// there were more). `None` when the chain holds no such refusal, or the certificate no
/// such name.
pub fn presented_names(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = current {
        let mut next = e.source();
        if let Some(rustls::Error::InvalidCertificate(
            rustls::CertificateError::NotValidForNameContext { presented, .. },
        )) = e.downcast_ref::<rustls::Error>()
        {
            return names_text(presented);
        }
        // An I/O error's `source()` skips its payload, where rustls puts its error.
        if let Some(payload) = e
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            next = Some(payload as &(dyn std::error::Error + 'static));
        }
        current = next;
    }
    None
}

/// `DnsName("localhost")` → `localhost`, `IpAddress(127.0.0.1)` → `127.0.0.1` (webpki's
/// spelling); other kinds of name are left out.
fn names_text(presented: &[String]) -> Option<String> {
    let names: Vec<String> = presented
        .iter()
        .filter_map(|name| {
            let inner = name
                .strip_prefix("DnsName(\"")
                .and_then(|rest| rest.strip_suffix("\")"))
                .or_else(|| {
                    name.strip_prefix("IpAddress(")
                        .and_then(|rest| rest.strip_suffix(')'))
                })?;
            let clean: String = inner
                .chars()
                .filter(|c| !c.is_control() && *c != ',' && *c != '(' && *c != ')')
                .collect();
            Some(match clean.char_indices().nth(MAX_NAME_CHARS) {
                Some((cut, _)) => format!("{}…", &clean[..cut]),
                None => clean,
            })
        })
        .filter(|name| !name.is_empty())
        .collect();
    if names.is_empty() {
        return None;
    }
    let mut text = names
        .iter()
        .take(MAX_NAMES)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > MAX_NAMES {
        text.push_str(&format!(" +{} more", names.len() - MAX_NAMES));
    }
    Some(text)
}

/// The report's key of a TLS problem (its count travels keyed by it, worker → report): the
/// problem's description, and for a name mismatch whose certificate's names are known,
/// `name mismatch (certificate for localhost, 127.0.0.1)`.
pub fn problem_key(problem: TlsProblem, names: Option<&str>) -> String {
    match (problem, names) {
        (TlsProblem::NameMismatch, Some(names)) => {
            format!("{} (certificate for {names})", problem.description())
        }
        _ => problem.description().to_owned(),
    }
}

/// The names of a [`problem_key`] of a name mismatch: `localhost, 127.0.0.1`.
pub fn names_of_key(key: &str) -> Option<&str> {
    key.strip_prefix(TlsProblem::NameMismatch.description())?
        .strip_prefix(" (certificate for ")?
        .strip_suffix(')')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca(pem: &str) -> Trust {
        Trust {
            ca: vec![CaPem {
                source_name: "--target-ca /tmp/ca.pem".into(),
                pem: pem.into(),
            }],
            insecure: false,
        }
    }

    #[test]
    fn a_ca_file_without_certificates_is_refused_by_name() {
        let error = client_config(&ca("not a certificate"), Alpn::H2ThenHttp1)
            .expect_err("a CA file with no certificate is an error");
        assert!(matches!(error, TlsError::CaEmpty { .. }), "{error:?}");
        assert!(error.to_string().contains("/tmp/ca.pem"), "{error}");
    }

    #[test]
    fn insecure_needs_no_ca_and_alpn_is_chosen() {
        let insecure = Trust {
            ca: Vec::new(),
            insecure: true,
        };
        let config = client_config(&insecure, Alpn::H2ThenHttp1).expect("config");
        assert_eq!(
            config.alpn_protocols,
            [b"h2".to_vec(), b"http/1.1".to_vec()]
        );
        let config = client_config(&Trust::default(), Alpn::ByConnector).expect("config");
        assert!(config.alpn_protocols.is_empty());
    }

    #[test]
    fn a_missing_ca_file_is_named() {
        let error = CaPem::read("--upstream-ca", std::path::Path::new("/nonexistent/ca.pem"))
            .expect_err("no such file");
        assert!(
            error
                .to_string()
                .starts_with("--upstream-ca /nonexistent/ca.pem: cannot read"),
            "{error}"
        );
    }

    #[test]
    fn a_name_mismatch_carries_the_names_the_certificate_holds() {
        let error =
            rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForNameContext {
                expected: ServerName::try_from("127.0.0.1").expect("name"),
                presented: vec![
                    "DnsName(\"localhost\")".into(),
                    "IpAddress(::1)".into(),
                    "UniformResourceIdentifier(\"x\")".into(),
                ],
            });
        assert_eq!(problem(&error), TlsProblem::NameMismatch);
        // Inside an I/O error inside another, as the connectors wrap it.
        let wrapped =
            std::io::Error::other(std::io::Error::new(std::io::ErrorKind::InvalidData, error));
        let names = presented_names(&wrapped);
        assert_eq!(names.as_deref(), Some("localhost, ::1"));
        let key = problem_key(TlsProblem::NameMismatch, names.as_deref());
        assert_eq!(key, "name mismatch (certificate for localhost, ::1)");
        assert_eq!(names_of_key(&key), Some("localhost, ::1"));
        assert_eq!(names_of_key("name mismatch"), None);
        assert_eq!(problem_key(TlsProblem::Expired, Some("x")), "expired");
    }

    #[test]
    fn presented_names_are_bounded() {
        let many: Vec<String> = (0..5)
            .map(|i| format!("DnsName(\"{}{i}\")", "a".repeat(100)))
            .collect();
        let text = names_text(&many).expect("names");
        assert!(text.ends_with(" +2 more"), "{text}");
        assert_eq!(text.matches('…').count(), 3, "{text}");
        assert!(text.chars().count() < 3 * 70 + 10, "{text}");
        assert_eq!(names_text(&["DirectoryName".into()]), None);
    }
}
