//! `tracing` spans that let one call's log lines be joined across client and server.
//!
//! A call's **request id** is on the wire already (header bytes 8..16, chosen by the
//! client, unique on its connection for the client's lifetime: `Client` and `DirectClient`
//! never reuse one, reconnects included), so no new carrier is needed. Both sides record
//! it, with the address that tells connections apart:
//!
//! - client: span `rpc.call` with `method`, `server` (the address dialled), and, once the
//!   call is sent, `request_id` and `local` (this connection's own socket address; empty
//!   for a Unix socket);
//! - server: span `rpc.conn` with `peer` (the client's socket address, `unix uid=N` for
//!   a Unix socket) around each connection, and within it `rpc.handle` with `request_id`
//!   and `method` around each handler, whichever way it runs (inline, as a task, on a
//!   blocking worker, after an HMC_BUFFER pull).
//!
//! A client line under `rpc.call{request_id=17 local=10.0.0.2:53422}` and a server line
//! under `rpc.conn{peer=10.0.0.2:53422}:rpc.handle{request_id=17}` are the same call. Over
//! Unix sockets the peer is named by uid only, so the request id joins one client's calls.
//!
//! The spans are at DEBUG level (`RUST_LOG=hmc_rpc=debug`): below that no span is made
//! (each macro checks its callsite's cached interest first and returns a disabled span,
//! which neither allocates nor formats its fields), which the test below asserts; the
//! client's local address is not even looked up then.

use std::fmt;
use std::net::SocketAddr;

use hmc_core::PeerAddr;
use tracing::Span;
use tracing::field::Empty;

use crate::data_plane::RpcPeer;

/// A client call's span: `request_id` and `local` are recorded by [`sent`].
pub(crate) fn call(server: &PeerAddr, method: u32) -> Span {
    tracing::debug_span!(
        "rpc.call",
        method,
        server = %server,
        request_id = Empty,
        local = Empty
    )
}

/// Records what identifies a call on the wire once it has an id and a connection (`local`
/// is asked only for a live span: it may be a system call).
pub(crate) fn sent(span: &Span, request_id: u64, local: impl FnOnce() -> Option<SocketAddr>) {
    if span.is_disabled() {
        return;
    }
    span.record("request_id", request_id);
    if let Some(local) = local() {
        span.record("local", tracing::field::display(local));
    }
}

/// Logs a failed call within its span (at DEBUG, like the span).
pub(crate) fn finished<T>(span: &Span, r: &Result<T, crate::CallError>) {
    if let Err(e) = r {
        tracing::debug!(parent: span, error = %e, "call failed");
    }
}

/// A server connection's span.
pub(crate) fn conn(peer: &RpcPeer) -> Span {
    tracing::debug_span!("rpc.conn", peer = %PeerName(peer))
}

/// A handler's span, a child of the current (connection) span.
pub(crate) fn handle(request_id: u64, method: u32) -> Span {
    tracing::debug_span!("rpc.handle", request_id, method)
}

/// How a connection's peer is named in `rpc.conn`.
struct PeerName<'a>(&'a RpcPeer);

impl fmt::Display for PeerName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            RpcPeer::Tcp { peer, .. } => write!(f, "{peer}"),
            RpcPeer::Unix { uid: Some(uid) } => write!(f, "unix uid={uid}"),
            RpcPeer::Unix { uid: None } => f.write_str("unix"),
            RpcPeer::Unknown => f.write_str("unknown"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::level_filters::LevelFilter;
    use tracing_subscriber::layer::SubscriberExt;

    fn all_spans() -> [Span; 3] {
        let server: PeerAddr = "tcp://127.0.0.1:7000".parse().unwrap();
        let peer = RpcPeer::Tcp {
            peer: "127.0.0.1:5000".parse().unwrap(),
            local: "127.0.0.1:7000".parse().unwrap(),
        };
        [call(&server, 1), conn(&peer), handle(7, 1)]
    }

    // One test, in this order: callsite interest is global to the process, so a DEBUG
    // subscriber registered by a test running beside these would make spans elsewhere.
    #[test]
    fn spans_are_made_at_debug_only() {
        for s in all_spans() {
            assert!(s.is_disabled(), "without a subscriber: {s:?}");
        }
        let info = tracing_subscriber::registry().with(LevelFilter::INFO);
        tracing::subscriber::with_default(info, || {
            for s in all_spans() {
                assert!(s.is_disabled(), "at INFO: {s:?}");
            }
        });
        let debug = tracing_subscriber::registry().with(LevelFilter::DEBUG);
        tracing::subscriber::with_default(debug, || {
            for s in all_spans() {
                assert!(!s.is_disabled(), "at DEBUG: {s:?}");
            }
        });
    }
}
