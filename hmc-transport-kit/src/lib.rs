//! `hmc-transport-kit`: what HMC's transports and its RPC runtime share below their
//! protocols, so that each is written once.
//!
//! - Sockets ([`Conn`], [`Listener`], [`connect`], [`bind_unix_listener`]): TCP and Unix
//!   domain streams and listeners named by `PeerAddr`, `TCP_NODELAY`, and one rule for
//!   stale Unix socket files ([`unix::clear_stale_socket`], also behind the blocking
//!   [`unix::bind_unix`]); [`unix::peer_cred`] says who is on the other end.
//! - Who a local peer is ([`owner`]) and pre-shared-secret authentication ([`auth`]),
//!   which every listener of the RPC runtime and the TCP transport applies.
//! - Deadlines across processes ([`deadline`]: `CLOCK_MONOTONIC` nanoseconds, what the
//!   plugin ABI passes).
//! - Framing with named limits: [`frame`] (async, `u32` length and `u64` request id) and
//!   [`control_frame`] (blocking, `kind u8, length u32`, the UCX and RDMA side channels),
//!   each checking the length against the reader's limit from the header alone.
//! - Request/reply matching under deadlines ([`reply`]) and tasks that stop when their
//!   owner drops ([`task`]).
//! - The random half of remote keys ([`key_token`]): drawn, compared in constant time,
//!   replaced by `rekey`; the TCP and shared-memory transports' registrations hold one,
//!   in the table by id that their targets serve requests from ([`registry`]).
//! - Non-blocking socket calls on a raw descriptor ([`nonblocking`]: `recv`, `recvmsg`,
//!   `send`, `sendmsg`, a zero-timeout `poll`, hang-up, reset on close), which the TCP
//!   transport's stream and the RPC runtime's busy-polling reads issue behind their
//!   runtime's back.
//! - Waking a thread parked in `poll(2)` ([`wake`]: an `eventfd` and the wait on a few
//!   descriptors), the sleep of the UCX progress thread, the RDMA completion thread and
//!   the plugin host's event thread, and the `eventfd` an exported plugin communicator
//!   hands its host.
//! - The pool of host chunks a target stages device memory through for its peers
//!   ([`staging`]): bounded, first come first served, taken from a task or a thread,
//!   refused by name (`max_staging_bytes`) when none come free in time; the TCP transport
//!   serves its device regions through one, and UCX those its library cannot move.
//!
//! The two stream types above these calls stay apart on purpose, each shaped by its hot
//! path: the TCP transport's `Stream` is one std socket shared by `&self` between a
//! request's reader and writer, registered with the poller only while a task must wait,
//! with a read-ahead buffer for headers; the RPC runtime's halves are tokio streams split
//! between a connection's reader and writer tasks, which busy-poll then park on tokio's
//! readiness. What they share is below the stream: these calls, dialling, listening,
//! authentication and framing.
//!
//! What a transfer's descriptors must satisfy (the key's endpoint, bounds, access) is
//! `hmc_core::check_desc`, in the core so that the plugin host, which depends on no
//! transport, calls the same check. ABI shims for tests live in `hmc-testshim`.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! use hmc_transport_kit::{Conn, Listener};
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! let l = Listener::bind(&"tcp://127.0.0.1:0".parse().unwrap()).unwrap();
//! let addr = l.local_addr().unwrap();
//! let (client, server) = tokio::join!(hmc_transport_kit::connect(&addr), l.accept());
//! let (Conn::Tcp(mut c), Conn::Tcp(mut s)) = (client?, server?) else { unreachable!() };
//! c.write_all(b"hi").await?;
//! let mut b = [0u8; 2];
//! s.read_exact(&mut b).await?;
//! assert_eq!(&b, b"hi");
//! # Ok(())
//! # }
//! ```
//!
//! # Safety story
//!
//! `unsafe` is limited to libc calls, each with its `SAFETY` note: with their buffers on
//! the stack (`clock_gettime`, `getsockopt(SO_PEERCRED)`, `setsockopt(SO_LINGER)`,
//! `poll`, the `eventfd` counter), the netlink socket of [`owner`]'s `sock_diag` queries,
//! and [`nonblocking`]'s reads and writes, into or from the slices they are given (a
//! `recvmsg` into caller-made `iovec`s is an `unsafe fn` with its contract). Besides
//! them, a [`staging::Lease`] makes its chunk's host memory a slice, bounds-checked
//! against the chunk it owns.

pub mod auth;
pub mod control_frame;
pub mod deadline;
pub mod frame;
mod ip;
pub mod key_token;
pub mod nonblocking;
pub mod owner;
pub mod registry;
pub mod reply;
mod sock_diag;
mod socket;
pub mod staging;
pub mod task;
pub mod unix;
pub mod wake;

pub use socket::{Conn, Listener, bind_unix_listener, connect};
