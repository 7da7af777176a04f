//! Run-time choice of the engine's transport (`transport = tcp | ucx | shm | rdma | auto | NAME`), over
//! [`AnyCommunicator`]: the string-keyed way HIXL users pick one, and what the Python
//! package exposes. The name is `hmc-transports`' [`TransportName`] and is opened by its
//! one [`hmc_transports::open`], as the binaries open theirs; this module only turns an
//! [`EngineConfig`] into that function's options. Any other name is a transport plugin's,
//! resolved by hmc-plugin's registry on `HMC_PLUGIN_PATH` and the `plugin_path` option.

use std::net::IpAddr;
use std::sync::Arc;

use hmc_core::{AnyCommunicator, PeerAddr};
use hmc_transports::Options;

use crate::config::EngineConfig;
use crate::engine::{Engine, parse_engine_addr};
use crate::error::Result;

/// Which transport moves an engine's bytes: `hmc-transports`' one name for every program.
pub use hmc_transports::TransportName as EngineTransport;

/// Opens `transport` with its data plane on `ip` (port chosen by the system), with the
/// transports' defaults and the environment; plugins are searched on `HMC_PLUGIN_PATH`
/// only.
pub fn open_transport(transport: EngineTransport, ip: IpAddr) -> Result<AnyCommunicator> {
    open_transport_with(transport, ip, &Options::from_env())
}

/// [`open_transport`] with the options `hmc-transports` takes.
pub fn open_transport_with(
    transport: EngineTransport,
    ip: IpAddr,
    options: &Options,
) -> Result<AnyCommunicator> {
    Ok(hmc_transports::open(&transport, ip, options)?)
}

/// What the engine asks of a transport, from `config` and the environment (read once).
///
/// With `config.auth_secret` the TCP transport authenticates every data-plane connection;
/// without one it refuses this host's other users (`same_user_only`). The shared-memory
/// transport admits only this user by construction (a socket of mode 0600); UCX, RDMA and
/// plugins get their keys only through the (authenticated) metadata exchange. Settings of
/// a transport this build leaves out are not set (its options have no place for them).
pub fn transport_options(config: &EngineConfig) -> Options {
    let mut options = Options::from_env();
    // The engine's notifications go through its metadata service; it never reads the
    // transports' own queues, which would only hold what peers pile into them.
    options.max_pending_notifications = Some(0);
    options.max_staging_bytes = Some(config.max_staging_bytes);
    #[cfg(feature = "tcp")]
    {
        options.tcp.auth_secret = config.auth_secret.clone();
        options.tcp.same_user_only = true;
        options.tcp.staging_chunk = config.staging_chunk_bytes;
    }
    #[cfg(feature = "shm")]
    {
        options.shm.copy_threads = config.copy_threads;
    }
    #[cfg(feature = "ucx")]
    {
        options.ucx.drain_timeout = config.ucx_drain_timeout;
        options.ucx.abandon_timeout = config.ucx_abandon_timeout;
    }
    #[cfg(feature = "plugin")]
    {
        options.plugins.search_path = config.plugin_path.clone();
    }
    options.faults = config.faults.clone();
    options.plugin_search_hint = Some(
        "transport plugins are found on HMC_PLUGIN_PATH and in the engine's `plugin_path` \
         option (`:`-separated files or folders; Python: initialize(addr, {\"plugin_path\": \
         ...})); hmc-plugin-kit checks one"
            .into(),
    );
    options
}

/// The transport `config` names, as [`crate::Engine::initialize_with`] opens it
/// ([`transport_options`]).
pub fn open_transport_for(config: &EngineConfig, ip: IpAddr) -> Result<AnyCommunicator> {
    open_transport_with(config.transport.clone(), ip, &transport_options(config))
}

/// `config` with the fault plan its transport will be opened with
/// ([`hmc_transports::fault_plan`]: the `faults` option, else `HMC_FAULTS`, else the
/// default spec for a `faulty:NAME` transport), so that the engine's notifications and
/// metadata lookups draw from the transport's plan.
pub(crate) fn with_fault_plan(mut config: EngineConfig) -> Result<EngineConfig> {
    config.faults = hmc_transports::fault_plan(&config.transport, &transport_options(&config))?;
    Ok(config)
}

