//! The communicator conformance kit against the stand-in `libibverbs.so.1`: real verbs calls through the ops table, bytes moved by the stand-in's per-process NIC.

mod common;

use common::peers;
use hmc_backend_cpu::HostMemory;
use hmc_transport_rdma::RdmaCommunicator;

hmc_core::communicator_conformance!(peers);

#[allow(dead_code)]
fn types(_: Option<hmc_core::testing::Peers<RdmaCommunicator, HostMemory>>) {}
