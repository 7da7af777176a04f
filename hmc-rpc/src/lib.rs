//! HMC RPC: protocol v1, the `RpcCodec` serde format, a method dispatcher, and a tokio
//! server and pipelined client over TCP and Unix sockets.
//!
//! # What this crate is for
//!
//! Calls between processes with a stable wire format (`docs/protocol.md`): a 48-byte
//! big-endian header, many calls in flight per persistent connection, out-of-order answers,
//! deadlines on every call, cancel, overload answers instead of silent drops, and graceful
//! shutdown. Payloads up to 4 KiB travel INLINE; larger ones as bounded DATA chunks
//! (TCP_STREAM) interleaved with other calls, or one-sided over a data plane (HMC_BUFFER).
//!
//! # Layers
//!
//! - [`frame`]: header encode/decode and validation; no state.
//! - [`proto`]: the sans-IO core (request tables, deadlines, credits, cancel, keepalive,
//!   GOAWAY), driven by bytes and `now`; no sockets, no clock.
//! - [`codec`]: [`RpcCodec`], the deterministic big-endian serde format.
//! - [`dispatch`]: method table with typed, raw, async and blocking handlers.
//! - [`server`] and [`client`]: the tokio runtime around the core.
//! - [`direct`]: [`DirectClient`], the same core driven by blocking sockets on the caller's
//!   thread, for synchronous callers that want no runtime and no thread hop.
//!
//! # Large payloads over a data plane (HMC_BUFFER)
//!
//! [`Server<C>`](server::Server) and [`Client<C>`](client::Client) take an optional data
//! plane `C: Communicator` (default [`NoDataPlane`]). With one on both sides, payloads from
//! [`DataPlaneConfig::threshold`] (64 KiB) move one-sided: the client lends pooled
//! registered buffers ([`pool`]) and sends a descriptor, the server pulls the request with a
//! READ and pushes a large response with a WRITE ([`ClientDataPlane`],
//! `docs/protocol.md`). [`plane::open_data_plane`] picks the TCP or UCX transport at run time
//! through [`hmc_core::AnyCommunicator`], as the binaries' `--data-plane` does.
//!
//! # Safety
//!
//! `unsafe` is denied crate-wide and allowed, each block with its `// SAFETY:` reasoning,
//! only where memory or the OS must be touched directly:
//! - [`NoDataPlane`]'s `Communicator::register`, which the trait declares unsafe and which
//!   touches no memory (it always fails);
//! - [`tuning::tune_allocator`]'s `mallopt` call;
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
mod net;
pub mod pool;
pub mod server;

pub use hmc_rpc_proto::{budget, codec, frame, proto};

pub use budget::{HeldBudget, ServerStats};
pub use client::{BlockingClient, CallError, CallOptions, Client, ClientConfig};
pub use codec::{CodecError, RpcCodec};
pub use data_plane::{
    ClientDataPlane, DataPlaneAllow, DataPlaneConfig, DataPlaneStats, NoDataPlane, NoRegistration,
};
pub use device::{DEFAULT_DEVICE_STAGING, StagingRing};
pub use direct::DirectClient;
pub use dispatch::{CallContext, CancelToken, Dispatcher, RpcError};
pub use frame::{Flags, FrameHeader, FrameKind, FrameLimits, PayloadMode, Status};
pub use pool::{BufferPool, PoolConfig, PoolStats, PooledBuffer};
pub use proto::ConnConfig;
pub use server::{RunningServer, Server, ServerConfig, ShutdownHandle};
