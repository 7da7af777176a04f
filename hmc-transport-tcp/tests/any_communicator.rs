//! The conformance kit through `hmc_core::AnyCommunicator`: run-time transport choice must behave exactly like the concrete `TcpCommunicator`.
//!
//! With a pre-shared secret, as in `conformance.rs` (the kit notifies without a key).

use std::sync::Arc;

use hmc_backend_cpu::HostMemory;
use hmc_core::testing::Peers;
use hmc_core::{AnyCommunicator, PeerAddr};
use hmc_transport_tcp::{AuthSecret, TcpCommunicator, TcpConfig};

async fn peers() -> Option<Peers<AnyCommunicator, HostMemory>> {
    let addr: PeerAddr = "tcp://127.0.0.1:0".parse().unwrap();
    let config = TcpConfig {
        auth_secret: Some(AuthSecret::new(*b"conformance-kit-secret").unwrap()),
        ..TcpConfig::default()
    };
    let make = || AnyCommunicator::new(TcpCommunicator::bind(&addr, config.clone()).expect("bind"));
    Some(Peers {
        a: Arc::new(make()),
        b: Arc::new(make()),
        memory: Arc::new(HostMemory::new()),
    })
}

hmc_core::communicator_conformance!(peers);
