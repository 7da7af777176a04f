//! What the HMC RPC binaries (`hmc-rpc-server`, `hmc-rpc-client`, `hmc-rpc-bench`) share:
//! the run-time choice of data plane ([`plane`], which links the TCP and UCX transports so
//! that the `hmc-rpc` library does not have to) and the allocator tuning ([`tuning`]).
//!
//! # Safety
//!
//! `unsafe` is denied crate-wide and allowed only for [`tuning::tune_allocator`]'s
//! `mallopt` call, with its `// SAFETY:` reasoning.

#![deny(unsafe_code)]

pub mod plane;
pub mod tuning;
