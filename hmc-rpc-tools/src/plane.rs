//! Run-time choice of the HMC_BUFFER data plane for the binaries
//! (`--data-plane tcp|ucx|shm|auto|rdma|none`, or a transport plugin's name): the command
//! line's names and checks over `hmc-transports`, which opens every transport for the
//! engine and the Python package too.

use std::net::IpAddr;
use std::path::PathBuf;

use hmc_core::{AnyCommunicator, Result};
use hmc_plugin::{PluginConfig, TransportRegistry};
use hmc_transports::{Options, TransportName};

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
    (--list-transports shows them); faulty:NAME injects faults into NAME (--faults)";

/// `--faults`' help, shared by the server and the client.
pub const FAULTS_HELP: &str = "Inject faults into the data plane, for testing: a spec such as \
    seed=7;xfer.fail=0.05;connect.refuse=first:1 (docs/faults.md has the grammar; a \
    malformed one is refused naming the item). Overrides HMC_FAULTS. Off by default";

impl DataPlaneKind {
    /// The transport it names; `None` for [`DataPlaneKind::None`].
    pub fn transport(self) -> Option<TransportName> {
        Some(match self {
            DataPlaneKind::None => return None,
            DataPlaneKind::Tcp => TransportName::Tcp,
            DataPlaneKind::Ucx => TransportName::Ucx,
            DataPlaneKind::Rdma => TransportName::Rdma,
            DataPlaneKind::Shm => TransportName::Shm,
            DataPlaneKind::Auto => TransportName::Auto,
        })
    }
}

/// What the RPC data plane asks of a transport (`hmc-transports`' [`Options`], the
/// environment read once): no notification queue (nobody reads notifications on the RPC
/// data plane, so a peer's NOTIFY is refused or dropped instead of queued for no reader),
/// plugins from `plugins`, and, with a TCP secret, TCP for `auto`'s network half.
fn transport_options(plugins: &PluginConfig) -> Options {
    let mut o = Options::from_env();
    o.max_pending_notifications = Some(0);
    o.plugins = plugins.clone();
    o.plugin_settings = vec![("max_pending_notifications".into(), "0".into())];
    o
}

/// [`transport_options`] with `options`' TCP secret read from its file and its faults.
fn transport_options_with(options: &PlaneOptions, plugins: &PluginConfig) -> Result<Options> {
    let mut o = transport_options(plugins);
    o.faults = options.faults.clone().map(hmc_transports::FaultPlan::new);
    if let Some(file) = &options.auth_secret_file {
        o.tcp.auth_secret = Some(hmc_transport_tcp::AuthSecret::from_file(file)?);
        // UCX has no such authentication: an authenticated plane stays on TCP.
        o.auto_prefers_ucx = false;
    }
    Ok(o)
}

/// The transports the binaries know by name: the built-ins (opened as
/// `hmc_transports::open` opens them), then the plugins found on `HMC_PLUGIN_PATH` and
/// `plugins.search_path`. For listing them (`--list-transports`) and opening plugins; a TCP
/// secret file is read by [`open_data_plane_with`], not here.
pub fn transport_registry(_options: &PlaneOptions, plugins: &PluginConfig) -> TransportRegistry {
    hmc_transports::registry(&transport_options(plugins))
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
        DataPlaneChoice::Builtin(kind) => open_plane(*kind, bind, options, plugins),
        DataPlaneChoice::Named(name) => {
            if options.auth_secret_file.is_some() {
                return Err(hmc_core::Error::InvalidArgument(format!(
                    "--data-plane-auth-secret-file applies to the tcp data plane only; configure \
                     authentication of `{name}` as its plugin documents"
                )));
            }
            // A plugin's name, or `faulty:NAME`.
            let name: TransportName = name.parse()?;
            hmc_transports::open(&name, bind, &transport_options_with(options, plugins)?).map(Some)
        }
    }
}

/// The flags `hmc-rpc-server` and `hmc-rpc-client` share (the data plane's, and the RPC
/// connection's secret), flattened into each one's arguments (`#[command(flatten)]`) where
/// they stood, so both take and list them alike.
#[derive(clap::Args, Debug)]
pub struct CommonArgs {
    // Help: DATA_PLANE_HELP.
    #[arg(long, default_value = "none", value_parser = DataPlaneChoice::parse, help = DATA_PLANE_HELP)]
    pub data_plane: DataPlaneChoice,
    /// Files or folders searched for transport plugins after `HMC_PLUGIN_PATH`'s.
    #[arg(long)]
    pub plugin_path: Vec<PathBuf>,
    /// Lists the transports: built-in, plugins loaded, plugin candidates refused and why;
    /// then exits.
    #[arg(long)]
    pub list_transports: bool,
    /// Authenticate every TCP data-plane connection with the pre-shared secret in this
    /// file (at least 16 bytes; both sides need the same). Recommended beyond loopback.
    #[arg(long)]
    pub data_plane_auth_secret_file: Option<PathBuf>,
    // Help: FAULTS_HELP.
    #[arg(long, value_name = "SPEC", help = FAULTS_HELP)]
    pub faults: Option<hmc_transports::FaultSpec>,
    /// Authenticate the RPC connection itself with the pre-shared secret in this file (an
    /// HMAC exchange before the first frame; both sides need the same; the file may be the
    /// data plane's).
    #[arg(long)]
    pub auth_secret_file: Option<PathBuf>,
}

