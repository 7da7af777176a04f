//! Transfers over prepared lists: made once from two lists and two index arrays, posted
//! any number of times (one at a time), polled, and released (NIXL's `make_prepped_xfer`,
//! `transfer`, `check_xfer_state`, `release_xfer_handle`).
//!
//! A posted transfer always ends. Its bytes move in chunks of at most
//! `progress_chunk_bytes`, each under a deadline of `no_progress_timeout`: a transfer that
//! keeps moving runs as long as it needs, and one where no chunk completes for that long
//! ends with [`EngineError::Timeout`]. Ending (an error, a cancel, a release) drops the
//! transport's future, whose cancellation contract stops every access to the local memory;
//! an ended WRITE is then settled ([`hmc_core::Communicator::settle`]: over TCP the target
//! is told to drop the rest of the WRITE, even bytes its socket already holds) before its
//! end is reported, so no byte of it lands at the target later.
//!
//! A notification attached to the transfer is sent through the peer's metadata service
//! after the last chunk completed (for a WRITE: after the bytes are visible at the target,
//! the transport's contract), and only then does the post report success; when the
//! transfer fails, the target is sent a failure notice (same name and message, with
//! [`crate::Notify::failed`] set) instead, best effort.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use hmc_core::{Communicator, Deadline, Op, TransferDesc, TransportId};
use parking_lot::Mutex;

use super::prepared::{ListSide, PreparedList, Resolved, needs};
use super::rules::broken_peer;
use super::{Engine, LocalReg, Peer, RemoteEntry};
use crate::TransferOp;
use crate::error::{EngineError, Result};
use crate::meta::{NotifyAck, NotifyId};
use crate::request::{TransferRequest, TransferStatus};

/// What one post of a transfer did, once it ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Telemetry {
    /// When it was posted.
    pub posted_at: SystemTime,
    /// From the post to its end.
    pub duration: Duration,
    /// Bytes moved (all of the transfer's when it completed, else those of the chunks that
    /// completed).
    pub bytes: u64,
    /// Descriptors the caller named.
    pub requested_descs: u64,
    /// Runs after merging the descriptors contiguous on both sides.
    pub descs: u64,
    /// Of the transfer's bytes, those in the peer's device memory that the transport
    /// stages (over tcp: moved through the peer's pinned host chunks, see
    /// `CommCapabilities::memory_path`); 0 when every byte moved on the direct path.
    pub staged_at_peer_bytes: u64,
    /// The transport that moved them.
    pub transport: TransportId,
    /// True when it completed.
    pub ok: bool,
}

/// One contiguous run of a prepared transfer, by region index in its two lists.
#[derive(Clone, Copy, Debug)]
struct Run {
    l: u32,
    r: u32,
    loff: u64,
    roff: u64,
    len: u64,
}

/// A transfer made of prepared lists (see [`Engine::make_transfer`]). Cheap to clone;
/// every clone is the same transfer.
pub struct PreparedTransfer<C: Communicator> {
    inner: Arc<XferInner<C>>,
}

impl<C: Communicator> Clone for PreparedTransfer<C> {
    fn clone(&self) -> Self {
        PreparedTransfer {
            inner: self.inner.clone(),
        }
    }
}

impl<C: Communicator> std::fmt::Debug for PreparedTransfer<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedTransfer")
            .field("op", &self.inner.op)
            .field("peer", &self.inner.peer.name)
            .field("descs", &self.inner.requested)
            .field("runs", &self.inner.runs.len())
            .field("bytes", &self.inner.bytes)
            .finish_non_exhaustive()
    }
}

struct XferInner<C: Communicator> {
    engine: Engine<C>,
    op: TransferOp,
    peer: Arc<Peer<C>>,
    local: Arc<ListSide<C>>,
    remote: Arc<ListSide<C>>,
    runs: Vec<Run>,
    bytes: u64,
    /// Bytes in the peer's device memory that the transport stages.
    staged_at_peer: u64,
    requested: u64,
    notify: Option<(String, Vec<u8>)>,
    transport: TransportId,
    /// Most runs in one transport batch.
    max_batch: usize,
    state: Mutex<XferState>,
}

