//! Whom an engine trusts with what a peer says: the dial rule for a data plane a peer
//! names (its host, an unprivileged port, a listener of the same user), the sender name of
//! a notification (from its connection, not its message), and which transport errors may
//! mean the peer restarted.

use hmc_core::PeerAddr;

use super::parse_engine_addr;
use crate::error::EngineError;

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
