//! Whom an engine trusts with what a peer says: the dial rule for a data plane a peer
//! names (its host, an unprivileged port, a listener of the same user), the sender name of
//! a notification (from its connection, not its message), which transport errors may
//! mean the peer restarted; and the access rule, what an op needs of the memory on each
//! side.

use hmc_core::{Access, PeerAddr};

use super::parse_engine_addr;
use crate::TransferOp;
use crate::error::{EngineError, Result};

/// Whose memory an access check is about.
#[derive(Clone, Copy, Debug)]
pub(super) enum Holder<'a> {
    /// This engine's.
    Local,
    /// The peer's of this name.
    Peer(&'a str),
}

/// The access rule: a READ reads the peer's memory and writes this engine's, a WRITE the
/// reverse. Memory `holder` registered for `has` that `op` cannot use is refused with
/// `AccessDenied` (before a byte moves: every caller checks all of a transfer's memory
/// first); `what` names the memory in the refusal (`0x1000+64`).
pub(super) fn check_access(
    op: TransferOp,
    holder: Holder<'_>,
    has: Access,
    what: impl FnOnce() -> String,
) -> Result<()> {
    let (remote_needs, local_needs) = match op {
        TransferOp::Read => (Access::READ, Access::WRITE),
        TransferOp::Write => (Access::WRITE, Access::READ),
    };
    let why = match holder {
        Holder::Peer(_) if has.allows(remote_needs) => return Ok(()),
        Holder::Local if has.allows(local_needs) => return Ok(()),
        Holder::Peer(peer) => format!(
            "{peer} registered {} for {has:?}; a {op:?} needs {remote_needs:?} there",
            what()
        ),
        Holder::Local => {
            let why = if local_needs == Access::WRITE {
                "it is registered read-only, and a Read writes into it: register a writable buffer as the target"
            } else {
                "it is not registered for reading, and a Write reads it"
            };
            format!("local memory {} ({has:?}): {why}", what())
        }
    };
    Err(EngineError::Transport(hmc_core::Error::AccessDenied(
        format!("{why} (nothing was moved)"),
    )))
}

/// May a peer's data plane at `dp` be dialled, given that its metadata service is at
/// `meta`? Only on the host the caller chose to connect to.
pub(super) fn same_host(meta: &PeerAddr, dp: &PeerAddr) -> bool {
    match (meta, dp) {
        (PeerAddr::Tcp(m), PeerAddr::Tcp(d)) => {
            m.ip() == d.ip() || (m.ip().is_loopback() && d.ip().is_loopback())
        }
        (PeerAddr::Unix(_), PeerAddr::Tcp(d)) => d.ip().is_loopback(),
        (PeerAddr::Unix(_), PeerAddr::Unix(_)) => true,
        (PeerAddr::Tcp(m), PeerAddr::Unix(_)) => m.ip().is_loopback(),
        _ => false,
    }
}

/// The rest of the dial rule for a peer's data plane (the RPC data plane's): a TCP port
/// from 1024, and on this host a listener (or Unix socket) of the user whose metadata
/// service named it, so that a peer cannot point this engine at another local service.
pub(super) fn check_data_plane(meta: &PeerAddr, dp: &PeerAddr) -> std::result::Result<(), String> {
    use hmc_transport_kit::owner;
    let meta_uid = || match meta {
        PeerAddr::Tcp(m) => owner::listener_uid(*m),
        PeerAddr::Unix(p) => owner::socket_file_uid(p).ok(),
        _ => None,
    };
    match dp {
        PeerAddr::Tcp(d) => {
            if d.port() < 1024 {
                return Err(format!("port {} is privileged (< 1024)", d.port()));
            }
            if !owner::canonical_ip(d.ip()).is_loopback() {
                return Ok(());
            }
            match (owner::listener_uid(*d), meta_uid()) {
                (Some(a), Some(b)) if a == b => Ok(()),
                (Some(a), Some(b)) => Err(format!(
                    "the listener there belongs to uid {a}, the engine's metadata service to uid {b}"
                )),
                (None, _) => Err("nothing listens there on this host".into()),
                (_, None) => {
                    Err("cannot tell which user runs the engine's metadata service".into())
                }
            }
        }
        PeerAddr::Unix(p) => match (owner::socket_file_uid(p)?, meta_uid()) {
            (a, Some(b)) if a == b => Ok(()),
            (a, Some(b)) => Err(format!(
                "the socket belongs to uid {a}, the engine's metadata service to uid {b}"
            )),
            (_, None) => Err("cannot tell which user runs the engine's metadata service".into()),
        },
        // Transport-specific addresses (UCX worker addresses, ...) are the transport's to
        // dial; it reaches only what its own protocol answers.
        _ => Ok(()),
    }
}

