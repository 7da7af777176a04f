//! Device regions the loaded UCX cannot move: registering them as staged regions, and
//! moving a batch's staged remote regions over the control connection (`crate::staged`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};

use futures::channel::oneshot;
use hmc_core::{
    Access, AnyMemory, Deadline, DeviceKind, Error, Memory, Op, Region, RemoteRegion, Result,
    TransportId,
};

use super::{KEY_HEADER, KEY_MAGIC, KEY_STAGED, UcxCommunicator, UcxEndpoint, UcxRegistration};
use crate::staged::{StagedDesc, StagedEvent, StagedRegion, StagedRun};

/// Events a staged batch's thread may have queued before it takes them.
const EVENT_QUEUE: usize = 64;

impl UcxCommunicator {
    /// `register_memory`: mapped by UCX where it moves the kind, else staged.
    pub(super) fn register_device(
        &self,
        region: Region,
        access: Access,
        memory: &AnyMemory,
    ) -> Result<UcxRegistration> {
        let kind = region.device.kind;
        if kind == DeviceKind::HOST || self.memory_kinds().contains(&kind) {
            return self.map(region, access, false);
        }
        if memory.device() != region.device {
            return Err(Error::InvalidArgument(format!(
                "register_memory: the region is on {} and the memory backend serves {}; pass \
                 the backend of the region's device",
                region.device,
                memory.device()
            )));
        }
        let id = self.target.staged_id();
        let mut key = Vec::with_capacity(KEY_HEADER + 6);
        key.extend_from_slice(KEY_MAGIC);
        key.push(KEY_STAGED);
        key.extend_from_slice(&id.to_be_bytes());
        key.extend_from_slice(b"staged");
        let export = RemoteRegion {
            transport: TransportId::UCX,
            region,
            access,
            key,
        };
        let staged = Arc::new(StagedRegion::new(region, access, memory.clone()));
        self.target.staged.lock().insert(id, staged.clone());
        self.target.regs.lock().insert(id, export.encode());
        self.counters.registered.fetch_add(1, Ordering::AcqRel);
        tracing::debug!(
            device = %region.device,
            len = region.len,
            "ucx: device memory this UCX cannot move is staged for peers over the control connection"
        );
        Ok(UcxRegistration {
            id,
            region,
            access,
            owned: false,
            export,
            engine: self.engine.clone(),
            target: self.target.clone(),
            revoke_timeout: self.config.revoke_timeout,
            counters: self.counters.clone(),
            staged: Some(staged),
        })
    }

    /// Moves the checked descriptors whose remote regions the peer stages, on a thread of
    /// their own; a dropped future waits until that thread no longer touches local memory.
    pub(super) async fn staged_transfer(
        &self,
        ep: &UcxEndpoint,
        op: Op,
        descs: Vec<StagedDesc>,
        deadline: Deadline,
    ) -> Result<()> {
        let (sender, events) = mpsc::sync_channel(EVENT_QUEUE);
        let cancelled = Arc::new(AtomicBool::new(false));
        let run = StagedRun {
            link: ep.0.link.clone(),
            peer: ep.0.peer,
            op,
            descs,
            deadline: deadline.instant(),
            drain_timeout: self.config.drain_timeout,
            events,
            cancelled: cancelled.clone(),
        };
        let (reply, result) = oneshot::channel();
        let (exited_tx, exited) = mpsc::sync_channel::<()>(1);
        let to_thread = sender.clone();
        std::thread::Builder::new()
            .name("hmc-ucx-staged".into())
            .spawn(move || {
                let _exited = exited_tx;
                let _ = reply.send(run.run(to_thread));
            })
            .map_err(|e| Error::io("spawning a UCX staged-transfer thread", e))?;
        let mut guard = StagedGuard {
            cancelled,
            sender,
            exited,
            armed: true,
        };
        let r = result.await;
        guard.armed = false;
        r.map_err(|_| Error::Closed("a UCX staged-transfer thread ended without a result".into()))?
    }
}

/// Stops a staged batch's thread when its future is dropped, and waits until it exited
/// (so no byte lands in local memory afterwards).
struct StagedGuard {
    cancelled: Arc<AtomicBool>,
    sender: mpsc::SyncSender<StagedEvent>,
    exited: mpsc::Receiver<()>,
    armed: bool,
}

impl Drop for StagedGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        self.cancelled.store(true, Ordering::Release);
        let _ = self.sender.try_send(StagedEvent::Cancel);
        // Bounded: the thread checks `cancelled` between frames and waits for a stopped
        // WRITE's answers at most `drain_timeout`.
        let _ = self.exited.recv();
    }
}
