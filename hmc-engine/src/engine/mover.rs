//! The one mover of the engine's bytes. A one-shot transfer ([`Engine::transfer`], and
//! through it the KV API and the blocking engine) and a prepared post
//! ([`super::PreparedTransfer::post`]) resolve their runs (and check access) themselves,
//! then hand them to a [`Mover`] with their bound; it does the rest:
//!
//! - the split: runs the transport moves go in its batches; runs of device memory it
//!   cannot register, or stages without moving it itself to this peer, go through this
//!   engine's bounce buffers ([`super::staged`]), after the others, grouped by device;
//! - the steps: batches (and staged groups) of at most the bound's chunk of bytes and the
//!   transport's batch length, each within the bound's deadline;
//! - the race of each step with the peer's `gone` watch, and with a timer at its deadline
//!   (the transport ends by the deadline; the timer is a second guard);
//! - the one mapping of how a step ended to [`EngineError`]: a deadline to
//!   [`EngineError::Timeout`], the peer gone to [`EngineError::PeerGone`] (or
//!   [`EngineError::Cancelled`] when this engine was finalized), a revoked key or a broken
//!   peer to what the peer's table, fetched again, says (the peer restarted, or which
//!   memory under the transfer is gone).
//!
//! A WRITE that ends early is settled (`Engine::settle_write`: no more of it lands at the
//! target) before its error is returned; a caller that drops the mover's future instead (a
//! cancel, a release) settles it itself.

use std::iter::Peekable;
use std::sync::Arc;
use std::time::Duration;

use hmc_core::{Communicator, Deadline, Op, TransferDesc};

use super::rules::broken_peer;
use super::staged::{StagedPiece, StagedReg};
use super::{Engine, LocalReg, Peer, RemoteEntry};
use crate::TransferOp;
use crate::error::EngineError;

/// This engine's side of a run.
pub(super) enum LocalMem<'r, C: Communicator> {
    /// Registered with the transport (device memory it stages still goes through the bounce
    /// buffers, unless it moves that memory to this peer itself).
    Reg(&'r Arc<LocalReg<C>>),
    /// Device memory the transport cannot register: only the bounce buffers reach it.
    Staged(&'r Arc<StagedReg>),
}

impl<C: Communicator> Clone for LocalMem<'_, C> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<C: Communicator> Copy for LocalMem<'_, C> {}

/// One contiguous run of a transfer, resolved on both sides. Whoever hands runs to the
/// mover holds their registrations until it returns.
pub(super) struct ResolvedRun<'r, C: Communicator> {
    pub(super) local: LocalMem<'r, C>,
    pub(super) local_off: u64,
    pub(super) remote: &'r Arc<RemoteEntry<C>>,
    pub(super) remote_off: u64,
    pub(super) len: u64,
}

impl<C: Communicator> Clone for ResolvedRun<'_, C> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<C: Communicator> Copy for ResolvedRun<'_, C> {}

/// What bounds a transfer in time.
#[derive(Clone, Copy, Debug)]
pub(super) enum Bound {
    /// A one-shot transfer of `descs` descriptors: the runs the transport moves in
    /// batches of at most `max_batch` (its `max_batch_len`), then the staged ones, all by
    /// `deadline` (`timeout` after its start).
    Deadline {
        deadline: Deadline,
        timeout: Duration,
        descs: usize,
        max_batch: usize,
    },
    /// A prepared post of `total` bytes, by the no-progress rule: steps of at most `chunk`
    /// bytes and `max_batch` runs, each within `stall` of its start; a transfer that keeps
    /// completing steps runs as long as it needs.
    NoProgress {
        stall: Duration,
        chunk: u64,
        max_batch: usize,
        total: u64,
    },
}

impl Bound {
    /// The deadline of a step starting now (and of a refresh of the peer's table after
    /// one failed).
    fn step_deadline(&self) -> Deadline {
        match *self {
            Bound::Deadline { deadline, .. } => deadline,
            Bound::NoProgress { stall, .. } => Deadline::after(stall),
        }
    }

    /// Most bytes and runs in one step.
    fn step_limits(&self) -> (u64, usize) {
        match *self {
            Bound::Deadline { max_batch, .. } => (u64::MAX, max_batch.max(1)),
            Bound::NoProgress {
                chunk, max_batch, ..
            } => (chunk.max(1), max_batch.max(1)),
        }
    }

