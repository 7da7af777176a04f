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

use hmc_core::{CommCapabilities, Communicator, TransportId};
use parking_lot::Mutex;

use super::mover::{Bound, LocalMem, Mover, ResolvedRun};
use super::prepared::{ListSide, PreparedList, Resolved};
use super::rules::{Holder, check_access};
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

/// A prepared transfer's runs, resolved in its lists' regions for the mover. (A named
/// iterator, not a `map` closure: a post's future holds it, and must be `Send`.)
struct RunsOf<'a, C: Communicator> {
    runs: std::slice::Iter<'a, Run>,
    local: &'a [Arc<LocalReg<C>>],
    remote: &'a [Arc<RemoteEntry<C>>],
}

impl<'a, C: Communicator> Iterator for RunsOf<'a, C> {
    type Item = ResolvedRun<'a, C>;

    fn next(&mut self) -> Option<Self::Item> {
        let run = self.runs.next()?;
        Some(ResolvedRun {
            local: LocalMem::Reg(&self.local[run.l as usize]),
            local_off: run.loff,
            remote: &self.remote[run.r as usize],
            remote_off: run.roff,
            len: run.len,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.runs.size_hint()
    }
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

/// The two lists of a transfer: the local one's regions, the peer, the remote one's.
type Sides<'a, C> = (
    &'a Resolved<std::sync::Weak<LocalReg<C>>>,
    Arc<Peer<C>>,
    &'a Resolved<Arc<RemoteEntry<C>>>,
);

/// Checks that `local` is a local list and `remote` a peer's.
fn sides<'a, C: Communicator>(
    local: &'a PreparedList<C>,
    remote: &'a PreparedList<C>,
) -> Result<Sides<'a, C>> {
    let l = local_of(&local.inner).ok_or_else(|| {
        EngineError::InvalidArgument(
            "the local list was prepared for a peer (prepare_remote); pass one from prepare_local"
                .into(),
        )
    })?;
    match &*remote.inner {
        ListSide::Remote { peer, resolved, .. } => Ok((l, peer.clone(), resolved)),
        ListSide::Local(_) => Err(EngineError::InvalidArgument(
            "the remote list is a local one (prepare_local); pass one from prepare_remote".into(),
        )),
    }
}

/// The access rule over every region under a transfer's two lists.
fn check_lists_access<C: Communicator>(
    op: TransferOp,
    held: &[Arc<LocalReg<C>>],
    r: &Resolved<Arc<RemoteEntry<C>>>,
    peer: &str,
) -> Result<()> {
    for reg in held {
        check_access(op, Holder::Local, reg.access, || {
            let region = hmc_core::LocalRegistration::region(&reg.reg);
            format!("{:#x}+{} of the local list", region.addr, region.len)
        })?;
    }
    for e in &r.regs {
        check_access(op, Holder::Peer(peer), e.access, || {
            format!("{:#x}+{} of the remote list", e.region.addr, e.region.len)
        })?;
    }
    Ok(())
}

/// A transfer's runs, with the bytes they move and those in the peer's device memory
/// that the transport stages.
struct Merged {
    runs: Vec<Run>,
    bytes: u64,
    staged_at_peer: u64,
}

