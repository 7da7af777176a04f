//! The blocking API: the same engine driven from synchronous code (HIXL's C++ calls, a
//! Python binding), on a runtime the engine owns.

use std::sync::Arc;
use std::time::Duration;

use hmc_core::Communicator;

use crate::config::EngineConfig;
use crate::engine::{Engine, MemDesc, MemHandle, MemType, Notify, TransferOp, TransferOpDesc};
use crate::error::{EngineError, Result};
use crate::request::{TransferRequest, TransferStatus};

/// An [`Engine`] with blocking calls, on a runtime of its own (two worker threads).
pub struct BlockingEngine<C: Communicator> {
    engine: Engine<C>,
    rt: tokio::runtime::Runtime,
}

impl<C: Communicator> BlockingEngine<C> {
    /// Starts the runtime, opens the communicator with `open` inside it (transports start
    /// their tasks there), and initializes the engine at `local`.
    pub fn initialize(
        open: impl FnOnce() -> hmc_core::Result<C>,
        local: &str,
        config: EngineConfig,
    ) -> Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("hmc-engine")
            .enable_all()
            .build()
            .map_err(|e| EngineError::InvalidArgument(format!("cannot start a runtime: {e}")))?;
        let engine = rt.block_on(async {
            let comm = Arc::new(open()?);
            Engine::initialize(comm, local, config).await
        })?;
        Ok(BlockingEngine { engine, rt })
    }

    /// The async engine (for mixing both styles).
    pub fn engine(&self) -> &Engine<C> {
        &self.engine
    }

    /// See [`Engine::name`].
    pub fn name(&self) -> &str {
        self.engine.name()
    }

    /// See [`Engine::register_mem`].
    ///
    /// # Safety
    /// As [`Engine::register_mem`].
    pub unsafe fn register_mem(
        &self,
        desc: MemDesc,
        mem_type: MemType,
        access: hmc_core::Access,
    ) -> Result<MemHandle> {
        // SAFETY: forwarded contract.
        unsafe { self.engine.register_mem(desc, mem_type, access) }
    }

    /// See [`Engine::deregister_mem`].
    pub fn deregister_mem(&self, handle: MemHandle) -> Result<()> {
        self.rt.block_on(self.engine.deregister_mem(handle))
    }

    /// See [`Engine::connect`].
    pub fn connect(&self, remote: &str, timeout: Duration) -> Result<()> {
        self.rt.block_on(self.engine.connect(remote, timeout))
    }

    /// See [`Engine::disconnect`].
    pub fn disconnect(&self, remote: &str) -> Result<()> {
        self.rt.block_on(self.engine.disconnect(remote))
    }

    /// See [`Engine::transfer`].
    pub fn transfer_sync(
        &self,
        remote: &str,
        op: TransferOp,
        descs: &[TransferOpDesc],
        timeout: Duration,
    ) -> Result<()> {
        self.rt
            .block_on(self.engine.transfer(remote, op, descs, timeout))
    }

    /// See [`Engine::transfer_async`].
    pub fn transfer_async(
        &self,
        remote: &str,
        op: TransferOp,
        descs: Vec<TransferOpDesc>,
        timeout: Duration,
    ) -> Result<TransferRequest> {
        self.engine.transfer_async(remote, op, descs, timeout)
    }

    /// Blocks until `req` ends.
    pub fn wait(&self, req: &TransferRequest) -> TransferStatus {
        self.rt.block_on(req.wait())
    }

    /// See [`Engine::send_notify`].
    pub fn send_notify(
        &self,
        remote: &str,
        name: &str,
        msg: &[u8],
        timeout: Duration,
    ) -> Result<()> {
        self.rt
            .block_on(self.engine.send_notify(remote, name, msg, timeout))
    }

    /// See [`Engine::get_notifies`].
    pub fn get_notifies(&self) -> Vec<Notify> {
        self.engine.get_notifies()
    }

    /// See [`Engine::finalize`].
    pub fn finalize(&self) {
        self.rt.block_on(self.engine.finalize())
    }
}
