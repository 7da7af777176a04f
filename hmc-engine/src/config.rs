//! Engine settings: a typed config, and HIXL's string-keyed option map read into it.

use std::collections::HashMap;
use std::time::Duration;

use crate::error::{EngineError, Result};

/// Engine limits and settings. Every field has a default and is also an option key of
/// [`EngineConfig::from_options`].
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Regions this engine may register (`max_regions`, default 65 536).
    pub max_regions: usize,
    /// Regions accepted in a peer's table (`max_remote_regions`, default 65 536).
    pub max_remote_regions: usize,
    /// Descriptors in one transfer (`max_descs_per_transfer`, default 65 536).
    pub max_descs_per_transfer: usize,
    /// Notifications held until `get_notifies` takes them (`max_pending_notifies`,
    /// default 4096); past it a sender gets OVERLOADED.
    pub max_pending_notifies: usize,
    /// Bytes of one notification's name and message (`max_notify_len`, default 64 KiB).
    pub max_notify_len: usize,
    /// Bytes of one value published for peers to look up (`max_published_len`, default
    /// 1 MiB; a KV cache's layout and tensor addresses).
    pub max_published_len: usize,
    /// Dial a peer's data plane even when it is on another host than the engine the
    /// caller connected to (`allow_foreign_data_plane`, default false).
    pub allow_foreign_data_plane: bool,
    /// Which transport [`crate::Engine::initialize_with`] opens (`transport`: tcp, ucx,
    /// auto or a transport plugin's name, default auto).
    pub transport: crate::EngineTransport,
    /// Files or folders searched for transport plugins after `HMC_PLUGIN_PATH`'s
    /// (`plugin_path`, `:`-separated; default none).
    pub plugin_path: Vec<std::path::PathBuf>,
    /// The metadata service's RPC limits.
    pub rpc: hmc_rpc::ServerConfig,
    /// Timeout of the blocking API's calls that take none (default 10 s).
    pub default_timeout: Duration,
    /// Where engines find each other (`metadata`: `embedded`, the default, or
    /// `etcd://host:port[,host:port]/namespace`; see `hmc_meta`).
    pub metadata: hmc_meta::MetadataUrl,
    /// This engine's name in the metadata namespace (`name`; default: its address). Only
    /// with an etcd `metadata`: without a directory, an engine's name is its address.
    pub name: Option<String>,
    /// etcd settings and limits (`lease_ttl_ms`, `etcd_op_timeout_ms`,
    /// `etcd_retry_initial_ms`, `etcd_retry_max_ms`, `max_value_len`, `max_members`, `max_labels`,
    /// `watch_backlog`).
    pub etcd: hmc_meta::EtcdConfig,
    /// A pre-shared secret of the job (`auth_secret`, or better `auth_secret_file`, a file
    /// holding it; default none). Every engine of the job needs the same one. With it, the
    /// metadata exchange (region table, notifications, lookups) is authenticated in both
    /// directions before anything is read, and so is every data-plane connection of the
    /// TCP transport ([`crate::open_transport_for`]). Without it, peers on this host that
    /// run as another user are refused by both; peers on other hosts are not authenticated.
    pub auth_secret: Option<hmc_rpc::AuthSecret>,
    /// Bytes of notifications (names, messages and senders) held until `get_notifies`
    /// takes them (`max_pending_notify_bytes`, default 4 MiB); past it a sender gets
    /// OVERLOADED naming the limit.
    pub max_pending_notify_bytes: usize,
    /// Notification ids remembered to deliver each at most once (`max_notify_ids`, default
    /// 65 536): a copy of a notification arriving after this many later ones (from all
    /// peers) counts as new. Ids of notifications still waiting are never forgotten.
    pub max_notify_ids: usize,
    /// How long a posted transfer ([`crate::PreparedTransfer::post`]) may go without
    /// progress before it ends with a timeout (`no_progress_timeout_ms`, default 5 s):
    /// its bytes move in chunks, each of which must complete within it. A transfer that
    /// keeps moving is never cut off.
    pub no_progress_timeout: Duration,
    /// Most bytes of one such chunk (`progress_chunk_bytes`, default 8 MiB): progress is
    /// seen chunk by chunk, so a transfer slower than this many bytes per
    /// `no_progress_timeout` counts as stalled.
    pub progress_chunk_bytes: usize,
    /// Bytes of a metadata blob accepted by [`crate::Engine::add_remote`]
    /// (`max_metadata_blob_len`, default 16 MiB).
    pub max_metadata_blob_len: usize,
    /// Threads that copy a transfer's host memory with a peer on this host by cross-memory
    /// attach (`copy_threads`, default: the CPUs this process may use, at most 4, or 1 in a
    /// build without the `shm` feature, where nothing reads it; 1: the calling thread
    /// alone): the shared-memory transport's `ShmConfig::copy_threads`.
    pub copy_threads: usize,
    /// Bytes of pinned host chunks the transport holds at once to serve peers' READs and
    /// WRITEs of this engine's device regions (`max_staging_bytes`, default 64 MiB): the
    /// TCP transport's `TcpConfig::max_staging_bytes`, and UCX's
    /// `UcxConfig::max_staging_bytes` for device memory the loaded UCX cannot move. A peer
    /// request that finds no chunk free within the request timeout fails `LimitExceeded`
    /// naming it.
    pub max_staging_bytes: usize,
    /// Bytes of one such chunk (`staging_chunk_bytes`, default 1 MiB): one device copy
    /// each; `max_staging_bytes` must hold at least two.
    pub staging_chunk_bytes: usize,
    /// Over UCX, how long a transfer that failed or was cancelled may take to drain
    /// (`ucx_drain_timeout_ms`, default 10 s): past it the peer is taken to make no
    /// progress (stopped) and the UCX endpoint's generation is abandoned, so that none of
    /// the transfer lands there later (`UcxConfig::drain_timeout`). A transfer to a stopped
    /// peer over UCX ends this long after `no_progress_timeout`, plus `ucx_abandon_timeout_ms`.
    pub ucx_drain_timeout: Duration,
    /// Over UCX, how long abandoning a generation waits for the peer's answer
    /// (`ucx_abandon_timeout_ms`, default 1 s, at least 250 ms: `UcxConfig::abandon_timeout`).
    pub ucx_abandon_timeout: Duration,
    /// Faults to inject, for testing what runs on this engine (`faults`: a spec of
    /// `hmc_faults::GRAMMAR`, docs/faults.md; default none). The transport is wrapped in
    /// `hmc_faults::Faulty` with this plan, and the engine's own notifications and
    /// metadata lookups draw from the same plan (clones share it).
    /// [`crate::Engine::initialize_with`] fills it from `HMC_FAULTS`, or from
    /// `hmc_faults::FaultSpec::DEFAULT_TEXT` for a `faulty:NAME` transport, when unset.
    pub faults: Option<hmc_faults::FaultPlan>,
}

