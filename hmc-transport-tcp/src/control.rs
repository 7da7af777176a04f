//! The control plane: a rank-addressed channel of small typed messages over TCP and Unix sockets.
//!
//! Each process binds as one rank and connects to others by rank and address. The first
//! bytes on every connection are a HELLO naming the dialler's rank; the listener refuses
//! its own rank, a rank that is already connected (the existing connection is kept, never
//! silently swapped) and connections past [`ControlPlaneConfig::max_peers`]. After that a
//! connection is symmetric: both sides send framed messages `[u32 length][u16 kind][body]`
//! (big-endian), and each side files incoming messages by `(rank, kind)`, so
//! [`ControlPlane::recv`] of one type never consumes another type's messages.
//!
//! Delivery is ordered per peer and kind. [`ControlPlane::send`] returns once the frame is
//! queued for the peer's writer task; it is not an acknowledgement.
//!
//! # What a peer can make this process hold
//!
//! - Only messages of kinds someone receives are kept: the built-in kinds (1–4), kinds
//!   registered with [`ControlPlane::register_kind`], and kinds a [`ControlPlane::recv`]
//!   has asked for. Messages of any other kind are dropped as they arrive, with a log line
//!   (and counted in [`ControlPlaneStats::dropped_unknown_kind`]). Register application
//!   kinds right after `bind`, before peers may send them.
//! - Kept messages wait in memory until received, within three budgets:
//!   [`ControlPlaneConfig::max_queued_per_peer`] messages and
//!   [`ControlPlaneConfig::max_queued_bytes_per_peer`] bytes from one rank, and
//!   [`ControlPlaneConfig::max_queued_bytes`] bytes from all ranks together. When a frame
//!   would not fit, that peer's connection is not read until the application catches up,
//!   so a slow receiver pushes back on the sender through TCP.
//! - When a rank leaves, the frames queued for it are dropped at once, and the messages
//!   from it that nobody received are dropped after
//!   [`ControlPlaneConfig::departed_retention`] (unless it has come back by then), with a
//!   log line saying how many.
//! - With [`ControlPlaneConfig::auth_secret`] set, a connection proves knowledge of the
//!   pre-shared secret at HELLO before its rank is considered (see `crate::auth`): the
//!   HELLO is `"HMCP" | 2 | rank u32 | nonce [32]`, the listener answers with status 2
//!   and its nonce and proof as the reason field, the dialler sends its 32-byte proof,
//!   and the listener's usual answer follows. Without a secret the wire is unchanged
//!   (version 1).
//!
//! # Layout
//!
//! This file holds the public API ([`ControlPlane`], its config, stats and
//! [`ControlMessage`]) and the shared state; `conn` runs each connection's reader and writer
//! tasks and the accept loop, `hello` both sides of the handshake and its authentication.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hmc_core::{Deadline, Error, PeerAddr, RemoteRegion, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use crate::AuthSecret;
use crate::auth::{self, NONCE_LEN, PROOF_LEN};
use crate::net::{Listener, Stream};
use crate::wait::Watched;

mod conn;
mod hello;

use conn::{accept_loop, attach, schedule_purge};
use hello::{Dialled, check_answer, dial_hello};

/// A process's number in the control plane.
pub type Rank = u32;

const HELLO_MAGIC: [u8; 4] = *b"HMCP";
const HELLO_VERSION: u8 = 1;
/// The HELLO version of a dialler that authenticates (followed by its nonce).
const HELLO_VERSION_AUTH: u8 = 2;
/// The answer status that starts the authentication exchange.
const STATUS_AUTHENTICATE: u8 = 2;
/// The `context` of control-plane authentication proofs.
const AUTH_CONTEXT: &str = "hmc-tcp control v1";
/// Kinds of the built-in message types, always kept.
const BUILTIN_KINDS: [u16; 4] = [1, 2, 3, 4];
const HELLO_LEN: usize = 4 + 1 + 4;
const ACK_FIXED_LEN: usize = 4 + 1 + 1 + 4 + 2;
const MAX_REASON_LEN: usize = 1024;
/// A wait with no real deadline (the reader's backpressure wait): a year.
const FOREVER: Duration = Duration::from_secs(365 * 86_400);

