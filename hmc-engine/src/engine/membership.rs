//! The engine in a metadata namespace (`hmc_meta`): registering its address, instance and
//! data plane (never its region table), resolving peers by name, and dropping peers that leave (their transfers in
//! flight fail with [`EngineError::PeerGone`]).

use std::sync::{Arc, Weak};
use std::time::Duration;

use hmc_core::{Communicator, Deadline, PeerAddr};
use hmc_meta::{MemberEvent, MemberEvents, MetadataStore, MetadataUrl};
use hmc_rpc::RpcCodec;

use super::{Engine, Inner, parse_engine_addr};
use crate::config::EngineConfig;
use crate::error::{EngineError, Result};
use crate::meta::EngineInfo;

/// Opens the configured store and registers this engine in it; returns the engine's name
/// (what peers pass to `connect`) and the store.
pub(super) async fn open_store(
    config: &EngineConfig,
    address: &str,
    info: &EngineInfo,
) -> Result<(String, Arc<dyn MetadataStore>)> {
    let name = match (&config.metadata, &config.name) {
        (MetadataUrl::Embedded, Some(n)) => {
            return Err(EngineError::InvalidArgument(format!(
                "option `name` = `{n}` needs a directory to be found by: set `metadata` to etcd://host:port/namespace, or leave `name` out (the engine's name is then its address)"
            )));
        }
        (_, Some(n)) => n.clone(),
        (MetadataUrl::Embedded, None) => address.to_string(),
        // Keys cannot hold `/`: the address as `connect` also takes it.
        (_, None) => address
            .strip_prefix("tcp://")
            .map(str::to_string)
            .unwrap_or_else(|| address.replace('/', "_")),
    };
    let record = RpcCodec::encode(info).map_err(|e| EngineError::InvalidArgument(e.to_string()))?;
    let store = hmc_meta::open(
        &config.metadata,
        config.etcd.clone(),
        &name,
        address,
        record,
    )
    .await?;
    // `meta.slow` / `meta.gone` act on this engine's lookups of its peers.
    let store: Arc<dyn MetadataStore> = match &config.faults {
        Some(plan) => Arc::new(hmc_faults::FaultyStore::new(store, plan.clone())),
        None => store,
    };
    Ok((name, store))
}

/// Follows membership events for as long as the engine lives: a connected peer that
/// leaves (or comes back as another instance) is disconnected, its transfers failed.
pub(super) fn watch_members<C: Communicator>(inner: Weak<Inner<C>>, mut events: MemberEvents) {
    tokio::spawn(async move {
        while let Some(ev) = events.next().await {
            let Some(inner) = inner.upgrade() else { return };
            let engine = Engine { inner };
            match ev {
                Ok(MemberEvent::Left { name }) => engine.peer_gone(
                    &name,
                    format!(
                        "it left the metadata namespace (its lease lapsed within lease_ttl = {:?}: dead, hung or cut off)",
                        engine.inner.shared.config.etcd.lease_ttl
                    ),
                ),
                Ok(MemberEvent::Updated(m)) | Ok(MemberEvent::Joined(m)) => {
                    let restarted = engine.peer(&m.name).ok().is_some_and(|p| {
                        RpcCodec::decode::<EngineInfo>(&m.record)
                            .is_ok_and(|info| info.instance != p.instance)
                    });
                    if restarted {
                        engine.peer_gone(&m.name, "it restarted under the same name".into());
                    }
                }
                Err(e) => {
                    // Events were dropped: check every connected peer against the store.
                    tracing::warn!(error = %e, "membership events lost; re-reading members");
                    let timeout = engine.inner.shared.config.etcd.op_timeout;
                    if let Ok(members) = engine.inner.meta.members(timeout).await {
                        for p in engine.peers() {
                            if parse_engine_addr(&p, None).is_err()
                                && !members.iter().any(|m| m.name == p)
                            {
                                engine.peer_gone(&p, "it left the metadata namespace".into());
                            }
                        }
                    }
                }
            }
        }
    });
}

impl<C: Communicator> Engine<C> {
    /// Publishes `blob` (a [`Engine::partial_metadata`], or any bytes) under `label` in
    /// the metadata namespace beside this engine's record, for a peer's
    /// [`Engine::fetch_label`] (NIXL's labelled partial metadata). It lives as long as this
    /// engine's registration. Needs an etcd `metadata` namespace.
    pub fn publish_label(&self, label: &str, blob: Vec<u8>) -> Result<()> {
        self.check_open()?;
        Ok(self.inner.meta.publish_label(label, blob)?)
    }

    /// What the engine `name` published under `label`; `None` while it has not.
    pub async fn fetch_label(
        &self,
        name: &str,
        label: &str,
        timeout: Duration,
    ) -> Result<Option<Vec<u8>>> {
        self.check_open()?;
        Ok(self.inner.meta.fetch_label(name, label, timeout).await?)
    }

    /// Takes this engine out of the metadata namespace (`false`: its record and labels
    /// are deleted, peers that watch it drop it and fail its transfers in flight, as for
    /// one that left) or lists it again (`true`). The engine keeps running: its own
    /// transfers and peers added by blob are untouched (NIXL's
    /// `invalidate_local_metadata` and a later `send_local_metadata`).
    pub fn set_listed(&self, listed: bool) -> Result<()> {
        self.check_open()?;
        Ok(self.inner.meta.set_listed(listed)?)
    }

