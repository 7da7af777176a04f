//! Run-time choice of the HMC_BUFFER data plane for the binaries (`--data-plane ucx|tcp|none`):
//! one code path over [`AnyCommunicator`].

use std::net::{IpAddr, SocketAddr};

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
}

/// Opens the chosen data plane listening on `bind` (port chosen by the system). Must run
/// inside a tokio runtime (the TCP transport starts its responder there).
pub fn open_data_plane(kind: DataPlaneKind, bind: IpAddr) -> Result<Option<AnyCommunicator>> {
    match kind {
        DataPlaneKind::None => Ok(None),
        DataPlaneKind::Tcp => {
            let addr = PeerAddr::Tcp(SocketAddr::new(bind, 0));
            let c = hmc_transport_tcp::TcpCommunicator::bind(&addr, Default::default())?;
            Ok(Some(AnyCommunicator::new(c)))
        }
        DataPlaneKind::Ucx => open_ucx(bind),
    }
}

fn open_ucx(bind: IpAddr) -> Result<Option<AnyCommunicator>> {
    // UCX_TLS (when set) chooses UCX's transports, as it does for ucx_perftest.
    let c = hmc_transport_ucx::UcxCommunicator::new(hmc_transport_ucx::UcxConfig {
        bind: SocketAddr::new(bind, 0),
        ..Default::default()
    })?;
    Ok(Some(AnyCommunicator::new(c)))
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
}
