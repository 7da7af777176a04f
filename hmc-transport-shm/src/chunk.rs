//! One chunk of a transfer, by whichever engine reaches the peer's memory: `memcpy` into a
//! shared mapping, `process_vm_*` for the peer's host memory, or a memory backend's copy
//! for device memory (an opened vendor IPC mapping, or local device memory against peer
//! host memory).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use parking_lot::RwLock;

use hmc_core::{AnyMemory, Device, Error, Op, PeerAddr, Region, Result};

use crate::cma::{self, PeerCred};
use crate::device::{self, IpcLease};
use crate::mapped::Mapping;
use crate::pool::{CopyPool, Failed, Group};

/// What one chunk copies between: the local range, and the lease's view of the peer.
pub(crate) struct Chunk<'a> {
    pub(crate) op: Op,
    /// The local bytes (host or device memory of this process).
    pub(crate) local: Region,
    /// Offset of the chunk in the peer's registration.
    pub(crate) at: u64,
    /// The copy engine of device memory on either side (`None`: host to host).
    pub(crate) engine: Option<&'a AnyMemory>,
}

/// The peer as one lease reaches it.
pub(crate) struct Peer<'a> {
    pub(crate) addr: &'a PeerAddr,
    pub(crate) cred: PeerCred,
    /// The registration's address in the peer (cross-memory attach).
    pub(crate) base: u64,
    /// Length of the registration.
    pub(crate) len: u64,
    pub(crate) map: Option<&'a Mapping>,
    pub(crate) ipc: Option<&'a IpcLease>,
    /// Counts IPC handles opened on this endpoint.
    pub(crate) opens: &'a AtomicU64,
    /// Keeps why an IPC handle could not be opened on this endpoint (the first reason).
    pub(crate) refused: &'a parking_lot::Mutex<Option<String>>,
}

/// A transfer's host-to-host pieces gathered into groups (consecutive pieces of one lease,
/// up to [`cma::MAX_IOV`] pieces or `group_bytes`) for one round of the copy pool.
pub(crate) struct Round {
    groups: Vec<Group>,
    group_bytes: usize,
    bytes: usize,
}

impl Round {
    /// An empty round whose groups hold up to `group_bytes` each.
    pub(crate) fn new(group_bytes: usize) -> Round {
        Round {
            groups: Vec::new(),
            group_bytes: group_bytes.max(1),
            bytes: 0,
        }
    }

    /// Bytes gathered.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Largest piece worth gathering: a group's bytes (a longer range is split).
    pub(crate) fn piece_cap(&self) -> usize {
        self.group_bytes
    }

    pub(crate) fn push(
        &mut self,
        valid: &Arc<RwLock<bool>>,
        local: *mut u8,
        remote: u64,
        len: usize,
    ) {
        let joins = self.groups.last().is_some_and(|g| {
            Arc::ptr_eq(&g.valid, valid)
                && g.pieces.len() < cma::MAX_IOV
                && g.bytes + len <= self.group_bytes
        });
        if !joins {
            self.groups.push(Group {
                valid: valid.clone(),
                pieces: Vec::new(),
                bytes: 0,
            });
        }
        let g = self.groups.last_mut().expect("pushed above");
        g.pieces.push(cma::Piece { local, remote, len });
        g.bytes += len;
        self.bytes += len;
    }

    /// Copies what is gathered with the peer over `pool`, and returns the bytes moved;
    /// `lost` says why when a lease was revoked.
    ///
    /// # Safety
    /// Every piece's local range lies inside a registration the batch borrows, which the
    /// caller keeps allocated; its remote range lies inside its lease.
    pub(crate) unsafe fn run(
        &mut self,
        pool: &CopyPool,
        op: Op,
        peer: &PeerAddr,
        cred: PeerCred,
        lost: impl FnOnce() -> Error,
    ) -> Result<usize> {
        if self.groups.is_empty() {
            return Ok(0);
        }
        self.bytes = 0;
        let groups = std::mem::take(&mut self.groups);
        // SAFETY: per this function's contract.
        match unsafe { pool.run(cred.pid, op, groups) } {
            Ok(n) => Ok(n),
            Err(Failed::Revoked) => Err(lost()),
            Err(Failed::Io(e)) => Err(copy_error(peer, cred, e)),
        }
    }
}

