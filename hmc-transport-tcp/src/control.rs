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
//! queued for the peer's writer task; it is not an acknowledgement. Incoming messages wait
//! in memory until received; past [`ControlPlaneConfig::max_queued_per_peer`] the reader
//! stops reading, so a slow receiver pushes back on the sender through TCP.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hmc_core::{Deadline, Error, PeerAddr, RemoteRegion, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use crate::net::{Listener, Stream};
use crate::wait::Watched;

/// A process's number in the control plane.
pub type Rank = u32;

const HELLO_MAGIC: [u8; 4] = *b"HMCP";
const HELLO_VERSION: u8 = 1;
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

#[derive(Default)]
struct State {
    closed: bool,
    peers: HashMap<Rank, PeerConn>,
    /// Why each rank that was connected is no longer.
    gone: HashMap<Rank, String>,
    inbox: HashMap<(Rank, u16), VecDeque<Vec<u8>>>,
    queued: HashMap<Rank, usize>,
    listeners: Vec<AbortHandle>,
}

impl State {
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
        let inner = Arc::new(Inner {
            rank,
            config,
            addrs,
            state: Watched::new(State::default()),
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
        let handshake = async {
            let mut hello = Vec::with_capacity(HELLO_LEN);
            hello.extend_from_slice(&HELLO_MAGIC);
            hello.push(HELLO_VERSION);
            hello.extend_from_slice(&inner.rank.to_be_bytes());
            stream.write_all(&hello).await?;
            let mut fixed = [0u8; ACK_FIXED_LEN];
            stream.read_exact(&mut fixed).await?;
            let reason_len = u16::from_be_bytes([fixed[10], fixed[11]]) as usize;
            let mut reason = vec![0u8; reason_len.min(MAX_REASON_LEN)];
            stream.read_exact(&mut reason).await?;
            Ok::<_, std::io::Error>((fixed, reason))
        };
        let (fixed, reason) =
            match tokio::time::timeout_at(deadline.instant().into(), handshake).await {
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
                Ok(Ok(ack)) => ack,
            };
        if fixed[..4] != HELLO_MAGIC || fixed[4] != HELLO_VERSION {
            return Err(Error::Protocol(format!(
                "{addr} did not answer with an HMC control-plane HELLO (version {HELLO_VERSION})"
            )));
        }
        let their_rank = Rank::from_be_bytes(fixed[6..10].try_into().expect("4 bytes"));
        if fixed[5] != 0 {
            return Err(Error::peer(
                format!("rank {rank} at {addr}"),
                format!(
                    "refused the connection: {}",
                    String::from_utf8_lossy(&reason)
                ),
            ));
        }
        if their_rank != rank {
            return Err(Error::peer(
                format!("rank {rank}"),
                format!("{addr} is rank {their_rank}, not rank {rank}; check the address"),
            ));
        }
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

    /// Receives the next message of type `T` from `from`. Messages already received are
    /// delivered even after the peer disconnects; then the error says why it left.
    pub async fn recv<T: ControlMessage>(&self, from: Rank, deadline: Deadline) -> Result<T> {
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
                    if let Some(n) = s.queued.get_mut(&from) {
                        *n -= 1;
                    }
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

    /// Drops the connection to `rank`; queued messages from it stay receivable.
    pub fn disconnect(&self, rank: Rank) -> Result<()> {
        self.inner.state.update(|s| {
            let peer = s.peers.remove(&rank).ok_or_else(|| s.not_connected(rank))?;
            peer.tasks.iter().for_each(AbortHandle::abort);
            s.gone.insert(rank, "disconnected locally".into());
            Ok(())
        })
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
        tracing::debug!(rank = inner.rank, "control plane closed");
    });
}

fn closed() -> Error {
    Error::Closed("the control plane was closed".into())
}

/// Makes `stream` the connection to `rank` and starts its reader and writer. `first`, when
/// given, is written before any message (the listener's HELLO answer). Refuses a rank that
/// is already connected, atomically with the insertion.
fn attach(inner: &Arc<Inner>, rank: Rank, stream: Stream, first: Option<Vec<u8>>) -> Result<()> {
    inner.state.update(|s| {
        if s.closed {
            return Err(closed());
        }
        if s.peers.contains_key(&rank) {
            return Err(Error::peer(
                format!("rank {rank}"),
                "is already connected; the existing connection is kept",
            ));
        }
        let conn_id = inner.next_conn.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(inner.config.max_send_queue.max(1));
        let (r, w) = tokio::io::split(stream);
        let writer = tokio::spawn(write_loop(inner.clone(), rank, conn_id, w, rx, first));
        let reader = tokio::spawn(read_loop(inner.clone(), rank, conn_id, r));
        s.gone.remove(&rank);
        s.peers.insert(
            rank,
            PeerConn {
                conn_id,
                tx,
                tasks: vec![writer.abort_handle(), reader.abort_handle()],
            },
        );
        Ok(())
    })
}

/// Forgets connection `conn_id` to `rank` (if it is still the current one) and records why.
fn detach(inner: &Inner, rank: Rank, conn_id: u64, why: String) {
    inner.state.update(|s| {
        if s.peers.get(&rank).is_some_and(|p| p.conn_id == conn_id) {
            let p = s.peers.remove(&rank).expect("checked");
            p.tasks.iter().for_each(AbortHandle::abort);
            tracing::info!(rank = inner.rank, peer = rank, %why, "control-plane peer left");
            s.gone.insert(rank, why);
        }
    });
}

async fn write_loop(
    inner: Arc<Inner>,
    rank: Rank,
    conn_id: u64,
    mut w: WriteHalf<Stream>,
    mut rx: mpsc::Receiver<Vec<u8>>,
    first: Option<Vec<u8>>,
) {
    let result = async {
        if let Some(bytes) = first {
            w.write_all(&bytes).await?;
        }
        while let Some(frame) = rx.recv().await {
            w.write_all(&frame).await?;
        }
        w.shutdown().await
    }
    .await;
    if let Err(e) = result {
        detach(&inner, rank, conn_id, format!("send failed: {e}"));
    }
}

async fn read_loop(inner: Arc<Inner>, rank: Rank, conn_id: u64, mut r: ReadHalf<Stream>) {
    let max_frame = inner.config.max_frame_len;
    let max_queued = inner.config.max_queued_per_peer.max(1);
    let why = loop {
        // Backpressure: stop reading while the application has not caught up.
        let room = inner
            .state
            .wait(
                Deadline::after(FOREVER),
                "control-plane backpressure",
                |s| {
                    (s.closed || s.queued.get(&rank).copied().unwrap_or(0) < max_queued)
                        .then_some(Ok(()))
                },
            )
            .await;
        if room.is_err() {
            break "the receive queue stayed full".to_string();
        }
        let mut len = [0u8; 4];
        if let Err(e) = r.read_exact(&mut len).await {
            break if crate::net::is_disconnect(&e) {
                "the peer closed the connection".to_string()
            } else {
                format!("receive failed: {e}")
            };
        }
        let len = u32::from_be_bytes(len) as usize;
        if len < 2 || len - 2 > max_frame {
            tracing::warn!(
                rank = inner.rank,
                peer = rank,
                len,
                max_frame,
                "control-plane peer sent an oversized or empty frame; disconnecting it"
            );
            break format!(
                "protocol violation: a frame of {len} bytes is outside 2..={} \
                 (max_frame_len {max_frame}); both peers must use the same max_frame_len",
                max_frame + 2
            );
        }
        let mut frame = vec![0u8; len];
        if let Err(e) = r.read_exact(&mut frame).await {
            break format!("receive failed mid-frame: {e}");
        }
        let kind = u16::from_be_bytes([frame[0], frame[1]]);
        frame.drain(..2);
        inner.state.update(|s| {
            s.inbox.entry((rank, kind)).or_default().push_back(frame);
            *s.queued.entry(rank).or_default() += 1;
        });
    };
    detach(&inner, rank, conn_id, why);
}

async fn accept_loop(inner: Arc<Inner>, listener: Listener) {
    loop {
        match listener.accept().await {
            Ok(stream) => {
                tokio::spawn(handshake(inner.clone(), stream));
            }
            Err(e) => {
                // Out of file descriptors and the like: keep serving, but do not spin.
                tracing::warn!(rank = inner.rank, error = %e, "control-plane accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

fn ack(status: u8, rank: Rank, reason: &str) -> Vec<u8> {
    let reason = &reason.as_bytes()[..reason.len().min(MAX_REASON_LEN)];
    let mut out = Vec::with_capacity(ACK_FIXED_LEN + reason.len());
    out.extend_from_slice(&HELLO_MAGIC);
    out.push(HELLO_VERSION);
    out.push(status);
    out.extend_from_slice(&rank.to_be_bytes());
    out.extend_from_slice(&(reason.len() as u16).to_be_bytes());
    out.extend_from_slice(reason);
    out
}

/// Reads an accepted connection's HELLO and admits or refuses it.
async fn handshake(inner: Arc<Inner>, mut stream: Stream) {
    let mut hello = [0u8; HELLO_LEN];
    let read = tokio::time::timeout(inner.config.hello_timeout, stream.read_exact(&mut hello));
    let refusal = match read.await {
        Err(_) => {
            tracing::warn!(
                rank = inner.rank,
                timeout = ?inner.config.hello_timeout,
                "dropping a control-plane connection that sent no HELLO in time (hello_timeout)"
            );
            return;
        }
        Ok(Err(e)) => {
            tracing::debug!(rank = inner.rank, error = %e, "connection closed before its HELLO");
            return;
        }
        Ok(Ok(_)) if hello[..4] != HELLO_MAGIC => {
            tracing::warn!(
                rank = inner.rank,
                "dropping a connection that is not an HMC control-plane peer (bad HELLO magic)"
            );
            return;
        }
        Ok(Ok(_)) if hello[4] != HELLO_VERSION => Some(format!(
            "control-plane version {} is not supported (this side speaks {HELLO_VERSION})",
            hello[4]
        )),
        Ok(Ok(_)) => None,
    };
    let rank = Rank::from_be_bytes(hello[5..9].try_into().expect("4 bytes"));
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
        None => match attach(&inner, rank, stream, Some(ack(0, inner.rank, ""))) {
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
    let _ = stream.write_all(&ack(1, inner.rank, &refusal)).await;
    let _ = stream.shutdown().await;
}

#[cfg(test)]
mod tests {
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
