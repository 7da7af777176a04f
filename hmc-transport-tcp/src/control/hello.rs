//! The HELLO handshake: the dialler's HELLO and the listener's answer on the wire, the
//! optional pre-shared-secret authentication exchange, the dialler's checks of the answer,
//! and admitting or refusing an accepted connection.

use super::*;

#[cfg(test)]
pub(super) fn ack(status: u8, rank: Rank, reason: &str) -> Vec<u8> {
    ack_v(HELLO_VERSION, status, rank, reason.as_bytes())
}

/// A HELLO answer of `version`; `reason` is text, or the nonce and proof of
/// [`STATUS_AUTHENTICATE`].
pub(super) fn ack_v(version: u8, status: u8, rank: Rank, reason: &[u8]) -> Vec<u8> {
    let reason = &reason[..reason.len().min(MAX_REASON_LEN)];
    let mut out = Vec::with_capacity(ACK_FIXED_LEN + reason.len());
    out.extend_from_slice(&HELLO_MAGIC);
    out.push(version);
    out.push(status);
    out.extend_from_slice(&rank.to_be_bytes());
    out.extend_from_slice(&(reason.len() as u16).to_be_bytes());
    out.extend_from_slice(reason);
    out
}

/// Reads a HELLO answer: its fixed part and its reason field.
pub(super) async fn read_ack(
    stream: &mut Stream,
) -> std::io::Result<([u8; ACK_FIXED_LEN], Vec<u8>)> {
    let mut fixed = [0u8; ACK_FIXED_LEN];
    stream.read_exact(&mut fixed).await?;
    let reason_len = u16::from_be_bytes([fixed[10], fixed[11]]) as usize;
    let mut reason = vec![0u8; reason_len.min(MAX_REASON_LEN)];
    stream.read_exact(&mut reason).await?;
    Ok((fixed, reason))
}

/// What both authentication proofs bind: the dialler's claimed rank and the listener's.
pub(super) fn auth_claim(dialler: Rank, listener: Rank) -> [u8; 8] {
    let mut claim = [0u8; 8];
    claim[..4].copy_from_slice(&dialler.to_be_bytes());
    claim[4..].copy_from_slice(&listener.to_be_bytes());
    claim
}

/// A HELLO answer: its fixed part and its reason field.
pub(super) type Answer = ([u8; ACK_FIXED_LEN], Vec<u8>);

/// How the dialler's side of a HELLO went.
pub(super) enum Dialled {
    /// The listener's answer, to check ([`check_answer`]).
    Answered(Answer),
    /// The listener's authentication proof does not match this side's secret.
    NotGenuine,
}

/// The dialler's side of the HELLO: sends this process's HELLO and, with a secret
/// configured, runs the authentication exchange, up to the listener's answer.
pub(super) async fn dial_hello(inner: &Inner, stream: &mut Stream) -> std::io::Result<Dialled> {
    let secret = inner.config.auth_secret.as_ref();
    let mut hello = Vec::with_capacity(HELLO_LEN + NONCE_LEN);
    hello.extend_from_slice(&HELLO_MAGIC);
    hello.push(if secret.is_some() {
        HELLO_VERSION_AUTH
    } else {
        HELLO_VERSION
    });
    hello.extend_from_slice(&inner.rank.to_be_bytes());
    let nonce = match secret {
        Some(_) => {
            let n = auth::nonce()?;
            hello.extend_from_slice(&n);
            Some(n)
        }
        None => None,
    };
    stream.write_all(&hello).await?;
    let (fixed, reason) = read_ack(stream).await?;
    let (Some(secret), Some(nonce)) = (secret, nonce) else {
        return Ok(Dialled::Answered((fixed, reason)));
    };
    if fixed[5] != STATUS_AUTHENTICATE || reason.len() != NONCE_LEN + PROOF_LEN {
        // A refusal (or a listener without authentication): reported by `check_answer`.
        return Ok(Dialled::Answered((fixed, reason)));
    }
    let theirs: [u8; NONCE_LEN] = reason[..NONCE_LEN].try_into().expect("32 bytes");
    let their_proof: [u8; PROOF_LEN] = reason[NONCE_LEN..].try_into().expect("32 bytes");
    let their_rank = Rank::from_be_bytes(fixed[6..10].try_into().expect("4 bytes"));
    let claim = auth_claim(inner.rank, their_rank);
    let genuine = secret.verify(AUTH_CONTEXT, b'L', &nonce, &theirs, &claim, &their_proof);
    // Our proof goes out either way, so the listener can report a mismatch too.
    let proof = secret.proof(AUTH_CONTEXT, b'D', &nonce, &theirs, &claim);
    stream.write_all(&proof).await?;
    if !genuine {
        return Ok(Dialled::NotGenuine);
    }
    read_ack(stream).await.map(Dialled::Answered)
}