/// The name a peer's notifications are delivered under: what it said at its metadata
/// request, when that is consistent with the connection (an engine address must be on the
/// connection's own IP), else the connection's own address.
pub(super) fn sender_name(conn: &hmc_rpc::Connection, claimed: &str) -> String {
    match (parse_engine_addr(claimed, None), conn.peer_ip()) {
        (Ok(PeerAddr::Tcp(a)), Some(ip)) => {
            let (a, ip) = (
                hmc_transport_kit::owner::canonical_ip(a.ip()),
                hmc_transport_kit::owner::canonical_ip(ip),
            );
            if a == ip || (a.is_loopback() && ip.is_loopback()) {
                claimed.to_string()
            } else {
                conn.peer().to_string()
            }
        }
        // A name (etcd) or a Unix-socket engine: as claimed, on this connection only.
        _ if !claimed.is_empty() && claimed.len() <= 255 => claimed.to_string(),
        _ => conn.peer().to_string(),
    }
}

/// A transport error that may mean the peer process is gone or replaced (its
/// connections refused, reset or closed), as opposed to a refusal of the request itself.
pub(super) fn broken_peer(e: &EngineError) -> bool {
    match e {
        EngineError::Transport(hmc_core::Error::Io { source, .. }) => matches!(
            source.kind(),
            std::io::ErrorKind::ConnectionRefused
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::BrokenPipe
                | std::io::ErrorKind::UnexpectedEof
                | std::io::ErrorKind::NotConnected
        ),
        EngineError::Transport(hmc_core::Error::Peer { .. }) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case::read_into_read_only(TransferOp::Read, Holder::Local, Access::READ, Some("read-only"))]
    #[case::write_from_write_only(
        TransferOp::Write,
        Holder::Local,
        Access::WRITE,
        Some("not registered for reading")
    )]
    #[case::write_to_read_only(
        TransferOp::Write,
        Holder::Peer("b"),
        Access::READ,
        Some("b registered 0x1000+8 for Access(READ); a Write needs Access(WRITE) there")
    )]
    #[case::read_from_write_only(
        TransferOp::Read,
        Holder::Peer("b"),
        Access::WRITE,
        Some("a Read needs Access(READ)")
    )]
    #[case::read_into_writable(TransferOp::Read, Holder::Local, Access::READ_WRITE, None)]
    #[case::write_to_writable(TransferOp::Write, Holder::Peer("b"), Access::WRITE, None)]
    fn the_access_rule_refuses_before_moving(
        #[case] op: TransferOp,
        #[case] holder: Holder<'_>,
        #[case] has: Access,
        #[case] refused: Option<&str>,
    ) {
        let r = check_access(op, holder, has, || "0x1000+8".into());
        match (r, refused) {
            (Ok(()), None) => {}
            (Err(EngineError::Transport(hmc_core::Error::AccessDenied(m))), Some(want)) => {
                assert!(
                    m.contains(want) && m.ends_with("(nothing was moved)"),
                    "{m}"
                )
            }
            (r, want) => panic!("{r:?}, wanted a refusal with {want:?}"),
        }
    }

    #[rstest]
    #[case::same_ip("tcp://10.0.0.1:5000", "tcp://10.0.0.1:6000", true)]
    #[case::other_ip("tcp://10.0.0.1:5000", "tcp://10.0.0.2:6000", false)]
    #[case::loopback_pair("tcp://127.0.0.1:5000", "tcp://[::1]:6000", true)]
    #[case::unix_to_loopback("unix:///run/e.sock", "tcp://127.0.0.1:6000", true)]
    #[case::unix_to_remote("unix:///run/e.sock", "tcp://10.0.0.2:6000", false)]
    #[case::remote_to_unix("tcp://10.0.0.1:5000", "unix:///run/dp.sock", false)]
    fn a_data_plane_is_dialled_only_on_the_engines_host(
        #[case] meta: &str,
        #[case] dp: &str,
        #[case] ok: bool,
    ) {
        assert_eq!(same_host(&meta.parse().unwrap(), &dp.parse().unwrap()), ok);
    }
}
