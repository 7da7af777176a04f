//! HMC RPC: a method dispatcher and a tokio server and pipelined client over TCP and Unix
//! sockets, around the sans-IO protocol core of [`hmc_rpc_proto`] (protocol v1, the
//! `RpcCodec` serde format).
//!
//! An echo method served and called on loopback:
//!
//! ```
//! use bytes::Bytes;
//! use hmc_rpc::{Client, ClientConfig, Dispatcher, Server, ServerConfig};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     const ECHO: u32 = 1;
//!     let mut methods = Dispatcher::new();
//!     methods.register_raw(ECHO, |_ctx, body: Bytes| async move { Ok(body) });
//!     let server = Server::new(methods, ServerConfig::default())
//!         .bind(&"tcp://127.0.0.1:0".parse()?)
//!         .await?;
//!
//!     let client = Client::connect(server.local_addr(), ClientConfig::default()).await?;
//!     assert_eq!(&client.call(ECHO, "hello").await?[..], b"hello");
//!
//!     server.shutdown().await;
//!     Ok(())
//! }
//! ```
//!
//! # What this crate is for
//!
//! Calls between processes with a stable wire format (`docs/protocol.md`): a 48-byte
//! big-endian header, many calls in flight per persistent connection, out-of-order answers,
//! deadlines on every call, cancel, overload answers instead of silent drops, and graceful
//! shutdown. Payloads up to 4 KiB travel INLINE; larger ones as bounded DATA chunks
//! (TCP_STREAM) interleaved with other calls, or one-sided over a data plane (HMC_BUFFER).
//!
//! This crate links no transport: the data plane is any `C: Communicator` the caller
//! brings. The binaries (`hmc-rpc-server`, `hmc-rpc-client`, `hmc-rpc-bench`) and the
//! run-time choice between the TCP and UCX transports live in `hmc-rpc-tools`. Nothing
//! here reads environment variables: every setting is a config field.
//!
//! # Layers
//!
//! - [`frame`], [`proto`], [`codec`], [`budget`]: re-exported from [`hmc_rpc_proto`], the
//!   sans-IO core (headers, request tables, deadlines, credits, cancel, keepalive, GOAWAY,
//!   the codec and the held-byte budget), driven by bytes and `now`; no sockets, no clock.
//! - [`dispatch`]: method table with typed, raw, async and blocking handlers.
//! - [`server`] and [`client`]: the tokio runtime around the core.
//! - [`direct`]: [`DirectClient`], the same core driven by blocking sockets on the caller's
//!   thread, for synchronous callers that want no runtime and no thread hop.
//!
//! # Logs and metrics
//!
//! Logs go through `tracing`. At DEBUG, each call runs in a span carrying its request id on
//! both sides (`rpc.call` at the client, `rpc.conn`/`rpc.handle` at the server), so that a
//! client's log line and the server's for the same call can be joined; below DEBUG no span
//! is made. Counters, gauges and histograms go through the `metrics` facade (names in
//! `docs/guide/cluster-etcd.md`, "Metrics"; why so in `docs/design.md`, "Metrics and
//! tracing"); both are free without a subscriber or recorder.
//!
//! # Large payloads over a data plane (HMC_BUFFER)
//!
//! [`Server<C>`](server::Server) and [`Client<C>`](client::Client) take an optional data
//! plane `C: Communicator` (default [`NoDataPlane`]). With one on both sides, payloads from
//! [`DataPlaneConfig::threshold`] (64 KiB) move one-sided: the client lends pooled
//! registered buffers ([`pool`]) and sends a descriptor, the server pulls the request with a
//! READ and pushes a large response with a WRITE ([`ClientDataPlane`],
//! `docs/protocol.md`). To choose the transport at run time, pass an
//! [`hmc_core::AnyCommunicator`] (as `hmc-rpc-tools`' `plane::open_data_plane` does for the
//! binaries' `--data-plane`).
//!
//! [`Server<C>`](server::Server) is generic; [`RunningServer`] is not: binding erases the
//! data plane's type once, behind the server half's object-safe trait, so that code which
//! holds, stops or inspects a running server does not carry `C` (the per-call path stays
//! monomorphised inside). [`Client<C>`](client::Client) stays generic.
//!
//! # Safety
//!
//! `unsafe` is denied crate-wide and allowed, each block with its `// SAFETY:` reasoning,
//! only where memory or the OS must be touched directly:
//! - (formerly) the empty data plane's `Communicator::register`, now core's `NoCommunicator`, which
//!   touches no memory (it always fails);
//! - the pool's views of registered host buffers ([`PooledBuffer::fill`],
//!   [`PooledBuffer::as_slice`], `RequestBuffer::as_mut_slice`), used once their transfers
//!   have completed;
//! - the data plane's device path, which copies a response chunk off the device into a
//!   pooled bounce buffer no transfer is using;
//! - the connection tasks' busy-polling (`net`): a non-blocking `recv` into caller-owned
//!   memory, the `Vec::set_len` after it, and `getrusage` to notice preemption.

#![deny(unsafe_code)]

pub mod client;
mod data_plane;
pub mod demo;
pub mod device;
pub mod direct;
pub mod dispatch;
mod metrics;
mod net;
pub mod pool;
pub mod server;
mod trace;

pub use hmc_rpc_proto::{budget, codec, frame, proto, settings};

pub use budget::{HeldBudget, ServerStats};
pub use client::{BlockingClient, CallError, CallOptions, Client, ClientConfig};
pub use codec::{CodecError, RpcCodec};
pub use data_plane::{
    ClientDataPlane, DataPlaneAllow, DataPlaneConfig, DataPlaneStats, NoDataPlane, NoRegistration,
};
pub use device::{DEFAULT_DEVICE_STAGING, StagingRing};
pub use direct::DirectClient;
pub use dispatch::{CallContext, CancelToken, Connection, Dispatcher, RpcError};
pub use frame::{Flags, FrameHeader, FrameKind, FrameLimits, PayloadMode, Status};
pub use hmc_transport_kit::auth::AuthSecret;
pub use pool::{BufferPool, PoolConfig, PoolStats, PooledBuffer};
pub use proto::ConnConfig;
pub use server::{RunningServer, Server, ServerConfig, ShutdownHandle};
