//! A peer's region table: fetched from its metadata service at connect and again when an
//! address is missing (it registered since) or a key is refused (it deregistered, or
//! restarted: then the peer is dropped and reported gone), imported on the endpoint.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use hmc_core::{Communicator, Deadline, RemoteRegion};
use hmc_rpc::{CallOptions, Client};

use hmc_core::PeerAddr;
use parking_lot::RwLock;

use super::rules::{check_data_plane, same_host};
use super::{Engine, Peer, PeerTable, RemoteEntry};
use crate::error::{EngineError, Result};
use crate::meta::{EngineInfo, Hello, METHOD_INFO, VERSION};
use crate::region_map::RegionMap;

impl<C: Communicator> Engine<C> {
    /// Connects the data plane of the peer `key` whose metadata service `rpc` reached at
    /// `addr` and which described itself with `info`, imports its regions and adds it.
    pub(super) async fn attach(
        &self,
        key: String,
        addr: &PeerAddr,
        rpc: Client,
        info: &EngineInfo,
        deadline: Deadline,
        timeout: Duration,
    ) -> Result<()> {
        let timed_out = || EngineError::Timeout {
            what: format!("connecting to `{key}`"),
            after: timeout,
        };
        let meta_err = |why: String| EngineError::Metadata {
            peer: key.clone(),
            why,
        };
        let dp: PeerAddr = info
            .data_plane
            .parse()
            .map_err(|e: hmc_core::Error| meta_err(e.to_string()))?;
        if !self.inner.shared.config.allow_foreign_data_plane {
            if !same_host(addr, &dp) {
                return Err(meta_err(format!(
                    "its data plane is at {dp}, another host than the engine; not dialled (set EngineConfig::allow_foreign_data_plane to allow it)"
                )));
            }
            check_data_plane(addr, &dp).map_err(|why| {
                meta_err(format!(
                    "its data plane at {dp} is not dialled: {why} (set EngineConfig::allow_foreign_data_plane to allow it)"
                ))
            })?;
        }
        let ep = tokio::time::timeout(
            deadline.remaining(),
            self.inner.shared.comm.connect(&dp, deadline),
        )
        .await
        .map_err(|_| timed_out())??;
        let table = self.import_table(&key, &ep, info, None)?;
        let peer = Arc::new(Peer {
            name: key.clone(),
            rpc,
            ep,
            instance: info.instance,
            table: RwLock::new(table),
            refreshing: tokio::sync::Mutex::new(()),
            gone: tokio::sync::watch::channel(None).0,
        });
        let mut peers = self.inner.peers.write();
        if peers.contains_key(&key) {
            return Err(EngineError::AlreadyConnected(key));
        }
        self.inner.lost.connected(&key);
        peers.insert(key, peer);
        Ok(())
    }

    pub(super) async fn fetch_info(&self, rpc: &Client, deadline: Deadline) -> Result<EngineInfo> {
        let hello = Hello {
            version: VERSION,
            from: self.inner.name.clone(),
        };
        // `meta.slow` / `meta.gone`: the peer's metadata service answers late, or not at
        // all (then the exchange ends at its deadline, as with an unreachable service).
        if let Some(plan) = &self.inner.shared.config.faults {
            let waited = deadline.remaining();
            if let Err(why) = plan.meta_lookup(waited).await {
                return Err(EngineError::Metadata {
                    peer: "peer".into(),
                    why: format!(
                        "no answer within {waited:?}: {why} (fault injected; unset the faults option or HMC_FAULTS to turn it off)"
                    ),
                });
            }
        }
        let opts = CallOptions {
            timeout: Some(deadline.remaining().max(Duration::from_millis(1))),
            ..CallOptions::default()
        };
        let info: EngineInfo = rpc
            .call_typed_with(METHOD_INFO, &hello, opts)
            .await
            .map_err(|e| match e {
                // A peer that accepts but never answers: a timeout, not a broken peer.
                hmc_rpc::CallError::DeadlineExceeded(after) => EngineError::Timeout {
                    what: "the metadata exchange".into(),
                    after,
                },
                e => EngineError::Metadata {
                    peer: "peer".into(),
                    why: e.to_string(),
                },
            })?;
        if info.version != VERSION {
            return Err(EngineError::Metadata {
                peer: "peer".into(),
                why: format!(
                    "metadata version {} (this engine speaks {VERSION}); use matching engine versions",
                    info.version
                ),
            });
        }
        Ok(info)
    }

    /// Builds a peer table from `info`, reusing the imports of `old` where a region's
    /// descriptor is unchanged.
    pub(super) fn import_table(
        &self,
        peer: &str,
        ep: &C::Endpoint,
        info: &EngineInfo,
        old: Option<&PeerTable<C>>,
    ) -> Result<PeerTable<C>> {
        let max = self.inner.shared.config.max_remote_regions;
        if info.regions.len() > max {
            return Err(EngineError::Limit {
                limit: "max_remote_regions",
                value: info.regions.len() as u64,
                max: max as u64,
                hint: "the peer registered more regions than this engine accepts; raise EngineConfig::max_remote_regions",
            });
        }
        let mut reuse: HashMap<&[u8], &Arc<RemoteEntry<C>>> = HashMap::new();
        if let Some(old) = old {
            for (_, _, e) in old.map.iter() {
                reuse.insert(&e.encoded, e);
            }
        }
        let mut map = RegionMap::default();
        for bytes in &info.regions {
            let entry = match reuse.get(bytes.as_slice()) {
                Some(e) => (*e).clone(),
                None => {
                    let remote = RemoteRegion::decode(bytes)?;
                    let key = self.inner.shared.comm.import(ep, &remote)?;
                    Arc::new(RemoteEntry {
                        key,
                        region: remote.region,
                        access: remote.access,
                        encoded: bytes.clone(),
                    })
                }
            };
            let r = entry.region;
            map.insert(r.addr, r.len as u64, entry)
                .map_err(|(s, l)| EngineError::Metadata {
                    peer: peer.to_string(),
                    why: format!(
                        "its table has overlapping regions {:#x}+{} and {s:#x}+{l}",
                        r.addr, r.len
                    ),
                })?;
        }
        Ok(PeerTable {
            generation: info.generation,
            map,
        })
    }

    /// Fetches `peer`'s table again (it registered or deregistered memory since). A peer
    /// found restarted (another instance at its address or name) is dropped, and
    /// [`EngineError::PeerGone`] says so: `connect` reaches the new instance.
    pub(super) async fn refresh(&self, peer: &Peer<C>, deadline: Deadline) -> Result<()> {
        let _one = peer.refreshing.lock().await;
        let info = self.fetch_info(&peer.rpc, deadline).await?;
        if info.instance != peer.instance {
            let why = "the engine there restarted (a new instance): its memory and keys are new; connect to it again".to_string();
            self.peer_gone(&peer.name, why.clone());
            return Err(EngineError::PeerGone {
                peer: peer.name.clone(),
                why,
            });
        }
        if info.generation == peer.table.read().generation {
            return Ok(());
        }
        let table = {
            let old = peer.table.read();
            self.import_table(&peer.name, &peer.ep, &info, Some(&old))?
        };
        *peer.table.write() = table;
        Ok(())
    }
}
