//! The communicator conformance kit against the stand-in `libibverbs.so.1`: real verbs calls through the ops table, bytes moved by the stand-in's per-process NIC.

mod common;

use common::peers;

hmc_core::communicator_conformance!(peers);