/// Copies one chunk.
///
/// # Safety
/// `c.local` lies inside a registration the batch borrows; the lease behind `p` is live
/// (its validity lock held for reading), so the peer's range is granted and mapped.
pub(crate) unsafe fn copy(c: &Chunk<'_>, p: &Peer<'_>) -> Result<()> {
    let n = c.local.len;
    let local = c.local.addr as *mut u8;
    match (c.engine, p.ipc, p.map) {
        (Some(e), Some(ipc), _) => {
            // SAFETY: the caller holds the lease live.
            let mapped = unsafe { ipc.region(e, p.len, p.opens) }.inspect_err(|err| {
                p.refused.lock().get_or_insert_with(|| err.to_string());
            })?;
            let remote = mapped.slice(c.at as usize, n)?;
            // SAFETY: both ranges are live (the registration and the open mapping).
            unsafe { device::engine_copy_op(e, c.op, c.local, remote) }
        }
        (None, Some(_), _) => Err(Error::Protocol(
            "device memory of the peer without a copy engine".into(),
        )),
        (Some(e), None, Some(m)) => {
            let remote = Region {
                device: Device::HOST,
                addr: m.ptr() as u64 + c.at,
                len: n,
            };
            // SAFETY: the mapping lives while the lease does; it is never shorter.
            unsafe { device::engine_copy_op(e, c.op, c.local, remote) }
        }
        (Some(e), None, None) => {
            let attach = |bounce: *mut u8| {
                // SAFETY: `bounce` is `n` bytes owned by `via_host`; the remote range is
                // inside the lease.
                unsafe { cma::copy(p.cred.pid, c.op, bounce, p.base + c.at, n) }
                    .map_err(|e| copy_error(p.addr, p.cred, e))
            };
            // SAFETY: per this function's contract.
            unsafe { device::via_host(e, c.op, c.local, attach) }
        }
        (None, None, Some(m)) => {
            debug_assert!(
                c.at as usize + n <= m.len(),
                "leases never exceed their mapping"
            );
            // SAFETY: the local range is as above; the remote range lies inside the mapping
            // (a lease is never longer than its memfd, checked when mapped), which lives
            // while the lease does; ranges of two distinct mappings or allocations cannot
            // overlap.
            unsafe {
                let remote = m.ptr().add(c.at as usize);
                match c.op {
                    Op::Write => std::ptr::copy_nonoverlapping(local, remote, n),
                    Op::Read => std::ptr::copy_nonoverlapping(remote, local, n),
                }
            }
            Ok(())
        }
        (None, None, None) => {
            // SAFETY: the local range lies inside a registration the batch borrows, which
            // the caller keeps allocated; the remote range lies inside the lease.
            unsafe { cma::copy(p.cred.pid, c.op, local, p.base + c.at, n) }
                .map_err(|e| copy_error(p.addr, p.cred, e))
        }
    }
}

pub(crate) fn copy_error(peer: &PeerAddr, cred: PeerCred, e: std::io::Error) -> Error {
    match e.raw_os_error() {
        Some(libc::ESRCH) => Error::peer(peer, format!("process {} is gone", cred.pid)),
        Some(libc::EPERM) | Some(libc::ENOSYS) => cma::diagnose(cred, &e),
        Some(libc::EFAULT) => Error::peer(
            peer,
            format!("a granted range of pid {} is not mapped: {e}", cred.pid),
        ),
        _ => Error::io(format!("process_vm_* with pid {}", cred.pid), e),
    }
}
