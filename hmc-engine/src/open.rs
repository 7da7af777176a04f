//! Run-time choice of the engine's transport (`transport = tcp | ucx | rdma | auto`), over
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
    /// `hmc-transport-rdma`: native verbs (`libibverbs.so.1` or `$HMC_IBVERBS_LIB`, the
    /// first device with an active port), loaded at run time.
    Rdma,
    /// UCX where it loads, TCP otherwise.
    #[default]
    Auto,
}

impl FromStr for EngineTransport {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "tcp" => Ok(EngineTransport::Tcp),
            "ucx" => Ok(EngineTransport::Ucx),
            "rdma" => Ok(EngineTransport::Rdma),
            "auto" => Ok(EngineTransport::Auto),
            other => Err(EngineError::InvalidArgument(format!(
                "transport `{other}`: use tcp, ucx, rdma or auto"
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
    let rdma = || -> Result<AnyCommunicator> {
        let c = hmc_transport_rdma::RdmaCommunicator::new(hmc_transport_rdma::RdmaConfig {
            bind: PeerAddr::Tcp(bind),
            ..Default::default()
        })?;
        Ok(AnyCommunicator::new(c))
    };
    match transport {
        EngineTransport::Tcp => tcp(),
        EngineTransport::Ucx => ucx(),
        EngineTransport::Rdma => rdma(),
        EngineTransport::Auto => ucx().or_else(|e| {
            tracing::info!(reason = %e, "UCX unavailable; the engine uses the TCP transport");
            tcp()
        }),
    }
}

impl Engine<AnyCommunicator> {
    /// Initializes an engine at `local` (`IP[:PORT]`) over the transport
    /// `config.transport` picks, its data plane on the same IP (HIXL's way: a string
    /// option map read by [`EngineConfig::from_options`], `transport=tcp|ucx|rdma|auto`). Must
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
        assert_eq!(
            "rdma".parse::<EngineTransport>().unwrap(),
            EngineTransport::Rdma
        );
        let e = "verbs".parse::<EngineTransport>().unwrap_err().to_string();
        assert!(e.contains("tcp, ucx, rdma or auto"), "{e}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn engines_from_an_option_map_move_bytes() {
        let opts: std::collections::HashMap<String, String> =
            [("transport".to_string(), "tcp".to_string())].into();
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
        // UCX or, where it does not load, TCP: either way a working transport.
        let auto = open_transport(EngineTransport::Auto, lo).unwrap();
        let id = hmc_core::Communicator::transport(&auto);
        assert!(id == hmc_core::TransportId::UCX || id == hmc_core::TransportId::TCP);
    }

    /// Two engines over RDMA, against the user-space libibverbs stand-in (not a NIC).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn engines_move_bytes_over_rdma_against_the_verbs_stand_in() {
        let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../target/tmp/ibverbs-standin");
        let lib = hmc_testshim::build_ibverbs_standin(&dir).expect("build the stand-in");
        let engine = || async {
            let c = hmc_transport_rdma::RdmaCommunicator::new(hmc_transport_rdma::RdmaConfig {
                library: Some(lib.clone()),
                ..Default::default()
            })
            .unwrap();
            Engine::initialize(
                Arc::new(AnyCommunicator::new(c)),
                "127.0.0.1",
                EngineConfig::default(),
            )
            .await
            .unwrap()
        };
        let (a, b) = (engine().await, engine().await);
        let src: Vec<u8> = (0..(1 << 20)).map(|i| (i * 7) as u8).collect();
        let dst = vec![0u8; 1 << 20];
        let desc = |b: &Vec<u8>| crate::MemDesc {
            addr: b.as_ptr() as u64,
            len: b.len(),
        };
        // SAFETY: both buffers outlive the engines' registrations (the engines drop first).
        unsafe {
            a.register_mem(desc(&src), crate::MemType::Host).unwrap();
            b.register_mem(desc(&dst), crate::MemType::Host).unwrap();
        }
        let t = std::time::Duration::from_secs(10);
        a.connect(b.name(), t).await.unwrap();
        let d = crate::TransferOpDesc {
            local_addr: src.as_ptr() as u64,
            remote_addr: dst.as_ptr() as u64,
            len: src.len(),
        };
        a.transfer(b.name(), crate::TransferOp::Write, &[d], t)
            .await
            .unwrap();
        assert!(dst == src, "bytes written over RDMA differ");
    }

    /// With the system's libibverbs: a NIC here opens, none (CI) is `Unavailable` saying why.
    #[tokio::test]
    async fn rdma_opens_a_nic_or_says_why_not() {
        match open_transport(EngineTransport::Rdma, [127, 0, 0, 1].into()) {
            Ok(c) => assert_eq!(
                hmc_core::Communicator::transport(&c),
                hmc_core::TransportId::RDMA
            ),
            Err(e) => assert!(e.to_string().contains("unavailable"), "{e}"),
        }
    }
}
