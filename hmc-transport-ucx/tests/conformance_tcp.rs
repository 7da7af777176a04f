//! The communicator conformance kit over UCX with `UCX_TLS=tcp` (set per communicator, not via the environment).

use std::sync::Arc;

use hmc_backend_cpu::HostMemory;
use hmc_core::testing::Peers;
use hmc_transport_ucx::{UcxCommunicator, UcxConfig};

async fn peers() -> Option<Peers<UcxCommunicator, HostMemory>> {
    // Never a silent skip: a missing UCX fails every test with the loader's message.
    let make = || UcxCommunicator::new(UcxConfig::with_tls("tcp")).expect("UCX with UCX_TLS=tcp");
    Some(Peers {
        a: Arc::new(make()),
        b: Arc::new(make()),
        memory: Arc::new(HostMemory::new()),
    })
}

hmc_core::communicator_conformance!(peers);
