//! Run-time choice of the engine's transport (`transport = tcp | ucx | shm | rdma | auto | NAME`), over
//! [`AnyCommunicator`]: the string-keyed way HIXL users pick one, and what the Python
//! package exposes. Any other name is a transport plugin's, resolved by hmc-plugin's
//! registry on `HMC_PLUGIN_PATH`.

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use hmc_core::{AnyCommunicator, PeerAddr};
use hmc_plugin::{OpenOptions, PluginConfig, TransportRegistry};

use crate::config::EngineConfig;
use crate::engine::{Engine, parse_engine_addr};
use crate::error::{EngineError, Result};

/// Which transport moves an engine's bytes.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
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
    /// `hmc-transport-rdma`: native verbs (`libibverbs.so.1` or `$HMC_IBVERBS_LIB`, the
    /// first device with an active port), loaded at run time.
    Rdma,
    #[default]
    Auto,
    /// A transport plugin by its name (or `NAME://IP`), found on `HMC_PLUGIN_PATH`.
    Named(String),
}

impl FromStr for EngineTransport {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "tcp" => Ok(EngineTransport::Tcp),
            "ucx" => Ok(EngineTransport::Ucx),
            "shm" => Ok(EngineTransport::Shm),
            "rdma" => Ok(EngineTransport::Rdma),
            "auto" => Ok(EngineTransport::Auto),
            "" => Err(EngineError::InvalidArgument(
                "an empty transport name: use tcp, ucx, shm, rdma, auto or a transport plugin's name"
                    .into(),
            )),
            other => Ok(EngineTransport::Named(other.to_string())),
        }
    }
}

/// Opens `transport` with its data plane on `ip` (port chosen by the system); plugins are
/// searched on `HMC_PLUGIN_PATH` only.
pub fn open_transport(transport: EngineTransport, ip: IpAddr) -> Result<AnyCommunicator> {
    open_transport_with(transport, ip, &PluginConfig::default())
}

/// [`open_transport`], searching `plugins`' path for a named transport too.
pub fn open_transport_with(
    transport: EngineTransport,
    ip: IpAddr,
    plugins: &PluginConfig,
) -> Result<AnyCommunicator> {
    open_inner(
        transport,
        ip,
        plugins,
        Default::default(),
        Default::default(),
    )
}

/// The transport `config` names, as [`crate::Engine::initialize_with`] opens it: with
/// `config.auth_secret` the TCP transport authenticates every data-plane connection;
/// without one it refuses this host's other users (`same_user_only`). The shared-memory
/// transport admits only this user by construction (a socket of mode 0600); UCX, RDMA and
/// plugins get their keys only through the (authenticated) metadata exchange.
pub fn open_transport_for(config: &EngineConfig, ip: IpAddr) -> Result<AnyCommunicator> {
    let plugins = PluginConfig {
        search_path: config.plugin_path.clone(),
    };
    let tcp = hmc_transport_tcp::TcpConfig {
        auth_secret: config.auth_secret.clone(),
        same_user_only: true,
        // The engine's notifications go through its metadata service; it never reads the
        // transport's own queue, which would only hold what peers pile into it.
        max_pending_notifications: 0,
        max_staging_bytes: config.max_staging_bytes,
        staging_chunk: config.staging_chunk_bytes,
        ..Default::default()
    };
    let shm = hmc_transport_shm::ShmConfig {
        copy_threads: config.copy_threads,
        ..Default::default()
    };
    open_inner(config.transport.clone(), ip, &plugins, tcp, shm)
}

