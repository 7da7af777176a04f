//! Metadata as an opaque, versioned blob (NIXL's `get_agent_metadata` /
//! `add_remote_agent`): a stack with its own side channel (vLLM's ZMQ, SGLang's bootstrap
//! server) carries it, and the peer is added without a lookup in the metadata store.
//!
//! A blob holds the engine's name, its metadata service's address, its instance, its data
//! plane and its region table; with a pre-shared secret it also carries a MAC of all that,
//! and one without (or with another secret's) is refused. Adding a blob still dials the
//! peer's metadata service once, to learn that the instance the blob describes is the one
//! running there (a blob of an engine that restarted is refused) and for notifications.

use std::time::Duration;

use hmc_core::{Communicator, Deadline};
use hmc_rpc::{CallOptions, Client, ClientConfig, RpcCodec};

use super::{Engine, MemHandle, parse_engine_addr, peer_key};
use crate::error::{EngineError, Result};
use crate::meta::{Blob, EngineInfo, Hello, Instance, METHOD_HELLO, SignedBlob, VERSION};

const MAGIC: [u8; 4] = *b"HMCM";
/// What the blob's MAC binds it to (beside the secret).
const MAC_CONTEXT: &str = "hmc-engine metadata blob v2";

fn bad_blob(why: impl std::fmt::Display) -> EngineError {
    EngineError::BadMetadata(why.to_string())
}

impl<C: Communicator> Engine<C> {
    /// This engine's metadata as a blob for [`Engine::add_remote`] on a peer: its name,
    /// addresses, instance and every registered region.
    pub fn local_metadata(&self) -> Result<Vec<u8>> {
        self.blob(None)
    }

    /// A partial blob: only the regions of `handles` (memory registered after the peer
    /// added the full blob). Adding it to a peer that has the full one adds those regions.
    pub fn partial_metadata(&self, handles: &[MemHandle]) -> Result<Vec<u8>> {
        self.blob(Some(handles))
    }

    fn blob(&self, only: Option<&[MemHandle]>) -> Result<Vec<u8>> {
        self.check_open()?;
        let s = &self.inner.shared;
        let mut info = s.info();
        if let Some(handles) = only {
            let t = s.local.read();
            info.regions = handles
                .iter()
                .map(|h| {
                    let (addr, staged) = t.by_handle.get(h).copied().ok_or_else(|| {
                        EngineError::InvalidArgument(format!("{h:?} is not registered here"))
                    })?;
                    if staged {
                        return Err(EngineError::InvalidArgument(format!(
                            "{h:?} is device memory peers cannot reach (it is moved through host bounce buffers here)"
                        )));
                    }
                    match t.map.find(addr, 1) {
                        crate::region_map::Lookup::Inside(r, _) => Ok(r.exported.clone()),
                        _ => unreachable!("a handle's region is in the map"),
                    }
                })
                .collect::<Result<_>>()?;
        }
        let blob = Blob {
            magic: MAGIC,
            version: VERSION,
            name: self.inner.name.clone(),
            address: self.inner.server.local_addr().to_string(),
            partial: only.is_some(),
            info,
        };
        let body = RpcCodec::encode(&blob).map_err(|e| bad_blob(e.to_string()))?;
        let mac = s
            .config
            .auth_secret
            .as_ref()
            .map(|k| mac(k, &body).to_vec());
        RpcCodec::encode(&SignedBlob { body, mac }).map_err(|e| bad_blob(e.to_string()))
    }

