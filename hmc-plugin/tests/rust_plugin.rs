//! The example Rust plugin (examples-plugins/rtcp: hmc-transport-tcp and hmc-backend-cpu through one `export_plugin!`, built here with cargo) through the loader: the communicator and memory conformance kits, and interoperation with the same transport linked statically.

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

/// The plugin's memory backend (hmc-backend-cpu's `HostMemory` through `export_plugin!`)
/// through the loader: the hmc-core memory kit.
mod memory_kit {
    hmc_core::memory_conformance!(Some(
        hmc_plugin::PluginMemory::open(crate::common::rtcp(), "ordinal=0\nhuge_pages=false\n")
            .expect("open rtcp memory")
    ));
}

#[test]
fn one_rust_plugin_provides_a_transport_and_a_memory_backend() {
    use hmc_core::{Device, MemSpan, MemSpanMut, Memory};
    let p = common::rtcp();
    assert!(p.provides_communicator() && p.provides_memory());
    let m = hmc_plugin::PluginMemory::open(p.clone(), "ordinal=0\n").unwrap();
    assert_eq!(m.device(), Device::HOST);
    assert_eq!(m.max_alloc(), HostMemory::new().max_alloc());
    // Host memory through the plugin is page-aligned, as hmc-backend-cpu allocates it.
    let mut buf = m.alloc(100).unwrap();
    let addr = hmc_core::DeviceBuffer::region(&buf).addr;
    assert_eq!(addr % hmc_backend_cpu::page_size() as u64, 0);
    m.copy(&mut MemSpanMut::of(&mut buf), &MemSpan::host(&[3u8; 100]))
        .unwrap();
    let mut back = [0u8; 100];
    m.copy(&mut MemSpanMut::host(&mut back), &MemSpan::of(&buf))
        .unwrap();
    assert_eq!(back, [3u8; 100]);
    // The author's errors come back with their text, as hmc_core::Error values.
    let e = hmc_plugin::PluginMemory::open(p.clone(), "ordinal=3\n")
        .err()
        .expect("host memory has no ordinal 3");
    assert!(matches!(e, hmc_core::Error::InvalidArgument(_)), "{e:?}");
    assert!(e.to_string().contains("ordinal 0 only"), "{e}");
    let e = hmc_plugin::PluginMemory::open(p.clone(), "mlock=perhaps\n")
        .err()
        .expect("not a boolean");
    assert!(e.to_string().contains("say true or false"), "{e}");
    // The report says what it provides.
    let d = hmc_plugin::Discovery::search(&hmc_plugin::PluginConfig {
        search_path: vec![p.path().to_path_buf()],
    });
    assert!(
        d.report().contains("communicator and memory"),
        "{}",
        d.report()
    );
}