/// Checks the listener's answer to a HELLO dialled to `rank` at `addr`: an HMC
/// control-plane answer of the version this side speaks, admitting the connection, from
/// `rank`.
pub(super) fn check_answer(
    inner: &Inner,
    rank: Rank,
    addr: &PeerAddr,
    (fixed, reason): &Answer,
) -> Result<()> {
    let secret = inner.config.auth_secret.as_ref();
    let version_ok = match secret {
        None => fixed[4] == HELLO_VERSION,
        // A refusal from a listener without authentication comes as version 1.
        Some(_) => fixed[4] == HELLO_VERSION_AUTH || (fixed[4] == HELLO_VERSION && fixed[5] != 0),
    };
    if fixed[..4] != HELLO_MAGIC || !version_ok {
        return Err(Error::Protocol(format!(
            "{addr} did not answer with an HMC control-plane HELLO (version {})",
            if secret.is_some() {
                HELLO_VERSION_AUTH
            } else {
                HELLO_VERSION
            }
        )));
    }
    let their_rank = Rank::from_be_bytes(fixed[6..10].try_into().expect("4 bytes"));
    if fixed[5] != 0 {
        return Err(Error::peer(
            format!("rank {rank} at {addr}"),
            format!(
                "refused the connection: {}",
                String::from_utf8_lossy(reason)
            ),
        ));
    }
    if their_rank != rank {
        return Err(Error::peer(
            format!("rank {rank}"),
            format!("{addr} is rank {their_rank}, not rank {rank}; check the address"),
        ));
    }
    Ok(())
}

/// How a HELLO went before the rank checks.
pub(super) enum Hello {
    /// The dialler claims `rank`; answer in `version`.
    Claims { rank: Rank, version: u8 },
    /// Refused with a reason (in `version`); `auth` counts it as an authentication failure.
    Refused {
        rank: Rank,
        version: u8,
        why: String,
        auth: bool,
    },
    /// Not an HMC control-plane peer: dropped without an answer.
    Garbage,
}

/// Reads a HELLO and, with a secret configured, runs the authentication exchange.
pub(super) async fn read_hello(inner: &Inner, stream: &mut Stream) -> std::io::Result<Hello> {
    let mut hello = [0u8; HELLO_LEN];
    stream.read_exact(&mut hello).await?;
    if hello[..4] != HELLO_MAGIC {
        return Ok(Hello::Garbage);
    }
    let version = hello[4];
    let rank = Rank::from_be_bytes(hello[5..9].try_into().expect("4 bytes"));
    let refuse = |why: String, auth| Hello::Refused {
        rank,
        version,
        why,
        auth,
    };
    match (&inner.config.auth_secret, version) {
        (_, v) if v != HELLO_VERSION && v != HELLO_VERSION_AUTH => Ok(Hello::Refused {
            rank,
            version: HELLO_VERSION,
            why: format!(
                "control-plane version {v} is not supported (this side speaks {HELLO_VERSION}, \
                 and {HELLO_VERSION_AUTH} with authentication)"
            ),
            auth: false,
        }),
        (None, HELLO_VERSION) => Ok(Hello::Claims { rank, version }),
        (None, _) => {
            let mut nonce = [0u8; NONCE_LEN];
            stream.read_exact(&mut nonce).await?;
            Ok(Hello::Refused {
                rank,
                // A dialler with a secret reads a version-1 refusal.
                version: HELLO_VERSION,
                why: format!(
                    "rank {} does not use authentication, and the dialler does: set the same \
                     ControlPlaneConfig::auth_secret on both peers, or on neither",
                    inner.rank
                ),
                auth: true,
            })
        }
        (Some(_), HELLO_VERSION) => Ok(refuse(
            format!(
                "rank {} requires authentication with a pre-shared secret: set the same \
                 ControlPlaneConfig::auth_secret on the dialler",
                inner.rank
            ),
            true,
        )),
        (Some(secret), _) => {
            let mut dialler_nonce = [0u8; NONCE_LEN];
            stream.read_exact(&mut dialler_nonce).await?;
            let nonce = auth::nonce()?;
            let claim = auth_claim(rank, inner.rank);
            let proof = secret.proof(AUTH_CONTEXT, b'L', &dialler_nonce, &nonce, &claim);
            let mut challenge = nonce.to_vec();
            challenge.extend_from_slice(&proof);
            stream
                .write_all(&ack_v(version, STATUS_AUTHENTICATE, inner.rank, &challenge))
                .await?;
            let mut theirs = [0u8; PROOF_LEN];
            stream.read_exact(&mut theirs).await?;
            if secret.verify(AUTH_CONTEXT, b'D', &dialler_nonce, &nonce, &claim, &theirs) {
                Ok(Hello::Claims { rank, version })
            } else {
                Ok(refuse(
                    format!(
                        "authentication failed at rank {}: the dialler's proof does not match \
                         this side's secret; both peers need the same \
                         ControlPlaneConfig::auth_secret",
                        inner.rank
                    ),
                    true,
                ))
            }
        }
    }
}

