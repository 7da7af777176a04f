//! The engine's directory: small named values an engine publishes for its peers to look
//! up (how the layers above it, such as the KV caches of [`crate::kv`], describe memory to
//! each other).

use std::time::Duration;

use hmc_core::Communicator;
use hmc_rpc::CallOptions;

use super::Engine;
use crate::error::{EngineError, Result};
use crate::meta::METHOD_LOOKUP;

impl<C: Communicator> Engine<C> {
    /// Publishes `value` under `name` for peers to [`Engine::lookup`] (replacing what was
    /// there): how layers above the engine describe memory to each other, such as the KV
    /// caches of [`crate::kv`].
    pub fn publish(&self, name: &str, value: Vec<u8>) -> Result<()> {
        let max = self.inner.shared.config.max_published_len;
        if value.len() > max {
            return Err(EngineError::Limit {
                limit: "max_published_len",
                value: value.len() as u64,
                max: max as u64,
                hint: "publish less (fewer tensors per key), or raise EngineConfig::max_published_len",
            });
        }
        self.inner
            .shared
            .directory
            .write()
            .insert(name.to_string(), value);
        Ok(())
    }

    /// Removes what was published under `name`.
    pub fn unpublish(&self, name: &str) {
        self.inner.shared.directory.write().remove(name);
    }

    /// The value `remote` published under `name`, if any.
    pub async fn lookup(
        &self,
        remote: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<Option<Vec<u8>>> {
        self.check_open()?;
        let peer = self.peer(remote)?;
        let opts = CallOptions {
            timeout: Some(timeout),
            ..CallOptions::default()
        };
        let req = crate::meta::Lookup {
            name: name.to_string(),
        };
        peer.rpc
            .call_typed_with(METHOD_LOOKUP, &req, opts)
            .await
            .map_err(|e| EngineError::Metadata {
                peer: peer.name.clone(),
                why: e.to_string(),
            })
    }
}
