//! [`TcpEndpoint`]: a peer's address and a small pool of connections to it, and
//! [`ConnLease`], one connection checked out of the pool for one request.
//!
//! A request takes a connection for its whole exchange and gives it back only once the
//! exchange ended in step ([`ConnLease::checkin`]). A lease dropped before that (its future
//! dropped, its deadline passed, the connection broke) never returns the connection to the
//! pool: see [`Unfinished`] for what happens to it then.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use hmc_core::{Deadline, Error, Op, PeerAddr, Result};
use parking_lot::Mutex;
use tokio::io::AsyncWriteExt;
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::AuthSecret;
use crate::auth::{NONCE_LEN, PROOF_LEN};
use crate::net::Stream;
use crate::state::Shared;
use crate::wire::{self, TOKEN_LEN};

/// How long a connection must have been idle in the endpoint's pool before it is probed
/// for a close by the peer (one non-blocking read) when it is taken for a request.
const PROBE_IDLE_AFTER: Duration = Duration::from_millis(1);

/// A connection to one peer; cheap to clone. The connections close when the last clone
/// is dropped.
#[derive(Clone)]
pub struct TcpEndpoint {
    pub(crate) inner: Arc<EndpointInner>,
}

pub(crate) struct EndpointInner {
    pub(crate) id: u64,
    pub(crate) peer: PeerAddr,
    /// Pooled connections, when each went idle, and whether it must be probed before reuse
    /// however soon (its last request was refused: the target may have closed it).
    idle: Mutex<Vec<(Stream, Instant, bool)>>,
    /// At most this many in `idle` (`max_idle_per_endpoint`).
    max_idle: usize,
    slots: Semaphore,
    /// The key (id, token) of the peer's region imported last on this endpoint: a NOTIFY
    /// carries it to prove that the peer granted this side access.
    pub(crate) notify_key: Mutex<Option<(u64, [u8; TOKEN_LEN])>>,
    /// Connections reset in the middle of a WRITE, not yet abandoned at the target.
    pub(crate) abandoned: Mutex<crate::abandon::Pending>,
    /// One `settle` at a time: a second one waits for the first's answers, which may cover
    /// its WRITEs too.
    pub(crate) settling: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for TcpEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpEndpoint")
            .field("peer", &self.inner.peer)
            .finish_non_exhaustive()
    }
}

impl TcpEndpoint {
    /// An endpoint to `peer`, with `stream` (just dialled) as its first pooled connection.
    pub(crate) fn new(shared: &Shared, peer: &PeerAddr, stream: Stream) -> TcpEndpoint {
        TcpEndpoint {
            inner: Arc::new(EndpointInner {
                id: shared.next_endpoint.fetch_add(1, Ordering::Relaxed),
                peer: peer.clone(),
                idle: Mutex::new(vec![(stream, Instant::now(), false)]),
                max_idle: shared.config.max_idle_per_endpoint,
                slots: Semaphore::new(shared.config.max_connections_per_endpoint.max(1)),
                notify_key: Mutex::new(None),
                abandoned: Mutex::default(),
                settling: tokio::sync::Mutex::new(()),
            }),
        }
    }

    /// The peer's address.
    pub fn peer(&self) -> &PeerAddr {
        &self.inner.peer
    }
}

/// What a [`ConnLease`] dropped before its request ended does with its connection, which is
/// out of step then and never goes back to the pool.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Unfinished {
    /// Closes it (a NOTIFY or an ABANDON: nothing of a peer's memory rides on it).
    Close,
    /// Resets it (a READ): the target sees the reset at once and stops.
    Reset,
    /// Resets it and records it on the endpoint for `settle` to abandon at the target (a
    /// WRITE). A reset discards the bytes of the WRITE still in this host's send buffer
    /// instead of delivering them when the target reads again, and the target, which checks
    /// for a reset before applying each part of a WRITE, applies none of the rest. A reset
    /// does not empty the target's receive queue, though: only after `settle`'s ABANDON
    /// does no more of the WRITE land, whatever the target's scheduling (see
    /// `crate::abandon`).
    Abandon,
}

