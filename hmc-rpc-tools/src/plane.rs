//! Run-time choice of the HMC_BUFFER data plane for the binaries
//! (`--data-plane tcp|ucx|shm|auto|rdma|none`, or a transport plugin's name): one code path
//! over [`AnyCommunicator`].

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use hmc_core::{AnyCommunicator, PeerAddr, Result};
use hmc_plugin::{OpenOptions, PluginConfig, TransportRegistry};

/// Which data plane carries HMC_BUFFER payloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DataPlaneKind {
    /// None: large payloads travel TCP_STREAM.
    None,
    /// `hmc-transport-tcp`'s `TcpCommunicator`.
    Tcp,
    /// `hmc-transport-ucx`'s `UcxCommunicator` (`UCX_TLS` chooses UCX's transports).
    Ucx,
    /// `hmc-transport-rdma`'s `RdmaCommunicator` (`HMC_IBVERBS_LIB` names the
    /// `libibverbs.so.1` to load; the first device with an active port).
    Rdma,
    /// `hmc-transport-shm`'s `ShmCommunicator`: cross-memory attach, clients on this host
    /// only.
    Shm,
    /// Shared memory to clients on this host and, to the others, UCX where it loads and
    /// TCP otherwise (`hmc_transport_shm::LocalFirst`). Both sides must choose `auto`.
    Auto,
}

/// A data plane chosen by name: one of the built-in [`DataPlaneKind`]s, or any other name,
/// which the [`transport_registry`] resolves (a transport plugin on `HMC_PLUGIN_PATH`).
#[derive(Clone, PartialEq, Eq)]
pub enum DataPlaneChoice {
    /// A transport linked into the binaries.
    Builtin(DataPlaneKind),
    /// A name for the registry: a plugin's name, or `NAME://IP`.
    Named(String),
}

impl DataPlaneChoice {
    /// Parses `--data-plane`: a built-in kind's name first, any other name as a plugin's.
    pub fn parse(s: &str) -> std::result::Result<Self, String> {
        if s.is_empty() {
            return Err(
                "an empty data-plane name; use none, tcp, ucx, shm, auto, rdma or a plugin's name"
                    .into(),
            );
        }
        Ok(
            match <DataPlaneKind as clap::ValueEnum>::from_str(s, true) {
                Ok(kind) => DataPlaneChoice::Builtin(kind),
                Err(_) => DataPlaneChoice::Named(s.to_string()),
            },
        )
    }
}

impl DataPlaneChoice {
    /// The name `--data-plane` takes for it (`tcp`, `ucx`, a plugin's name).
    pub fn cli_name(&self) -> String {
        match self {
            DataPlaneChoice::Builtin(k) => clap::ValueEnum::to_possible_value(k)
                .map(|v| v.get_name().to_string())
                .unwrap_or_else(|| format!("{k:?}").to_lowercase()),
            DataPlaneChoice::Named(n) => n.clone(),
        }
    }
}

/// As `Display` (`Tcp`, `Ucx`, a plugin's name), so tables keep the kinds' names.
impl std::fmt::Debug for DataPlaneChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl std::fmt::Display for DataPlaneChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DataPlaneChoice::Builtin(k) => write!(f, "{k:?}"),
            DataPlaneChoice::Named(n) => f.write_str(n),
        }
    }
}

/// `--data-plane`'s help, shared by the server and the client: every built-in choice (a
/// test checks it against the registry) and where plugins come from.
pub const DATA_PLANE_HELP: &str = "Data plane for HMC_BUFFER payloads (both sides must use \
    the same one): none, tcp, ucx, shm (this host only), rdma, auto (shm on this host, ucx or \
    tcp to others), or the name of a transport plugin on HMC_PLUGIN_PATH / --plugin-path \
    (--list-transports shows them)";

