//! What the HMC RPC binaries (`hmc-rpc-server`, `hmc-rpc-client`, `hmc-rpc-bench`) share:
//! the run-time choice of data plane ([`plane`], which links the TCP and UCX transports so
//! that the `hmc-rpc` library does not have to), the allocator tuning ([`tuning`]) and
//! what the connection sweeps of `hmc-rpc-bench` and the engine bench share ([`sweep`],
//! from `hmc-bench-kit`).
//!
//! # Example
//!
//! The binaries' run-time choice of data plane (`--data-plane tcp|ucx|none`):
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> hmc_core::Result<()> {
//! use hmc_rpc_tools::plane::{open_data_plane, DataPlaneKind};
//! let dp = open_data_plane(DataPlaneKind::Tcp, [127, 0, 0, 1].into())?.expect("a TCP data plane");
//! println!("HMC_BUFFER payloads move over {}", hmc_core::Communicator::address(&dp));
//! assert!(open_data_plane(DataPlaneKind::None, [127, 0, 0, 1].into())?.is_none());
//! # Ok(())
//! # }
//! ```
//!
//! # Safety
//!
//! `unsafe` is denied crate-wide and allowed only for [`tuning::tune_allocator`]'s
//! `mallopt` call, with its `// SAFETY:` reasoning.

#![deny(unsafe_code)]

pub mod plane;
/// The connection sweep's shared pieces, now in `hmc-bench-kit` (re-exported for the
/// binaries' paths).
pub use hmc_bench_kit::sweep;
pub mod tuning;