#[derive(Default)]
struct XferState {
    current: Option<TransferRequest>,
    released: bool,
    telemetry: Option<Telemetry>,
}

fn local_of<C: Communicator>(l: &ListSide<C>) -> Option<&Resolved<std::sync::Weak<LocalReg<C>>>> {
    match l {
        ListSide::Local(r) => Some(r),
        ListSide::Remote { .. } => None,
    }
}

fn remote_of<C: Communicator>(l: &ListSide<C>) -> Option<&Resolved<Arc<RemoteEntry<C>>>> {
    match l {
        ListSide::Remote { resolved, .. } => Some(resolved),
        ListSide::Local(_) => None,
    }
}

/// A local list's registrations, or [`EngineError::ListInvalid`] if one was
/// deregistered.
fn live_regs<C: Communicator>(
    l: &Resolved<std::sync::Weak<LocalReg<C>>>,
) -> Result<Vec<Arc<LocalReg<C>>>> {
    l.regs
        .iter()
        .map(|w| {
            w.upgrade().ok_or_else(|| {
                EngineError::ListInvalid(
                    "local memory under a prepared local list was deregistered".into(),
                )
            })
        })
        .collect()
}

impl<C: Communicator> Engine<C> {
    /// Makes a transfer of entries `local_idx[k]` of `local` with entries `remote_idx[k]`
    /// of `remote` (a list prepared for a peer), for every `k`: both index arrays have one
    /// length, every index is inside its list, and the two entries of a pair have one
    /// length. Pairs contiguous on both sides merge into one run. Access is checked here
    /// (a READ needs local memory registered writable and the peer's readable; a WRITE the
    /// reverse). With `notify` (`name`, `message`), every post ends by delivering that
    /// notification to the peer (see the module documentation of the ordering).
    pub fn make_transfer(
        &self,
        op: TransferOp,
        local: &PreparedList<C>,
        local_idx: &[u64],
        remote: &PreparedList<C>,
        remote_idx: &[u64],
        notify: Option<(String, Vec<u8>)>,
    ) -> Result<PreparedTransfer<C>> {
        self.check_open()?;
        let bad = |m: String| EngineError::InvalidArgument(m);
        let l = local_of(&local.inner)
            .ok_or_else(|| bad("the local list was prepared for a peer (prepare_remote); pass one from prepare_local".into()))?;
        let (peer, r) = match &*remote.inner {
            ListSide::Remote { peer, resolved, .. } => (peer.clone(), resolved),
            ListSide::Local(_) => {
                return Err(bad(
                    "the remote list is a local one (prepare_local); pass one from prepare_remote"
                        .into(),
                ));
            }
        };
        if local_idx.len() != remote_idx.len() {
            return Err(bad(format!(
                "{} local indices and {} remote ones; pass one of each per descriptor",
                local_idx.len(),
                remote_idx.len()
            )));
        }
        if let Some((name, _)) = &notify
            && name.len() > self.inner.shared.config.max_notify_len
        {
            return Err(EngineError::Limit {
                limit: "max_notify_len",
                value: name.len() as u64,
                max: self.inner.shared.config.max_notify_len as u64,
                hint: "use a shorter notification name",
            });
        }
        let (remote_needs, local_needs) = needs(op);
        let held = live_regs(l)?;
        if let Some(reg) = held.iter().find(|g| !g.access.allows(local_needs)) {
            return Err(EngineError::Transport(hmc_core::Error::AccessDenied(
                format!(
                    "local memory {:?} is registered for {:?}; a {op:?} needs {local_needs:?} there (nothing was moved)",
                    hmc_core::LocalRegistration::region(&reg.reg),
                    reg.access
                ),
            )));
        }
        if let Some(reg) = r.regs.iter().find(|g| !g.access.allows(remote_needs)) {
            return Err(EngineError::Transport(hmc_core::Error::AccessDenied(
                format!(
                    "{} registered a region of this list for {:?}; a {op:?} needs {remote_needs:?} there (nothing was moved)",
                    peer.name, reg.access
                ),
            )));
        }
        let caps = self.inner.shared.comm.capabilities();
        let max_run = caps.max_transfer_len;
        let mut runs: Vec<Run> = Vec::with_capacity(local_idx.len().min(1 << 20));
        let mut bytes = 0u64;
        let mut staged_at_peer = 0u64;
        // Per remote region: is it device memory this transport stages?
        let staged: Vec<bool> = r
            .regs
            .iter()
            .map(|e| {
                !e.region.device.is_host()
                    && caps.memory_path(e.region.device.kind) == hmc_core::DeviceMemoryPath::Staged
            })
            .collect();
        for (k, (&li, &ri)) in local_idx.iter().zip(remote_idx).enumerate() {
            let (lr, loff, llen) = l.entry(li).ok_or_else(|| {
                bad(format!(
                    "local index {li} (at {k}) is outside the local list of {} entries",
                    l.len
                ))
            })?;
            let (rr, roff, rlen) = r.entry(ri).ok_or_else(|| {
                bad(format!(
                    "remote index {ri} (at {k}) is outside the remote list of {} entries",
                    r.len
                ))
            })?;
            if llen != rlen {
                return Err(bad(format!(
                    "pair {k}: local entry {li} is {llen} bytes, remote entry {ri} is {rlen}; pair entries of one length"
                )));
            }
            bytes += llen;
            if staged.get(rr as usize) == Some(&true) {
                staged_at_peer += llen;
            }
            if let Some(p) = runs.last_mut()
                && p.l == lr
                && p.r == rr
                && p.loff + p.len == loff
                && p.roff + p.len == roff
                && p.len + llen <= max_run
            {
                p.len += llen;
                continue;
            }
            runs.push(Run {
                l: lr,
                r: rr,
                loff,
                roff,
                len: llen,
            });
        }
        runs.shrink_to_fit();
        Ok(PreparedTransfer {
            inner: Arc::new(XferInner {
                engine: self.clone(),
                op,
                peer,
                local: local.inner.clone(),
                remote: remote.inner.clone(),
                runs,
                bytes,
                staged_at_peer,
                requested: local_idx.len() as u64,
                notify,
                transport: caps.transport,
                max_batch: caps.max_batch_len.clamp(1, 65_536),
                state: Mutex::default(),
            }),
        })
    }
}