    /// Adds the peer a blob of [`Engine::local_metadata`] describes, as
    /// [`Engine::connect`] would, and returns its name (what transfers and
    /// [`Engine::remove_remote`] take). A partial blob adds its regions to a peer already
    /// added, or adds the peer with those regions (further ones are fetched from it on
    /// first use, as for any peer whose table changed). Refused: a blob over `max_metadata_blob_len`, one whose MAC does not match
    /// this engine's secret, one of another version, and one of an engine that restarted
    /// since it was made.
    pub async fn add_remote(&self, blob: &[u8], timeout: Duration) -> Result<String> {
        self.check_open()?;
        let max = self.inner.shared.config.max_metadata_blob_len;
        if blob.len() > max {
            return Err(EngineError::Limit {
                limit: "max_metadata_blob_len",
                value: blob.len() as u64,
                max: max as u64,
                hint: "raise EngineConfig::max_metadata_blob_len (option `max_metadata_blob_len`) here",
            });
        }
        let signed: SignedBlob = RpcCodec::decode(blob)
            .map_err(|e| bad_blob(format!("not a metadata blob of this engine ({e})")))?;
        match (&self.inner.shared.config.auth_secret, &signed.mac) {
            (Some(k), Some(m)) if m.len() == hmc_transport_kit::auth::PROOF_LEN => {
                let proof: [u8; 32] = m.as_slice().try_into().expect("length checked");
                let zero = [0u8; hmc_transport_kit::auth::NONCE_LEN];
                if !k.verify(MAC_CONTEXT, b'B', &zero, &zero, &signed.body, &proof) {
                    return Err(bad_blob(
                        "its MAC does not match this engine's auth_secret: it was made with another secret, or changed on the way",
                    ));
                }
            }
            (Some(_), _) => {
                return Err(bad_blob(
                    "it carries no MAC, and this engine has an auth_secret: give the engine that made it the same secret",
                ));
            }
            (None, Some(_)) => {
                return Err(bad_blob(
                    "it was made by an engine with an auth_secret: give this engine the same secret",
                ));
            }
            (None, None) => {}
        }
        let b: Blob = RpcCodec::decode(&signed.body)
            .map_err(|e| bad_blob(format!("its body does not decode ({e})")))?;
        if b.magic != MAGIC || b.version != VERSION || b.info.version != VERSION {
            return Err(bad_blob(format!(
                "version {} (this engine reads {VERSION}); use matching engine versions",
                b.version
            )));
        }
        let key = peer_key(&b.name);
        // A partial blob carries the peer's addresses too: to a peer not added yet it adds
        // the peer with those regions (NIXL's partial metadata with connection info).
        if b.partial && self.inner.peers.read().contains_key(&key) {
            self.add_regions(&key, &b.info)?;
            return Ok(key);
        }
        if self.inner.peers.read().contains_key(&key) {
            return Err(EngineError::AlreadyConnected(key));
        }
        let deadline = Deadline::after(timeout);
        let addr = parse_engine_addr(&b.address, None)?;
        let client_config = ClientConfig {
            auth_secret: self.inner.shared.config.auth_secret.clone(),
            ..ClientConfig::default()
        };
        let meta_err = |why: String| EngineError::Metadata {
            peer: key.clone(),
            why,
        };
        let rpc = tokio::time::timeout(deadline.remaining(), Client::connect(&addr, client_config))
            .await
            .map_err(|_| EngineError::Timeout {
                what: format!("connecting to `{key}`"),
                after: timeout,
            })?
            .map_err(|e| meta_err(e.to_string()))?;
        let hello = Hello {
            version: VERSION,
            from: self.inner.name.clone(),
        };
        let opts = CallOptions {
            timeout: Some(deadline.remaining().max(Duration::from_millis(1))),
            ..CallOptions::default()
        };
        let live: Instance = rpc
            .call_typed_with(METHOD_HELLO, &hello, opts)
            .await
            .map_err(|e| meta_err(e.to_string()))?;
        if live.instance != b.info.instance {
            return Err(meta_err(
                "the blob is stale: the engine there restarted since it was made (another instance); get its metadata again".into(),
            ));
        }
        self.attach(key.clone(), &addr, rpc, &b.info, deadline, timeout)
            .await?;
        Ok(key)
    }

    /// Adds the regions of a partial blob to the connected peer `key`.
    fn add_regions(&self, key: &str, info: &EngineInfo) -> Result<()> {
        // A partial blob adds regions to a connected peer; removed meanwhile, it is not.
        let peer = self.peer(key)?;
        if info.instance != peer.instance {
            return Err(EngineError::Metadata {
                peer: key.to_string(),
                why: "the partial blob is stale: the engine there restarted since it was made; get its metadata again".into(),
            });
        }
        let mut merged = {
            let t = peer.table.read();
            let mut all = EngineInfo {
                version: VERSION,
                instance: peer.instance,
                data_plane: String::new(),
                generation: t.generation,
                regions: t.map.iter().map(|(_, _, e)| e.encoded.clone()).collect(),
            };
            for r in &info.regions {
                if !all.regions.contains(r) {
                    all.regions.push(r.clone());
                }
            }
            self.import_table(key, &peer.ep, &all, Some(&t))?
        };
        // A fetched table (a refresh) supersedes a blob's: keep the generation it had.
        merged.generation = peer.table.read().generation;
        *peer.table.write() = merged;
        Ok(())
    }

    /// Removes a peer added with [`Engine::add_remote`] (or [`Engine::connect`]); transfers
    /// already running finish.
    pub async fn remove_remote(&self, name: &str) -> Result<()> {
        self.disconnect(name).await
    }

    /// True when `name` is added (connected) and not known gone.
    pub fn check_remote(&self, name: &str) -> bool {
        self.peer(name)
            .map(|p| p.gone.borrow().is_none())
            .unwrap_or(false)
    }
}

fn mac(k: &hmc_rpc::AuthSecret, body: &[u8]) -> [u8; 32] {
    let zero = [0u8; hmc_transport_kit::auth::NONCE_LEN];
    k.proof(MAC_CONTEXT, b'B', &zero, &zero, body)
}
