//! The communicator conformance kit over UCX shared memory (`UCX_TLS=posix,cma,self`) (set per communicator, not via the environment).

use std::sync::Arc;

use hmc_backend_cpu::HostMemory;
use hmc_core::testing::Peers;
use hmc_transport_ucx::{UcxCommunicator, UcxConfig};

async fn peers() -> Option<Peers<UcxCommunicator, HostMemory>> {
    // Never a silent skip: a missing UCX fails every test with the loader's message.
    let make = || {
        UcxCommunicator::new(UcxConfig::with_tls("posix,cma,self"))
            .expect("UCX with UCX_TLS=posix,cma,self")
    };
    Some(Peers {
        a: Arc::new(make()),
        b: Arc::new(make()),
        memory: Arc::new(HostMemory::new()),
    })
}

hmc_core::communicator_conformance!(peers);
