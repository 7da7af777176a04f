//! The RPC connection's authentication exchange, run before the first frame when the server
//! has an [`AuthSecret`] (`ServerConfig::auth_secret`, `ClientConfig::auth_secret`), and
//! the rule for local peers of a server without one (`ServerConfig::same_user_only`).
//!
//! # The exchange
//!
//! 1. The client sends `HMCAUTH1` and a fresh 32-byte nonce `Nc`.
//! 2. The server answers `HMCAUTH1`, its own fresh nonce `Ns` and its proof
//!    `Ps = HMAC-SHA256(secret, "hmc-rpc v1" | "L" | Nc | Ns)`.
//! 3. The client checks `Ps` (a server without the secret cannot answer, so a client never
//!    sends a request to an impostor), then sends `Pc = HMAC-SHA256(secret, "hmc-rpc v1" |
//!    "D" | Nc | Ns)`.
//! 4. The server checks `Pc` and answers one byte, 0 (admitted) or 1 (refused), and only
//!    then reads frames.
//!
//! The primitives are `hmc_transport_kit::auth`'s (the TCP transport's planes use the same ones with
//! their own contexts). Nothing is encrypted.

use std::time::Duration;

use hmc_transport_kit::auth::{AuthSecret, NONCE_LEN, PROOF_LEN};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const MAGIC: &[u8; 8] = b"HMCAUTH1";
const CONTEXT: &str = "hmc-rpc v1";

fn fail(what: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::PermissionDenied, what)
}

/// The client's side, on a fresh connection, within `timeout`.
pub(crate) async fn client<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    secret: &AuthSecret,
    timeout: Duration,
) -> std::io::Result<()> {
    let run = async {
        let nc = hmc_transport_kit::auth::nonce()?;
        let mut hello = Vec::with_capacity(MAGIC.len() + NONCE_LEN);
        hello.extend_from_slice(MAGIC);
        hello.extend_from_slice(&nc);
        s.write_all(&hello).await?;
        let mut answer = [0u8; 8 + NONCE_LEN + PROOF_LEN];
        s.read_exact(&mut answer).await.map_err(|e| {
            fail(format!(
                "the RPC server did not answer the authentication challenge ({e}); it has no auth_secret, or another one: give both sides the same secret"
            ))
        })?;
        if &answer[..8] != MAGIC {
            return Err(fail(
                "the RPC server does not authenticate (it answered the challenge with something else): set the same auth_secret on the server, or none on this client".into(),
            ));
        }
        let ns: [u8; NONCE_LEN] = answer[8..8 + NONCE_LEN].try_into().expect("32 bytes");
        let ps: [u8; PROOF_LEN] = answer[8 + NONCE_LEN..].try_into().expect("32 bytes");
        let server_ok = secret.verify(CONTEXT, b'L', &nc, &ns, b"", &ps);
        // Sent either way, so that the server can report the failure too.
        let pc = secret.proof(CONTEXT, b'D', &nc, &ns, b"");
        s.write_all(&pc).await?;
        if !server_ok {
            return Err(fail(
                "the RPC server's authentication proof does not match this side's secret; both sides need the same auth_secret".into(),
            ));
        }
        let mut verdict = [0u8; 1];
        s.read_exact(&mut verdict).await?;
        if verdict[0] != 0 {
            return Err(fail(
                "the RPC server refused this client's authentication proof; both sides need the same auth_secret".into(),
            ));
        }
        Ok(())
    };
    tokio::time::timeout(timeout, run).await.map_err(|_| {
        fail(format!(
            "the authentication exchange took longer than {timeout:?}: the server is slow, or has no auth_secret (then it waits for a frame): give both sides the same auth_secret"
        ))
    })?
}

/// The server's side, on an accepted connection, within `timeout`. `Err` says why the
/// connection is refused (the caller closes it).
pub(crate) async fn server<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    secret: &AuthSecret,
    timeout: Duration,
) -> std::result::Result<(), String> {
    let run = async {
        let mut hello = [0u8; 8 + NONCE_LEN];
        s.read_exact(&mut hello)
            .await
            .map_err(|e| format!("no authentication hello ({e})"))?;
        if &hello[..8] != MAGIC {
            return Err(
                "the client sent no authentication hello: it has no auth_secret (this server requires one)".to_string(),
            );
        }
        let nc: [u8; NONCE_LEN] = hello[8..].try_into().expect("32 bytes");
        let ns = hmc_transport_kit::auth::nonce().map_err(|e| e.to_string())?;
        let mut answer = Vec::with_capacity(8 + NONCE_LEN + PROOF_LEN);
        answer.extend_from_slice(MAGIC);
        answer.extend_from_slice(&ns);
        answer.extend_from_slice(&secret.proof(CONTEXT, b'L', &nc, &ns, b""));
        s.write_all(&answer).await.map_err(|e| e.to_string())?;
        let mut pc = [0u8; PROOF_LEN];
        s.read_exact(&mut pc)
            .await
            .map_err(|e| format!("no authentication proof ({e})"))?;
        let ok = secret.verify(CONTEXT, b'D', &nc, &ns, b"", &pc);
        let _ = s.write_all(&[u8::from(!ok)]).await;
        if ok {
            Ok(())
        } else {
            Err("the client's authentication proof does not match this server's auth_secret".into())
        }
    };
    tokio::time::timeout(timeout, run)
        .await
        .map_err(|_| format!("the authentication exchange took longer than {timeout:?}"))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn secret(b: &[u8]) -> AuthSecret {
        AuthSecret::new(b.to_vec()).unwrap()
    }

    #[rstest]
    #[case::same(b"0123456789abcdef", b"0123456789abcdef", true)]
    #[case::different(b"0123456789abcdef", b"0123456789abcdeX", false)]
    #[tokio::test]
    async fn both_sides_must_hold_the_same_secret(
        #[case] c: &[u8],
        #[case] s: &[u8],
        #[case] ok: bool,
    ) {
        let (mut a, mut b) = tokio::io::duplex(1024);
        let t = Duration::from_secs(5);
        let (cs, ss) = (secret(c), secret(s));
        let (rc, rs) = tokio::join!(client(&mut a, &cs, t), server(&mut b, &ss, t));
        assert_eq!(rc.is_ok(), ok, "{rc:?}");
        assert_eq!(rs.is_ok(), ok, "{rs:?}");
    }

    #[tokio::test]
    async fn a_client_without_a_secret_is_refused_by_name() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        let s = secret(b"0123456789abcdef");
        let (_, rs) = tokio::join!(
            async { a.write_all(&[0u8; 64]).await },
            server(&mut b, &s, Duration::from_secs(5))
        );
        assert!(rs.unwrap_err().contains("no auth_secret"));
    }

    #[tokio::test]
    async fn a_silent_peer_is_given_up_on() {
        let (mut a, _b) = tokio::io::duplex(1024);
        let e = client(
            &mut a,
            &secret(b"0123456789abcdef"),
            Duration::from_millis(50),
        )
        .await
        .unwrap_err();
        assert!(e.to_string().contains("took longer"), "{e}");
    }
}
