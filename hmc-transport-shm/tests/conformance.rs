//! The hmc-core conformance kit for `ShmCommunicator`: two communicators in one process
//! (cross-memory attach on one's own pid).

use std::sync::Arc;
use std::time::Duration;

use hmc_backend_cpu::HostMemory;
use hmc_core::testing::Peers;
use hmc_transport_shm::{ShmCommunicator, ShmConfig};

fn bind() -> Arc<ShmCommunicator> {
    let config = ShmConfig {
        revoke_timeout: Duration::from_secs(2),
        ..ShmConfig::default()
    };
    Arc::new(ShmCommunicator::bind(config).expect("bind"))
}

async fn peers() -> Option<Peers<ShmCommunicator, HostMemory>> {
    Some(Peers {
        a: bind(),
        b: bind(),
        memory: Arc::new(HostMemory::new()),
    })
}

hmc_core::communicator_conformance!(peers);