/// Limits and timeouts of a [`ControlPlane`]. Every field has a default; both peers should
/// agree on `max_frame_len`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControlPlaneConfig {
    /// Largest message body sent or accepted, in bytes (default 1 MiB). A peer that sends
    /// more is disconnected. Large data belongs on a `Communicator`, not here.
    pub max_frame_len: usize,
    /// Messages from one peer held until received (default 1024); past it, that peer's
    /// connection is no longer read until the application catches up.
    pub max_queued_per_peer: usize,
    /// Bytes of messages from one peer held until received (default 16 MiB); a frame that
    /// would pass it waits (the connection is not read) until the application catches up.
    /// A single frame is always taken into an empty queue.
    pub max_queued_bytes_per_peer: usize,
    /// Bytes of messages from all peers (connected or departed) held until received
    /// (default 256 MiB); past it, no peer is read until the application catches up or
    /// departed ranks' messages are dropped. A warning names this limit when it bites.
    pub max_queued_bytes: usize,
    /// How long unreceived messages from a rank that left stay receivable (default 5 s);
    /// then they are dropped, unless the rank has come back. Zero drops them as it leaves.
    pub departed_retention: Duration,
    /// A pre-shared secret for peer authentication (default `None`: off). When set, both
    /// sides of every connection prove they hold it at HELLO (see [`crate::AuthSecret`]);
    /// a peer without it, with another one, or with one when this side has none, is
    /// refused before its rank is considered. Both peers need the same setting.
    pub auth_secret: Option<AuthSecret>,
    /// Connected peers at once (default 1024); further HELLOs are refused.
    pub max_peers: usize,
    /// Frames queued for one peer's writer (default 256); `send` waits when it is full.
    pub max_send_queue: usize,
    /// How long an accepted connection may take to send its HELLO (default 5 s).
    pub hello_timeout: Duration,
}

impl Default for ControlPlaneConfig {
    fn default() -> Self {
        ControlPlaneConfig {
            max_frame_len: 1 << 20,
            max_queued_per_peer: 1024,
            max_queued_bytes_per_peer: 16 << 20,
            max_queued_bytes: 256 << 20,
            departed_retention: Duration::from_secs(5),
            auth_secret: None,
            max_peers: 1024,
            max_send_queue: 256,
            hello_timeout: Duration::from_secs(5),
        }
    }
}

/// A message type that travels on the control plane.
///
/// `KIND` tells message types apart on the wire; kinds below 256 are reserved for HMC's
/// own types, applications use 256 and up. `decode` must check every length against the
/// bytes it was given.
pub trait ControlMessage: Sized {
    /// The wire kind of this type.
    const KIND: u16;
    /// Appends the encoded message to `out`.
    fn encode(&self, out: &mut Vec<u8>);
    /// Decodes a message; malformed bytes are an [`Error::Protocol`].
    fn decode(bytes: &[u8]) -> Result<Self>;
}

impl ControlMessage for Vec<u8> {
    const KIND: u16 = 1;
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
    fn decode(bytes: &[u8]) -> Result<Self> {
        Ok(bytes.to_vec())
    }
}

impl ControlMessage for String {
    const KIND: u16 = 2;
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
    fn decode(bytes: &[u8]) -> Result<Self> {
        String::from_utf8(bytes.to_vec())
            .map_err(|e| Error::Protocol(format!("a String message is not UTF-8: {e}")))
    }
}

impl ControlMessage for RemoteRegion {
    const KIND: u16 = 3;
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&RemoteRegion::encode(self));
    }
    fn decode(bytes: &[u8]) -> Result<Self> {
        RemoteRegion::decode(bytes)
    }
}

impl ControlMessage for PeerAddr {
    const KIND: u16 = 4;
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.to_string().as_bytes());
    }
    fn decode(bytes: &[u8]) -> Result<Self> {
        std::str::from_utf8(bytes)
            .map_err(|e| Error::Protocol(format!("a PeerAddr message is not UTF-8: {e}")))?
            .parse()
    }
}

struct PeerConn {
    conn_id: u64,
    tx: mpsc::Sender<Vec<u8>>,
    tasks: Vec<AbortHandle>,
}

/// What a [`ControlPlane`] holds and has dropped ([`ControlPlane::stats`]). Counts are
/// since `bind`; "now" fields are a snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ControlPlaneStats {
    /// Ranks connected now.
    pub peers: u64,
    /// Messages received from peers and not yet taken by `recv`, now.
    pub queued_messages: u64,
    /// Bytes of those messages.
    pub queued_bytes: u64,
    /// Messages dropped on arrival because nobody receives their kind.
    pub dropped_unknown_kind: u64,
    /// Unreceived messages dropped because their rank left.
    pub dropped_departed: u64,
    /// Connections refused because the peer failed the pre-shared-secret authentication
    /// (or one side had a secret and the other none).
    pub auth_failures: u64,
}

