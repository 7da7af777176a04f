//! Who may speak on an accepted connection: the `auth_secret` exchange, the
//! `same_user_only` rule for local peers, the GOAWAY a refused connection gets, and each
//! connection's share of `max_inflight_total`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::Shared;
use crate::data_plane::RpcPeer;
use crate::dispatch::Connection;
use crate::frame::{FrameHeader, FrameKind, Status};
use crate::net::Stream;

/// Who may speak on an accepted connection: with an `auth_secret`, a client that proves it
/// holds it; without one and `same_user_only`, a local client of this user (or root), or a
/// client on another host. `None`: refused (logged, counted, the connection closed).
pub(super) async fn admit(
    mut stream: Stream,
    peer: &RpcPeer,
    id: u64,
    shared: &Shared,
) -> Option<(Stream, Connection)> {
    let (desc, ip) = match peer {
        RpcPeer::Tcp { peer, .. } => (format!("tcp://{peer}"), Some(peer.ip())),
        RpcPeer::Unix { uid: Some(u) } => (format!("unix (uid {u})"), None),
        _ => ("unknown".to_string(), None),
    };
    let verdict = match &shared.config.auth_secret {
        Some(secret) => stream
            .authenticate_server(secret, shared.config.auth_timeout)
            .await
            .map(|()| true),
        None if shared.config.same_user_only => {
            hmc_transport_kit::owner::admit_local_peer(stream.local_peer()).map(|()| false)
        }
        None => Ok(false),
    };
    match verdict {
        Ok(authenticated) => Some((stream, Connection::new(id, desc, ip, authenticated))),
        Err(why) => {
            shared.refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(peer = %desc, %why, "RPC connection refused");
            if shared.config.auth_secret.is_some() {
                // A client without a secret reads this as the server's goodbye, and
                // learns what to set; one with the wrong secret has its own message.
                goaway(&stream, Status::UNAUTHENTICATED, &format!("refused: {why}"));
                // What the client already sent is read (briefly) before the close, so
                // that the kernel does not reset the connection over unread bytes and
                // lose the GOAWAY.
                stream.drain_briefly(Duration::from_millis(200)).await;
            }
            None
        }
    }
}

pub(super) fn refuse_connection(stream: &Stream, max: usize) {
    let why = format!(
        "limit `max_connections` ({max}) reached; retry later or raise the server's ServerConfig::max_connections"
    );
    goaway(stream, Status::OVERLOADED, &why);
    tracing::warn!("{why}");
}

/// Writes a GOAWAY with `status` and `why`, as far as the socket takes it at once.
fn goaway(stream: &Stream, status: Status, why: &str) {
    let mut h = FrameHeader::new(FrameKind::GoAway, 0);
    h.status = status;
    h.body_len = why.len() as u32;
    h.payload_len = why.len() as u64;
    let mut b = h.encode().to_vec();
    b.extend_from_slice(why.as_bytes());
    let _ = stream.try_write(&b);
}

/// Each connection's share of `max_inflight_total`: once three quarters of it are taken, a
/// connection already holding its share (the total over the connections with calls in
/// flight, itself included) gets no more, so that one connection cannot take what the
/// others need; alone, a connection may take it all. `Some` says why a call is refused.
pub(super) fn over_share(shared: &Shared, conn: &Connection) -> Option<String> {
    let total = shared.config.max_inflight_total;
    if shared.inflight.available_permits() > total / 4 {
        return None;
    }
    let mine = conn.calls();
    let active = shared.active.load(Ordering::Relaxed) + usize::from(mine == 0);
    let share = (total / active.max(1)).max(1);
    (mine >= share).then(|| {
        format!(
            "limit `max_inflight_total` ({total}) nearly reached, and this connection holds its share ({share}: the total over {active} connections with calls in flight); retry later or raise the server's max_inflight_total"
        )
    })
}

/// A call counted in its connection's calls in flight, and the connection among the active
/// ones while it has any, until dropped (with the call's permit).
pub(super) struct CountedCall {
    conn: Connection,
    active: Arc<AtomicUsize>,
}

impl CountedCall {
    pub(super) fn start(conn: &Connection, active: &Arc<AtomicUsize>) -> Self {
        if conn.call_started() {
            active.fetch_add(1, Ordering::AcqRel);
        }
        CountedCall {
            conn: conn.clone(),
            active: active.clone(),
        }
    }
}

impl Drop for CountedCall {
    fn drop(&mut self) {
        if self.conn.call_ended() {
            self.active.fetch_sub(1, Ordering::AcqRel);
        }
    }
}