/// The transports the binaries know by name: the built-in `tcp` and `ucx` (opened as
/// [`open_data_plane_with`] opens them), then the plugins found on `HMC_PLUGIN_PATH` and
/// `plugins.search_path`.
pub fn transport_registry(options: &PlaneOptions, plugins: &PluginConfig) -> TransportRegistry {
    let mut r = TransportRegistry::discover(plugins);
    for (kind, name, about) in [
        (
            DataPlaneKind::Tcp,
            "tcp",
            "hmc-transport-tcp: one-sided READ/WRITE over TCP sockets",
        ),
        (
            DataPlaneKind::Ucx,
            "ucx",
            "hmc-transport-ucx: UCX loaded at run time (UCX_TLS chooses)",
        ),
        (
            DataPlaneKind::Shm,
            "shm",
            "hmc-transport-shm: cross-memory attach and shared memory, this host only",
        ),
        (
            DataPlaneKind::Auto,
            "auto",
            "shm to peers on this host, ucx (or tcp) to the others",
        ),
        (
            DataPlaneKind::Rdma,
            "rdma",
            "hmc-transport-rdma: RDMA verbs (libibverbs.so.1 loaded at run time)",
        ),
    ] {
        let options = options.clone();
        r.register_builtin(name, about, move |o: &OpenOptions| {
            open_data_plane_with(kind, o.bind, &options)?.ok_or_else(|| {
                hmc_core::Error::Unsupported(format!("the {name} data plane opened nothing"))
            })
        });
    }
    r
}

/// Opens the data plane `choice` names on `bind`: a built-in kind as
/// [`open_data_plane_with`] does, a name through [`transport_registry`] (with
/// `max_pending_notifications=0`: nobody reads notifications on the RPC data plane).
pub fn open_data_plane_choice(
    choice: &DataPlaneChoice,
    bind: IpAddr,
    options: &PlaneOptions,
    plugins: &PluginConfig,
) -> Result<Option<AnyCommunicator>> {
    match choice {
        DataPlaneChoice::Builtin(kind) => open_data_plane_with(*kind, bind, options),
        DataPlaneChoice::Named(name) => {
            if options.auth_secret_file.is_some() {
                return Err(hmc_core::Error::InvalidArgument(format!(
                    "--data-plane-auth-secret-file applies to the tcp data plane only; configure                      authentication of `{name}` as its plugin documents"
                )));
            }
            let open = OpenOptions::new(bind).with("max_pending_notifications", 0);
            transport_registry(options, plugins)
                .open(name, &open)
                .map(Some)
        }
    }
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
        DataPlaneKind::Rdma => {
            if options.auth_secret_file.is_some() {
                return Err(hmc_core::Error::InvalidArgument(
                    "--data-plane-auth-secret-file applies to the tcp data plane only; the RDMA \
                     control plane has no such authentication here"
                        .into(),
                ));
            }
            let c = hmc_transport_rdma::RdmaCommunicator::new(hmc_transport_rdma::RdmaConfig {
                bind: PeerAddr::Tcp(SocketAddr::new(bind, 0)),
                max_pending_notifications: 0,
                ..Default::default()
            })?;
            Ok(Some(AnyCommunicator::new(c)))
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

    #[test]
    fn the_help_names_every_built_in_data_plane() {
        let r = transport_registry(&PlaneOptions::default(), &PluginConfig::default());
        for name in r.names().iter().map(String::as_str).chain(["none"]) {
            assert!(
                DATA_PLANE_HELP.contains(&format!(" {name}")),
                "--data-plane's help omits `{name}`"
            );
        }
    }

    #[test]
    fn built_in_names_parse_as_kinds_and_others_as_plugin_names() {
        assert_eq!(
            DataPlaneChoice::parse("tcp").unwrap(),
            DataPlaneChoice::Builtin(DataPlaneKind::Tcp)
        );
        assert_eq!(
            DataPlaneChoice::parse("loopmem").unwrap(),
            DataPlaneChoice::Named("loopmem".into())
        );
        assert!(DataPlaneChoice::parse("").is_err());
        assert_eq!(DataPlaneChoice::parse("ucx").unwrap().cli_name(), "ucx");
        assert_eq!(
            format!("{:?}", DataPlaneChoice::parse("tcp").unwrap()),
            "Tcp"
        );
    }

    #[tokio::test]
    async fn an_unknown_name_lists_the_transports_there_are() {
        let e = open_data_plane_choice(
            &DataPlaneChoice::Named("nosuch".into()),
            [127, 0, 0, 1].into(),
            &PlaneOptions::default(),
            &PluginConfig::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("no transport named `nosuch`") && e.contains("tcp, ucx"),
            "{e}"
        );
        let r = transport_registry(&PlaneOptions::default(), &PluginConfig::default());
        let c = r
            .open("tcp", &OpenOptions::new([127, 0, 0, 1].into()))
            .unwrap();
        assert_eq!(
            hmc_core::Communicator::transport(&c),
            hmc_core::TransportId::TCP
        );
    }

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