impl Default for EngineConfig {
    /// The engine's own defaults, and the transports' through `hmc_transports::Defaults`
    /// (each filled by the compiled-in transport that reads it, the same values whichever
    /// transports the build has).
    fn default() -> Self {
        let transports = hmc_transports::Defaults::of_this_build();
        EngineConfig {
            max_regions: 65_536,
            max_remote_regions: 65_536,
            max_descs_per_transfer: 65_536,
            max_pending_notifies: 4096,
            max_notify_len: 64 << 10,
            max_published_len: 1 << 20,
            allow_foreign_data_plane: false,
            transport: crate::EngineTransport::Auto,
            plugin_path: Vec::new(),
            rpc: hmc_rpc::ServerConfig::default(),
            default_timeout: Duration::from_secs(10),
            metadata: hmc_meta::MetadataUrl::Embedded,
            name: None,
            etcd: hmc_meta::EtcdConfig::default(),
            auth_secret: None,
            max_pending_notify_bytes: 4 << 20,
            max_notify_ids: 65_536,
            no_progress_timeout: Duration::from_secs(5),
            progress_chunk_bytes: 8 << 20,
            max_metadata_blob_len: 16 << 20,
            copy_threads: transports.copy_threads,
            max_staging_bytes: transports.max_staging_bytes,
            staging_chunk_bytes: transports.staging_chunk,
            ucx_drain_timeout: transports.ucx_drain_timeout,
            ucx_abandon_timeout: transports.ucx_abandon_timeout,
            faults: None,
        }
    }
}

