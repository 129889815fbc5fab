//! The cause of a transport failure, read from an error's source chain: the one
//! classification the replay's client (`worker::client`) and the recording proxy's upstream
//! client (`capture::upstream`) share, so that a refused port, a reset, a connection closed
//! before a response or a TLS problem is named the same wherever it happens, and the resend
//! rule both apply ("closed or reset before any response byte") rests on one reading.
//!
//! A rustls error is read by the one TLS module ([`crate::tls::problem`]). It reads error
//! *types* only — `std::io::Error` kinds, `rustls::Error`, `hyper::Error`'s
//! kinds — and builds no client: behind the feature `transport-errors`, which only the worker
//! and the proxy enable, so the rest of `common` still knows nothing of HTTP or TLS.

use std::error::Error as StdError;
use std::io::ErrorKind;

use crate::measure::TransportCause;

/// What an error's source chain says went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainCause {
    /// A cause of the report's list.
    Transport(TransportCause),
    /// The operating system gave up on the socket (`ETIMEDOUT`: a connect no SYN-ACK
    /// answered). The replay counts it as [`TransportCause::Other`] (its own deadline
    /// usually passes first); the proxy names it in its 502.
    TimedOut,
}

impl ChainCause {
    /// The report's cause: a timed-out socket is [`TransportCause::Other`].
    pub fn transport(self) -> TransportCause {
        match self {
            ChainCause::Transport(cause) => cause,
            ChainCause::TimedOut => TransportCause::Other,
        }
    }
}

/// The cause of a transport failure, from the error's source chain, outermost first: a
/// rustls error is [`TransportCause::Tls`] (with its problem), a refused or reset socket is
/// [`TransportCause::Refused`] or [`TransportCause::Reset`], a name that did not resolve is
/// [`TransportCause::Dns`] (by its message: the resolvers' error types are private), an
/// HTTP/2 frame where an HTTP/1.1 status line should be is [`TransportCause::Http2Only`]; a
/// connection that ended early (an `UnexpectedEof`, hyper's incomplete message, canceled
/// or closed) is [`TransportCause::ClosedBeforeResponse`] unless something more specific is
/// found further down; anything else is [`TransportCause::Other`].
///
/// The caller decides what no error type can say: a failure after a response head is
/// [`TransportCause::ClosedAfterHead`] whatever ended the body.
pub fn classify(error: &(dyn StdError + 'static)) -> ChainCause {
    let mut current: Option<&(dyn StdError + 'static)> = Some(error);
    let mut fallback = TransportCause::Other;
    while let Some(e) = current {
        // An I/O error's `source()` skips its own payload, where rustls (and connectors
        // wrapping rustls's I/O error in another) put theirs: walk into the payload instead.
        let mut next = e.source();
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return ChainCause::Transport(TransportCause::Tls(crate::tls::problem(tls)));
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            match io.kind() {
                ErrorKind::ConnectionRefused => {
                    return ChainCause::Transport(TransportCause::Refused);
                }
                ErrorKind::ConnectionReset
                | ErrorKind::ConnectionAborted
                | ErrorKind::BrokenPipe => return ChainCause::Transport(TransportCause::Reset),
                ErrorKind::TimedOut => return ChainCause::TimedOut,
                ErrorKind::UnexpectedEof => fallback = TransportCause::ClosedBeforeResponse,
                _ => {}
            }
            if let Some(payload) = io.get_ref() {
                next = Some(payload as &(dyn StdError + 'static));
            }
        }
        if let Some(hyper) = e.downcast_ref::<hyper::Error>() {
            if hyper.is_incomplete_message() || hyper.is_canceled() || hyper.is_closed() {
                fallback = TransportCause::ClosedBeforeResponse;
            }
            // hyper's HTTP/1.1 parser meets an HTTP/2 frame (0x00 0x00 …) where the status
            // line's `HTTP/1.1` should be.
            if hyper.is_parse() && hyper.to_string().contains("invalid HTTP version") {
                return ChainCause::Transport(TransportCause::Http2Only);
            }
        }
        let text = e.to_string();
        if text.starts_with("dns error") || text.contains("failed to lookup address") {
            return ChainCause::Transport(TransportCause::Dns);
        }
        current = next;
    }
    ChainCause::Transport(fallback)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::TlsProblem;
    use std::io::Error;

    #[test]
    fn io_kinds_name_their_cause() {
        for (kind, cause) in [
            (
                ErrorKind::ConnectionRefused,
                ChainCause::Transport(TransportCause::Refused),
            ),
            (
                ErrorKind::ConnectionReset,
                ChainCause::Transport(TransportCause::Reset),
            ),
            (
                ErrorKind::BrokenPipe,
                ChainCause::Transport(TransportCause::Reset),
            ),
            (ErrorKind::TimedOut, ChainCause::TimedOut),
            (
                ErrorKind::UnexpectedEof,
                ChainCause::Transport(TransportCause::ClosedBeforeResponse),
            ),
            (
                ErrorKind::InvalidData,
                ChainCause::Transport(TransportCause::Other),
            ),
        ] {
            assert_eq!(classify(&Error::from(kind)), cause, "{kind:?}");
        }
        assert_eq!(ChainCause::TimedOut.transport(), TransportCause::Other);
    }

    #[test]
    fn rustls_errors_inside_io_errors_are_found() {
        let io = Error::new(
            ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        assert_eq!(
            classify(&io),
            ChainCause::Transport(TransportCause::Tls(TlsProblem::UnknownIssuer))
        );
        // As hyper-rustls wraps it: an I/O error holding rustls's I/O error.
        let wrapped = Error::other(Error::new(
            ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName),
        ));
        assert_eq!(
            classify(&wrapped),
            ChainCause::Transport(TransportCause::Tls(TlsProblem::NameMismatch))
        );
    }

    #[test]
    fn a_name_that_did_not_resolve_is_dns() {
        let error = Error::other("failed to lookup address information: Name or service not known");
        assert_eq!(classify(&error), ChainCause::Transport(TransportCause::Dns));
    }
}
