//! Run-time choice of the engine's transport (`transport = tcp | ucx | shm | auto`), over
//! [`AnyCommunicator`]: the string-keyed way HIXL users pick one, and what the Python
//! package exposes.

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use hmc_core::{AnyCommunicator, PeerAddr};

use crate::config::EngineConfig;
use crate::engine::{Engine, parse_engine_addr};
use crate::error::{EngineError, Result};

/// Which transport moves an engine's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EngineTransport {
    /// `hmc-transport-tcp`: host memory, any network.
    Tcp,
    /// `hmc-transport-ucx` (UCX's own transports: `UCX_TLS`), loaded at run time.
    Ucx,
    /// `hmc-transport-shm` alone: cross-memory attach, peers on this host only.
    Shm,
    /// Shared memory (`hmc-transport-shm`) to peers on this host, and to the others UCX
    /// where it loads, TCP otherwise (`hmc_transport_shm::LocalFirst`). Every engine of a
    /// job must use the same setting.
    #[default]
    Auto,
}

impl FromStr for EngineTransport {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "tcp" => Ok(EngineTransport::Tcp),
            "ucx" => Ok(EngineTransport::Ucx),
            "shm" => Ok(EngineTransport::Shm),
            "auto" => Ok(EngineTransport::Auto),
            other => Err(EngineError::InvalidArgument(format!(
                "transport `{other}`: use tcp, ucx, shm or auto"
            ))),
        }
    }
}

/// Opens `transport` with its data plane on `ip` (port chosen by the system).
pub fn open_transport(transport: EngineTransport, ip: IpAddr) -> Result<AnyCommunicator> {
    let bind = SocketAddr::new(ip, 0);
    let tcp = || -> Result<AnyCommunicator> {
        let c = hmc_transport_tcp::TcpCommunicator::bind(&PeerAddr::Tcp(bind), Default::default())?;
        Ok(AnyCommunicator::new(c))
    };
    let ucx = || -> Result<AnyCommunicator> {
        let c = hmc_transport_ucx::UcxCommunicator::new(hmc_transport_ucx::UcxConfig {
            bind,
            ..hmc_transport_ucx::UcxConfig::default()
        })?;
        Ok(AnyCommunicator::new(c))
    };
    let shm = || hmc_transport_shm::ShmCommunicator::bind(Default::default());
    match transport {
        EngineTransport::Tcp => tcp(),
        EngineTransport::Ucx => ucx(),
        EngineTransport::Shm => Ok(AnyCommunicator::new(shm()?)),
        EngineTransport::Auto => {
            let net = ucx().or_else(|e| {
                tracing::info!(reason = %e, "UCX unavailable; the engine uses the TCP transport");
                tcp()
            })?;
            Ok(AnyCommunicator::new(match shm() {
                Ok(shm) => hmc_transport_shm::LocalFirst::new(net, shm),
                Err(e) => {
                    tracing::warn!(reason = %e, "shared memory unavailable; peers on this host use the network transport too");
                    hmc_transport_shm::LocalFirst::net_only(net)
                }
            }))
        }
    }
}

impl Engine<AnyCommunicator> {
    /// Initializes an engine at `local` (`IP[:PORT]`) over the transport
    /// `config.transport` picks, its data plane on the same IP (HIXL's way: a string
    /// option map read by [`EngineConfig::from_options`], `transport=tcp|ucx|auto`). Must
    /// run inside a tokio runtime.
    pub async fn initialize_with(local: &str, config: EngineConfig) -> Result<Self> {
        let transport = config.transport;
        let ip = match parse_engine_addr(local, Some(0))? {
            PeerAddr::Tcp(a) => a.ip(),
            // A Unix-socket engine's data plane stays on this host.
            _ => IpAddr::from([127, 0, 0, 1]),
        };
        let comm = open_transport(transport, ip)?;
        Engine::initialize(Arc::new(comm), local, config).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transports_parse_and_unknown_ones_say_what_exists() {
        assert_eq!(
            "tcp".parse::<EngineTransport>().unwrap(),
            EngineTransport::Tcp
        );
        assert_eq!(
            "auto".parse::<EngineTransport>().unwrap(),
            EngineTransport::Auto
        );
        let e = "rdma".parse::<EngineTransport>().unwrap_err().to_string();
        assert!(e.contains("tcp, ucx, shm or auto"), "{e}");
    }

    #[rstest::rstest]
    #[case::tcp("tcp")]
    #[case::shm("shm")]
    #[case::auto("auto")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn engines_from_an_option_map_move_bytes(#[case] transport: &str) {
        let opts: std::collections::HashMap<String, String> =
            [("transport".to_string(), transport.to_string())].into();
        let config = EngineConfig::from_options(&opts).unwrap();
        let a = Engine::initialize_with("127.0.0.1", config.clone())
            .await
            .unwrap();
        let b = Engine::initialize_with("127.0.0.1", config).await.unwrap();
        let src = vec![5u8; 4096];
        let dst = vec![0u8; 4096];
        let desc = |b: &Vec<u8>| crate::MemDesc {
            addr: b.as_ptr() as u64,
            len: 4096,
        };
        // SAFETY: both buffers outlive the engines' registrations (the engines drop first).
        unsafe {
            a.register_mem(desc(&src), crate::MemType::Host).unwrap();
            b.register_mem(desc(&dst), crate::MemType::Host).unwrap();
        }
        let t = std::time::Duration::from_secs(5);
        a.connect(b.name(), t).await.unwrap();
        let d = crate::TransferOpDesc {
            local_addr: src.as_ptr() as u64,
            remote_addr: dst.as_ptr() as u64,
            len: 4096,
        };
        a.transfer(b.name(), crate::TransferOp::Write, &[d], t)
            .await
            .unwrap();
        assert_eq!(dst, src);
    }

    #[tokio::test]
    async fn auto_opens_a_transport_and_tcp_is_always_there() {
        let lo: IpAddr = [127, 0, 0, 1].into();
        let tcp = open_transport(EngineTransport::Tcp, lo).unwrap();
        assert_eq!(
            hmc_core::Communicator::transport(&tcp),
            hmc_core::TransportId::TCP
        );
        // Shared memory to this host's peers, UCX or TCP to the others.
        let auto = open_transport(EngineTransport::Auto, lo).unwrap();
        let id = hmc_core::Communicator::transport(&auto);
        assert_eq!(id, hmc_core::TransportId::LOCAL_FIRST);
    }
}