impl Unfinished {
    /// The rule for a transfer of `op`.
    pub(crate) fn of(op: Op) -> Unfinished {
        match op {
            Op::Write => Unfinished::Abandon,
            Op::Read => Unfinished::Reset,
        }
    }
}

/// One connection of an endpoint checked out for one request, with the slot it takes of
/// `max_connections_per_endpoint`. [`ConnLease::checkin`] returns the connection to the
/// pool once the request ended in step; dropped before that, the lease does what its
/// [`Unfinished`] says. The slot frees after the connection is back or gone.
pub(crate) struct ConnLease<'e> {
    /// `None` once checked in. Declared before `_slot`: the connection is handled before
    /// the slot frees.
    stream: Option<Stream>,
    ep: &'e EndpointInner,
    unfinished: Unfinished,
    _slot: SemaphorePermit<'e>,
}

impl EndpointInner {
    /// Takes one of the endpoint's `max_connections_per_endpoint` slots and a connection
    /// for it: an idle one, or a new one. `now`: the caller's clock read, for the idle check.
    pub(crate) async fn checkout(
        &self,
        shared: &Shared,
        deadline: Deadline,
        now: Instant,
        unfinished: Unfinished,
    ) -> Result<ConnLease<'_>> {
        let slot = self
            .slots
            .acquire()
            .await
            .map_err(|_| Error::Closed("endpoint closed".into()))?;
        let stream = match self.pooled(shared, now) {
            Some(s) => s,
            // The endpoint's peer was reachable once: failing to reach it again means it
            // went away (Error::Peer), the same shape as losing it mid-transfer; only
            // `connect` reports a refusal as the io::Error it is.
            None => dial(shared, &self.peer, deadline)
                .await
                .map_err(|e| match e {
                    Error::Io { source, .. } => Error::peer(
                        &self.peer,
                        format!("gone: reconnecting to it failed ({source}); connect again once it is back"),
                    ),
                    e => e,
                })?,
        };
        Ok(ConnLease {
            stream: Some(stream),
            ep: self,
            unfinished,
            _slot: slot,
        })
    }

    /// An idle connection still fit for a request, if the pool holds one. The target closes
    /// connections idle for its `idle_timeout`: pooled ones close to it, or that it has
    /// already closed, are dropped. A connection back in the pool for less than
    /// `PROBE_IDLE_AFTER` is not probed: the probe is a system call per op in a loop of
    /// small ops, and it could not see a close that comes after it anyway.
    fn pooled(&self, shared: &Shared, now: Instant) -> Option<Stream> {
        let max_idle = shared.config.idle_timeout / 2;
        loop {
            let (s, since, refused) = self.idle.lock().pop()?;
            let idle = now.saturating_duration_since(since);
            let probe = refused || idle >= PROBE_IDLE_AFTER;
            if idle < max_idle && !(probe && s.closed_by_peer()) {
                return Some(s);
            }
        }
    }
}

impl ConnLease<'_> {
    /// The connection, for the request's I/O.
    pub(crate) fn stream(&mut self) -> &mut Stream {
        self.stream.as_mut().expect("held until checked in")
    }

    /// Returns the connection to the pool, in step again: the request ended (`refused`: the
    /// target refused it, and may have closed the connection).
    pub(crate) fn checkin(mut self, refused: bool) {
        let stream = self.stream.take().expect("checked in once");
        let mut idle = self.ep.idle.lock();
        if idle.len() < self.ep.max_idle {
            idle.push((stream, Instant::now(), refused));
        }
    }
}

impl Drop for ConnLease<'_> {
    fn drop(&mut self) {
        let Some(s) = &self.stream else { return };
        if self.unfinished != Unfinished::Close {
            s.reset_on_close();
        }
        if self.unfinished == Unfinished::Abandon {
            self.ep.abandoned.lock().push(s.local_conn_name());
        }
    }
}

/// How the dialler's side of a data-plane HELLO went.
enum Answered {
    /// The listener's answer, or why it is not one.
    Answer(std::result::Result<wire::Hello, String>),
    /// The listener's proof does not match this side's secret.
    NotGenuine,
}

