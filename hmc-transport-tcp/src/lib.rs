//! HMC over plain sockets: a rank-addressed control plane over TCP and Unix sockets, and a
//! TCP `Communicator` that serves one-sided READ/WRITE for hosts without UCX or RDMA.
//!
//! # Example
//!
//! Two communicators in one process: register a buffer at the target, export its key, and
//! WRITE into it one-sided from the initiator.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> hmc_core::Result<()> {
//! use std::sync::Arc;
//! use hmc_backend_cpu::HostMemory;
//! use hmc_core::{Access, Communicator, ConnBuffer, Deadline, MemSpan, Op, RegisteredBuffer, TransferDesc};
//! use hmc_transport_tcp::{TcpCommunicator, TcpConfig};
//!
//! let addr = "tcp://127.0.0.1:0".parse().unwrap();
//! let target = Arc::new(TcpCommunicator::bind(&addr, TcpConfig::default())?);
//! let initiator = Arc::new(TcpCommunicator::bind(&addr, TcpConfig::default())?);
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
//! # What this crate is for
//!
//! - [`ControlPlane`]: processes find and talk to each other by rank. Bind as rank N on
//!   TCP and/or Unix socket addresses, connect to rank M over either, then send and receive
//!   small typed messages ([`ControlMessage`]) per peer. A HELLO binds each connection to
//!   the dialler's rank; a second connection claiming a connected rank is refused. This is
//!   where peers exchange [`hmc_core::RemoteRegion`] descriptors and addresses.
//! - [`TcpCommunicator`]: an [`hmc_core::Communicator`] for hosts without UCX or RDMA. A
//!   responder inside the library serves peers' READ and WRITE requests against this
//!   process's registrations, so the remote application does nothing during a transfer,
//!   as with RDMA. A remote key carries a 128-bit random token; every request is checked
//!   against the region's bounds and access flags before any byte is touched, and a WRITE
//!   completes only when the target holds the bytes. A WRITE that ends early (its future
//!   dropped, its deadline) is made final at the target by
//!   [`hmc_core::Communicator::settle`]: once it returns `Ok`, no more of it lands there.
//!
//! # What it is not for
//!
//! Device memory: the CPU moves the bytes, so only host regions register (stage device
//! data through a host `ConnBuffer`). Large or many-in-flight RPC payloads: that is
//! `hmc-rpc`'s job. Untrusted networks: nothing is encrypted, and the tokens protect
//! against mistakes and stale keys, not against an eavesdropper on the wire. The optional
//! pre-shared-secret authentication ([`AuthSecret`], off by default) keeps processes
//! without the secret off both planes; it does not hide or protect the bytes in transit.
//!
//! # Runtime and limits
//!
//! Both types need a tokio runtime (they spawn their accept loops and connection tasks)
//! and never busy-poll: idle connections cost a parked task each. Every limit has a
//! default and a name in [`ControlPlaneConfig`] or [`TcpConfig`], and the error that
//! reports it says how to raise it.
//!
//! # Safety story
//!
//! `unsafe` appears where bytes move between a socket and registered memory. Registration
//! is `unsafe` in `hmc-core` for that reason: the caller keeps the region allocated while it
//! is registered. The initiator touches local memory only inside the transfer future (so a
//! dropped future stops at once); the responder touches a region only under its liveness
//! lock, after a full bounds, token and access check.

mod abandon;
mod auth;
mod comm;
mod config;
mod conn_name;
mod control;
mod endpoint;
mod net;
mod region;
mod registration;
mod request;
mod responder;
mod staged;
mod state;
mod wait;
mod wire;
#[cfg(test)]
mod wire_doc_tests;

pub use auth::{AuthSecret, MIN_SECRET_LEN};
pub use comm::{TcpCommunicator, TcpStats};
pub use config::TcpConfig;
pub use control::{ControlMessage, ControlPlane, ControlPlaneConfig, ControlPlaneStats, Rank};
pub use endpoint::TcpEndpoint;
pub use net::bind_unix_listener;
pub use registration::{TcpRegistration, TcpRemoteKey};
pub use staged::StagingStats;