    /// The transfer, in an error message.
    fn what(&self, peer: &str) -> String {
        match *self {
            Bound::Deadline { descs, .. } => {
                format!("a transfer of {descs} descriptor(s) with `{peer}`")
            }
            Bound::NoProgress { .. } => format!("a transfer with `{peer}`"),
        }
    }
}

/// What one step moves.
enum Step<'b, 'r, C: Communicator> {
    /// A batch of the transport's.
    Batch(&'b [TransferDesc<'r, C>]),
    /// Staged runs of one device, through the bounce buffers.
    Staged(&'b [StagedPiece<'r, C>]),
}

/// How a step ended early.
enum Ended {
    Transport(hmc_core::Error),
    /// The peer's `gone` watch fired, with its reason.
    Gone(Option<String>),
    /// The guard timer fired at the step's deadline.
    Timer,
}

/// Which kind of step ended early, for the no-progress message.
#[derive(Clone, Copy)]
enum Failed {
    Batch,
    /// Staged runs of this many bytes.
    Staged(u64),
}

/// Moves one transfer's runs with one peer (see the module documentation).
pub(super) struct Mover<'a, C: Communicator> {
    pub(super) engine: &'a Engine<C>,
    pub(super) peer: &'a Peer<C>,
    pub(super) op: TransferOp,
    pub(super) bound: Bound,
}