/// Messages and bytes queued from one rank.
#[derive(Clone, Copy, Default)]
struct Queued {
    messages: usize,
    bytes: usize,
}

#[derive(Default)]
struct State {
    closed: bool,
    peers: HashMap<Rank, PeerConn>,
    /// Why each rank that was connected is no longer (at most `max_peers` entries).
    gone: HashMap<Rank, String>,
    inbox: HashMap<(Rank, u16), VecDeque<Vec<u8>>>,
    queued: HashMap<Rank, Queued>,
    /// Bytes queued from all ranks.
    queued_bytes: usize,
    /// Kinds whose messages are kept.
    kinds: HashSet<u16>,
    /// Bumped on every departure of a rank, so a late purge leaves a newer stay alone.
    departures: HashMap<Rank, u64>,
    dropped_unknown_kind: u64,
    dropped_departed: u64,
    auth_failures: u64,
    listeners: Vec<AbortHandle>,
}

impl State {
    /// Takes one message off the queue counts.
    fn dequeued(&mut self, rank: Rank, len: usize) {
        if let Some(q) = self.queued.get_mut(&rank) {
            q.messages -= 1;
            q.bytes -= len;
            if q.messages == 0 {
                self.queued.remove(&rank);
            }
        }
        self.queued_bytes -= len;
    }

    /// Drops every unreceived message from `rank`; returns how many and their bytes.
    fn purge(&mut self, rank: Rank) -> (usize, usize) {
        let q = self.queued.remove(&rank).unwrap_or_default();
        self.inbox.retain(|(r, _), _| *r != rank);
        self.queued_bytes -= q.bytes;
        self.dropped_departed += q.messages as u64;
        (q.messages, q.bytes)
    }

    /// Records that `rank` left and why; keeps at most `max` reasons.
    fn record_departure(&mut self, rank: Rank, why: String, max: usize) {
        if self.gone.len() >= max.max(1)
            && !self.gone.contains_key(&rank)
            && let Some(old) = self.gone.keys().next().copied()
        {
            self.gone.remove(&old);
        }
        self.gone.insert(rank, why);
        *self.departures.entry(rank).or_default() += 1;
    }

    /// The error for a rank that has no connection now.
    fn not_connected(&self, rank: Rank) -> Error {
        match self.gone.get(&rank) {
            Some(why) => Error::peer(
                format!("rank {rank}"),
                format!("disconnected ({why}); connect again to talk to it"),
            ),
            None => Error::peer(
                format!("rank {rank}"),
                "is not connected; call ControlPlane::connect or wait_for_peer first",
            ),
        }
    }
}

struct Inner {
    rank: Rank,
    config: ControlPlaneConfig,
    addrs: Vec<PeerAddr>,
    state: Watched<State>,
    next_conn: AtomicU64,
}

/// A process's endpoint in the control plane. Safe to share between threads (`Arc` it);
/// dropping it closes it.
pub struct ControlPlane {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("rank", &self.inner.rank)
            .field("addrs", &self.inner.addrs)
            .finish_non_exhaustive()
    }
}

impl ControlPlane {
    /// Binds as `rank`, listening on every address in `listen` (TCP and/or Unix; none for a
    /// process that only dials). Must be called inside a tokio runtime.
    pub async fn bind(
        rank: Rank,
        listen: &[PeerAddr],
        config: ControlPlaneConfig,
    ) -> Result<ControlPlane> {
        let listeners = listen
            .iter()
            .map(Listener::bind)
            .collect::<Result<Vec<_>>>()?;
        let addrs = listeners
            .iter()
            .map(Listener::local_addr)
            .collect::<Result<Vec<_>>>()?;
        let state = State {
            kinds: BUILTIN_KINDS.into_iter().collect(),
            ..State::default()
        };
        let inner = Arc::new(Inner {
            rank,
            config,
            addrs,
            state: Watched::new(state),
            next_conn: AtomicU64::new(1),
        });
        let handles = listeners
            .into_iter()
            .map(|l| tokio::spawn(accept_loop(inner.clone(), l)).abort_handle())
            .collect();
        inner.state.with(|s| s.listeners = handles);
        tracing::debug!(rank, addrs = ?inner.addrs, "control plane bound");
        Ok(ControlPlane { inner })
    }

    /// This process's rank.
    pub fn rank(&self) -> Rank {
        self.inner.rank
    }