impl Engine<AnyCommunicator> {
    /// Initializes an engine at `local` (`IP[:PORT]`) over the transport
    /// `config.transport` picks, its data plane on the same IP (HIXL's way: a string
    /// option map read by [`EngineConfig::from_options`], `transport=tcp|ucx|rdma|auto`). Must
    /// run inside a tokio runtime. With faults asked for (the `faults` option, `HMC_FAULTS` or
    /// a `faulty:NAME` transport), the transport injects them and the engine's
    /// `config.faults` holds the plan it draws from.
    pub async fn initialize_with(local: &str, config: EngineConfig) -> Result<Self> {
        let ip = match parse_engine_addr(local, Some(0))? {
            PeerAddr::Tcp(a) => a.ip(),
            // A Unix-socket engine's data plane stays on this host.
            _ => IpAddr::from([127, 0, 0, 1]),
        };
        let config = with_fault_plan(config)?;
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
        let config = EngineConfig {
            transport: EngineTransport::Named("nosuch".into()),
            ..EngineConfig::default()
        };
        let e = open_transport_for(&config, lo).unwrap_err().to_string();
        assert!(
            e.contains("no transport named `nosuch`; known: tcp, ucx, shm, rdma, auto")
                && e.contains("`plugin_path` option"),
            "{e}"
        );
    }

    /// Two engines from `a` and `b`, `a` holding 4096 bytes of 5 and `b` 4096 zeros, both
    /// registered, `a` connected to `b`. The engines are declared first: they drop (and
    /// deregister) before the buffers.
    struct Two {
        a: Engine<AnyCommunicator>,
        b: Engine<AnyCommunicator>,
        src: Vec<u8>,
        dst: Vec<u8>,
    }

    impl Two {
        async fn new(a: EngineConfig, b: EngineConfig) -> Two {
            let a = Engine::initialize_with("127.0.0.1", a).await.unwrap();
            let b = Engine::initialize_with("127.0.0.1", b).await.unwrap();
            let (src, dst) = (vec![5u8; 4096], vec![0u8; 4096]);
            let desc = |b: &Vec<u8>| crate::MemDesc {
                addr: b.as_ptr() as u64,
                len: 4096,
            };
            // SAFETY: both buffers outlive the engines' registrations (`Two` drops the
            // engines first).
            unsafe {
                for (engine, buf) in [(&a, &src), (&b, &dst)] {
                    engine
                        .register_mem(
                            desc(buf),
                            crate::MemType::Host,
                            hmc_core::Access::READ_WRITE,
                        )
                        .unwrap();
                }
            }
            a.connect(b.name(), std::time::Duration::from_secs(5))
                .await
                .unwrap();
            Two { a, b, src, dst }
        }

        /// `a` WRITEs its 4096 bytes into `b`'s.
        async fn write(&self) -> Result<()> {
            let d = crate::TransferOpDesc {
                local_addr: self.src.as_ptr() as u64,
                remote_addr: self.dst.as_ptr() as u64,
                len: 4096,
            };
            let t = std::time::Duration::from_secs(5);
            self.a
                .transfer(self.b.name(), crate::TransferOp::Write, &[d], t)
                .await
        }
    }

    fn options(pairs: &[(&str, &str)]) -> EngineConfig {
        let opts: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        EngineConfig::from_options(&opts).unwrap()
    }

    #[rstest::rstest]
    #[case::tcp("tcp")]
    #[case::shm("shm")]
    #[case::auto("auto")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn engines_from_an_option_map_move_bytes(#[case] transport: &str) {
        let config = options(&[("transport", transport)]);
        let two = Two::new(config.clone(), config).await;
        two.write().await.unwrap();
        assert_eq!(two.dst, two.src);
    }

    /// The `faults` option reaches the transport: the plan's first transfer fails, moving
    /// nothing, and the next moves the bytes. A `faulty:` name alone gets the default spec.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_faults_option_reaches_the_engines_transport() {
        let faulty = options(&[
            ("transport", "faulty:tcp"),
            ("faults", "seed=2;xfer.fail=first:1"),
        ]);
        let two = Two::new(faulty, options(&[("transport", "tcp")])).await;
        let e = two.write().await.unwrap_err();
        assert!(e.to_string().contains("xfer.fail"), "{e}");
        assert!(
            two.dst.iter().all(|b| *b == 0),
            "a failed transfer moved nothing"
        );
        two.write().await.unwrap();
        assert_eq!(two.dst, two.src);

        let bare = EngineConfig {
            transport: "faulty:tcp".parse().unwrap(),
            ..EngineConfig::default()
        };
        let plan = with_fault_plan(bare)
            .unwrap()
            .faults
            .expect("a faulty: name asks");
        assert_eq!(plan.spec(), &hmc_faults::FaultSpec::default_faults());
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
