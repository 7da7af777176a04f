//! Pre-shared-secret authentication, shared by every listener of the project (the TCP
//! transport's two planes, the RPC runtime, the engine's metadata service): the secret's
//! type ([`AuthSecret`]), fresh nonces, and HMAC-SHA256 proofs bound to a context, a role,
//! both nonces and what the dialler claimed. Each protocol runs its own exchange of them
//! (documented where it is); the primitives are the same, so one secret file serves all.
//!
//! Authentication keeps processes that do not hold the secret out; it does not encrypt.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use hmc_core::{Error, Result};

/// Length of each side's random nonce.
pub const NONCE_LEN: usize = 32;
/// Length of an HMAC-SHA256 proof.
pub const PROOF_LEN: usize = 32;

/// The shortest secret accepted, in bytes.
pub const MIN_SECRET_LEN: usize = 16;

/// A pre-shared secret for peer authentication. Its `Debug` form never shows the bytes.
#[derive(Clone)]
pub struct AuthSecret(Arc<[u8]>);

impl AuthSecret {
    /// A secret of at least [`MIN_SECRET_LEN`] bytes (random bytes, or a long passphrase).
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<AuthSecret> {
        let bytes = bytes.into();
        if bytes.len() < MIN_SECRET_LEN {
            return Err(Error::InvalidArgument(format!(
                "an authentication secret of {} bytes is too short; use at least \
                 {MIN_SECRET_LEN} (for example `head -c 32 /dev/urandom | base64 > FILE`)",
                bytes.len()
            )));
        }
        Ok(AuthSecret(bytes.into()))
    }

    /// Reads a secret from a file (so it never appears on a command line). Trailing ASCII
    /// whitespace (the newline an editor or `echo` adds) is not part of the secret.
    pub fn from_file(path: &Path) -> Result<AuthSecret> {
        let mut bytes = std::fs::read(path).map_err(|e| {
            Error::io(
                format!("reading the authentication secret {}", path.display()),
                e,
            )
        })?;
        while bytes.last().is_some_and(u8::is_ascii_whitespace) {
            bytes.pop();
        }
        AuthSecret::new(bytes).map_err(|e| match e {
            Error::InvalidArgument(m) => Error::InvalidArgument(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    /// The proof of `role` (`b'D'` dialler, `b'L'` listener) for one exchange.
    pub fn proof(
        &self,
        context: &str,
        role: u8,
        dialler_nonce: &[u8; NONCE_LEN],
        listener_nonce: &[u8; NONCE_LEN],
        identity: &[u8],
    ) -> [u8; PROOF_LEN] {
        self.mac(context, role, dialler_nonce, listener_nonce, identity)
            .finalize()
            .into_bytes()
            .into()
    }

    /// Checks `proof` against the expected one in constant time.
    pub fn verify(
        &self,
        context: &str,
        role: u8,
        dialler_nonce: &[u8; NONCE_LEN],
        listener_nonce: &[u8; NONCE_LEN],
        identity: &[u8],
        proof: &[u8; PROOF_LEN],
    ) -> bool {
        self.mac(context, role, dialler_nonce, listener_nonce, identity)
            .verify_slice(proof)
            .is_ok()
    }

    fn mac(
        &self,
        context: &str,
        role: u8,
        dialler_nonce: &[u8; NONCE_LEN],
        listener_nonce: &[u8; NONCE_LEN],
        identity: &[u8],
    ) -> Hmac<Sha256> {
        let mut mac =
            <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(context.as_bytes());
        mac.update(&[role]);
        mac.update(dialler_nonce);
        mac.update(listener_nonce);
        mac.update(&(identity.len() as u32).to_be_bytes());
        mac.update(identity);
        mac
    }
}

impl PartialEq for AuthSecret {
    /// Constant time in the bytes' contents.
    fn eq(&self, other: &Self) -> bool {
        crate::key_token::bytes_equal(&self.0, &other.0)
    }
}

impl Eq for AuthSecret {}

impl fmt::Debug for AuthSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AuthSecret({} bytes, redacted)", self.0.len())
    }
}

/// A fresh random nonce.
pub fn nonce() -> std::io::Result<[u8; NONCE_LEN]> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n).map_err(|e| {
        std::io::Error::other(format!(
            "the OS random number generator failed ({e}); authentication needs fresh nonces"
        ))
    })?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_depend_on_secret_role_nonces_and_identity() {
        let s = AuthSecret::new(*b"0123456789abcdef").unwrap();
        let other = AuthSecret::new(*b"0123456789abcdeX").unwrap();
        let (nd, nl) = ([1u8; NONCE_LEN], [2u8; NONCE_LEN]);
        let p = s.proof("ctx", b'D', &nd, &nl, b"rank 1");
        assert!(s.verify("ctx", b'D', &nd, &nl, b"rank 1", &p));
        assert!(!other.verify("ctx", b'D', &nd, &nl, b"rank 1", &p));
        assert!(!s.verify("ctx", b'L', &nd, &nl, b"rank 1", &p), "role");
        assert!(!s.verify("ctx", b'D', &nl, &nd, b"rank 1", &p), "nonces");
        assert!(!s.verify("ctx", b'D', &nd, &nl, b"rank 2", &p), "identity");
        assert!(!s.verify("other", b'D', &nd, &nl, b"rank 1", &p), "context");
    }

    #[test]
    fn short_secrets_are_refused_and_debug_hides_the_bytes() {
        let e = AuthSecret::new(*b"short").unwrap_err();
        assert!(e.to_string().contains("at least 16"), "{e}");
        let s = AuthSecret::new(*b"super-secret-value").unwrap();
        let shown = format!("{s:?}");
        assert!(!shown.contains("super"), "{shown}");
        assert_eq!(s, AuthSecret::new(*b"super-secret-value").unwrap());
        assert_ne!(s, AuthSecret::new(*b"super-secret-valuf").unwrap());
    }

    #[test]
    fn a_secret_file_loses_its_trailing_newline() {
        let path = std::env::temp_dir().join(format!("hmc-auth-secret-{}.txt", std::process::id()));
        std::fs::write(&path, b"a-secret-from-a-file\n").unwrap();
        let from_file = AuthSecret::from_file(&path).unwrap();
        assert_eq!(
            from_file,
            AuthSecret::new(*b"a-secret-from-a-file").unwrap()
        );
        std::fs::write(&path, b"short\n").unwrap();
        let e = AuthSecret::from_file(&path).unwrap_err();
        assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        std::fs::remove_file(&path).unwrap();
    }
}
