//! RDMA verbs transport for HMC: a [`Communicator`](hmc_core::Communicator) over RC queue
//! pairs with one-sided READ and WRITE, with `libibverbs.so.1` loaded at run time.
//!
//! # Example
//!
//! Without an RDMA device (or without rdma-core) the communicator is `Unavailable`, with
//! a message that says which:
//!
//! ```
//! use hmc_core::Communicator;
//! use hmc_transport_rdma::{RdmaCommunicator, RdmaConfig};
//! match RdmaCommunicator::new(RdmaConfig::default()) {
//!     Ok(c) => println!("RDMA on {:?} at {}", c.device(), c.address()),
//!     Err(e) => println!("RDMA unavailable here: {e}"),
//! }
//! ```
//!
//! # What this crate is for
//!
//! Moving bytes between registered memory of two processes with the NIC doing the work:
//! RDMA WRITE and READ on reliable-connected QPs, over InfiniBand or RoCE, host memory and
//! (where the host allows) GPU memory by DMA-BUF or a peer-memory module. It is not an RPC
//! layer, and its control plane is one TCP or Unix-socket connection per endpoint, used for
//! the handshake, key confirmation, re-establishing a QP, and notifications.
//!
//! # Loading
//!
//! [`sys`] declares the slice of rdma-core's `verbs.h` used here and opens
//! `libibverbs.so.1` (or `$HMC_IBVERBS_LIB`) when a communicator is created; nothing links
//! it at build time, so binaries start where rdma-core is absent. `ibv_post_send`,
//! `ibv_poll_cq` and `ibv_req_notify_cq` are inline in `verbs.h`; they are called through
//! the context's ops table, as the header's inline functions do. `ibv_reg_dmabuf_mr`,
//! `ibv_reg_mr_iova2` and `_ibv_query_gid_ex` are used when present. No library, no
//! device, or no RDMA stack in the kernel (`ENOSYS`) is
//! [`Error::Unavailable`](hmc_core::Error::Unavailable), never a panic.
//!
//! # How a transfer runs
//!
//! - `connect` creates [`RdmaConfig::qps_per_endpoint`] QPs, exchanges a versioned
//!   `{gid, lid, qpn, psn, mtu, port}` record per QP over the control connection, and walks
//!   RESET → INIT → RTR → RTS with attributes capped by the device (path MTU: the smallest
//!   of both ports' and the configured one).
//! - `transfer` checks every descriptor (bounds, rights, which endpoint a key belongs to)
//!   before anything is posted, splits descriptors at the port's `max_msg_sz` (a `u32`:
//!   larger descriptors become several WRs, never a truncated one), stripes the pieces
//!   over the endpoint's QPs, and posts each QP's share as chains of at most
//!   [`RdmaConfig::max_chain`] WRs with only the last signalled. A `wr_id` is (QP
//!   generation, slab slot, last-of-chain): a completion of an old QP incarnation or
//!   another endpoint never matches a live chain.
//! - One completion thread per communicator polls the CQ, busy-polls for
//!   [`RdmaConfig::spin`] after the last completion, then arms the CQ and sleeps on the
//!   completion channel's fd: an idle communicator uses no CPU. It also fires the timers
//!   behind deadlines.
//! - A WRITE is complete when its completion arrives: the responder acknowledged it, so the
//!   bytes are visible at the target.
//!
//! # Errors, cancellation and peers
//!
//! - A dropped transfer (or one whose deadline passed) moves the QPs it used to ERR and
//!   returns only once the NIC flushed its WRs, so the NIC no longer touches its memory;
//!   the next transfer re-establishes those QPs with the peer (both sides reset theirs).
//!   Other transfers flushed by that ERR are posted again: READ and WRITE are idempotent.
//! - A remote access error (deregistered region, forged rkey) is
//!   [`Error::InvalidKey`](hmc_core::Error::InvalidKey); a peer that stops answering
//!   (retry counter exceeded) or whose control connection fails is
//!   [`Error::Peer`](hmc_core::Error::Peer), and the endpoint stays dead.
//! - `import` confirms the descriptor with its owner over the control connection: the key
//!   carries a random per-registration id besides the rkey, so a forged or stale
//!   descriptor is refused before the NIC sees it; the NIC still refuses a key of a region
//!   deregistered after import.
//! - Notifications travel on the control connection (in order per endpoint), not as
//!   SEND/WRITE_WITH_IMM: they need no receive buffers posted and no RNR flow control.
//!
//! # Testing without a NIC
//!
//! The test suite runs against a user-space stand-in for `libibverbs.so.1` (built by
//! `hmc-testshim` at test time) that moves bytes between real processes; it checks how this
//! crate uses the verbs, not a NIC.
//!
//! # Safety story
//!
//! `unsafe` lives in [`sys`] (symbols), `nic` (verbs objects, each freed once in `Drop`),
//! `engine` (polling) and `comm` (posting WRs). Memory named by a posted WR is kept alive by
//! the transfer's borrows of its registrations, and a dropped transfer waits for the flush.

mod comm;
mod control;
mod endpoint;
mod engine;
mod nic;
pub mod sys;
mod target;
pub mod wire;
#[cfg(test)]
mod wire_doc_tests;

pub use comm::{RdmaCommunicator, RdmaConfig, RdmaRegistration, RdmaRemoteKey, RdmaStats};
pub use endpoint::RdmaEndpoint;
pub use nic::DeviceMemorySupport;
