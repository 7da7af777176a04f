//! HMC RPC: protocol v1, the `RpcCodec` serde format, a method dispatcher, and a tokio
//! server and pipelined client over TCP and Unix sockets.
//!
//! # What this crate is for
//!
//! Calls between processes with a stable wire format (`docs/protocol.md`): a 48-byte
//! big-endian header, many calls in flight per persistent connection, out-of-order answers,
//! deadlines on every call, cancel, overload answers instead of silent drops, and graceful
//! shutdown. Payloads up to 4 KiB travel INLINE; larger ones as bounded DATA chunks
//! (TCP_STREAM) interleaved with other calls.
//!
//! # Layers
//!
//! - [`frame`]: header encode/decode and validation; no state.
//! - [`proto`]: the sans-IO core (request tables, deadlines, credits, cancel, keepalive,
//!   GOAWAY), driven by bytes and `now`; no sockets, no clock.
//! - [`codec`]: [`RpcCodec`], the deterministic big-endian serde format.
//! - [`dispatch`]: method table with typed, raw, async and blocking handlers.
//! - [`server`] and [`client`]: the tokio runtime around the core.
//!
//! # What it is not (yet)
//!
//! The HMC_BUFFER payload mode (one-sided pull/push of large payloads through a
//! [`hmc_core::Communicator`]) is the next step. The types already carry the parameter:
//! [`Server<C>`](server::Server) and [`Client<C>`](client::Client) take an optional data
//! plane `C: Communicator`, defaulting to [`NoDataPlane`], and a peer that sends HMC_BUFFER
//! today is answered `DATA_PLANE`.
//!
//! # Safety
//!
//! `unsafe` is denied crate-wide and allowed in two places: [`NoDataPlane`]'s
//! `Communicator::register`, which the trait declares unsafe and which touches no memory
//! (it always fails), and [`tuning::tune_allocator`]'s `mallopt` call.

#![deny(unsafe_code)]

pub mod client;
pub mod codec;
mod data_plane;
pub mod demo;
pub mod dispatch;
pub mod frame;
mod net;
pub mod plane;
pub mod pool;
pub mod proto;
pub mod server;
pub mod tuning;

pub use client::{BlockingClient, CallError, CallOptions, Client, ClientConfig};
pub use codec::{CodecError, RpcCodec};
pub use data_plane::{
    ClientDataPlane, DataPlaneConfig, DataPlaneStats, NoDataPlane, NoRegistration,
};
pub use dispatch::{CallContext, CancelToken, Dispatcher, RpcError};
pub use frame::{Flags, FrameHeader, FrameKind, FrameLimits, PayloadMode, Status};
pub use pool::{BufferPool, PoolConfig, PoolStats, PooledBuffer};
pub use proto::ConnConfig;
pub use server::{RunningServer, Server, ServerConfig, ShutdownHandle};
