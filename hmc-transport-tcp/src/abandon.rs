//! Making an abandoned WRITE final at the target: each served data connection's apply gate, found by the initiator's address, and the initiator's record of the connections it gave up on.
//!
//! An initiator that gives up on a WRITE mid-way resets its connection (the drop rule of
//! `crate::endpoint`'s `ConnLease` for a WRITE, `Unfinished::Abandon`). The target checks
//! for that reset before each `recvmsg` into the registered region, but a reset does not
//! empty the target's receive queue: a responder descheduled between its check and its `recvmsg` would still apply what its
//! socket holds, after the initiator reported the end. So the check and the `recvmsg` (or,
//! for device memory, the copy out of a staging chunk) run under the connection's [`Gate`],
//! and an ABANDON request (`crate::wire::REQ_ABANDON`) sent over another connection from
//! the same initiator sets the gate's flag under the same lock: once it is answered, the
//! `recvmsg` in progress (if any) is over and no other starts.
//!
//! Connections are named by the initiator's address and port as the target sees them, so
//! only TCP connections can be abandoned this way (a Unix socket's dialler is unnamed), and
//! only from the same IP address: a peer cannot abandon another peer's connections.
//! Between the two, a NAT that rewrites the initiator's IP address makes every ABANDON a
//! refusal (so `settle` fails and says so); one that keeps the address but rewrites ports
//! would make the target answer 0 for a connection it does not know, which no test covers.
//! The kernel may also hand a reset connection's port to a new connection to the same
//! target before its ABANDON arrives: the ABANDON then closes the new one too (its next
//! request fails), never the connection that asked.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::net::Stream;

/// One served data connection's apply gate: `true` once an ABANDON named it. Held (never
/// across an `.await`) for each check-then-apply of a WRITE's bytes into registered memory.
pub(crate) type Gate = Arc<Mutex<bool>>;

/// The gates of the data connections being served, by the initiator's address and port.
#[derive(Default)]
pub(crate) struct Gates {
    by_peer: Mutex<HashMap<SocketAddr, Vec<(u64, Gate)>>>,
    next: AtomicU64,
}

/// A connection's gate, registered under its peer's address while the connection is
/// served; unregistered on drop.
pub(crate) struct Registered<'a> {
    gates: &'a Gates,
    peer: Option<SocketAddr>,
    id: u64,
    pub(crate) gate: Gate,
}

impl Gates {
    /// Registers a gate for a connection from `peer` (`None`: a Unix socket, which no
    /// ABANDON can name; it still gets a gate, never set).
    pub(crate) fn register(&self, peer: Option<SocketAddr>) -> Registered<'_> {
        let peer = peer.map(canonical);
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let gate = Gate::default();
        if let Some(addr) = peer {
            self.by_peer
                .lock()
                .entry(addr)
                .or_default()
                .push((id, gate.clone()));
        }
        Registered {
            gates: self,
            peer,
            id,
            gate,
        }
    }

    /// The gates registered under `addr`, but `asking`'s own: the connections an ABANDON
    /// over `asking` names. Usually one; more only where the kernel reused the port of a
    /// connection the target has not finished with.
    pub(crate) fn named(&self, addr: SocketAddr, asking: &Registered<'_>) -> Vec<Gate> {
        self.by_peer
            .lock()
            .get(&canonical(addr))
            .map(|v| {
                v.iter()
                    .filter(|(id, _)| *id != asking.id)
                    .map(|(_, g)| g.clone())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let Some(addr) = self.peer else { return };
        let mut map = self.gates.by_peer.lock();
        if let Some(v) = map.get_mut(&addr) {
            v.retain(|(id, _)| *id != self.id);
            if v.is_empty() {
                map.remove(&addr);
            }
        }
    }
}

/// `addr` with an IPv4-mapped IPv6 address as the IPv4 address it maps: how a dual-stack
/// listener sees an IPv4 peer, and how that peer names its own side.
pub(crate) fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

/// The error a responder ends a WRITE with once its initiator abandoned it.
pub(crate) fn abandoned() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionReset,
        "the initiator abandoned this WRITE; the rest of it is not applied",
    )
}

/// Runs `apply` (one `recvmsg` into registered memory) under `gate`'s lock, unless the
/// initiator abandoned the connection: by an ABANDON (the gate's flag) or by resetting it
/// ([`Stream::abandoned_by_peer`]). Both are checked inside the lock, so an ABANDON that has
/// been answered leaves no `recvmsg` in progress and lets none start.
pub(crate) fn apply<T>(gate: &Gate, stream: &Stream, apply: impl FnOnce() -> T) -> io::Result<T> {
    let flag = gate.lock();
    if *flag || stream.abandoned_by_peer() {
        return Err(abandoned());
    }
    Ok(apply())
}

/// Sets the flag of each of `gates`, each under its lock: waits out a `recvmsg` (or a
/// staged chunk's copy) in progress, on a blocking thread so that no worker waits.
pub(crate) async fn close_gates(gates: Vec<Gate>) {
    if gates.is_empty() {
        return;
    }
    let set = tokio::task::spawn_blocking(move || {
        for g in gates {
            *g.lock() = true;
        }
    });
    // The closure cannot panic; a cancelled blocking task only happens at runtime
    // shutdown, when no responder runs either.
    let _ = set.await;
}

/// The longest address text an ABANDON carries (an IPv6 address with scope and port fits).
pub(crate) const MAX_ADDR_TEXT: usize = 64;

/// The ABANDON request naming the connection this side had at `local`.
pub(crate) fn encode_request(local: SocketAddr) -> Vec<u8> {
    let text = local.to_string();
    let mut out = Vec::with_capacity(2 + text.len());
    out.push(crate::wire::REQ_ABANDON);
    out.push(text.len() as u8);
    out.extend_from_slice(text.as_bytes());
    out
}

/// Connections an endpoint gave up on in the middle of a WRITE, not yet abandoned at the
/// target: the initiator's side of [`hmc_core::Communicator::settle`].
#[derive(Default)]
pub(crate) struct Pending {
    /// The connections' local addresses; `None` for a Unix socket, which cannot be named.
    pub(crate) conns: Vec<Option<SocketAddr>>,
}

impl Pending {
    /// At most this many are kept: older ones are forgotten (a settle that could not reach
    /// the target returns them here to be tried again, so a target that never answers
    /// would otherwise make the list grow).
    pub(crate) const MAX: usize = 1024;

    pub(crate) fn push(&mut self, conn: Option<SocketAddr>) {
        if self.conns.len() >= Self::MAX {
            self.conns.remove(0);
        }
        self.conns.push(conn);
    }
}
