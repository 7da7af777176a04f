//! `hmc-engine`: a one-sided transfer engine in the style of HIXL (and of NIXL's agent and
//! Mooncake's Transfer Engine), over any [`hmc_core::Communicator`].
//!
//! # What it adds to a `Communicator`
//!
//! A communicator moves bytes between a local registration and an imported remote
//! region, each named by a handle and an offset. An engine lets callers name memory by raw
//! address on both sides, as inference engines hold it (a KV cache is a base address and a
//! layout):
//!
//! - [`Engine::register_mem`] registers `{addr, len}` of host or device memory;
//! - [`Engine::connect`] asks the peer engine's metadata service (an `hmc-rpc` server on the
//!   engine's own address) for its data-plane address and its table of registered regions,
//!   connects the data plane and imports every region;
//! - [`Engine::transfer`] translates each `{local_addr, remote_addr, len}` through interval
//!   maps to (registration, offset) pairs, checks every descriptor before any byte moves
//!   (an address outside every region, or straddling two, is an error naming both), merges
//!   runs that are contiguous on both sides, and runs the batch with a deadline;
//! - a remote address missing from the table fetched at connect makes the engine fetch it
//!   once more (the peer may have registered memory since); a region the peer deregistered
//!   has its key revoked by the transport, so a racing transfer fails instead of touching
//!   freed memory;
//! - [`Engine::transfer_async`] returns a [`TransferRequest`] whose timeout really ends it
//!   (the transport's cancellation contract: once reported, its memory is no longer
//!   touched); many may be in flight per peer;
//! - [`Engine::send_notify`] / [`Engine::get_notifies`]: small messages through the
//!   metadata service, bounded at the receiver.
//!
//! [`BlockingEngine`] is the same with blocking calls on a runtime of its own.
//!
//! # Transports and cargo features
//!
//! [`Engine::initialize_with`] opens the transport its config names (`transport = tcp |
//! ucx | shm | rdma | auto | <plugin>`) through `hmc-transports`; each is a cargo feature of
//! this crate of the same name (`tcp`, `ucx`, `shm`, `rdma`, `plugin`), all in the default
//! set with `etcd` (etcd metadata, independent of them). The engine builds with any one of
//! them, e.g. `--no-default-features --features tcp`, and takes the transports' defaults
//! (staging limits, copy threads, UCX timeouts) from `hmc_transports::Defaults`, so they are
//! the same whichever are in. A name whose feature is left out is refused as `Unavailable`,
//! naming the feature; `auto` needs `tcp` or `ucx` for peers on other hosts.
//!
//! With no transport feature at all the engine still builds: [`Engine::initialize`] runs
//! over any [`hmc_core::Communicator`], so an embedder that brings its own transport needs
//! none of these (and `cargo xtask matrix` builds every crate without its default
//! features). [`Engine::initialize_with`] and [`open_transport`] then fail with
//! [`EngineError::Transport`] holding `hmc_core::Error::Unavailable`, whose text names the
//! five features to build with, rather than the build failing with a `compile_error!` that
//! would refuse that embedder.
//!
//! # Example
//!
//! Two engines in one process over the TCP transport: register a buffer on each, connect,
//! write, read back.
//!
//! ```
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use hmc_engine::{Access, Engine, EngineConfig, MemDesc, MemType, TransferOp, TransferOpDesc};
//! use hmc_transport_tcp::TcpCommunicator;
//!
//! let open = || TcpCommunicator::bind(&"tcp://127.0.0.1:0".parse().unwrap(), Default::default());
//! let a = Engine::initialize(Arc::new(open()?), "127.0.0.1", EngineConfig::default()).await?;
//! let b = Engine::initialize(Arc::new(open()?), "127.0.0.1", EngineConfig::default()).await?;
//! let src = vec![7u8; 4096];
//! let dst = vec![0u8; 4096];
//! // SAFETY: both buffers outlive their registrations (deregistered below).
//! let (ha, hb) = unsafe {
//!     let ha = a.register_mem(MemDesc { addr: src.as_ptr() as u64, len: 4096 }, MemType::Host, Access::READ_WRITE)?;
//!     let hb = b.register_mem(MemDesc { addr: dst.as_ptr() as u64, len: 4096 }, MemType::Host, Access::READ_WRITE)?;
//!     (ha, hb)
//! };
//! a.connect(b.name(), Duration::from_secs(5)).await?;
//! let desc = TransferOpDesc { local_addr: src.as_ptr() as u64, remote_addr: dst.as_ptr() as u64, len: 4096 };
//! a.transfer(b.name(), TransferOp::Write, &[desc], Duration::from_secs(5)).await?;
//! assert_eq!(dst, src);
//! a.deregister_mem(ha).await?;
//! b.deregister_mem(hb).await?;
//! # Ok(())
//! # }
//! ```

mod blocking;
mod config;
mod engine;
mod error;
mod guide_doctests;
pub mod kv;
mod mapping;
mod meta;
mod open;
mod region_map;
mod request;

pub use blocking::BlockingEngine;
pub use config::EngineConfig;
pub use engine::{
    BlockDesc, Engine, MemDesc, MemHandle, MemType, Notify, PreparedList, PreparedTransfer,
    Telemetry, TransferOp, TransferOpDesc,
};
pub use error::{EngineError, Result, Side};
pub use hmc_core::Access;
pub use mapping::host_range_access;
pub use open::{
    EngineTransport, open_transport, open_transport_for, open_transport_with, transport_options,
};
pub use request::{TransferRequest, TransferStatus};
