//! Mutual authentication of a worker and its coordinator by a shared token, without the token
//! ever crossing the link.
//!
//! The worker sends a random nonce in `Hello`; the coordinator answers with its own nonce and a
//! proof, HMAC-SHA256(token, "coordinator" ‖ worker nonce ‖ coordinator nonce ‖ worker id). The
//! worker checks it before it trusts anything the coordinator says (its assignment names the
//! target and the `${VAR}`s to expand), then proves itself the same way with the roles
//! swapped. A peer that does not know the token learns nothing it could replay: each proof is
//! bound to both fresh nonces.

use ring::hmac;

/// Length of each side's nonce, bytes.
pub const NONCE_BYTES: usize = 32;

/// A fresh random nonce.
pub fn nonce() -> Vec<u8> {
    let mut out = Vec::with_capacity(NONCE_BYTES);
    out.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    out.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    out
}

fn message(role: &str, first: &[u8], second: &[u8], worker_id: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for part in [role.as_bytes(), first, second, worker_id.as_bytes()] {
        out.extend_from_slice(&(part.len() as u32).to_be_bytes());
        out.extend_from_slice(part);
    }
    out
}

/// The coordinator's proof for a worker's `Hello`.
pub fn coordinator_proof(
    token: &str,
    worker_nonce: &[u8],
    coordinator_nonce: &[u8],
    worker_id: &str,
) -> Vec<u8> {
    let key = hmac::Key::new(hmac::HMAC_SHA256, token.as_bytes());
    let text = message("coordinator", worker_nonce, coordinator_nonce, worker_id);
    hmac::sign(&key, &text).as_ref().to_vec()
}

/// The worker's proof, answering the coordinator's challenge.
pub fn worker_proof(
    token: &str,
    worker_nonce: &[u8],
    coordinator_nonce: &[u8],
    worker_id: &str,
) -> Vec<u8> {
    let key = hmac::Key::new(hmac::HMAC_SHA256, token.as_bytes());
    let text = message("worker", coordinator_nonce, worker_nonce, worker_id);
    hmac::sign(&key, &text).as_ref().to_vec()
}

/// Constant-time check of a proof.
pub fn verify(expected: &[u8], given: &[u8]) -> bool {
    expected.len() == given.len()
        && expected
            .iter()
            .zip(given)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_bind_the_token_both_nonces_the_worker_and_the_role() {
        let (w, c) = (nonce(), nonce());
        assert_eq!(w.len(), NONCE_BYTES);
        assert_ne!(w, c);
        let proof = coordinator_proof("t0ken-t0ken-t0ken", &w, &c, "w1");
        assert!(verify(
            &proof,
            &coordinator_proof("t0ken-t0ken-t0ken", &w, &c, "w1")
        ));
        assert!(!verify(
            &proof,
            &coordinator_proof("other-token-xxxx", &w, &c, "w1")
        ));
        assert!(!verify(
            &proof,
            &coordinator_proof("t0ken-t0ken-t0ken", &c, &w, "w1")
        ));
        assert!(!verify(
            &proof,
            &coordinator_proof("t0ken-t0ken-t0ken", &w, &c, "w2")
        ));
        // A coordinator's proof is not a worker's.
        assert!(!verify(
            &proof,
            &worker_proof("t0ken-t0ken-t0ken", &w, &c, "w1")
        ));
    }
}
