//! What hmc's benchmarks share, so that a bench depends on this crate rather than on
//! another bench's crate (the engine bench once pulled in the RPC binaries for these).
//!
//! - [`sweep`]: the connection sweeps of `hmc-rpc-bench --conn-sweep` and the engine
//!   bench's `--conn-sweep`.
//!
//! `unsafe` appears in [`sweep::raise_fd_limit`]'s `getrlimit`/`setrlimit`, each with its
//! `// SAFETY:` comment.

#![deny(unsafe_code)]

pub mod sweep;