    /// The addresses peers dial (with the ports the kernel chose for `:0`).
    pub fn local_addrs(&self) -> &[PeerAddr] {
        &self.inner.addrs
    }

    /// Keeps messages of type `T` that arrive before anyone calls `recv::<T>`. Messages of
    /// kinds that are neither built in, registered, nor asked for by a `recv` are dropped
    /// on arrival; register application kinds right after `bind`.
    pub fn register_kind<T: ControlMessage>(&self) {
        self.inner.state.with(|s| s.kinds.insert(T::KIND));
    }

    /// What this control plane holds now and has dropped.
    pub fn stats(&self) -> ControlPlaneStats {
        self.inner.state.with(|s| ControlPlaneStats {
            peers: s.peers.len() as u64,
            queued_messages: s.queued.values().map(|q| q.messages as u64).sum(),
            queued_bytes: s.queued_bytes as u64,
            dropped_unknown_kind: s.dropped_unknown_kind,
            dropped_departed: s.dropped_departed,
            auth_failures: s.auth_failures,
        })
    }

    /// The ranks connected now, in order.
    pub fn peers(&self) -> Vec<Rank> {
        let mut v: Vec<Rank> = self.inner.state.with(|s| s.peers.keys().copied().collect());
        v.sort_unstable();
        v
    }

    /// Dials `addr`, introduces this process, and checks that the listener is `rank`.
    pub async fn connect(&self, rank: Rank, addr: &PeerAddr, deadline: Deadline) -> Result<()> {
        let inner = &self.inner;
        if rank == inner.rank {
            return Err(Error::InvalidArgument(format!(
                "rank {rank} is this process's own rank; connect to another rank"
            )));
        }
        inner.state.with(|s| {
            if s.closed {
                Err(closed())
            } else if s.peers.contains_key(&rank) {
                Err(Error::peer(
                    format!("rank {rank}"),
                    "is already connected; use the existing connection",
                ))
            } else {
                Ok(())
            }
        })?;
        let start = std::time::Instant::now();
        let mut stream = Stream::connect(addr, deadline).await?;
        let handshake = dial_hello(inner, &mut stream);
        let answer = match tokio::time::timeout_at(deadline.instant().into(), handshake).await {
            Err(_) => {
                return Err(Error::DeadlineExceeded {
                    during: "control-plane HELLO",
                    elapsed: start.elapsed(),
                });
            }
            Ok(Err(e)) => {
                return Err(Error::peer(
                    format!("rank {rank} at {addr}"),
                    format!("HELLO failed: {e}; is an HMC control plane listening there?"),
                ));
            }
            Ok(Ok(Dialled::NotGenuine)) => {
                tracing::warn!(rank = inner.rank, peer = rank, %addr, "control-plane peer failed authentication");
                return Err(Error::peer(
                    format!("rank {rank} at {addr}"),
                    "failed authentication: its proof does not match this side's secret; \
                         both peers need the same ControlPlaneConfig::auth_secret",
                ));
            }
            Ok(Ok(Dialled::Answered(answer))) => answer,
        };
        check_answer(inner, rank, addr, &answer)?;
        attach(inner, rank, stream, None)?;
        tracing::debug!(rank = inner.rank, peer = rank, %addr, "control plane connected");
        Ok(())
    }

    /// Waits until `rank` is connected (by either side).
    pub async fn wait_for_peer(&self, rank: Rank, deadline: Deadline) -> Result<()> {
        self.inner
            .state
            .wait(deadline, "waiting for a control-plane peer", |s| {
                if s.closed {
                    Some(Err(closed()))
                } else if s.peers.contains_key(&rank) {
                    Some(Ok(()))
                } else {
                    None
                }
            })
            .await
    }