impl CommonArgs {
    /// The data-plane options and plugin search path the flags give.
    fn settings(&self) -> (PlaneOptions, PluginConfig) {
        (
            PlaneOptions {
                auth_secret_file: self.data_plane_auth_secret_file.clone(),
                faults: self.faults.clone(),
            },
            PluginConfig {
                search_path: self.plugin_path.clone(),
            },
        )
    }

    /// Opens the `--data-plane` chosen, listening on `bind`, with the options and plugin
    /// search path the flags give ([`open_data_plane_choice`]).
    pub fn open_data_plane(&self, bind: IpAddr) -> Result<Option<AnyCommunicator>> {
        let (options, plugins) = self.settings();
        open_data_plane_choice(&self.data_plane, bind, &options, &plugins)
    }

    /// The RPC connection's secret, read from `--auth-secret-file` (`None` without one).
    pub fn rpc_auth_secret(&self) -> Result<Option<hmc_rpc::AuthSecret>> {
        self.auth_secret_file
            .as_deref()
            .map(hmc_rpc::AuthSecret::from_file)
            .transpose()
    }

    /// With `--list-transports`, the [`transport_registry`]'s report (the binary prints it
    /// and exits); else `None`.
    pub fn transports_report(&self) -> Option<String> {
        self.list_transports.then(|| {
            let (options, plugins) = self.settings();
            transport_registry(&options, &plugins).report()
        })
    }
}

/// What the binaries may set on the data plane they open.
#[derive(Clone, Debug, Default)]
pub struct PlaneOptions {
    /// The TCP data plane authenticates every connection with this pre-shared secret
    /// (`--data-plane-auth-secret-file`; both sides need the same). Off by default; set it
    /// for anything beyond loopback.
    pub auth_secret_file: Option<PathBuf>,
    /// Faults to inject into the data plane (`--faults SPEC`, docs/faults.md; over
    /// `HMC_FAULTS`). Off by default.
    pub faults: Option<hmc_transports::FaultSpec>,
}

/// Opens the chosen data plane listening on `bind` (port chosen by the system) with
/// default [`PlaneOptions`]. Must run inside a tokio runtime (the TCP transport starts its
/// responder there).
pub fn open_data_plane(kind: DataPlaneKind, bind: IpAddr) -> Result<Option<AnyCommunicator>> {
    open_data_plane_with(kind, bind, &PlaneOptions::default())
}

/// [`open_data_plane`] with options. The RPC data plane moves payloads one-sided and never
/// reads notifications, so every transport is opened with `max_pending_notifications`
/// 0: a peer's NOTIFY is refused (TCP) or dropped (UCX) instead of queued for no reader.
pub fn open_data_plane_with(
    kind: DataPlaneKind,
    bind: IpAddr,
    options: &PlaneOptions,
) -> Result<Option<AnyCommunicator>> {
    open_plane(kind, bind, options, &PluginConfig::default())
}

fn open_plane(
    kind: DataPlaneKind,
    bind: IpAddr,
    options: &PlaneOptions,
    plugins: &PluginConfig,
) -> Result<Option<AnyCommunicator>> {
    let Some(name) = kind.transport() else {
        return Ok(None);
    };
    if options.auth_secret_file.is_some() {
        let what = match kind {
            DataPlaneKind::Ucx => Some("UCX has no such authentication here"),
            DataPlaneKind::Shm => Some(
                "shared memory has no such authentication here (it admits processes of this \
                 user only)",
            ),
            DataPlaneKind::Rdma => Some("the RDMA control plane has no such authentication here"),
            _ => None,
        };
        if let Some(what) = what {
            return Err(hmc_core::Error::InvalidArgument(format!(
                "--data-plane-auth-secret-file applies to the tcp data plane only; {what}"
            )));
        }
    }
    let o = transport_options_with(options, plugins)?;
    hmc_transports::open(&name, bind, &o).map(Some)
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
    async fn faults_reach_the_data_plane_by_flag_and_by_name() {
        let spec: hmc_transports::FaultSpec = "seed=5;xfer.fail=0.5".parse().unwrap();
        let options = PlaneOptions {
            faults: Some(spec.clone()),
            ..PlaneOptions::default()
        };
        let o = transport_options_with(&options, &PluginConfig::default()).unwrap();
        assert_eq!(o.faults.map(|p| p.spec().clone()), Some(spec));
        let faulty = DataPlaneChoice::parse("faulty:tcp").unwrap();
        let plane = open_data_plane_choice(
            &faulty,
            [127, 0, 0, 1].into(),
            &PlaneOptions::default(),
            &PluginConfig::default(),
        )
        .unwrap()
        .expect("a data plane");
        assert_eq!(
            hmc_core::Communicator::transport(&plane),
            hmc_core::TransportId::TCP
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
            .open("tcp", &hmc_plugin::OpenOptions::new([127, 0, 0, 1].into()))
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
            ..PlaneOptions::default()
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
