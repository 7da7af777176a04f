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
//! Connections are named by the initiator's side of them as the target sees it ([`ConnName`]):
//! a TCP connection by its address and port, a Unix-socket one by the abstract address
//! the initiator's socket is bound to before it dials (the kernel picks a unique one:
//! Linux's autobind, see `crate::net`). An ABANDON may name only a connection of the same
//! IP address (TCP) or of the same user (Unix sockets, by the peers' credentials): a peer
//! cannot abandon another peer's connections. A dialler of an older version, whose Unix
//! socket is unnamed, leaves nothing to name: its `settle` answers `Unsupported`.
//! Between the two, a NAT that rewrites the initiator's IP address makes every ABANDON a
//! refusal (so `settle` fails and says so); one that keeps the address but rewrites ports
//! would make the target answer 0 for a connection it does not know, which no test covers.
//! The kernel may also hand a reset connection's port to a new connection to the same
//! target before its ABANDON arrives: the ABANDON then closes the new one too (its next
//! request fails), never the connection that asked.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::conn_name::{ConnName, Holder};
use crate::net::Stream;

/// One served data connection's apply gate: `true` once an ABANDON named it. Held (never
/// across an `.await`) for each check-then-apply of a WRITE's bytes into registered memory.
pub(crate) type Gate = Arc<Mutex<bool>>;

/// The gates of the data connections being served, by the initiator's side of them.
#[derive(Default)]
pub(crate) struct Gates {
    by_peer: Mutex<HashMap<ConnName, Vec<Served>>>,
    next: AtomicU64,
}

/// One served connection under its name: its registration's id, who holds its other end,
/// and its gate.
struct Served {
    id: u64,
    holder: Option<Holder>,
    gate: Gate,
}

/// A connection's gate, registered under its initiator's side while the connection is
/// served; unregistered on drop.
pub(crate) struct Registered<'a> {
    gates: &'a Gates,
    peer: Option<ConnName>,
    id: u64,
    /// Who holds the connection's other end (`None`: unknown, which no ABANDON matches).
    pub(crate) holder: Option<Holder>,
    pub(crate) gate: Gate,
}

impl Gates {
    /// Registers a gate for a connection from `peer`, held by `holder` (`peer` `None`: an
    /// unnamed Unix socket, which no ABANDON can name; it still gets a gate, never set).
    pub(crate) fn register(
        &self,
        peer: Option<ConnName>,
        holder: Option<Holder>,
    ) -> Registered<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let gate = Gate::default();
        if let Some(name) = &peer {
            self.by_peer
                .lock()
                .entry(name.clone())
                .or_default()
                .push(Served {
                    id,
                    holder,
                    gate: gate.clone(),
                });
        }
        Registered {
            gates: self,
            peer,
            id,
            holder,
            gate,
        }
    }

    /// The gates registered under `name` and held by the same peer as `asking`, but
    /// `asking`'s own: the connections an ABANDON over `asking` names. Usually one; more
    /// only where the kernel reused the port of a connection the target has not finished
    /// with.
    pub(crate) fn named(&self, name: &ConnName, asking: &Registered<'_>) -> Vec<Gate> {
        let Some(holder) = asking.holder else {
            return Vec::new();
        };
        self.by_peer
            .lock()
            .get(name)
            .map(|v| {
                v.iter()
                    .filter(|c| c.id != asking.id && c.holder == Some(holder))
                    .map(|c| c.gate.clone())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let Some(addr) = &self.peer else { return };
        let mut map = self.gates.by_peer.lock();
        if let Some(v) = map.get_mut(addr) {
            v.retain(|c| c.id != self.id);
            if v.is_empty() {
                map.remove(addr);
            }
        }
    }
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

/// The longest address text an ABANDON carries (an IPv6 address with scope and port
/// fits, and a Unix socket's abstract address of up to 29 bytes in hex).
pub(crate) const MAX_ADDR_TEXT: usize = 64;

/// The ABANDON request naming the connection this side had at `local`.
pub(crate) fn encode_request(local: &ConnName) -> Vec<u8> {
    let text = local.to_text();
    debug_assert!(text.len() <= MAX_ADDR_TEXT, "{text}");
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
    /// The connections' names on this side; `None` for one that has none (an unnamed
    /// Unix socket, or one whose name could not be read).
    pub(crate) conns: Vec<Option<ConnName>>,
}

impl Pending {
    /// At most this many are kept: older ones are forgotten (a settle that could not reach
    /// the target returns them here to be tried again, so a target that never answers
    /// would otherwise make the list grow).
    pub(crate) const MAX: usize = 1024;

    pub(crate) fn push(&mut self, conn: Option<ConnName>) {
        if self.conns.len() >= Self::MAX {
            self.conns.remove(0);
        }
        self.conns.push(conn);
    }
}