    /// Queues `msg` for `to`. Fails at once for an unknown rank or an oversized message;
    /// waits (until `deadline`) only while the peer's send queue is full.
    pub async fn send<T: ControlMessage>(
        &self,
        to: Rank,
        msg: &T,
        deadline: Deadline,
    ) -> Result<()> {
        let mut frame = vec![0u8; 6];
        msg.encode(&mut frame);
        let body = frame.len() - 6;
        let max = self.inner.config.max_frame_len;
        if body > max {
            return Err(Error::LimitExceeded {
                limit: "max_frame_len",
                value: body as u64,
                max: max as u64,
                hint: "raise ControlPlaneConfig::max_frame_len on both peers, or move large data \
                       with a Communicator"
                    .into(),
            });
        }
        frame[..4].copy_from_slice(&((body + 2) as u32).to_be_bytes());
        frame[4..6].copy_from_slice(&T::KIND.to_be_bytes());
        let tx = self.inner.state.with(|s| {
            if s.closed {
                return Err(closed());
            }
            s.peers
                .get(&to)
                .map(|p| p.tx.clone())
                .ok_or_else(|| s.not_connected(to))
        })?;
        let start = std::time::Instant::now();
        match tokio::time::timeout_at(deadline.instant().into(), tx.send(frame)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(self.inner.state.with(|s| {
                if s.closed {
                    closed()
                } else {
                    s.not_connected(to)
                }
            })),
            Err(_) => Err(Error::DeadlineExceeded {
                during: "control-plane send (the peer's queue of max_send_queue frames stayed full)",
                elapsed: start.elapsed(),
            }),
        }
    }

    /// Receives the next message of type `T` from `from` (and registers `T`'s kind, see
    /// [`ControlPlane::register_kind`]). Messages already received are delivered after the
    /// peer disconnects for [`ControlPlaneConfig::departed_retention`]; then the error
    /// says why it left.
    pub async fn recv<T: ControlMessage>(&self, from: Rank, deadline: Deadline) -> Result<T> {
        self.register_kind::<T>();
        let body = self
            .inner
            .state
            .wait(deadline, "control-plane receive", |s| {
                if s.closed {
                    return Some(Err(closed()));
                }
                if let Some(body) = s
                    .inbox
                    .get_mut(&(from, T::KIND))
                    .and_then(VecDeque::pop_front)
                {
                    s.dequeued(from, body.len());
                    return Some(Ok(body));
                }
                if s.peers.contains_key(&from) {
                    None
                } else {
                    Some(Err(s.not_connected(from)))
                }
            })
            .await?;
        T::decode(&body)
    }

    /// Drops the connection to `rank`; queued messages from it stay receivable for
    /// [`ControlPlaneConfig::departed_retention`].
    pub fn disconnect(&self, rank: Rank) -> Result<()> {
        let inner = &self.inner;
        let generation = inner.state.update(|s| {
            let peer = s.peers.remove(&rank).ok_or_else(|| s.not_connected(rank))?;
            peer.tasks.iter().for_each(AbortHandle::abort);
            s.record_departure(rank, "disconnected locally".into(), inner.config.max_peers);
            Ok(s.departures[&rank])
        })?;
        schedule_purge(inner, rank, generation);
        Ok(())
    }

    /// Closes every connection and listener. Every waiter, now and later, gets
    /// [`Error::Closed`]. Idempotent.
    pub fn close(&self) {
        close_inner(&self.inner);
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        close_inner(&self.inner);
    }
}

fn close_inner(inner: &Inner) {
    inner.state.update(|s| {
        if s.closed {
            return;
        }
        s.closed = true;
        for (_, p) in s.peers.drain() {
            p.tasks.iter().for_each(AbortHandle::abort);
        }
        s.listeners.drain(..).for_each(|h| h.abort());
        s.inbox.clear();
        s.queued.clear();
        s.queued_bytes = 0;
        tracing::debug!(rank = inner.rank, "control plane closed");
    });
}

fn closed() -> Error {
    Error::Closed("the control plane was closed".into())
}

#[cfg(test)]
mod tests {
    use super::hello::ack;
    use super::*;

    #[test]
    fn acks_carry_status_rank_and_a_bounded_reason() {
        let a = ack(1, 7, &"x".repeat(5000));
        assert_eq!(&a[..4], b"HMCP");
        assert_eq!(a[5], 1);
        assert_eq!(u32::from_be_bytes(a[6..10].try_into().unwrap()), 7);
        let n = u16::from_be_bytes([a[10], a[11]]) as usize;
        assert_eq!(n, MAX_REASON_LEN);
        assert_eq!(a.len(), ACK_FIXED_LEN + n);
    }

    #[test]
    fn builtin_messages_round_trip_and_refuse_bad_bytes() {
        let mut out = Vec::new();
        "héllo".to_string().encode(&mut out);
        assert_eq!(String::decode(&out).unwrap(), "héllo");
        assert!(String::decode(&[0xff, 0xfe]).is_err());
        let addr: PeerAddr = "tcp://127.0.0.1:9".parse().unwrap();
        let mut out = Vec::new();
        addr.encode(&mut out);
        assert_eq!(PeerAddr::decode(&out).unwrap(), addr);
        assert!(PeerAddr::decode(b"nonsense").is_err());
    }
}
