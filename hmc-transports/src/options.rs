//! [`Options`]: what a program sets on the transport it opens.

use crate::env::Environment;

/// How [`crate::open`] opens a transport: each built-in's own config (present when its
/// feature is), the settings every transport shares (which override the fields of the
/// same name in those configs), plugin settings, and the [`Environment`].
///
/// `Options::default()` reads nothing from the environment; [`Options::from_env`] does,
/// once.
#[derive(Clone, Debug)]
pub struct Options {
    /// Notifications each transport queues for the application (`None`: each config's
    /// own). A program that never reads the transport's queue (the engine, whose
    /// notifications go through its metadata service; the RPC data plane) sets 0, so a
    /// peer's notification is refused or dropped rather than held for no reader.
    pub max_pending_notifications: Option<usize>,
    /// Host memory held to serve peers' READs of staged device regions (`None`: each
    /// config's own), for TCP and UCX alike.
    pub max_staging_bytes: Option<usize>,
    /// `auto`'s network half: UCX where it loads, TCP otherwise (true, the default), or
    /// TCP always (false: a program that authenticates the data plane by TCP's secret).
    pub auto_prefers_ucx: bool,
    /// `hmc-transport-tcp`'s settings.
    #[cfg(feature = "tcp")]
    pub tcp: hmc_transport_tcp::TcpConfig,
    /// `hmc-transport-ucx`'s settings (its `bind` port is ignored: the IP given to
    /// [`crate::open`] is used, port 0).
    #[cfg(feature = "ucx")]
    pub ucx: hmc_transport_ucx::UcxConfig,
    /// `hmc-transport-shm`'s settings.
    #[cfg(feature = "shm")]
    pub shm: hmc_transport_shm::ShmConfig,
    /// `hmc-transport-rdma`'s settings (its `bind` is replaced as for UCX).
    #[cfg(feature = "rdma")]
    pub rdma: hmc_transport_rdma::RdmaConfig,
    /// Where transport plugins are searched after `HMC_PLUGIN_PATH`.
    #[cfg(feature = "plugin")]
    pub plugins: hmc_plugin::PluginConfig,
    /// `key=value` lines a plugin's `comm_open` receives after `bind=`.
    pub plugin_settings: Vec<(String, String)>,
    /// Where plugins come from in the program's own terms (an option's name, a flag), for
    /// the error that an unknown name gets. `None`: the command-line wording.
    pub plugin_search_hint: Option<String>,
    /// What the environment said ([`Environment::read`]); default: nothing.
    pub environment: Environment,
    /// Faults to inject into the transport opened (`hmc_faults::Faulty`), over
    /// [`Environment::faults`] (`HMC_FAULTS`). `None` (the default): none, unless the
    /// environment or a `faulty:` name asks. Clones of a plan share its decisions: a
    /// program that injects faults elsewhere too (the engine's notifications) passes the
    /// plan it uses ([`crate::fault_plan`]).
    pub faults: Option<hmc_faults::FaultPlan>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            max_pending_notifications: None,
            max_staging_bytes: None,
            auto_prefers_ucx: true,
            #[cfg(feature = "tcp")]
            tcp: Default::default(),
            #[cfg(feature = "ucx")]
            ucx: Default::default(),
            #[cfg(feature = "shm")]
            shm: Default::default(),
            #[cfg(feature = "rdma")]
            rdma: Default::default(),
            #[cfg(feature = "plugin")]
            plugins: Default::default(),
            plugin_settings: Vec::new(),
            plugin_search_hint: None,
            environment: Environment::default(),
            faults: None,
        }
    }
}

impl Options {
    /// The defaults, with the [`Environment`] read now.
    pub fn from_env() -> Self {
        Options {
            environment: Environment::read(),
            ..Options::default()
        }
    }

    /// `max_pending_notifications` for a config whose own value is `own`.
    #[cfg_attr(
        not(any(feature = "tcp", feature = "ucx", feature = "shm", feature = "rdma")),
        allow(dead_code)
    )]
    pub(crate) fn notifications(&self, own: usize) -> usize {
        self.max_pending_notifications.unwrap_or(own)
    }

    /// `max_staging_bytes` for a config whose own value is `own`.
    #[cfg_attr(not(any(feature = "tcp", feature = "ucx")), allow(dead_code))]
    pub(crate) fn staging(&self, own: usize) -> usize {
        self.max_staging_bytes.unwrap_or(own)
    }
}
