//! The random half of a remote key. A key names a registration by id and proves the
//! holder was given it by a random token; the TCP and shared-memory transports check the
//! token of every request, and `Communicator::rekey` replaces it, which revokes every key
//! exported before.
//!
//! Tokens are compared in constant time ([`bytes_equal`]): a peer probing tokens learns
//! nothing from how long a refusal takes.

use hmc_core::{Error, Result};
use parking_lot::Mutex;

/// Bytes of a key token.
pub const KEY_TOKEN_LEN: usize = 16;

/// A fresh token from the OS random number generator.
pub fn random_token() -> Result<[u8; KEY_TOKEN_LEN]> {
    let mut t = [0u8; KEY_TOKEN_LEN];
    getrandom::fill(&mut t).map_err(|e| Error::Unavailable {
        what: "the OS random number generator".into(),
        reason: e.to_string(),
        hint: "remote keys need unguessable tokens; check /dev/urandom or getrandom(2)".into(),
    })?;
    Ok(t)
}

/// Whether `a` and `b` are equal, in time independent of where they differ (their
/// lengths are not secret).
pub fn bytes_equal(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A registration's current token.
#[derive(Debug)]
pub struct KeyToken(Mutex<[u8; KEY_TOKEN_LEN]>);

impl KeyToken {
    /// A fresh random token.
    pub fn new() -> Result<Self> {
        Ok(KeyToken(Mutex::new(random_token()?)))
    }

    /// The token as it is now, to export.
    pub fn get(&self) -> [u8; KEY_TOKEN_LEN] {
        *self.0.lock()
    }

    /// Whether a request's token is the current one (constant time).
    pub fn matches(&self, token: &[u8; KEY_TOKEN_LEN]) -> bool {
        bytes_equal(&*self.0.lock(), token)
    }

    /// Makes `token` (drawn with [`random_token`]) the current one, for a caller that
    /// publishes it elsewhere in the same step (the shared-memory transport's control page).
    pub fn replace(&self, token: [u8; KEY_TOKEN_LEN]) {
        *self.0.lock() = token;
    }

    /// Replaces the token with a fresh one: every key exported before stops matching. A
    /// check made before the swap stands; one made after it fails.
    pub fn rekey(&self) -> Result<()> {
        let fresh = random_token()?;
        *self.0.lock() = fresh;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_matches_itself_and_not_after_rekey() {
        let t = KeyToken::new().unwrap();
        let old = t.get();
        assert!(t.matches(&old));
        t.rekey().unwrap();
        assert!(!t.matches(&old), "rekey revokes the token exported before");
        assert!(t.matches(&t.get()));
    }

    #[test]
    fn bytes_differing_anywhere_or_in_length_are_unequal() {
        let a = [7u8; KEY_TOKEN_LEN];
        for i in 0..KEY_TOKEN_LEN {
            let mut b = a;
            b[i] ^= 0x80;
            assert!(!bytes_equal(&a, &b), "byte {i}");
        }
        assert!(bytes_equal(&a, &a));
        assert!(!bytes_equal(&a, &a[..15]));
    }

    #[test]
    fn fresh_tokens_differ() {
        assert_ne!(random_token().unwrap(), random_token().unwrap());
    }
}