fn open_inner(
    transport: EngineTransport,
    ip: IpAddr,
    plugins: &PluginConfig,
    tcp_config: hmc_transport_tcp::TcpConfig,
    shm_config: hmc_transport_shm::ShmConfig,
) -> Result<AnyCommunicator> {
    // Queues of transport notifications, for the transports below: none where the TCP
    // config says none (an engine's transports; see `open_transport_for`).
    let notify_queue = if tcp_config.max_pending_notifications == 0 {
        0
    } else {
        4096
    };
    let bind = SocketAddr::new(ip, 0);
    #[cfg(feature = "ucx")]
    let max_staging_bytes = tcp_config.max_staging_bytes;
    let tcp = move || -> hmc_core::Result<AnyCommunicator> {
        let c = hmc_transport_tcp::TcpCommunicator::bind(&PeerAddr::Tcp(bind), tcp_config.clone())?;
        Ok(AnyCommunicator::new(c))
    };
    #[cfg(feature = "ucx")]
    let ucx = move || -> hmc_core::Result<AnyCommunicator> {
        let c = hmc_transport_ucx::UcxCommunicator::new(hmc_transport_ucx::UcxConfig {
            bind,
            max_pending_notifications: notify_queue,
            max_staging_bytes,
            ..hmc_transport_ucx::UcxConfig::default()
        })?;
        Ok(AnyCommunicator::new(c))
    };
    #[cfg(not(feature = "ucx"))]
    let ucx = move || -> hmc_core::Result<AnyCommunicator> {
        let _ = bind;
        Err(hmc_core::Error::Unavailable {
            what: "the UCX transport".into(),
            reason: "this build of hmc-engine leaves out its `ucx` feature".into(),
            hint: "build hmc-engine with its `ucx` feature (a default one), or choose tcp".into(),
        })
    };
    let shm = || {
        hmc_transport_shm::ShmCommunicator::bind(hmc_transport_shm::ShmConfig {
            max_pending_notifications: notify_queue,
            ..shm_config.clone()
        })
    };
    let rdma = move || -> hmc_core::Result<AnyCommunicator> {
        let c = hmc_transport_rdma::RdmaCommunicator::new(hmc_transport_rdma::RdmaConfig {
            bind: PeerAddr::Tcp(bind),
            max_pending_notifications: notify_queue,
            ..Default::default()
        })?;
        Ok(AnyCommunicator::new(c))
    };
    match transport {
        EngineTransport::Tcp => Ok(tcp()?),
        EngineTransport::Ucx => Ok(ucx()?),
        EngineTransport::Shm => Ok(AnyCommunicator::new(shm()?)),
        EngineTransport::Rdma => Ok(rdma()?),
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
        EngineTransport::Named(name) => {
            // Only plugins reach here (the built-in names parse to their own variants);
            // the built-ins are registered so that an unknown name lists every choice.
            let mut registry = TransportRegistry::discover(plugins);
            registry
                .register_builtin("tcp", "hmc-transport-tcp", move |_| tcp())
                .register_builtin("ucx", "hmc-transport-ucx", move |_| ucx())
                .register_builtin("shm", "hmc-transport-shm", |_| {
                    Err(hmc_core::Error::Unsupported(
                        "`shm` is opened by its own variant".into(),
                    ))
                })
                .register_builtin("rdma", "hmc-transport-rdma", move |_| rdma())
                .register_builtin(
                    "auto",
                    "shared memory on this host, the network otherwise",
                    |_| {
                        Err(hmc_core::Error::Unsupported(
                            "`auto` is opened by its own variant".into(),
                        ))
                    },
                )
                .set_search_hint(
                    "transport plugins are found on HMC_PLUGIN_PATH and in the engine's \
                     `plugin_path` option (`:`-separated files or folders; Python: \
                     initialize(addr, {\"plugin_path\": ...})); hmc-plugin-kit checks one",
                );
            Ok(registry.open(&name, &OpenOptions::new(ip))?)
        }
    }
}

impl Engine<AnyCommunicator> {
    /// Initializes an engine at `local` (`IP[:PORT]`) over the transport
    /// `config.transport` picks, its data plane on the same IP (HIXL's way: a string
    /// option map read by [`EngineConfig::from_options`], `transport=tcp|ucx|rdma|auto`). Must
    /// run inside a tokio runtime.
    pub async fn initialize_with(local: &str, config: EngineConfig) -> Result<Self> {
        let ip = match parse_engine_addr(local, Some(0))? {
            PeerAddr::Tcp(a) => a.ip(),
            // A Unix-socket engine's data plane stays on this host.
            _ => IpAddr::from([127, 0, 0, 1]),
        };
        let comm = open_transport_for(&config, ip)?;
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
        assert!("".parse::<EngineTransport>().is_err());
        let lo: IpAddr = [127, 0, 0, 1].into();
        let e = open_transport(EngineTransport::Named("nosuch".into()), lo)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no transport named `nosuch`; known: tcp, ucx, shm, rdma, auto")
                && e.contains("`plugin_path` option"),
            "{e}"
        );
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
            a.register_mem(
                desc(&src),
                crate::MemType::Host,
                hmc_core::Access::READ_WRITE,
            )
            .unwrap();
            b.register_mem(
                desc(&dst),
                crate::MemType::Host,
                hmc_core::Access::READ_WRITE,
            )
            .unwrap();
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
            a.register_mem(
                desc(&src),
                crate::MemType::Host,
                hmc_core::Access::READ_WRITE,
            )
            .unwrap();
            b.register_mem(
                desc(&dst),
                crate::MemType::Host,
                hmc_core::Access::READ_WRITE,
            )
            .unwrap();
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
