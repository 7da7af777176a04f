//! Pieces every HMC backend ends up writing, in one small crate: deadlines that cross processes, a Unix-socket side channel's bind and peer credentials, length-prefixed frames with a named size limit, request/reply matching under deadlines, tasks that stop when their owner drops, and ABI shims that test a backend without its hardware.
//!
//! ```
//! use std::time::Duration;
//! use hmc_backend_helpers::deadline::{from_monotonic_ns, to_monotonic_ns};
//! use hmc_core::Deadline;
//!
//! // A deadline sent to another process on this host as CLOCK_MONOTONIC nanoseconds.
//! let d = Deadline::after(Duration::from_secs(2));
//! let back = from_monotonic_ns(to_monotonic_ns(d));
//! assert!(back.remaining() <= Duration::from_secs(2));
//! assert!(back.remaining() > Duration::from_secs(1));
//! ```
//!
//! What it is not: a transport, a protocol, or a runtime. The frame and reply helpers run
//! on tokio, as the in-tree transports do; [`deadline`], [`unix`] need none. [`shim`]
//! is for tests: it compiles an author's C stand-in for a vendor library with the
//! system's C compiler.
//! docs/backend-guide.md says where each fits in a backend.
//!
//! # Safety story
//!
//! `unsafe` is limited to two libc calls (`clock_gettime`, `getsockopt(SO_PEERCRED)`),
//! each with its buffer on the stack.

pub mod deadline;
pub mod frame;
pub mod reply;
pub mod shim;
pub mod task;
pub mod unix;
