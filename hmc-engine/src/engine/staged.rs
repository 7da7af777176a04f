//! Device memory the transport does not move directly. Where the transport stages it
//! ([`DeviceMemoryPath::Staged`]: the TCP transport serves peers' READs and WRITEs of it
//! through its own pinned host chunks), the region is exported like any other and this
//! engine's own transfers from it go through registered host bounce buffers
//! ([`hmc_core::Stager`]), one chunk in the device copy while the previous one is on the
//! wire. Where the transport refuses the kind, the region stays local-only: this engine
//! READs into it and WRITEs from it, and peers cannot reach it.

use std::sync::Arc;

use hmc_backend_cpu::HostMemory;
use hmc_core::{
    AnyMemory, CommCapabilities, Communicator, Deadline, DeviceMemoryPath, MemSpan, MemSpanMut,
    Memory, Op, Region, StagedRun, Stager, StagingConfig,
};

use super::{Engine, MemDesc, MemHandle, RemoteEntry};
use crate::error::{EngineError, Result};
use crate::region_map::Lookup;

/// A device region this engine moves through its host bounce buffers: local-only where
/// the transport refuses the memory, exported where it stages it for peers.
pub(crate) struct StagedReg {
    memory: AnyMemory,
    region: Region,
}

impl StagedReg {
    /// The device's memory backend.
    pub(super) fn memory(&self) -> &AnyMemory {
        &self.memory
    }

    /// The device the registration is on.
    pub(super) fn device(&self) -> hmc_core::Device {
        self.region.device
    }
}

/// A run between staged local memory and a peer's region (made by the mover's split,
/// [`super::mover`], from runs whose owner holds both registrations until it ends).
pub(crate) struct StagedPiece<'r, C: Communicator> {
    pub(super) local: &'r StagedReg,
    pub(super) local_off: usize,
    pub(super) remote: &'r RemoteEntry<C>,
    pub(super) remote_off: u64,
    pub(super) len: usize,
}

/// The engine's bounce buffers.
pub(crate) type EngineStager<C> = Stager<HostMemory, C>;

impl<C: Communicator> Engine<C> {
    /// What the transport can do ([`Communicator::capabilities`]). Device memory of a kind
    /// outside its `local_memory`, or that it refuses, is still usable through
    /// [`Engine::register_device_mem`], staged through host memory.
    pub fn capabilities(&self) -> CommCapabilities {
        self.inner.shared.comm.capabilities()
    }

    /// Registers `desc`, device memory of `memory` (its kind and ordinal), by the one rule
    /// of [`CommCapabilities::memory_path`]: where the transport moves that kind directly
    /// it is registered like [`Engine::register_mem`]'s; where it stages it (the TCP
    /// transport, through its bounded pinned host chunks) it is exported too, so peers
    /// READ and WRITE it, and this engine's own transfers of it are staged through host
    /// bounce buffers; where the transport refuses the kind it stays local-only: this
    /// engine's transfers move it through the bounce buffers, and peers cannot reach it.
    ///
    /// # Safety
    /// As for [`Engine::register_mem`]: `desc` must be memory of `memory`'s device that
    /// stays allocated until [`Engine::deregister_mem`] of the handle has returned.
    pub unsafe fn register_device_mem(
        &self,
        desc: MemDesc,
        memory: AnyMemory,
    ) -> Result<MemHandle> {
        let device = memory.device();
        let caps = self.capabilities();
        let region = Region {
            device,
            addr: desc.addr,
            len: desc.len,
        };
        match caps.memory_path(device.kind) {
            DeviceMemoryPath::Refused => tracing::warn!(
                %device,
                transport = %caps.transport,
                "the transport does not take this memory kind: moved through host buffers by this engine only, peers cannot reach it; for peers to reach it choose transport=tcp (staged) or shm (vendor IPC), or a UCX built with the device's support (HMC_UCX_LIB)"
            ),
            DeviceMemoryPath::Staged => {
                self.check_open()?;
                tracing::debug!(
                    %device,
                    len = desc.len,
                    transport = %caps.transport,
                    "device memory served to peers through the transport's host chunks"
                );
                let entry = Arc::new(StagedReg { memory, region });
                // SAFETY: forwarded contract.
                return unsafe {
                    self.add_registered(region, hmc_core::Access::READ_WRITE, None, Some(entry))
                };
            }
            _ => {
                // Registered with its backend: a transport may need it (RDMA exports a
                // DMA-BUF of the memory for the NIC, shared memory an IPC handle).
                self.check_open()?;
                // SAFETY: forwarded contract.
                match unsafe {
                    self.add_registered(region, hmc_core::Access::READ_WRITE, Some(&memory), None)
                } {
                    // This memory, not the kind, is beyond the transport (a backend without
                    // IPC or DMA-BUF export): local-only, as for a refused kind.
                    Err(EngineError::Transport(hmc_core::Error::UnsupportedMemory {
                        reason,
                        ..
                    })) => tracing::warn!(
                        %device,
                        transport = %caps.transport,
                        %reason,
                        "the transport cannot register this device memory: moved through host buffers by this engine only, peers cannot reach it"
                    ),
                    other => return other,
                }
            }
        }
        if desc.len == 0 {
            return Err(EngineError::InvalidArgument(
                "cannot register 0 bytes".into(),
            ));
        }
        let mut t = self.inner.shared.local.write();
        if let Lookup::Inside(..) | Lookup::Straddles { .. } = t.map.find(desc.addr, 1) {
            return Err(EngineError::InvalidArgument(format!(
                "{:#x} is already registered; deregister it first",
                desc.addr
            )));
        }
        let entry = Arc::new(StagedReg { memory, region });
        if let Err((start, region_len)) = t.staged.insert(desc.addr, desc.len as u64, entry) {
            return Err(EngineError::Overlaps {
                addr: desc.addr,
                len: desc.len as u64,
                start,
                region_len,
            });
        }
        let handle = MemHandle(t.next_handle);
        t.next_handle += 1;
        t.by_handle.insert(handle, (desc.addr, true));
        tracing::debug!(
            %device,
            len = desc.len,
            transport = %caps.transport,
            "device memory the transport cannot register: staged through host buffers"
        );
        Ok(handle)
    }

