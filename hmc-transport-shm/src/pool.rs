//! Helper threads for cross-memory-attach copies: a round of a transfer's host-to-host
//! pieces is spread over [`ShmConfig::copy_threads`](crate::ShmConfig::copy_threads)
//! threads (the calling one and helpers), because one `process_vm_*` caller is bound by the
//! kernel's copy loop on one core while the target process, which a one-sided copy never
//! wakes, leaves the others idle.
//!
//! The calling thread waits for every helper's part before it returns, even when its own
//! part failed or panicked, so the memory a transfer borrows outlives every copy into it.

use std::sync::Arc;
use std::sync::mpsc;
use std::thread;

use parking_lot::{Mutex, RwLock};

use crate::cma::{self, Piece};
use hmc_core::Op;

/// A round's part smaller than this is copied by the calling thread alone: waking a helper
/// costs more than it saves.
const MIN_PARALLEL_BYTES: usize = 256 << 10;

/// Pieces of one lease, copied under its validity lock.
pub(crate) struct Group {
    pub(crate) valid: Arc<RwLock<bool>>,
    pub(crate) pieces: Vec<Piece>,
    pub(crate) bytes: usize,
}

/// Why a part stopped.
#[derive(Debug)]
pub(crate) enum Failed {
    /// The lease of a group was revoked before its copy.
    Revoked,
    /// A `process_vm_*` call failed.
    Io(std::io::Error),
}

type Job = Box<dyn FnOnce() + Send + 'static>;

/// The helper threads of one communicator, started on first use, ended when it drops.
pub(crate) struct CopyPool {
    threads: usize,
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
}

impl CopyPool {
    /// A pool that copies on `threads` threads in all (the caller's among them; 1: none).
    pub(crate) fn new(threads: usize) -> CopyPool {
        CopyPool {
            threads: threads.max(1),
            jobs: Mutex::new(None),
        }
    }

    pub(crate) fn threads(&self) -> usize {
        self.threads
    }

    fn sender(&self) -> Option<mpsc::Sender<Job>> {
        let mut jobs = self.jobs.lock();
        if jobs.is_none() {
            let (tx, rx) = mpsc::channel::<Job>();
            let rx = Arc::new(Mutex::new(rx));
            for i in 1..self.threads {
                let rx = rx.clone();
                let spawned = thread::Builder::new()
                    .name(format!("hmc-shm-copy-{i}"))
                    .spawn(move || {
                        loop {
                            let job = rx.lock().recv();
                            match job {
                                Ok(job) => job(),
                                Err(_) => return,
                            }
                        }
                    });
                if let Err(e) = spawned {
                    tracing::warn!(error = %e, "cannot start a copy thread; copying on fewer");
                    break;
                }
            }
            *jobs = Some(tx);
        }
        jobs.clone()
    }

    /// Copies every group with process `pid`, spread over the pool's threads by bytes, and
    /// returns the bytes moved or the first failure.
    ///
    /// # Safety
    /// Every piece's local range is valid for the access for the whole call (it is borrowed
    /// by the transfer that calls, which this call outlives); its remote range lies inside
    /// its group's lease.
    pub(crate) unsafe fn run(&self, pid: i32, op: Op, groups: Vec<Group>) -> Result<usize, Failed> {
        let total: usize = groups.iter().map(|g| g.bytes).sum();
        let parts = self
            .threads
            .min(groups.len())
            .min(total / MIN_PARALLEL_BYTES)
            .max(1);
        let sender = if parts > 1 { self.sender() } else { None };
        let Some(sender) = sender else {
            // SAFETY: per this function's contract.
            return unsafe { copy_groups(pid, op, &groups) };
        };
        // Greedy by bytes, largest first: parts within one group of each other.
        let mut order: Vec<Group> = groups;
        order.sort_by_key(|g| std::cmp::Reverse(g.bytes));
        let mut split: Vec<(usize, Vec<Group>)> = (0..parts).map(|_| (0, Vec::new())).collect();
        for g in order {
            let least = split
                .iter_mut()
                .min_by_key(|(b, _)| *b)
                .expect("parts >= 1");
            least.0 += g.bytes;
            least.1.push(g);
        }
        let mine = split.pop().expect("parts >= 1").1;
        let (done_tx, done_rx) = mpsc::channel();
        let mut waiting = Waiting {
            rx: done_rx,
            left: 0,
        };
        for (_, part) in split {
            let done = done_tx.clone();
            let job: Job = Box::new(move || {
                // SAFETY: the caller of `run` waits for this job's answer (or its sender's
                // drop, when it panicked) before the borrowed memory can go (`Waiting`).
                let r = unsafe { copy_groups(pid, op, &part) };
                let _ = done.send(r);
            });
            if sender.send(job).is_err() {
                // No helper is left to take it (none could start): nothing was queued.
                break;
            }
            waiting.left += 1;
        }
        drop(done_tx);
        // SAFETY: per this function's contract.
        let own = unsafe { copy_groups(pid, op, &mine) };
        let others = waiting.all();
        let mut moved = own?;
        for r in others {
            moved += r?;
        }
        Ok(moved)
    }
}

