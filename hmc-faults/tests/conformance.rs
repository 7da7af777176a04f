//! `Faulty` with an empty spec passes the hmc-core conformance kit over TCP and shared
//! memory: the wrapper forwards every contract unchanged.

use std::sync::Arc;

use hmc_backend_cpu::HostMemory;
use hmc_core::testing::Peers;
use hmc_faults::{FaultPlan, FaultSpec, Faulty};

fn plan() -> FaultPlan {
    FaultPlan::new(FaultSpec::default())
}

mod over_tcp {
    use super::*;
    use hmc_transport_tcp::{AuthSecret, TcpCommunicator, TcpConfig};

    fn bind() -> Arc<Faulty<TcpCommunicator>> {
        let config = TcpConfig {
            auth_secret: Some(AuthSecret::new(*b"conformance-kit-secret").unwrap()),
            ..TcpConfig::default()
        };
        let tcp = TcpCommunicator::bind(&"tcp://127.0.0.1:0".parse().unwrap(), config).unwrap();
        Arc::new(Faulty::new(tcp, plan()))
    }

    async fn peers() -> Option<Peers<Faulty<TcpCommunicator>, HostMemory>> {
        Some(Peers {
            a: bind(),
            b: bind(),
            memory: Arc::new(HostMemory::new()),
        })
    }

    hmc_core::communicator_conformance!(peers);
}

mod over_shm {
    use super::*;
    use hmc_transport_shm::{ShmCommunicator, ShmConfig};

    fn bind() -> Arc<Faulty<ShmCommunicator>> {
        let config = ShmConfig {
            revoke_timeout: std::time::Duration::from_secs(2),
            ..ShmConfig::default()
        };
        Arc::new(Faulty::new(ShmCommunicator::bind(config).unwrap(), plan()))
    }

    async fn peers() -> Option<Peers<Faulty<ShmCommunicator>, HostMemory>> {
        Some(Peers {
            a: bind(),
            b: bind(),
            memory: Arc::new(HostMemory::new()),
        })
    }

    hmc_core::communicator_conformance!(peers);
}