impl<C: Communicator> PreparedTransfer<C> {
    /// Starts the transfer and returns at once. Refused while a post of it is in progress,
    /// and after [`PreparedTransfer::release`]; posting again after it ended is the way to
    /// repeat it.
    pub fn post(&self) -> Result<()> {
        let x = &self.inner;
        x.engine.check_open()?;
        let mut st = x.state.lock();
        if st.released {
            return Err(EngineError::InvalidArgument(
                "this transfer was released; make a new one".into(),
            ));
        }
        if st.current.as_ref().is_some_and(|c| !c.status().is_done()) {
            return Err(EngineError::InvalidArgument(
                "this transfer is still in progress; wait for it (or release it) before posting it again".into(),
            ));
        }
        let (req, done) = TransferRequest::new();
        st.current = Some(req);
        st.telemetry = None;
        drop(st);
        let me = self.inner.clone();
        // Every post is a new send of the notification: a late copy of an earlier post's
        // cannot count as this one's, and this one's failure notice replaces only it.
        let notify_id = x.engine.next_notify_id();
        x.engine.inner.runtime.spawn(async move {
            let posted_at = SystemTime::now();
            let start = Instant::now();
            let metrics = super::membership::TransferMetrics::start_bytes(me.op, me.bytes);
            let mut moved = 0u64;
            let cancel = done.cancel.clone();
            let outcome = tokio::select! {
                r = me.run(notify_id, &mut moved) => r,
                _ = cancel.notified() => Err(EngineError::Cancelled(format!(
                    "a transfer of {} descriptor(s) with `{}`", me.requested, me.peer.name
                ))),
            };
            if me.op == TransferOp::Write && outcome.is_err() {
                // The transport's future is gone (an error, a timeout, a cancel, a
                // release); the target may still hold bytes of it: before the end is
                // reported, and before the target is told of the failure.
                me.engine.settle_write(&me.peer).await;
            }
            metrics.finish(&outcome);
            if let Err(e) = &outcome
                && let Some((name, msg)) = &me.notify
            {
                me.failure_notice(notify_id, name.clone(), msg.clone(), e.to_string());
            }
            let telemetry = Telemetry {
                posted_at,
                duration: start.elapsed(),
                bytes: if outcome.is_ok() { me.bytes } else { moved },
                requested_descs: me.requested,
                descs: me.runs.len() as u64,
                staged_at_peer_bytes: me.staged_at_peer,
                transport: me.transport,
                ok: outcome.is_ok(),
            };
            me.state.lock().telemetry = Some(telemetry);
            done.finish(match outcome {
                Ok(()) => TransferStatus::Completed,
                Err(EngineError::Timeout { .. }) => TransferStatus::TimedOut,
                Err(e) => TransferStatus::Failed(Arc::new(e)),
            });
        });
        Ok(())
    }

