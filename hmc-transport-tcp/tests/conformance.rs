//! The hmc-core conformance kit for `TcpCommunicator`, over TCP and over Unix domain sockets.
//!
//! The peers share a pre-shared secret: the kit's `notify_in_order` notifies without
//! importing a region first, which a target takes only over an authenticated connection,
//! and the whole kit then runs over authenticated connections.

use std::sync::Arc;

use hmc_backend_cpu::HostMemory;
use hmc_core::PeerAddr;
use hmc_core::testing::Peers;
use hmc_transport_tcp::{AuthSecret, TcpCommunicator, TcpConfig};

fn bind(addr: PeerAddr) -> Arc<TcpCommunicator> {
    let config = TcpConfig {
        auth_secret: Some(AuthSecret::new(*b"conformance-kit-secret").unwrap()),
        ..TcpConfig::default()
    };
    Arc::new(TcpCommunicator::bind(&addr, config).expect("bind"))
}

mod over_tcp {
    use super::*;

    async fn peers() -> Option<Peers<TcpCommunicator, HostMemory>> {
        let any: PeerAddr = "tcp://127.0.0.1:0".parse().unwrap();
        Some(Peers {
            a: bind(any.clone()),
            b: bind(any),
            memory: Arc::new(HostMemory::new()),
        })
    }

    hmc_core::communicator_conformance!(peers);
}

mod over_unix_sockets {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn socket_path() -> PeerAddr {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("hmc-tcp-kit-{}-{n}.sock", std::process::id()));
        PeerAddr::Unix(path)
    }

    async fn peers() -> Option<Peers<TcpCommunicator, HostMemory>> {
        Some(Peers {
            a: bind(socket_path()),
            b: bind(socket_path()),
            memory: Arc::new(HostMemory::new()),
        })
    }

    hmc_core::communicator_conformance!(peers);
}
