//! AWS Signature Version 4 for replayed Bedrock requests (`--aws-sigv4 REGION`).
//!
//! The recording never holds credentials (its `authorization` and `x-amz-*` headers are
//! dropped), so each request is signed again here, with the worker's own credentials, over
//! exactly what is sent: method, path and query, host, content type and body bytes.

use std::time::SystemTime;

use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;

/// The AWS service name Bedrock requests are signed for.
pub const SERVICE: &str = "bedrock";

/// Signs requests for one region with credentials read from the worker's environment.
#[derive(Clone)]
pub struct SigV4Signer {
    region: String,
    access_key_id: String,
    secret_access_key: String,
    session_token: Option<String>,
}

impl std::fmt::Debug for SigV4Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print a secret, not even in a debug log.
        f.debug_struct("SigV4Signer")
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// Why a request could not be signed.
#[derive(Debug, thiserror::Error)]
pub enum SigV4Error {
    #[error(
        "--aws-sigv4 {region}: the worker's environment lacks {missing} (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, and AWS_SESSION_TOKEN for temporary credentials, where the worker runs)"
    )]
    MissingCredentials { region: String, missing: String },
    #[error("--aws-sigv4: empty region")]
    EmptyRegion,
    #[error("signing parameters: {0}")]
    Params(#[source] aws_sigv4::sign::v4::signing_params::BuildError),
    #[error("signing the request failed: {0}")]
    Sign(#[source] aws_sigv4::http_request::SigningError),
    #[error("the signature produced an invalid header {0}")]
    Header(String),
}

impl SigV4Signer {
    /// A signer for `region` with credentials from `lookup` (the worker's environment):
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and, optionally, `AWS_SESSION_TOKEN`.
    pub fn from_env(
        region: &str,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<SigV4Signer, SigV4Error> {
        if region.trim().is_empty() {
            return Err(SigV4Error::EmptyRegion);
        }
        let get = |name: &str| lookup(name).filter(|v| !v.is_empty());
        let access_key_id = get("AWS_ACCESS_KEY_ID");
        let secret_access_key = get("AWS_SECRET_ACCESS_KEY");
        let missing: Vec<&str> = [
            ("AWS_ACCESS_KEY_ID", access_key_id.is_none()),
            ("AWS_SECRET_ACCESS_KEY", secret_access_key.is_none()),
        ]
        .into_iter()
        .filter_map(|(name, absent)| absent.then_some(name))
        .collect();
        match (access_key_id, secret_access_key) {
            (Some(access_key_id), Some(secret_access_key)) => Ok(SigV4Signer {
                region: region.trim().to_owned(),
                access_key_id,
                secret_access_key,
                session_token: get("AWS_SESSION_TOKEN"),
            }),
            _ => Err(SigV4Error::MissingCredentials {
                region: region.to_owned(),
                missing: missing.join(" and "),
            }),
        }
    }

    /// Sign `request` as of `time`: adds `x-amz-date`, `authorization` and, with a session
    /// token, `x-amz-security-token`. Signed headers: `host`, `content-type` and any `x-amz-*`
    /// header the request carries. The `host` header is set explicitly to what was signed.
    pub fn sign(&self, request: &mut reqwest::Request, time: SystemTime) -> Result<(), SigV4Error> {
        let headers = request.headers_mut();
        for name in ["authorization", "x-amz-date", "x-amz-security-token"] {
            headers.remove(name);
        }
        let host = host_header(request.url());
        let host_value = http::HeaderValue::from_str(&host)
            .map_err(|_| SigV4Error::Header(format!("host {host:?}")))?;
        request.headers_mut().insert(http::header::HOST, host_value);

        let signed: Vec<(String, String)> = request
            .headers()
            .iter()
            .filter(|(name, _)| {
                let name = name.as_str();
                name == "host" || name == "content-type" || name.starts_with("x-amz-")
            })
            .filter_map(|(name, value)| {
                value
                    .to_str()
                    .ok()
                    .map(|v| (name.as_str().to_owned(), v.to_owned()))
            })
            .collect();
        let body: &[u8] = request.body().and_then(|b| b.as_bytes()).unwrap_or(&[]);
        let signable = SignableRequest::new(
            request.method().as_str(),
            request.url().as_str(),
            signed.iter().map(|(n, v)| (n.as_str(), v.as_str())),
            SignableBody::Bytes(body),
        )
        .map_err(SigV4Error::Sign)?;
        let identity = aws_credential_types::Credentials::new(
            self.access_key_id.clone(),
            self.secret_access_key.clone(),
            self.session_token.clone(),
            None,
            "llm-replay-worker-environment",
        )
        .into();
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name(SERVICE)
            .time(time)
            .settings(SigningSettings::default())
            .build()
            .map_err(SigV4Error::Params)?
            .into();
        let (instructions, _signature) = sign(signable, &params)
            .map_err(SigV4Error::Sign)?
            .into_parts();
        let (new_headers, _params) = instructions.into_parts();
        for header in new_headers {
            let name = http::HeaderName::from_static(header.name());
            let mut value = http::HeaderValue::from_str(header.value())
                .map_err(|_| SigV4Error::Header(header.name().to_owned()))?;
            value.set_sensitive(header.sensitive());
            request.headers_mut().insert(name, value);
        }
        Ok(())
    }
}

/// The `Host` header a client sends for `url`: the host, plus the port when it is not the
/// scheme's default.
fn host_header(url: &reqwest::Url) -> String {
    let host = url.host_str().unwrap_or_default();
    match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn missing_credentials_are_named() {
        let error = SigV4Signer::from_env("us-east-1", &env(&[("AWS_ACCESS_KEY_ID", "AKID")]))
            .expect_err("no secret");
        let text = error.to_string();
        assert!(text.contains("lacks AWS_SECRET_ACCESS_KEY ("), "{text}");
    }

    /// The AWS documentation's example key, signing a fixed request at a fixed time: the
    /// signature is botocore's for the same request (`tests/python/test_sigv4.py` checks
    /// live requests the same way), and the signed headers are the ones sent.
    #[test]
    fn signs_host_content_type_and_date_over_the_sent_body() {
        let signer = SigV4Signer::from_env(
            "us-east-1",
            &env(&[
                ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
                (
                    "AWS_SECRET_ACCESS_KEY",
                    "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
                ),
            ]),
        )
        .expect("credentials");
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(crate::client::tls_config(&Default::default()).expect("tls"))
            .build()
            .expect("client");
        let mut request = client
            .post("https://bedrock-runtime.us-east-1.amazonaws.com/model/m%3A0/converse-stream")
            .header("content-type", "application/json")
            .header("accept", "application/vnd.amazon.eventstream")
            .body(r#"{"messages":[]}"#)
            .build()
            .expect("request");
        // 2015-08-30T12:36:00Z
        let time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_440_938_160);
        signer.sign(&mut request, time).expect("signs");
        let headers = request.headers();
        assert_eq!(headers["x-amz-date"], "20150830T123600Z");
        assert_eq!(headers["host"], "bedrock-runtime.us-east-1.amazonaws.com");
        // The same request signed by botocore's SigV4Auth at the same instant (the unsigned
        // `accept` header left out, as here).
        assert_eq!(
            headers["authorization"],
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/bedrock/aws4_request, \
             SignedHeaders=content-type;host;x-amz-date, \
             Signature=e0d2f69343c72d2d2632f86dc8a85e2677486dcbaaed8f912869e7fce8a9b275"
        );
        // Deterministic: the same request at the same time signs the same.
        let mut again = request.try_clone().expect("bytes body");
        signer.sign(&mut again, time).expect("signs");
        assert_eq!(again.headers()["authorization"], headers["authorization"]);
        // A different body signs differently.
        let mut other = client
            .post("https://bedrock-runtime.us-east-1.amazonaws.com/model/m%3A0/converse-stream")
            .header("content-type", "application/json")
            .body(r#"{"messages":[1]}"#)
            .build()
            .expect("request");
        signer.sign(&mut other, time).expect("signs");
        assert_ne!(other.headers()["authorization"], headers["authorization"]);
    }

    #[test]
    fn session_token_is_sent_and_signed() {
        let signer = SigV4Signer::from_env(
            "eu-west-1",
            &env(&[
                ("AWS_ACCESS_KEY_ID", "AKID"),
                ("AWS_SECRET_ACCESS_KEY", "SECRET"),
                ("AWS_SESSION_TOKEN", "TOKEN"),
            ]),
        )
        .expect("credentials");
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(crate::client::tls_config(&Default::default()).expect("tls"))
            .build()
            .expect("client");
        let mut request = client
            .post("http://127.0.0.1:9999/model/x/converse-stream")
            .body("{}")
            .build()
            .expect("request");
        signer
            .sign(&mut request, std::time::SystemTime::now())
            .expect("signs");
        assert_eq!(request.headers()["x-amz-security-token"], "TOKEN");
        assert_eq!(request.headers()["host"], "127.0.0.1:9999");
        let authorization = request.headers()["authorization"].to_str().expect("ascii");
        assert!(
            authorization.contains("SignedHeaders=host;x-amz-date;x-amz-security-token"),
            "{authorization}"
        );
    }
}