    /// Where the last post stands; `None` before the first.
    pub fn status(&self) -> Option<TransferStatus> {
        self.inner.state.lock().current.as_ref().map(|c| c.status())
    }

    /// Waits for the last post to end and returns how; `None` before the first.
    pub async fn wait(&self) -> Option<TransferStatus> {
        let req = self.inner.state.lock().current.clone();
        match req {
            Some(r) => Some(r.wait().await),
            None => None,
        }
    }

    /// The last post's telemetry, once it ended.
    pub fn telemetry(&self) -> Option<Telemetry> {
        self.inner.state.lock().telemetry.clone()
    }

    /// Ends the transfer for good: a post in progress is cancelled and waited for (when
    /// this returns, the transport no longer touches either side's memory for it), and
    /// later posts are refused.
    pub async fn release(&self) {
        let req = {
            let mut st = self.inner.state.lock();
            st.released = true;
            st.current.clone()
        };
        if let Some(r) = req {
            r.cancel();
            r.wait().await;
        }
    }

    /// Bytes one post moves.
    pub fn bytes(&self) -> u64 {
        self.inner.bytes
    }

    /// Runs after merging.
    pub fn runs(&self) -> usize {
        self.inner.runs.len()
    }
}

impl<C: Communicator> XferInner<C> {
    /// Checks the lists still belong to the peer as connected now.
    fn check_peer(&self) -> Result<()> {
        let current = self.engine.inner.peers.read().get(&self.peer.name).cloned();
        match current {
            Some(p) if Arc::ptr_eq(&p, &self.peer) => Ok(()),
            _ => {
                let why = self.peer.gone.borrow().clone();
                Err(EngineError::PeerGone {
                    peer: self.peer.name.clone(),
                    why: why.unwrap_or_else(|| {
                        "disconnected since the remote list was prepared: prepare it again after connecting".into()
                    }),
                })
            }
        }
    }

