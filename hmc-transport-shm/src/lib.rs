//! HMC between processes of one Linux host: a [`Communicator`](hmc_core::Communicator)
//! that moves host memory with cross-memory attach (`process_vm_readv`/`process_vm_writev`),
//! one copy by the kernel, with keys granted over a Unix-socket side channel.
//!
//! # Example
//!
//! Two communicators in one process (cross-memory attach works on one's own pid): register
//! a buffer at the target, export its key, WRITE into it one-sided from the initiator.
//!
//! ```
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> hmc_core::Result<()> {
//! use std::sync::Arc;
//! use hmc_backend_cpu::HostMemory;
//! use hmc_core::{Access, Communicator, ConnBuffer, Deadline, MemSpan, Op, RegisteredBuffer, TransferDesc};
//! use hmc_transport_shm::{ShmCommunicator, ShmConfig};
//!
//! let target = Arc::new(ShmCommunicator::bind(ShmConfig::default())?);
//! let initiator = Arc::new(ShmCommunicator::bind(ShmConfig::default())?);
//! let mem = Arc::new(HostMemory::new());
//! let dst = RegisteredBuffer::new(mem.clone(), target.clone(), 4096, Access::WRITE)?;
//! let src = RegisteredBuffer::new(mem, initiator.clone(), 4096, Access::READ)?;
//! src.write_at(0, &MemSpan::host(&[9u8; 4096]))?;
//!
//! let ep = initiator.connect(&target.address(), Deadline::default()).await?;
//! let key = initiator.import(&ep, &dst.export()?)?;
//! let batch = [TransferDesc { local: src.registration(), local_offset: 0, remote: &key, remote_offset: 0, len: 4096 }];
//! initiator.transfer(&ep, Op::Write, &batch, Deadline::default()).await?;
//! let mut back = vec![0u8; 4096];
//! dst.read_at(0, &mut hmc_core::MemSpanMut::host(&mut back))?;
//! assert_eq!(back, vec![9u8; 4096]);
//! # Ok(())
//! # }
//! ```
//!
//! # Design
//!
//! Each communicator listens on a Unix socket (`unix:///path`, mode 0600; by default a
//! random name in the system temp dir, or [`ShmConfig::path`]). `connect` dials it and
//! learns the target's pid from `SO_PEERCRED` (the target learns the initiator's the same
//! way; pids never travel in messages), then reads one probe byte of the target with
//! `process_vm_readv`. When the kernel refuses it (Yama `ptrace_scope`, seccomp, another
//! user, no `CAP_SYS_PTRACE`), the endpoint still connects
//! ([`ShmEndpoint::cross_memory_attach`] is false) but reaches only the peer's shared
//! memory (below); a transfer to any other region is `Error::Unavailable`, naming the cause
//! and the fix.
//!
//! **Shared memory.** [`Communicator::alloc_registered`](hmc_core::Communicator::alloc_registered)
//! returns a sealed memfd mapping (it cannot shrink under a peer). Its first grant on a
//! connection carries the memfd (`SCM_RIGHTS`); the initiator checks the seals and size,
//! maps it once, and from then on copies with `memcpy`: no system call per transfer, and no
//! cross-memory attach. Dropping the registration revokes its leases, then tells the peers
//! to unmap it (`Forget`). The RPC data plane's buffer pool and `LocalFirst` allocate this
//! way.
//!
//! Side-channel messages (length-prefixed frames): the initiator sends `Hello` (its own
//! address), `Grant` (key id, 128-bit random token, op, offset, length), `Notify` and
//! `Released` (lease ids); the target answers `Welcome` (the probe byte's address),
//! `Granted` (lease id, the registration's address, length and access), `Ok`, `Refused`
//! (a code that maps to `InvalidKey`, `AccessDenied`, `OutOfBounds`, ...) and sends
//! `Revoke` (lease ids).
//!
//! **Keys, leases and revocation.** A registration's key is its id and a random 128-bit
//! token ([`Communicator::rekey`](hmc_core::Communicator::rekey) draws a new one). The
//! first transfer with a key on an endpoint asks the target for a *lease*: the target
//! checks the token, the first access's bounds and the access right, records the lease
//! against the connection and answers with the registration's address range. The
//! initiator caches the lease per (key, endpoint) and checks every later descriptor
//! against the lease's length and rights locally, so repeated transfers to a region take
//! no round trip. The cache is invalidated by the target, never by time: dropping (or
//! rekeying) a registration sends `Revoke` for each of its leases; the initiator's reader
//! thread drops the lease from its cache, waits for the chunk in progress under it (each
//! chunk copy holds the lease's read lock) and answers `Released`. The drop returns once
//! every lease is released, a holder's connection closed (its process exited or closed
//! the endpoint), or [`ShmConfig::revoke_timeout`] passed (then it warns and gives up on
//! the hung peer). A `Granted` is always written before any `Revoke` of the same lease.
//! Copies are split into [`ShmConfig::chunk_len`] pieces; the deadline and the lease are
//! checked before each, and the transfer future yields between them. Host-to-host
//! descriptors of a batch are gathered: consecutive pieces of one lease become one
//! vectored `process_vm_*` call (up to 1,024 iovecs), and a chunk's calls are spread over
//! [`ShmConfig::copy_threads`] threads (a block table of scattered small blocks pays one
//! call's fixed cost per group, not per block).
//!
//! Shared memory from `alloc_registered` carries a control page after its data (the
//! current key and per-process copy counters): an initiator that has it mapped checks keys
//! there instead of asking for a lease, and `rekey` or deregistration waits for the copies
//! announced there instead of a `Revoke` round trip; a rekey that peers do not end within
//! `revoke_timeout` fails, so the memory is not reused. See the `control` module.
//!
//! **What keys protect against.** Mistakes and stale keys, not a hostile peer: a process
//! allowed to `process_vm_writev` into yours can already reach all of your memory.
//!
//! Notifications are supported (`Notify` on the side channel), up to
//! [`ShmConfig::max_notify_len`] bytes.
//!
//! **Device memory** goes through the vendor IPC of its memory backend, registered by
//! buffer with [`ShmCommunicator::register_device`] (a `Region` given to `register` does
//! not carry the allocation an IPC handle belongs to, so `register` refuses device memory
//! with `Error::UnsupportedMemory`). Its key is the same id and token; the target's
//! `Granted` carries the buffer's `IpcDescriptor`, which the initiator opens once per
//! region with a memory backend of that kind ([`ShmCommunicator::add_memory`], or the
//! backend of its own device registration) and caches under the lease; copies are that
//! backend's `Memory::copy` between the mapping and local memory, chunk by chunk like the
//! others. Revocation closes the mapping before `Released` is sent, and so does the end of
//! the side channel. A backend without IPC is refused at `register_device` with
//! `Error::UnsupportedMemory` carrying its reason.
//!
//! # Runtime
//!
//! `bind` needs a tokio runtime; the side channel runs on plain threads (one accept
//! thread per communicator, one per accepted connection, one reader per endpoint), so
//! revocation, which blocks in `Drop` and `rekey`, never waits for a runtime worker.

use std::path::PathBuf;
use std::time::Duration;

use hmc_core::TransportId;

mod chunk;
mod cma;
mod comm;
mod control;
mod device;
mod host;
mod key;
mod local_first;
mod mapped;
mod page_copy;
mod pool;
mod socket_files;
mod target;
mod wire;
#[cfg(test)]
mod wire_doc_tests;

#[cfg(test)]
mod tests;

pub use comm::{ShmCommunicator, ShmEndpoint, ShmRegistration};
pub use key::ShmRemoteKey;
pub use local_first::{LocalFirst, LocalFirstEndpoint, LocalFirstKey, LocalFirstRegistration};

/// This transport's wire number, [`TransportId::SHM`].
pub const SHM_TRANSPORT: TransportId = TransportId::SHM;

/// Settings of a [`ShmCommunicator`]. Every field has a default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShmConfig {
    /// The Unix socket to listen on (default `None`: `hmc-shm-<pid>-<random>.sock` in the
    /// system temp dir).
    pub path: Option<PathBuf>,
    /// Bytes per `process_vm_*` call or announced `memcpy` (default 4 MiB): the deadline
    /// and revocation are checked between chunks, and the transfer yields to the executor.
    pub chunk_len: usize,
    /// How long dropping or rekeying a registration waits for peers to release their
    /// leases (default 2 s); also the side channel's write timeout.
    pub revoke_timeout: Duration,
    /// How long an accepted connection may take to send its `Hello` (default 5 s).
    pub hello_timeout: Duration,
    /// Largest `notify` message in bytes (default 64 KiB).
    pub max_notify_len: usize,
    /// Notifications held until received (default 4096); past it `notify` fails at the
    /// sender with `LimitExceeded`.
    pub max_pending_notifications: usize,
    /// Lets any process of this user attach to this one when Yama's `ptrace_scope` is 1
    /// (`prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)`, process-wide; default false).
    pub allow_any_ptracer: bool,
    /// Side-channel connections served at once (`max_connections`, default 1024; one
    /// thread each); past it a new connection is closed unread, with a warning naming the
    /// limit.
    pub max_connections: usize,
    /// How long a side-channel message may take to arrive once its first byte is in
    /// (`frame_timeout`, default 10 s); past it the connection is closed. An idle
    /// connection waits for its next message without a limit.
    pub frame_timeout: Duration,
    /// Threads that copy one transfer's host memory with a peer by cross-memory attach
    /// (`copy_threads`, default: the CPUs this process may use, at most 4; 1: the calling
    /// thread alone). The kernel copies for the calling process on its CPU, so one caller
    /// is bound by one core while the target, which a one-sided copy never wakes, leaves
    /// the others idle. Rounds under 256 KiB stay on the calling thread.
    pub copy_threads: usize,
}

/// The default [`ShmConfig::copy_threads`]: the CPUs this process may use, at most 4.
pub fn default_copy_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}

impl Default for ShmConfig {
    fn default() -> Self {
        ShmConfig {
            path: None,
            chunk_len: 4 << 20,
            revoke_timeout: Duration::from_secs(2),
            hello_timeout: Duration::from_secs(5),
            max_notify_len: 64 << 10,
            max_pending_notifications: 4096,
            allow_any_ptracer: false,
            max_connections: 1024,
            frame_timeout: Duration::from_secs(10),
            copy_threads: default_copy_threads(),
        }
    }
}
