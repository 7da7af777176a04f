//! Run-time choice of the HMC_BUFFER data plane for the binaries
//! (`--data-plane tcp|ucx|shm|auto|none`):
//! one code path over [`AnyCommunicator`].

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use hmc_core::{AnyCommunicator, PeerAddr, Result};

/// Which data plane carries HMC_BUFFER payloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DataPlaneKind {
    /// None: large payloads travel TCP_STREAM.
    None,
    /// `hmc-transport-tcp`'s `TcpCommunicator`.
    Tcp,
    /// `hmc-transport-ucx`'s `UcxCommunicator` (`UCX_TLS` chooses UCX's transports).
    Ucx,
    /// `hmc-transport-shm`'s `ShmCommunicator`: cross-memory attach, clients on this host
    /// only.
    Shm,
    /// Shared memory to clients on this host and, to the others, UCX where it loads and
    /// TCP otherwise (`hmc_transport_shm::LocalFirst`). Both sides must choose `auto`.
    Auto,
}

/// What the binaries may set on the data plane they open.
#[derive(Clone, Debug, Default)]
pub struct PlaneOptions {
    /// The TCP data plane authenticates every connection with this pre-shared secret
    /// (`--data-plane-auth-secret-file`; both sides need the same). Off by default; set it
    /// for anything beyond loopback.
    pub auth_secret_file: Option<PathBuf>,
}

/// Opens the chosen data plane listening on `bind` (port chosen by the system) with
/// default [`PlaneOptions`]. Must run inside a tokio runtime (the TCP transport starts its
/// responder there).
pub fn open_data_plane(kind: DataPlaneKind, bind: IpAddr) -> Result<Option<AnyCommunicator>> {
    open_data_plane_with(kind, bind, &PlaneOptions::default())
}

/// [`open_data_plane`] with options. The RPC data plane moves payloads one-sided and never
/// reads notifications, so both transports are opened with `max_pending_notifications`
/// 0: a peer's NOTIFY is refused (TCP) or dropped (UCX) instead of queued for no reader.
pub fn open_data_plane_with(
    kind: DataPlaneKind,
    bind: IpAddr,
    options: &PlaneOptions,
) -> Result<Option<AnyCommunicator>> {
    let only_tcp = |what: &str| {
        if options.auth_secret_file.is_some() {
            return Err(hmc_core::Error::InvalidArgument(format!(
                "--data-plane-auth-secret-file applies to the tcp data plane only; {what} has no such authentication here"
            )));
        }
        Ok(())
    };
    match kind {
        DataPlaneKind::None => Ok(None),
        DataPlaneKind::Tcp => Ok(Some(AnyCommunicator::new(open_tcp(bind, options)?))),
        DataPlaneKind::Ucx => {
            only_tcp("UCX")?;
            Ok(Some(AnyCommunicator::new(open_ucx(bind)?)))
        }
        DataPlaneKind::Shm => {
            only_tcp("shared memory (it admits processes of this user only)")?;
            Ok(Some(AnyCommunicator::new(open_shm()?)))
        }
        DataPlaneKind::Auto => {
            // UCX where it loads, unless a TCP secret was asked for.
            let net = match options.auth_secret_file {
                Some(_) => AnyCommunicator::new(open_tcp(bind, options)?),
                None => match open_ucx(bind) {
                    Ok(c) => AnyCommunicator::new(c),
                    Err(e) => {
                        tracing::info!(reason = %e, "UCX unavailable; the data plane uses TCP");
                        AnyCommunicator::new(open_tcp(bind, options)?)
                    }
                },
            };
            let lf = match open_shm() {
                Ok(shm) => hmc_transport_shm::LocalFirst::new(net, shm),
                Err(e) => {
                    tracing::warn!(reason = %e, "shared memory unavailable; clients on this host use the network data plane");
                    hmc_transport_shm::LocalFirst::net_only(net)
                }
            };
            Ok(Some(AnyCommunicator::new(lf)))
        }
    }
}

fn open_tcp(bind: IpAddr, options: &PlaneOptions) -> Result<hmc_transport_tcp::TcpCommunicator> {
    let addr = PeerAddr::Tcp(SocketAddr::new(bind, 0));
    let auth_secret = options
        .auth_secret_file
        .as_deref()
        .map(hmc_transport_tcp::AuthSecret::from_file)
        .transpose()?;
    let config = hmc_transport_tcp::TcpConfig {
        max_pending_notifications: 0,
        auth_secret,
        ..Default::default()
    };
    hmc_transport_tcp::TcpCommunicator::bind(&addr, config)
}

fn open_shm() -> Result<hmc_transport_shm::ShmCommunicator> {
    hmc_transport_shm::ShmCommunicator::bind(hmc_transport_shm::ShmConfig {
        max_pending_notifications: 0,
        ..Default::default()
    })
}

fn open_ucx(bind: IpAddr) -> Result<hmc_transport_ucx::UcxCommunicator> {
    // UCX_TLS (when set) chooses UCX's transports, as it does for ucx_perftest.
    // Nobody reads notifications on the RPC data plane: queue none.
    let c = hmc_transport_ucx::UcxCommunicator::new(hmc_transport_ucx::UcxConfig {
        bind: SocketAddr::new(bind, 0),
        max_pending_notifications: 0,
        ..hmc_transport_ucx::UcxConfig::from_env()
    })?;
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn none_is_none_and_tcp_listens() {
        let lo: IpAddr = [127, 0, 0, 1].into();
        assert!(open_data_plane(DataPlaneKind::None, lo).unwrap().is_none());
        let c = open_data_plane(DataPlaneKind::Tcp, lo).unwrap().unwrap();
        assert!(
            hmc_core::Communicator::address(&c)
                .to_string()
                .starts_with("tcp://127.0.0.1:")
        );
    }

    #[tokio::test]
    async fn the_tcp_plane_queues_no_notifications_and_takes_a_secret_file() {
        use hmc_core::{Communicator, Deadline};
        let lo: IpAddr = [127, 0, 0, 1].into();
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "0123456789abcdef0123\n").unwrap();
        let options = PlaneOptions {
            auth_secret_file: Some(secret),
        };
        let a = open_data_plane_with(DataPlaneKind::Tcp, lo, &options)
            .unwrap()
            .unwrap();
        let b = open_data_plane_with(DataPlaneKind::Tcp, lo, &options)
            .unwrap()
            .unwrap();
        // An authenticated peer may NOTIFY without a key, and is still refused: nobody
        // reads notifications on an RPC data plane.
        let ep = a.connect(&b.address(), Deadline::default()).await.unwrap();
        let e = a
            .notify(&ep, 1, b"x", Deadline::default())
            .await
            .expect_err("refused");
        assert!(e.to_string().contains("max_pending_notifications"), "{e}");
        // Without the secret, the connection is refused.
        let c = open_data_plane(DataPlaneKind::Tcp, lo).unwrap().unwrap();
        let e = match c.connect(&b.address(), Deadline::default()).await {
            Ok(ep) => c
                .notify(&ep, 1, b"x", Deadline::default())
                .await
                .expect_err("no secret, no service"),
            Err(e) => e,
        };
        assert!(e.to_string().contains("authentication"), "{e}");
    }
}