    /// After the transport refused a key: fetches the peer's table again and says which
    /// region of the remote list is gone.
    async fn check_list(&self, refused: EngineError) -> EngineError {
        let deadline = Deadline::after(self.engine.inner.shared.config.no_progress_timeout);
        if let Err(e) = Box::pin(self.engine.refresh(&self.peer, deadline)).await {
            return match e {
                gone @ EngineError::PeerGone { .. } => gone,
                _ => refused,
            };
        }
        let r = remote_of(&self.remote).expect("checked at make_transfer");
        let table = self.peer.table.read();
        for reg in &r.regs {
            let region = reg.region;
            let live = matches!(
                table.map.find(region.addr, region.len as u64),
                crate::region_map::Lookup::Inside(e, 0) if Arc::ptr_eq(e, reg)
            );
            if !live {
                return EngineError::ListInvalid(format!(
                    "`{}` deregistered its region {:#x}+{} under a prepared remote list",
                    self.peer.name, region.addr, region.len
                ));
            }
        }
        refused
    }

    /// Why a post ended when its peer went: this engine's finalize, or the peer.
    fn gone_error(&self) -> EngineError {
        if self.engine.is_finalized() {
            return EngineError::Cancelled(format!(
                "a transfer with `{}`: this engine was finalized",
                self.peer.name
            ));
        }
        EngineError::PeerGone {
            peer: self.peer.name.clone(),
            why: self
                .peer
                .gone
                .borrow()
                .clone()
                .unwrap_or_else(|| "disconnected".into()),
        }
    }