/// Dials `peer` and exchanges HELLOs (and authenticates, with a secret).
pub(crate) async fn dial(shared: &Shared, peer: &PeerAddr, deadline: Deadline) -> Result<Stream> {
    let start = Instant::now();
    let mut stream = Stream::connect(peer, deadline).await?;
    let me = shared.addr.to_string();
    let secret = shared.config.auth_secret.as_ref();
    let hello = exchange_hello(&mut stream, &me, secret);
    let answer = match tokio::time::timeout_at(deadline.instant().into(), hello).await {
        Err(_) => {
            return Err(Error::DeadlineExceeded {
                during: "data-plane HELLO",
                elapsed: start.elapsed(),
            });
        }
        Ok(Err(e)) => {
            return Err(Error::peer(
                peer,
                format!("HELLO failed: {e}; is an HMC TcpCommunicator listening there?"),
            ));
        }
        Ok(Ok(Answered::NotGenuine)) => {
            tracing::warn!(%peer, "data-plane peer failed authentication");
            return Err(Error::peer(
                peer,
                "failed authentication: its proof does not match this side's secret; both \
                 peers need the same TcpConfig::auth_secret",
            ));
        }
        Ok(Ok(Answered::Answer(answer))) => answer,
    };
    match answer {
        Err(why) => Err(Error::Protocol(format!("{peer}: {why}"))),
        Ok(h) if h.status == 0 && secret.is_some() && h.version != wire::VERSION_AUTH => {
            Err(Error::peer(
                peer,
                "admitted the connection without authenticating; it has no \
                 TcpConfig::auth_secret, and this side requires one",
            ))
        }
        Ok(h) if h.status == 0 => Ok(stream),
        Ok(h) => Err(Error::peer(
            peer,
            format!(
                "refused the connection: {}",
                String::from_utf8_lossy(&h.payload)
            ),
        )),
    }
}

/// The dialler's HELLO as `me`, and with a secret the authentication exchange (see
/// [`crate::auth`]), up to the listener's answer. A future made here rather than an
/// `async fn`, which would keep its arguments twice in `dial`'s future (and so in every
/// request's that dials).
#[allow(clippy::manual_async_fn)]
fn exchange_hello<'a>(
    stream: &'a mut Stream,
    me: &'a str,
    secret: Option<&'a AuthSecret>,
) -> impl Future<Output = std::io::Result<Answered>> + 'a {
    async move {
        let Some(secret) = secret else {
            stream.write_all(&wire::encode_hello(None, me)).await?;
            return wire::read_hello_v(stream, true).await.map(Answered::Answer);
        };
        let nonce = crate::auth::nonce()?;
        let mut hello = wire::encode_hello_v(wire::VERSION_AUTH, None, me.as_bytes());
        hello.extend_from_slice(&nonce);
        stream.write_all(&hello).await?;
        let challenge = match wire::read_hello_v(stream, true).await? {
            Ok(h) if h.status == wire::STATUS_AUTHENTICATE => h,
            // A refusal (or garbage): reported by the caller like any answer.
            other => return Ok(Answered::Answer(other)),
        };
        if challenge.payload.len() != NONCE_LEN + PROOF_LEN {
            return Ok(Answered::Answer(Err(format!(
                "an authentication challenge of {} bytes (expected {})",
                challenge.payload.len(),
                NONCE_LEN + PROOF_LEN
            ))));
        }
        let theirs: [u8; NONCE_LEN] = challenge.payload[..NONCE_LEN].try_into().expect("32");
        let their_proof: [u8; PROOF_LEN] = challenge.payload[NONCE_LEN..].try_into().expect("32");
        let ctx = crate::responder::AUTH_CONTEXT;
        let claim = me.as_bytes();
        let genuine = secret.verify(ctx, b'L', &nonce, &theirs, claim, &their_proof);
        // Our proof goes out either way, so the listener can report a mismatch too.
        let proof = secret.proof(ctx, b'D', &nonce, &theirs, claim);
        stream.write_all(&proof).await?;
        if !genuine {
            return Ok(Answered::NotGenuine);
        }
        wire::read_hello_v(stream, true).await.map(Answered::Answer)
    }
}
