//! The conformance kit through `hmc_core::AnyCommunicator`: run-time transport choice must behave exactly like the concrete `TcpCommunicator`.

use std::sync::Arc;

use hmc_backend_cpu::HostMemory;
use hmc_core::testing::Peers;
use hmc_core::{AnyCommunicator, PeerAddr};
use hmc_transport_tcp::{TcpCommunicator, TcpConfig};

async fn peers() -> Option<Peers<AnyCommunicator, HostMemory>> {
    let addr: PeerAddr = "tcp://127.0.0.1:0".parse().unwrap();
    let make =
        || AnyCommunicator::new(TcpCommunicator::bind(&addr, TcpConfig::default()).expect("bind"));
    Some(Peers {
        a: Arc::new(make()),
        b: Arc::new(make()),
        memory: Arc::new(HostMemory::new()),
    })
}

hmc_core::communicator_conformance!(peers);