    /// Moves staged runs of a transfer, all of memory of one device (the mover groups them
    /// so), through the bounce buffers (made on first use), packed together where they are
    /// small.
    pub(super) async fn run_staged(
        &self,
        ep: &C::Endpoint,
        op: Op,
        staged: &[StagedPiece<'_, C>],
        deadline: Deadline,
    ) -> hmc_core::Result<()> {
        let Some(first) = staged.first() else {
            return Ok(());
        };
        let mut guard = self.inner.stager.lock().await;
        if guard.is_none() {
            *guard = Some(Stager::new(
                Arc::new(HostMemory::new()),
                self.inner.shared.comm.clone(),
                StagingConfig::default(),
            )?);
        }
        let stager = guard.as_mut().expect("made above");
        // The caller groups runs by device, so one backend copies them all.
        let memory = first.local.memory();
        let regions = staged
            .iter()
            .map(|p| p.local.region.slice(p.local_off, p.len))
            .collect::<hmc_core::Result<Vec<_>>>()?;
        let total: u64 = staged.iter().map(|p| p.len as u64).sum();
        match op {
            Op::Write => {
                let runs: Vec<StagedRun<'_, C, MemSpan<'_>>> = staged
                    .iter()
                    .zip(&regions)
                    .map(|(p, &region)| StagedRun {
                        // SAFETY: the run was resolved inside a staged registration, which
                        // the caller keeps allocated while registered (`register_device_mem`),
                        // and the runs the mover was given hold the registration until this
                        // transfer ends.
                        local: unsafe { MemSpan::from_region(region) },
                        remote: &p.remote.key,
                        remote_offset: p.remote_off,
                    })
                    .collect();
                stager.write_gather(memory, ep, &runs, deadline).await?;
                // Literal labels: static keys (see `TransferMetrics`).
                metrics::counter!("hmc_engine_staged_bytes_total", "op" => "write")
                    .increment(total);
            }
            Op::Read => {
                let mut runs: Vec<StagedRun<'_, C, MemSpanMut<'_>>> = staged
                    .iter()
                    .zip(&regions)
                    .map(|(p, &region)| StagedRun {
                        // SAFETY: as for WRITE; a transfer's runs do not overlap in local
                        // memory, and peers that reach it write it only as the DMA rule
                        // the registering caller accepted allows.
                        local: unsafe { MemSpanMut::from_region(region) },
                        remote: &p.remote.key,
                        remote_offset: p.remote_off,
                    })
                    .collect();
                stager.read_scatter(memory, ep, &mut runs, deadline).await?;
                metrics::counter!("hmc_engine_staged_bytes_total", "op" => "read").increment(total);
            }
        }
        Ok(())
    }
}
