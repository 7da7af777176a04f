//! What hmc's benchmarks share, so that a bench depends on this crate rather than on
//! another bench's crate (the engine bench once pulled in the RPC binaries for these).
//!
//! - [`sweep`]: the connection sweeps of `hmc-rpc-bench --conn-sweep` and the engine
//!   bench's `--conn-sweep`.
//! - [`cpu`]: the CPU time of every process taking part in a measured section, as
//!   CPU-seconds per GiB and CPU-microseconds per operation (issue 60).
//! - [`iperf3`]: iperf3 on loopback, one way or both, as a reference rate and CPU per GiB.
//! - [`rounds`]: the median and range of a figure over alternated rounds.
//!
//! `unsafe` appears in [`sweep::raise_fd_limit`]'s `getrlimit`/`setrlimit` and in
//! [`cpu`]'s `getrusage`/`sysconf`, each with its `// SAFETY:` comment.

#![deny(unsafe_code)]

pub mod cpu;
pub mod iperf3;
pub mod rounds;
pub mod sweep;