    async fn run(&self, notify_id: NotifyId, moved: &mut u64) -> Result<()> {
        self.engine.check_open()?;
        self.check_peer()?;
        let l = local_of(&self.local).expect("checked at make_transfer");
        // Held until this post ends: deregistering waits for it.
        let held = live_regs(l)?;
        let r = remote_of(&self.remote).expect("checked at make_transfer");
        let cfg = &self.engine.inner.shared.config;
        let stall = cfg.no_progress_timeout;
        let chunk_bytes = cfg.progress_chunk_bytes.max(1) as u64;
        let comm = &self.engine.inner.shared.comm;
        let op = match self.op {
            TransferOp::Read => Op::Read,
            TransferOp::Write => Op::Write,
        };
        let mut gone = self.peer.gone.subscribe();
        // Runs of device memory the transport stages and does not move itself go through
        // this engine's bounce buffers, after the others.
        let mut staged = Vec::new();
        let mut i = 0;
        let mut batch: Vec<TransferDesc<'_, C>> = Vec::new();
        while i < self.runs.len() {
            batch.clear();
            let mut chunk = 0u64;
            while i < self.runs.len() && batch.len() < self.max_batch {
                let run = self.runs[i];
                let (local, remote) = (&held[run.l as usize], &r.regs[run.r as usize]);
                if let Some(st) = &local.staged
                    && !comm.moves_device_memory(&self.peer.ep, &local.reg, &remote.key)
                {
                    staged.push(super::staged::StagedPiece {
                        local: st.clone(),
                        local_off: run.loff as usize,
                        remote: remote.clone(),
                        remote_off: run.roff,
                        len: run.len as usize,
                    });
                    i += 1;
                    continue;
                }
                if !batch.is_empty() && chunk + run.len > chunk_bytes {
                    break;
                }
                batch.push(TransferDesc {
                    local: &held[run.l as usize].reg,
                    local_offset: run.loff as usize,
                    remote: &r.regs[run.r as usize].key,
                    remote_offset: run.roff,
                    len: run.len as usize,
                });
                chunk += run.len;
                i += 1;
            }
            if batch.is_empty() {
                continue;
            }
            let outcome = tokio::select! {
                biased;
                r = comm.transfer(&self.peer.ep, op, &batch, Deadline::after(stall)) => r,
                _ = gone.wait_for(Option::is_some) => return Err(self.gone_error()),
            };
            match outcome {
                Ok(()) => *moved += chunk,
                Err(hmc_core::Error::DeadlineExceeded { .. }) => {
                    return Err(EngineError::Timeout {
                        what: format!(
                            "a transfer with `{}` made no progress (no chunk of up to {chunk_bytes} bytes completed; {moved} of {} bytes moved): no_progress_timeout",
                            self.peer.name, self.bytes
                        ),
                        after: stall,
                    });
                }
                Err(e @ hmc_core::Error::InvalidKey(_)) => {
                    drop(batch);
                    return Err(self.check_list(EngineError::Transport(e)).await);
                }
                Err(e) => {
                    let e = EngineError::Transport(e);
                    if broken_peer(&e) {
                        drop(batch);
                        let deadline = Deadline::after(stall);
                        if let Err(gone @ EngineError::PeerGone { .. }) =
                            Box::pin(self.engine.refresh(&self.peer, deadline)).await
                        {
                            return Err(gone);
                        }
                    }
                    return Err(e);
                }
            }
        }
        drop(batch);
        // Staged runs in groups of up to `progress_chunk_bytes` on one device, each group
        // within the no-progress bound; the stager packs a group's runs into its bounce
        // buffers, so many small runs cost a few transfers.
        let mut rest = &staged[..];
        while !rest.is_empty() {
            let device = rest[0].local.device();
            let mut bytes = 0u64;
            let n = rest
                .iter()
                .take_while(|p| {
                    let fits = p.local.device() == device
                        && (bytes == 0 || bytes + p.len as u64 <= chunk_bytes);
                    if fits {
                        bytes += p.len as u64;
                    }
                    fits
                })
                .count()
                .max(1);
            let (group, later) = rest.split_at(n);
            rest = later;
            let group_bytes: u64 = group.iter().map(|p| p.len as u64).sum();
            let outcome = tokio::select! {
                biased;
                r = Box::pin(self.engine.run_staged(&self.peer.ep, op, group, Deadline::after(stall))) => r,
                _ = gone.wait_for(Option::is_some) => return Err(self.gone_error()),
            };
            match outcome {
                Ok(()) => *moved += group_bytes,
                Err(hmc_core::Error::DeadlineExceeded { .. }) => {
                    return Err(EngineError::Timeout {
                        what: format!(
                            "a transfer with `{}` made no progress (staged runs of {group_bytes} bytes did not complete; {moved} of {} bytes moved): no_progress_timeout",
                            self.peer.name, self.bytes
                        ),
                        after: stall,
                    });
                }
                Err(e) => return Err(EngineError::Transport(e)),
            }
        }
        if let Some((name, msg)) = &self.notify {
            self.engine
                .notify_peer(&self.peer, notify_id, name, msg, None, stall)
                .await
                .map_err(|e| match e {
                    EngineError::Metadata { peer, why } => EngineError::Metadata {
                        peer,
                        why: format!(
                            "the bytes moved, but the transfer's notification was not taken: {why}"
                        ),
                    },
                    e => e,
                })?;
        }
        Ok(())
    }

    /// Tells the target a transfer it may be waiting for failed (best effort, in the
    /// background: the initiator's error is not held up by a target that does not answer).
    /// Under the post's notification id, so it takes the place of that notification if it
    /// reached the target unanswered, and a copy arriving later is dropped.
    fn failure_notice(self: &Arc<Self>, id: NotifyId, name: String, msg: Vec<u8>, why: String) {
        let me = self.clone();
        self.engine.spawn_for_peer(&self.peer, async move {
            // A target that was stopped or slow gets it when it runs again, if soon.
            let cfg = &me.engine.inner.shared.config;
            let t = cfg.default_timeout.max(cfg.no_progress_timeout);
            match me
                .engine
                .notify_peer(&me.peer, id, &name, &msg, Some(why), t)
                .await
            {
                Ok(NotifyAck::AlreadyTaken) => tracing::warn!(
                    peer = %me.peer.name,
                    "a transfer reported failed had its notification taken by the peer's program (every byte had landed; the answer was lost)"
                ),
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(peer = %me.peer.name, error = %e, "failure notice not delivered")
                }
            }
        });
    }
}