/// Reads an accepted connection's HELLO (and authenticates it) and admits or refuses it.
pub(super) async fn handshake(inner: Arc<Inner>, mut stream: Stream) {
    let read = tokio::time::timeout(inner.config.hello_timeout, read_hello(&inner, &mut stream));
    let (rank, version, refusal) = match read.await {
        Err(_) => {
            tracing::warn!(
                rank = inner.rank,
                timeout = ?inner.config.hello_timeout,
                "dropping a control-plane connection that did not finish its HELLO in time \
                 (hello_timeout)"
            );
            return;
        }
        Ok(Err(e)) => {
            tracing::debug!(rank = inner.rank, error = %e, "connection closed during its HELLO");
            return;
        }
        Ok(Ok(Hello::Garbage)) => {
            tracing::warn!(
                rank = inner.rank,
                "dropping a connection that is not an HMC control-plane peer (bad HELLO magic)"
            );
            return;
        }
        Ok(Ok(Hello::Refused {
            rank,
            version,
            why,
            auth,
        })) => {
            if auth {
                inner.state.with(|s| s.auth_failures += 1);
            }
            (rank, version, Some(why))
        }
        Ok(Ok(Hello::Claims { rank, version })) => (rank, version, None),
    };
    let refusal = refusal.or_else(|| {
        inner.state.with(|s| {
            if rank == inner.rank {
                Some(format!(
                    "rank {rank} is the listener's own rank; pick another rank"
                ))
            } else if s.peers.contains_key(&rank) {
                Some(format!(
                    "rank {rank} is already connected; close that connection first \
                     (two processes may be using the same rank)"
                ))
            } else if s.peers.len() >= inner.config.max_peers {
                Some(format!(
                    "limit `max_peers` reached ({}); raise ControlPlaneConfig::max_peers",
                    inner.config.max_peers
                ))
            } else {
                None
            }
        })
    });
    let refusal = match refusal {
        Some(r) => r,
        None => match attach(
            &inner,
            rank,
            stream,
            Some(ack_v(version, 0, inner.rank, b"")),
        ) {
            Ok(()) => {
                tracing::debug!(rank = inner.rank, peer = rank, "control-plane peer joined");
                return;
            }
            // Lost a race with another connection of the same rank; the stream is gone
            // with the error, and the dialler sees the connection close.
            Err(e) => {
                tracing::warn!(rank = inner.rank, peer = rank, error = %e, "refused a HELLO");
                return;
            }
        },
    };
    tracing::warn!(rank = inner.rank, peer = rank, reason = %refusal, "refused a HELLO");
    let answer = ack_v(version, 1, inner.rank, refusal.as_bytes());
    let _ = tokio::time::timeout(inner.config.hello_timeout, async {
        let _ = stream.write_all(&answer).await;
        let _ = stream.shutdown().await;
    })
    .await;
}
