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

/// Issue 14's bug: exporting one wrapped transport's registration through a wrapper of
/// another transport panicked. It is refused with an error naming the cause, both ways,
/// and the owner still exports it.
#[tokio::test]
async fn a_registration_of_another_transport_is_refused_not_a_panic() {
    // The glob import is the point: `any.register(..)` must not be ambiguous (E0034)
    // between `Communicator` and `DynCommunicator`.
    use hmc_core::*;
    let addr: PeerAddr = "tcp://127.0.0.1:0".parse().unwrap();
    let tcp = Arc::new(AnyCommunicator::new(
        TcpCommunicator::bind(&addr, TcpConfig::default()).expect("bind"),
    ));
    let none = AnyCommunicator::new(NoCommunicator);
    let buf = RegisteredBuffer::new(Arc::new(HostMemory::new()), tcp.clone(), 64, Access::READ)
        .expect("register");
    let err = none.export(buf.registration()).unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument(_)) && err.to_string().contains("different"),
        "{err}"
    );
    assert!(none.rekey(buf.registration()).is_err());
    tcp.export(buf.registration())
        .expect("the owner exports it");

    let mut host = [0u8; 16];
    let region = Region {
        device: Device::HOST,
        addr: host.as_mut_ptr() as u64,
        len: host.len(),
    };
    // SAFETY: `host` outlives the registration, dropped at the end of the statement.
    let reg = unsafe { tcp.register(region, Access::READ) }.expect("register through the wrapper");
    assert_eq!(reg.region(), region);
    assert!(matches!(
        tcp.capabilities().local_memory,
        MemoryKinds::Only(ref kinds) if kinds == &[DeviceKind::HOST]
    ));
}