impl Drop for CopyPool {
    fn drop(&mut self) {
        // Dropping the sender ends every helper after the job in hand.
        self.jobs.lock().take();
    }
}

/// The helpers' answers still owed; dropping it (on a panic too) waits for all of them.
struct Waiting {
    rx: mpsc::Receiver<Result<usize, Failed>>,
    left: usize,
}

impl Waiting {
    fn all(&mut self) -> Vec<Result<usize, Failed>> {
        let mut out = Vec::with_capacity(self.left);
        while self.left > 0 {
            self.left -= 1;
            match self.rx.recv() {
                Ok(r) => out.push(r),
                // A helper panicked (its sender dropped after its copy ended).
                Err(_) => out.push(Err(Failed::Io(std::io::Error::other(
                    "a copy thread panicked",
                )))),
            }
        }
        out
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.all();
    }
}

/// Copies `groups` in order on this thread, each under its lease's validity lock.
///
/// # Safety
/// As [`CopyPool::run`].
unsafe fn copy_groups(pid: i32, op: Op, groups: &[Group]) -> Result<usize, Failed> {
    let mut moved = 0;
    for g in groups {
        let valid = g.valid.read();
        if !*valid {
            return Err(Failed::Revoked);
        }
        // SAFETY: per this function's contract; the lease cannot be revoked while `valid`
        // is held for reading.
        unsafe { cma::copy_vectored(pid, op, &g.pieces) }.map_err(Failed::Io)?;
        moved += g.bytes;
    }
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Groups spread over helpers land every byte, and a revoked group fails the round
    /// while the others' copies still end before `run` returns.
    #[test]
    fn rounds_over_helpers_move_every_group_and_report_revocation() {
        let pool = CopyPool::new(3);
        let pid = std::process::id() as i32;
        let src: Vec<u8> = (0..8 << 20).map(|i: u32| (i % 253) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        let valid = Arc::new(RwLock::new(true));
        let groups: Vec<Group> = (0..8)
            .map(|g| {
                let pieces: Vec<Piece> = (0..256)
                    .map(|k| {
                        let at = (g * 256 + k) * 4096;
                        Piece {
                            local: dst[at..].as_mut_ptr(),
                            remote: src[at..].as_ptr() as u64,
                            len: 4096,
                        }
                    })
                    .collect();
                Group {
                    valid: valid.clone(),
                    pieces,
                    bytes: 256 * 4096,
                }
            })
            .collect();
        // SAFETY: every local range lies inside `dst`, borrowed for the call.
        let moved = unsafe { pool.run(pid, Op::Read, groups) }.unwrap();
        assert_eq!(moved, src.len());
        assert!(dst == src, "every byte copied");

        let revoked = Arc::new(RwLock::new(false));
        let mut out = vec![0u8; 2 << 20];
        let groups: Vec<Group> = [valid.clone(), revoked]
            .into_iter()
            .enumerate()
            .map(|(g, v)| Group {
                valid: v,
                pieces: vec![Piece {
                    local: out[g << 20..].as_mut_ptr(),
                    remote: src[g << 20..].as_ptr() as u64,
                    len: 1 << 20,
                }],
                bytes: 1 << 20,
            })
            .collect();
        // SAFETY: as above, inside `out`.
        let r = unsafe { pool.run(pid, Op::Read, groups) };
        assert!(matches!(r, Err(Failed::Revoked)), "{r:?}");
    }
}