impl EngineConfig {
    /// Reads HIXL-style string options over the defaults. Keys are the field names;
    /// unknown keys are refused (a misspelt option should not pass silently).
    pub fn from_options(options: &HashMap<String, String>) -> Result<Self> {
        let mut c = EngineConfig::default();
        for (k, v) in options {
            let bad =
                |why: String| EngineError::InvalidArgument(format!("option `{k}` = `{v}`: {why}"));
            let num = || v.parse::<usize>().map_err(|e| bad(e.to_string()));
            let ms = || num().map(|n| Duration::from_millis(n as u64));
            match k.as_str() {
                "max_regions" => c.max_regions = num()?,
                "max_remote_regions" => c.max_remote_regions = num()?,
                "max_descs_per_transfer" => c.max_descs_per_transfer = num()?,
                "max_pending_notifies" => c.max_pending_notifies = num()?,
                "max_notify_len" => c.max_notify_len = num()?,
                "max_published_len" => c.max_published_len = num()?,
                "allow_foreign_data_plane" => {
                    c.allow_foreign_data_plane =
                        v.parse().map_err(|_| bad("true or false".into()))?
                }
                "transport" => {
                    c.transport = v.parse().map_err(|e: hmc_core::Error| bad(e.to_string()))?
                }
                "plugin_path" => c.plugin_path = std::env::split_paths(v).collect(),
                "default_timeout_ms" => c.default_timeout = ms()?,
                "metadata" => {
                    c.metadata = v
                        .parse()
                        .map_err(|e: hmc_meta::MetaError| bad(e.to_string()))?
                }
                "name" => c.name = Some(v.clone()),
                "lease_ttl_ms" => c.etcd.lease_ttl = ms()?,
                "etcd_op_timeout_ms" => c.etcd.op_timeout = ms()?,
                "etcd_retry_initial_ms" => c.etcd.retry_initial = ms()?,
                "etcd_retry_max_ms" => c.etcd.retry_max = ms()?,
                "max_value_len" => c.etcd.max_value_len = num()?,
                "max_members" => c.etcd.max_members = num()?,
                "max_labels" => c.etcd.max_labels = num()?,
                "watch_backlog" => c.etcd.watch_backlog = num()?,
                "max_pending_notify_bytes" => c.max_pending_notify_bytes = num()?,
                "max_notify_ids" => c.max_notify_ids = num()?.max(1),
                "no_progress_timeout_ms" => c.no_progress_timeout = ms()?,
                "progress_chunk_bytes" => c.progress_chunk_bytes = num()?,
                "max_metadata_blob_len" => c.max_metadata_blob_len = num()?,
                "copy_threads" => c.copy_threads = num()?.max(1),
                "max_staging_bytes" => c.max_staging_bytes = num()?,
                "staging_chunk_bytes" => c.staging_chunk_bytes = num()?,
                "ucx_drain_timeout_ms" => c.ucx_drain_timeout = ms()?,
                "ucx_abandon_timeout_ms" => c.ucx_abandon_timeout = ms()?,
                "faults" => {
                    let spec: hmc_faults::FaultSpec = v
                        .parse()
                        .map_err(|e: hmc_faults::FaultError| bad(e.to_string()))?;
                    c.faults = Some(hmc_faults::FaultPlan::new(spec));
                }
                "auth_secret" => {
                    c.auth_secret = Some(
                        // The value is never echoed in an error.
                        hmc_rpc::AuthSecret::new(v.as_bytes().to_vec()).map_err(|e| {
                            EngineError::InvalidArgument(format!("option `auth_secret`: {e}"))
                        })?,
                    )
                }
                "auth_secret_file" => {
                    c.auth_secret = Some(
                        hmc_rpc::AuthSecret::from_file(std::path::Path::new(v))
                            .map_err(|e| bad(e.to_string()))?,
                    )
                }
                _ => {
                    return Err(EngineError::InvalidArgument(format!(
                        "unknown option `{k}`; known: max_regions, max_remote_regions, max_descs_per_transfer, max_pending_notifies, max_notify_len, max_published_len, allow_foreign_data_plane, transport, plugin_path, default_timeout_ms, metadata, name, lease_ttl_ms, etcd_op_timeout_ms, etcd_retry_initial_ms, etcd_retry_max_ms, max_value_len, max_members, max_labels, watch_backlog, max_pending_notify_bytes, max_notify_ids, no_progress_timeout_ms, progress_chunk_bytes, max_metadata_blob_len, copy_threads, max_staging_bytes, staging_chunk_bytes, ucx_drain_timeout_ms, ucx_abandon_timeout_ms, auth_secret, auth_secret_file, faults"
                    )));
                }
            }
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_override_defaults_and_unknown_keys_are_refused() {
        let o: HashMap<String, String> = [
            ("max_pending_notifies", "7"),
            ("allow_foreign_data_plane", "true"),
            ("default_timeout_ms", "250"),
            ("transport", "tcp"),
            ("metadata", "etcd://10.0.0.1:2379/job"),
            ("name", "prefill-0"),
            ("lease_ttl_ms", "3000"),
            ("watch_backlog", "9"),
            ("copy_threads", "1"),
            ("max_staging_bytes", "8388608"),
            ("staging_chunk_bytes", "262144"),
            ("ucx_drain_timeout_ms", "2000"),
            ("ucx_abandon_timeout_ms", "500"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let c = EngineConfig::from_options(&o).unwrap();
        assert_eq!(c.max_pending_notifies, 7);
        assert!(c.allow_foreign_data_plane);
        assert_eq!(c.default_timeout, Duration::from_millis(250));
        assert_eq!(c.transport, crate::EngineTransport::Tcp);
        assert_eq!(c.max_regions, 65_536);
        assert_eq!(c.metadata.to_string(), "etcd://10.0.0.1:2379/job");
        assert_eq!(c.name.as_deref(), Some("prefill-0"));
        assert_eq!(c.etcd.lease_ttl, Duration::from_secs(3));
        assert_eq!(c.etcd.watch_backlog, 9);
        assert_eq!(c.copy_threads, 1);
        assert_eq!(
            (c.max_staging_bytes, c.staging_chunk_bytes),
            (8 << 20, 256 << 10)
        );
        assert_eq!(
            (c.ucx_drain_timeout, c.ucx_abandon_timeout),
            (Duration::from_secs(2), Duration::from_millis(500))
        );
        #[cfg(feature = "ucx")]
        {
            // The engine's defaults are the transport's.
            let (e, u) = (
                EngineConfig::default(),
                hmc_transports::Options::default().ucx,
            );
            assert_eq!(
                (e.ucx_drain_timeout, e.ucx_abandon_timeout),
                (u.drain_timeout, u.abandon_timeout)
            );
        }
        assert!(EngineConfig::default().copy_threads >= 1);
        // The transports' defaults, as documented above, whichever transports are in.
        let d = EngineConfig::default();
        assert_eq!(
            (d.max_staging_bytes, d.staging_chunk_bytes),
            (64 << 20, 1 << 20)
        );
        assert_eq!(
            (d.ucx_drain_timeout, d.ucx_abandon_timeout),
            (Duration::from_secs(10), Duration::from_secs(1))
        );
        let bad: HashMap<String, String> =
            [("metadata".to_string(), "etcd://x/".to_string())].into();
        let e = EngineConfig::from_options(&bad).unwrap_err().to_string();
        assert!(e.contains("etcd://host:port"), "{e}");
        let bad: HashMap<String, String> = [("max_region".to_string(), "1".to_string())].into();
        let e = EngineConfig::from_options(&bad).unwrap_err().to_string();
        assert!(e.contains("unknown option `max_region`"), "{e}");
        let bad: HashMap<String, String> = [("max_regions".to_string(), "x".to_string())].into();
        assert!(EngineConfig::from_options(&bad).is_err());
    }

    #[rstest::rstest]
    #[case::none(None, None)]
    #[case::a_spec(Some("seed=4;xfer.fail=first:1"), Some("seed=4;xfer.fail=first:1"))]
    #[case::an_empty_spec(Some(""), Some(""))]
    fn the_faults_option_is_a_spec(#[case] given: Option<&str>, #[case] want: Option<&str>) {
        let o: HashMap<String, String> = given
            .map(|v| ("faults".to_string(), v.to_string()))
            .into_iter()
            .collect();
        let c = EngineConfig::from_options(&o).unwrap();
        let want = want.map(|w| w.parse::<hmc_faults::FaultSpec>().unwrap());
        assert_eq!(c.faults.map(|p| p.spec().clone()), want);
    }

    #[test]
    fn a_malformed_faults_option_names_the_item_and_the_grammar() {
        let o: HashMap<String, String> =
            [("faults".to_string(), "xfer.stall=9".to_string())].into();
        let e = EngineConfig::from_options(&o).unwrap_err().to_string();
        assert!(
            e.contains("option `faults`") && e.contains("`xfer.stall=9`") && e.contains("grammar"),
            "{e}"
        );
    }
}