impl<C: Communicator> Mover<'_, C> {
    /// Moves `runs`, adding the bytes of each step that completes to `moved`. When a key is
    /// refused and the peer's table, fetched again, still has the peer's instance,
    /// `revoked` says which memory under the transfer is gone (`None`: the refusal as is).
    ///
    /// (A function returning an `async move` block, here and in [`Mover::step`], rather
    /// than an `async fn`: an `async fn` keeps its arguments twice in its state, as
    /// captured and as locals, and every op's future carries that state.)
    #[allow(clippy::manual_async_fn)]
    pub(super) fn run<'r>(
        self,
        runs: impl Iterator<Item = ResolvedRun<'r, C>>,
        moved: &mut u64,
        revoked: impl FnOnce() -> Option<EngineError>,
    ) -> impl Future<Output = crate::error::Result<()>> {
        async move {
            let mut runs = runs.peekable();
            let mut staged = Vec::new();
            let failed = 'moving: {
                // One run, the usual sync transfer of one descriptor: its batch is the run
                // itself, with no `Vec` to allocate and fill.
                let direct = if runs.size_hint() == (1, Some(1)) {
                    let run = runs.next().expect("the one run");
                    match self.split(run) {
                        Ok(desc) => Some((desc, run.len)),
                        Err(piece) => {
                            staged.push(piece);
                            None
                        }
                    }
                } else {
                    None
                };
                if let Some((desc, bytes)) = direct {
                    match self.step(Step::Batch(std::slice::from_ref(&desc))).await {
                        Ok(()) => *moved += bytes,
                        Err(ended) => break 'moving (ended, Failed::Batch),
                    }
                }
                let max_runs = self.bound.step_limits().1;
                let mut batch = Vec::with_capacity(runs.size_hint().0.min(max_runs));
                loop {
                    batch.clear();
                    let bytes = self.fill(&mut runs, &mut batch, &mut staged);
                    if batch.is_empty() {
                        break;
                    }
                    match self.step(Step::Batch(&batch)).await {
                        Ok(()) => *moved += bytes,
                        Err(ended) => break 'moving (ended, Failed::Batch),
                    }
                }
                if staged.is_empty() {
                    return Ok(());
                }
                // Boxed: the staged path is the rare one, and its state would otherwise
                // ride in every op's future.
                match Box::pin(self.run_staged(&staged, moved)).await {
                    None => return Ok(()),
                    Some(failed) => failed,
                }
            };
            // Boxed too: only an op that failed needs the state of its settling and mapping.
            Err(Box::pin(self.fail(failed, *moved, revoked)).await)
        }
    }

    /// Takes runs into `batch` up to the step's bounds, setting aside the staged ones met
    /// on the way; returns the batch's bytes. An empty batch: no run is left.
    fn fill<'r>(
        &self,
        runs: &mut Peekable<impl Iterator<Item = ResolvedRun<'r, C>>>,
        batch: &mut Vec<TransferDesc<'r, C>>,
        staged: &mut Vec<StagedPiece<'r, C>>,
    ) -> u64 {
        let (max_bytes, max_runs) = self.bound.step_limits();
        let mut bytes = 0u64;
        while batch.len() < max_runs
            && let Some(&run) = runs.peek()
        {
            match self.split(run) {
                Err(piece) => staged.push(piece),
                Ok(_) if !batch.is_empty() && bytes.saturating_add(run.len) > max_bytes => break,
                Ok(desc) => {
                    batch.push(desc);
                    bytes += run.len;
                }
            }
            runs.next();
        }
        bytes
    }

    /// The split: a run the transport moves (a batch entry), or one through this engine's
    /// bounce buffers (device memory it cannot register, or that it stages and does not
    /// move to this peer itself).
    fn split<'r>(
        &self,
        run: ResolvedRun<'r, C>,
    ) -> std::result::Result<TransferDesc<'r, C>, StagedPiece<'r, C>> {
        let piece = |local: &'r StagedReg| StagedPiece {
            local,
            local_off: run.local_off as usize,
            remote: run.remote,
            remote_off: run.remote_off,
            len: run.len as usize,
        };
        let l = match run.local {
            LocalMem::Staged(st) => return Err(piece(st.as_ref())),
            LocalMem::Reg(l) => l,
        };
        match &l.staged {
            Some(st)
                if !self.engine.inner.shared.comm.moves_device_memory(
                    &self.peer.ep,
                    &l.reg,
                    &run.remote.key,
                ) =>
            {
                Err(piece(st.as_ref()))
            }
            _ => Ok(TransferDesc {
                local: &l.reg,
                local_offset: run.local_off as usize,
                remote: &run.remote.key,
                remote_offset: run.remote_off,
                len: run.len as usize,
            }),
        }
    }

    /// Moves the staged runs in groups of one device and up to the step's bytes (the stager
    /// packs a group's runs into its bounce buffers, so many small runs cost a few
    /// transfers).
    async fn run_staged(
        &self,
        staged: &[StagedPiece<'_, C>],
        moved: &mut u64,
    ) -> Option<(Ended, Failed)> {
        let (max_bytes, _) = self.bound.step_limits();
        let mut rest = staged;
        while !rest.is_empty() {
            let (n, bytes) = first_group(rest, |p| (p.local.device(), p.len as u64), max_bytes);
            let (group, later) = rest.split_at(n);
            rest = later;
            if let Err(e) = self.step(Step::Staged(group)).await {
                return Some((e, Failed::Staged(bytes)));
            }
            *moved += bytes;
        }
        None
    }

    /// Runs one step against the peer's `gone` watch and a timer at the step's deadline.
    #[allow(clippy::manual_async_fn)]
    fn step(&self, step: Step<'_, '_, C>) -> impl Future<Output = std::result::Result<(), Ended>> {
        async move {
            let deadline = self.bound.step_deadline();
            let op = match self.op {
                TransferOp::Read => Op::Read,
                TransferOp::Write => Op::Write,
            };
            let (engine, ep) = (self.engine, &self.peer.ep);
            // Dropping the transport's future cancels it: the transport no longer touches the
            // memory after. One async block and one `select!`, not futures wrapped in futures:
            // each wrapper keeps its own copy of the inner future's state, so nesting multiplied
            // the size of every op's future (and the bytes moved per op). Staged groups are
            // boxed: the stager's state is several KiB.
            let moving = async move {
                match step {
                    Step::Batch(b) => engine.inner.shared.comm.transfer(ep, op, b, deadline).await,
                    Step::Staged(g) => Box::pin(engine.run_staged(ep, op, g, deadline)).await,
                }
            };
            // The watch and the timer are async blocks: nothing is subscribed or armed before
            // their first poll, and a small op that completes in its first poll never polls them.
            let gone = async {
                let mut gone = self.peer.gone.subscribe();
                gone.wait_for(Option::is_some)
                    .await
                    .ok()
                    .and_then(|w| w.clone())
            };
            tokio::select! {
                biased;
                r = moving => r.map_err(Ended::Transport),
                why = gone => Err(Ended::Gone(why)),
                _ = async { tokio::time::sleep_until(deadline.instant().into()).await } => {
                    Err(Ended::Timer)
                }
            }
        }
    }

    /// Ends a transfer early, `moved` bytes in: a WRITE is settled first (the step's
    /// transport future is gone, and the target may still hold bytes of it), then the one
    /// mapping of how it ended to the caller's error.
    async fn fail(
        &self,
        (ended, at): (Ended, Failed),
        moved: u64,
        revoked: impl FnOnce() -> Option<EngineError>,
    ) -> EngineError {
        if self.op == TransferOp::Write {
            self.engine.settle_write(self.peer).await;
        }
        let e = match ended {
            Ended::Gone(why) => return self.gone(why),
            Ended::Timer | Ended::Transport(hmc_core::Error::DeadlineExceeded { .. }) => {
                return self.timeout(at, moved);
            }
            Ended::Transport(e) => e,
        };
        let revoked_key = matches!(e, hmc_core::Error::InvalidKey(_));
        let e = EngineError::Transport(e);
        if !revoked_key && !broken_peer(&e) {
            return e;
        }
        // A refused key: the peer deregistered memory since its table was fetched (its key
        // is revoked), or restarted; a data plane that stopped answering may belong to an
        // engine that restarted at the same address. Its metadata service says which: a new
        // instance is reported as such (and the stale peer dropped), else `revoked` says
        // which memory is gone rather than which key. Boxed: a refresh is a metadata round
        // trip whose state is several KiB; inline, every op's future would carry it.
        let refreshed = Box::pin(self.engine.refresh(self.peer, self.bound.step_deadline())).await;
        match refreshed {
            Err(restarted @ EngineError::PeerGone { .. }) => restarted,
            Ok(()) if revoked_key => revoked().unwrap_or(e),
            _ => e,
        }
    }

    /// The end of a transfer whose peer went: this engine's finalize, or the peer.
    fn gone(&self, why: Option<String>) -> EngineError {
        if self.engine.is_finalized() {
            return EngineError::Cancelled(format!(
                "{}: this engine was finalized",
                self.bound.what(&self.peer.name)
            ));
        }
        EngineError::PeerGone {
            peer: self.peer.name.clone(),
            why: why.unwrap_or_else(|| "disconnected".into()),
        }
    }

    /// The end of a transfer at its bound.
    fn timeout(&self, at: Failed, moved: u64) -> EngineError {
        let what = self.bound.what(&self.peer.name);
        match self.bound {
            Bound::Deadline { timeout, .. } => EngineError::Timeout {
                what,
                after: timeout,
            },
            Bound::NoProgress {
                stall,
                chunk,
                total,
                ..
            } => {
                let step = match at {
                    Failed::Batch => {
                        format!("no chunk of up to {} bytes completed", chunk.max(1))
                    }
                    Failed::Staged(bytes) => {
                        format!("staged runs of {bytes} bytes did not complete")
                    }
                };
                EngineError::Timeout {
                    what: format!(
                        "{what} made no progress ({step}; {moved} of {total} bytes moved): no_progress_timeout"
                    ),
                    after: stall,
                }
            }
        }
    }
}

