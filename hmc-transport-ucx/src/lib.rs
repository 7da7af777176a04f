//! UCX transport for HMC: a [`Communicator`](hmc_core::Communicator) over UCX's UCP layer,
//! with `libucp.so.0` loaded at run time.
//!
//! # Example
//!
//! A communicator over UCX (loaded at run time); without `libucp.so.0` it answers
//! `Unavailable` with the install hint.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use hmc_core::Communicator;
//! use hmc_transport_ucx::{UcxCommunicator, UcxConfig};
//! match UcxCommunicator::new(UcxConfig::default()) {
//!     Ok(c) => println!("UCX listening at {}; it can {:?}", c.address(), c.capabilities()),
//!     Err(e) => println!("UCX unavailable here: {e}"),
//! }
//! # }
//! ```
//!
//! # What this crate is for
//!
//! One-sided READ/WRITE (UCP `put`/`get` with packed remote keys) between registered regions
//! of two processes, over whatever UCX reaches on the host: shared memory (`posix`, `cma`),
//! TCP, InfiniBand/RoCE, and GPU memory with a CUDA-enabled UCX. Small ordered notifications
//! travel as UCX active messages. It is not an RPC layer (`hmc-rpc` builds on it) and not a
//! control plane beyond the one TCP connection each endpoint keeps to its peer.
//!
//! Nothing from UCX is needed to build: [`sys`] declares the slice of the UCX 1.13 API this
//! crate uses and opens `libucp.so.0` (or `$HMC_UCX_LIB`) when a communicator is created. A
//! missing library is an [`Error::Unavailable`](hmc_core::Error::Unavailable) naming the
//! library and the variable, never a panic. Newer UCX releases keep that API: the test
//! suite also passes against UCX 1.22 (`cargo xtask ucx-wheel`, which fetches a
//! CUDA-enabled build from PyPI), whose parameter structs only grew fields at their ends.
//!
//! # Thread safety and progress
//!
//! [`UcxCommunicator`] is `Send + Sync`. Each communicator owns one progress thread, the only
//! thread that calls UCX for it (`UCS_THREAD_MODE_SINGLE`, no lock around UCX); every
//! method hands that thread a command and awaits its reply. The thread polls
//! `ucp_worker_progress` while there is work, spins for [`UcxConfig::spin`] after the last
//! event, then arms the worker and sleeps on its event fd, so an idle process burns no CPU.
//!
//! Closing (or dropping) a communicator keeps its thread progressing, for at most 1 s and
//! only while its registrations are still mapped, until the worker has been quiet for
//! 100 ms: UCX answers peers' emulated GETs and PUTs by itself, and in UCX 1.13
//! `ucp_worker_destroy` crashes the process purging such an answer still queued behind a
//! full peer queue. A worker that could not be settled is not destroyed but leaked, with a
//! warning, and counted in [`UcxCommunicator::process_stats`].
//!
//! # Who checks what
//!
//! - Bounds and access rights are checked at the initiator, before any byte moves, against
//!   what the *target* confirmed at import time over the control connection: a descriptor
//!   whose bytes differ from the target's export (forged, damaged, rights or length
//!   inflated) is refused with `InvalidKey`, and UCX never parses its key.
//! - UCX itself enforces neither rights nor revocation on TCP and shared memory (its
//!   `UCP_MEM_MAP_PROT_*` flags are passed, and honoured by RDMA hardware only), so the
//!   rights check protects honest peers from mistakes, not from a hostile process that
//!   bypasses this crate; on shared memory any local process of the same user can read
//!   another's memory anyway.
//! - Deregistration first revokes the key at every peer that imported it and waits until
//!   their in-flight operations on it drained ([`UcxConfig::revoke_timeout`]); then it
//!   unmaps. A stale key is refused with `InvalidKey`; registrations are unmapped exactly once.
//! - Every transfer has a deadline; a deadline, a cancel (dropping the future) or a peer's
//!   failure stops the batch, and the caller hears back only once UCX no longer touches its
//!   memory. A WRITE is reported complete after `ucp_ep_flush_nbx`, i.e. visible at the target.
//!   One that ends early is flushed too; where the target makes no progress (stopped), the
//!   endpoint's generation is abandoned first, so none of its bytes lands at the target once
//!   it runs again, and the endpoint and its keys work on a new generation
//!   ([`UcxConfig::drain_timeout`], [`UcxConfig::abandon_timeout`]).
//! - A peer's death is seen by UCX's error handler (`UCP_ERR_HANDLING_MODE_PEER`) or by EOF
//!   on the control connection, whichever comes first; its endpoint then fails every
//!   operation with [`Error::Peer`](hmc_core::Error::Peer).
//!
//! # Performance notes (UCX 1.13)
//!
//! Over shared memory UCX 1.13 does RMA on *user* memory (what `register` gets) by
//! emulation: active messages through the posix queues, applied by the target's progress
//! thread (CMA is used only for rendezvous of active messages: the `cma` transport offers
//! zero-copy put/get only, which UCP 1.13 does not accept as an RMA lane, and `posix` can
//! map only memory it allocated). `UCX_POSIX_USE_PROC_LINK` does not change that (it only
//! chooses how a peer opens a posix segment); mapping arbitrary user pages needs `xpmem`
//! or `knem`, kernel modules this host does not have. `UCX_PROTO_ENABLE=y` (UCX's newer
//! protocol selection) moved puts of user memory several times faster and gets slower in
//! one run on a loaded host; it is not measured well enough to recommend.
//! `ucx_perftest ucp_put_bw` reaches memcpy speed because it allocates its buffers *through*
//! UCX (`UCP_MEM_MAP_FLAG_ALLOCATE`), which the posix transport maps into the peer directly.
//! [`UcxCommunicator::alloc_registered`] does the same: transfers between such
//! registrations run at `ucx_perftest` speed (see `benches/rma.rs`); data planes that own
//! their staging buffers get it through `Communicator::alloc_registered` (hmc-rpc's
//! `BufferPool` asks for it first). When UCX maps a remote region into this process
//! (`ucp_rkey_ptr`), a transfer is a plain memcpy on the calling thread, as inside
//! `ucp_put_nbx`, without the round trip through the progress thread
//! ([`UcxConfig::direct_mapped`], counted in [`UcxStats::direct_transfers`]).
//! Over TCP both kinds go through the same emulation and are on par. UCX sends it in
//! `UCX_TCP_TX_SEG_SIZE` pieces, 8 KiB by default, with which single puts of 1 MiB and more
//! stall in UCX 1.13 (`ucx_perftest ucp_put_bw -s 16777216` shows it; figures in
//! `docs/benchmarks.md`), and larger pieces remove the stall. This transport therefore
//! sets 64 KiB ([`TCP_TX_SEG_SIZE`]) unless `UCX_TCP_TX_SEG_SIZE` is in the environment or
//! `TCP_TX_SEG_SIZE` in [`UcxConfig::ucx_options`].
//!
//! # Safety story
//!
//! `unsafe` lives in [`sys`] (symbol binding) and in the engine (UCX calls), each block with
//! its reason. Local memory handed to UCX is kept alive by the borrow of the registration in
//! each `TransferDesc` for as long as the transfer future lives, and a dropped future waits
//! until UCX released the memory.

mod caps;
mod comm;
mod config;
mod control;
mod engine;
mod staged;
pub mod sys;
#[cfg(test)]
mod wire_doc_tests;

pub use comm::{
    UcxCommunicator, UcxEndpoint, UcxProcessStats, UcxRegistration, UcxRemoteKey, UcxStats,
};
pub use config::{DIRECT_ENV, TCP_TX_SEG_SIZE, UcxConfig};
pub use staged::UcxStagingStats;