/// Pairs entry `local_idx[k]` of `l` with entry `remote_idx[k]` of `r`, for every `k`,
/// into runs: pairs contiguous on both sides merge, up to the transport's longest run.
fn merge_pairs<L, C: Communicator>(
    l: &Resolved<L>,
    local_idx: &[u64],
    r: &Resolved<Arc<RemoteEntry<C>>>,
    remote_idx: &[u64],
    caps: &CommCapabilities,
) -> Result<Merged> {
    let bad = |m: String| EngineError::InvalidArgument(m);
    // Per remote region: is it device memory this transport stages?
    let staged: Vec<bool> = r
        .regs
        .iter()
        .map(|e| {
            !e.region.device.is_host()
                && caps.memory_path(e.region.device.kind) == hmc_core::DeviceMemoryPath::Staged
        })
        .collect();
    let mut m = Merged {
        runs: Vec::with_capacity(local_idx.len().min(1 << 20)),
        bytes: 0,
        staged_at_peer: 0,
    };
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
        m.bytes += llen;
        if staged.get(rr as usize) == Some(&true) {
            m.staged_at_peer += llen;
        }
        match m.runs.last_mut() {
            Some(p)
                if p.l == lr
                    && p.r == rr
                    && p.loff + p.len == loff
                    && p.roff + p.len == roff
                    && p.len + llen <= caps.max_transfer_len =>
            {
                p.len += llen
            }
            _ => m.runs.push(Run {
                l: lr,
                r: rr,
                loff,
                roff,
                len: llen,
            }),
        }
    }
    m.runs.shrink_to_fit();
    Ok(m)
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
        let (l, peer, r) = sides(local, remote)?;
        if local_idx.len() != remote_idx.len() {
            return Err(EngineError::InvalidArgument(format!(
                "{} local indices and {} remote ones; pass one of each per descriptor",
                local_idx.len(),
                remote_idx.len()
            )));
        }
        let max_notify_len = self.inner.shared.config.max_notify_len;
        if let Some((name, _)) = &notify
            && name.len() > max_notify_len
        {
            return Err(EngineError::Limit {
                limit: "max_notify_len",
                value: name.len() as u64,
                max: max_notify_len as u64,
                hint: "use a shorter notification name",
            });
        }
        check_lists_access(op, &live_regs(l)?, r, &peer.name)?;
        let caps = self.inner.shared.comm.capabilities();
        let merged = merge_pairs(l, local_idx, r, remote_idx, &caps)?;
        Ok(PreparedTransfer {
            inner: Arc::new(XferInner {
                engine: self.clone(),
                op,
                peer,
                local: local.inner.clone(),
                remote: remote.inner.clone(),
                runs: merged.runs,
                bytes: merged.bytes,
                staged_at_peer: merged.staged_at_peer,
                requested: local_idx.len() as u64,
                notify,
                transport: caps.transport,
                max_batch: self.inner.shared.max_batch,
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
            let (outcome, cancelled) = tokio::select! {
                r = me.run(notify_id, &mut moved) => (r, false),
                _ = cancel.notified() => (Err(EngineError::Cancelled(format!(
                    "a transfer of {} descriptor(s) with `{}`", me.requested, me.peer.name
                ))), true),
            };
            if me.op == TransferOp::Write && cancelled {
                // A cancel or a release dropped the transport's future (the mover settles
                // the transfer's own early ends); the target may still hold bytes of it:
                // before the end is reported, and before the target is told of the failure.
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

    /// After the transport refused a key and the peer's table was fetched again: the
    /// region of the remote list the peer deregistered, if one.
    fn list_gone(&self) -> Option<EngineError> {
        let r = remote_of(&self.remote).expect("checked at make_transfer");
        let table = self.peer.table.read();
        let gone = r.regs.iter().find(|reg| {
            let region = reg.region;
            !matches!(
                table.map.find(region.addr, region.len as u64),
                crate::region_map::Lookup::Inside(e, 0) if Arc::ptr_eq(e, reg)
            )
        })?;
        Some(EngineError::ListInvalid(format!(
            "`{}` deregistered its region {:#x}+{} under a prepared remote list",
            self.peer.name, gone.region.addr, gone.region.len
        )))
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
        let mover = Mover {
            engine: &self.engine,
            peer: &self.peer,
            op: self.op,
            bound: Bound::NoProgress {
                stall,
                chunk: cfg.progress_chunk_bytes as u64,
                max_batch: self.max_batch,
                total: self.bytes,
            },
        };
        let runs = RunsOf {
            runs: self.runs.iter(),
            local: &held,
            remote: &r.regs,
        };
        mover.run(runs, moved, || self.list_gone()).await?;
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