    /// Where to reach `remote`: its address when it is one, else what the store says
    /// the member of that name registered.
    pub(super) async fn resolve(&self, remote: &str, deadline: Deadline) -> Result<PeerAddr> {
        if let Ok(a) = parse_engine_addr(remote, None) {
            return Ok(a);
        }
        let store = &self.inner.meta;
        let member = store
            .resolve(remote, deadline.remaining())
            .await?
            .ok_or_else(|| EngineError::Metadata {
                peer: remote.to_string(),
                why: format!(
                    "no engine of that name is registered in {}; start it, or check the name and namespace",
                    store.describe()
                ),
            })?;
        parse_engine_addr(&member.address, None)
    }

    /// Disconnects `name` and fails its transfers in flight with `why`.
    pub(super) fn peer_gone(&self, name: &str, why: String) {
        let Some(peer) = self.inner.peers.write().remove(name) else {
            return;
        };
        tracing::warn!(peer = %name, %why, "peer gone");
        metrics::counter!("hmc_engine_peers_gone_total").increment(1);
        self.inner.lost.gone(name);
        peer.gone.send_replace(Some(why));
    }
}

/// Peers dropped as gone ([`Engine::peer_gone`]) and not connected since: connecting to one
/// again is a reconnect (`hmc_engine_reconnects_total`). At most [`LostPeers::MAX`] names
/// are kept (peers that never come back would otherwise pile up); past it, a reconnect to
/// a peer not remembered counts as a first connect.
#[derive(Default)]
pub(super) struct LostPeers(parking_lot::Mutex<std::collections::HashSet<String>>);

impl LostPeers {
    /// Names remembered at most.
    pub(super) const MAX: usize = 4096;

    fn gone(&self, name: &str) {
        let mut lost = self.0.lock();
        if lost.len() < Self::MAX {
            lost.insert(name.to_string());
        }
    }

    /// True when `name` was dropped as gone and not connected since.
    pub(super) fn contains(&self, name: &str) -> bool {
        self.0.lock().contains(name)
    }

    /// A connection to `name` was made: counts it, as a reconnect when `name` was lost.
    pub(super) fn connected(&self, name: &str) {
        metrics::counter!("hmc_engine_connects_total").increment(1);
        if self.0.lock().remove(name) {
            metrics::counter!("hmc_engine_reconnects_total").increment(1);
        }
    }
}

/// A transfer's counters (`metrics` facade; names prefixed `hmc_engine_`): `transfers_total`
/// and `transfer_bytes_total` (label `op`), `transfer_errors_total` (label `kind`),
/// `transfers_inflight`, `transfer_seconds`; and `connects_total`, `reconnects_total`
/// (a connect to a peer that was dropped as gone), `peers_gone_total`; `staged_bytes_total`
/// (label `op`: bytes of this engine's own side moved through host bounce buffers, device
/// memory its transport does not move directly).
pub(super) struct TransferMetrics {
    start: std::time::Instant,
}

impl TransferMetrics {
    pub(super) fn start(op: crate::TransferOp, descs: &[crate::TransferOpDesc]) -> Self {
        // Saturating: the descriptors are checked after the count starts, and lengths a
        // caller made up must not overflow (a panic with overflow checks on) before that.
        let bytes = descs
            .iter()
            .fold(0u64, |n, d| n.saturating_add(d.len as u64));
        Self::start_bytes(op, bytes)
    }

    pub(super) fn start_bytes(op: crate::TransferOp, bytes: u64) -> Self {
        // Literal labels make static keys: a label from a variable would allocate and hash
        // a key on every transfer, recorder or not.
        let (ops, moved) = match op {
            crate::TransferOp::Read => (
                metrics::counter!("hmc_engine_transfers_total", "op" => "read"),
                metrics::counter!("hmc_engine_transfer_bytes_total", "op" => "read"),
            ),
            crate::TransferOp::Write => (
                metrics::counter!("hmc_engine_transfers_total", "op" => "write"),
                metrics::counter!("hmc_engine_transfer_bytes_total", "op" => "write"),
            ),
        };
        ops.increment(1);
        moved.increment(bytes);
        metrics::gauge!("hmc_engine_transfers_inflight").increment(1.0);
        TransferMetrics {
            start: std::time::Instant::now(),
        }
    }

    /// The transfer's deadline, `timeout` after its start (the start's clock read serves
    /// both), with the timeout it came from for error messages.
    pub(super) fn deadline(&self, timeout: Duration) -> (Deadline, Duration) {
        let at = self
            .start
            .checked_add(timeout)
            .unwrap_or(self.start + Duration::from_secs(86_400 * 365));
        (Deadline::at(at), timeout)
    }

    pub(super) fn finish(&self, r: &Result<()>) {
        metrics::histogram!("hmc_engine_transfer_seconds")
            .record(self.start.elapsed().as_secs_f64());
        if let Err(e) = r {
            let kind = match e {
                EngineError::Timeout { .. } => "timeout",
                EngineError::PeerGone { .. } => "peer_gone",
                EngineError::NotConnected(_) => "not_connected",
                EngineError::NotRegistered { .. } | EngineError::Straddles { .. } => "bad_address",
                EngineError::Limit { .. } => "limit",
                EngineError::Cancelled(_) => "cancelled",
                EngineError::ListInvalid(_) => "list_invalid",
                EngineError::Transport(_) => "transport",
                EngineError::Metadata { .. } | EngineError::Store(_) => "metadata",
                _ => "other",
            };
            metrics::counter!("hmc_engine_transfer_errors_total", "kind" => kind).increment(1);
        }
    }
}

impl Drop for TransferMetrics {
    fn drop(&mut self) {
        metrics::gauge!("hmc_engine_transfers_inflight").decrement(1.0);
    }
}
