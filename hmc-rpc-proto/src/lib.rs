//! HMC RPC protocol v1 without I/O: frames, the connection state machines, the `RpcCodec`
//! serde format and the held-byte budget. Nothing here touches a socket, reads a clock or
//! needs an async runtime; `hmc-rpc` drives it with tokio (and blocking sockets), and the
//! fuzz targets drive it with arbitrary bytes.
//!
//! One call, a client and a server core driven against each other in memory:
//!
//! ```
//! use std::time::Instant;
//!
//! use bytes::Bytes;
//! use hmc_rpc_proto::proto::{ClientConn, ClientEvent, ConnConfig, ServerConn, ServerEvent};
//! use hmc_rpc_proto::{RpcCodec, Status};
//!
//! let now = Instant::now();
//! let mut client = ClientConn::new(ConnConfig::default(), now);
//! let mut server = ServerConn::new(ConnConfig::default(), now);
//!
//! // The client queues a call to method 2 with a typed argument; its bytes go to the server.
//! let arg = RpcCodec::encode(&"hello".to_string()).unwrap();
//! let id = client.start_call(2, Bytes::from(arg), None, false, now).unwrap();
//! let wire = client.pending_tx().to_vec();
//! client.advance_tx(wire.len());
//! server.handle_input(&wire, now);
//!
//! // The server's runtime runs the call and answers it.
//! let Some(ServerEvent::Call(call)) = server.poll_event() else { panic!("no call") };
//! assert_eq!((call.request_id, call.method_id), (id, 2));
//! let text: String = RpcCodec::decode(&call.payload).unwrap();
//! let answer = RpcCodec::encode(&text.to_uppercase()).unwrap();
//! server.respond(call.request_id, call.method_id, Status::OK, Bytes::from(answer), now);
//! let wire = server.pending_tx().to_vec();
//! server.advance_tx(wire.len());
//! client.handle_input(&wire, now);
//!
//! let Some(ClientEvent::Response { request_id, status, payload }) = client.poll_event() else {
//!     panic!("no response")
//! };
//! assert_eq!((request_id, status), (id, Status::OK));
//! assert_eq!(RpcCodec::decode::<String>(&payload).unwrap(), "HELLO");
//! ```
//!
//! # Modules
//!
//! - [`frame`]: the 48-byte header, its encoding, validation and the payload CRC; no state.
//! - [`proto`]: the connection cores ([`ServerConn`], [`ClientConn`]) and the framing they
//!   share (reassembly, transmit scheduling), driven by bytes and `now`.
//! - [`codec`]: [`RpcCodec`], the deterministic big-endian serde format.
//! - [`budget`]: [`HeldBudget`], the server-wide bound on bytes held for clients.
//! - [`demo`]: the demo service's method ids and types.
//!
//! `unsafe` is forbidden in this crate.

#![forbid(unsafe_code)]

pub mod budget;
pub mod codec;
pub mod demo;
pub mod frame;
mod input_pool;
pub mod proto;
pub mod settings;

pub use budget::{HeldBudget, ServerStats};
pub use codec::{CodecError, RpcCodec};
pub use frame::{Flags, FrameHeader, FrameKind, FrameLimits, PayloadMode, Status};
pub use proto::{ClientConn, ConnConfig, ServerConn};
pub use settings::{SETTINGS_METHOD, Settings};
