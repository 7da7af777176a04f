//! [`BlockingClient`]: the async client driven by a small runtime of its own, for
//! synchronous callers.

use bytes::Bytes;
use hmc_core::{Error, PeerAddr};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{CallError, CallOptions, Client, ClientConfig};

/// A blocking client: the same client driven by its own small runtime.
pub struct BlockingClient {
    rt: tokio::runtime::Runtime,
    client: Client,
}

impl BlockingClient {
    /// Connects to `addr`.
    pub fn connect(addr: &PeerAddr, config: ClientConfig) -> Result<Self, CallError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("hmc-rpc-client")
            .enable_all()
            .build()
            .map_err(|e| CallError::Connect(Error::io("starting the client runtime", e)))?;
        let client = rt.block_on(Client::connect(addr, config))?;
        Ok(BlockingClient { rt, client })
    }

    /// A blocking raw call.
    pub fn call(&self, method: u32, payload: impl Into<Bytes>) -> Result<Bytes, CallError> {
        self.rt.block_on(self.client.call(method, payload))
    }

    /// A blocking raw call with options.
    pub fn call_with(
        &self,
        method: u32,
        payload: impl Into<Bytes>,
        opts: CallOptions,
    ) -> Result<Bytes, CallError> {
        self.rt
            .block_on(self.client.call_with(method, payload, opts))
    }

    /// A blocking typed call.
    pub fn call_typed<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        method: u32,
        req: &Req,
    ) -> Result<Resp, CallError> {
        self.rt.block_on(self.client.call_typed(method, req))
    }

    /// The async client inside (to start calls concurrently).
    pub fn client(&self) -> &Client {
        &self.client
    }
}
