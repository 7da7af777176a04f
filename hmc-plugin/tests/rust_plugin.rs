//! The example Rust plugin (examples-plugins/rtcp: hmc-transport-tcp through `export_plugin!`, built here with cargo) through the loader: the communicator conformance kit, and interoperation with the same transport linked statically.

mod common;

use std::sync::Arc;

use hmc_backend_cpu::HostMemory;
use hmc_core::testing::Peers;
use hmc_core::{Access, Communicator, ConnBuffer, Deadline, Op, RegisteredBuffer, TransferDesc};
use hmc_plugin::PluginCommunicator;

/// Both peers share a secret: the kit notifies without importing a region first, which
/// the TCP transport takes only over an authenticated connection.
const CONFIG: &str = "bind=127.0.0.1\nauth_secret=plugin-kit-secret-0123\n";

mod kit {
    use super::*;

    async fn peers() -> Option<Peers<PluginCommunicator, HostMemory>> {
        let p = common::rtcp();
        Some(Peers {
            a: Arc::new(PluginCommunicator::open(p.clone(), CONFIG).unwrap()),
            b: Arc::new(PluginCommunicator::open(p, CONFIG).unwrap()),
            memory: Arc::new(HostMemory::new()),
        })
    }

    hmc_core::communicator_conformance!(peers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_and_the_static_transport_speak_the_same_wire() {
    let p = common::rtcp();
    assert_eq!(p.transport(), hmc_core::TransportId::TCP);
    let plugin = Arc::new(PluginCommunicator::open(p, "bind=127.0.0.1\n").unwrap());
    let native = Arc::new(
        hmc_transport_tcp::TcpCommunicator::bind(
            &"tcp://127.0.0.1:0".parse().unwrap(),
            Default::default(),
        )
        .unwrap(),
    );
    let mem = Arc::new(HostMemory::new());
    let target =
        RegisteredBuffer::new(mem.clone(), native.clone(), 4096, Access::READ_WRITE).unwrap();
    let src = RegisteredBuffer::new(mem, plugin.clone(), 4096, Access::READ).unwrap();
    src.write_at(0, &hmc_core::MemSpan::host(&[7u8; 4096]))
        .unwrap();
    let ep = plugin
        .connect(&native.address(), Deadline::default())
        .await
        .unwrap();
    let key = plugin.import(&ep, &target.export().unwrap()).unwrap();
    let d = [TransferDesc::<PluginCommunicator> {
        local: src.registration(),
        local_offset: 0,
        remote: &key,
        remote_offset: 0,
        len: 4096,
    }];
    plugin
        .transfer(&ep, Op::Write, &d, Deadline::default())
        .await
        .unwrap();
    let mut back = vec![0u8; 4096];
    target
        .read_at(0, &mut hmc_core::MemSpanMut::host(&mut back))
        .unwrap();
    assert_eq!(back, vec![7u8; 4096]);
}