/// The first group of `runs` (not empty) that one staged step moves: the runs from the
/// first on that are of its device and fit `max_bytes` together (the first always goes);
/// their count and bytes. `of` gives a run's device and length.
fn first_group<T>(
    runs: &[T],
    of: impl Fn(&T) -> (hmc_core::Device, u64),
    max_bytes: u64,
) -> (usize, u64) {
    let device = runs.first().map(|r| of(r).0);
    let mut bytes = 0u64;
    let n = runs
        .iter()
        .map(&of)
        .take_while(|&(d, len)| {
            let fits = Some(d) == device && (bytes == 0 || bytes.saturating_add(len) <= max_bytes);
            if fits {
                bytes += len;
            }
            fits
        })
        .count();
    (n, bytes)
}

#[cfg(test)]
mod tests {
    use hmc_core::{Device, DeviceKind};

    use super::first_group;

    #[test]
    fn staged_groups_are_of_one_device_and_up_to_the_step_bytes() {
        let (d0, d1) = (
            Device::new(DeviceKind::CUDA, 0),
            Device::new(DeviceKind::CUDA, 1),
        );
        let of = |r: &(Device, u64)| *r;
        let runs = [(d0, 4), (d0, 4), (d0, 4), (d1, 4), (d0, 4)];
        // Unbounded (a one-shot transfer): split only where the device changes.
        assert_eq!(first_group(&runs, of, u64::MAX), (3, 12));
        assert_eq!(first_group(&runs[3..], of, u64::MAX), (1, 4));
        assert_eq!(first_group(&runs[4..], of, u64::MAX), (1, 4));
        // A post's chunk: as many as fit, and a run larger than the chunk alone.
        assert_eq!(first_group(&runs, of, 8), (2, 8));
        assert_eq!(first_group(&[(d0, 100), (d0, 1)], of, 8), (1, 100));
        assert_eq!(first_group::<(Device, u64)>(&[], of, 8), (0, 0));
    }
}
