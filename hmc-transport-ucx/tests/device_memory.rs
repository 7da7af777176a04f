//! Device memory and the loaded UCX: its kinds are taken only where that UCX says it moves them (`ucp_context_query`), and a kind it does not move is refused at registration, before any device pointer reaches UCX as if it were host memory.

use std::sync::Arc;

use hmc_core::{Access, Communicator, Device, DeviceKind, DeviceMemoryPath, Error, Region};
use hmc_transport_ucx::{UcxCommunicator, UcxConfig};

fn comm() -> Arc<UcxCommunicator> {
    Arc::new(UcxCommunicator::new(UcxConfig::with_tls("tcp")).expect("UCX available"))
}

#[test]
fn capabilities_list_the_device_kinds_the_loaded_ucx_moves() {
    let c = comm();
    let kinds = c.memory_kinds();
    eprintln!("UCX {:?} moves {kinds:?}", c.ucx_version());
    assert!(kinds.contains(&DeviceKind::HOST), "{kinds:?}");
    let caps = c.capabilities();
    for kind in [DeviceKind::CUDA, DeviceKind::ROCM] {
        let expected = if kinds.contains(&kind) {
            DeviceMemoryPath::LibraryDependent
        } else {
            DeviceMemoryPath::Refused
        };
        assert_eq!(caps.memory_path(kind), expected, "{kind:?}");
    }
    // Kinds UCX has no memory type for are never handed to it.
    assert_eq!(
        caps.memory_path(DeviceKind::ASCEND),
        DeviceMemoryPath::Refused
    );
    assert_eq!(caps.memory_path(DeviceKind::HOST), DeviceMemoryPath::Direct);
}

#[rstest::rstest]
#[case::cuda(DeviceKind::CUDA)]
#[case::rocm(DeviceKind::ROCM)]
#[case::ascend(DeviceKind::ASCEND)]
fn memory_of_a_kind_the_ucx_does_not_move_is_refused_before_ucx_sees_it(#[case] kind: DeviceKind) {
    let c = comm();
    if c.memory_kinds().contains(&kind) {
        eprintln!("skipped: this UCX moves {kind:?} memory");
        return;
    }
    // Host bytes under a device label: were they handed to UCX, it would map them as host
    // memory and the registration would succeed.
    let buf = vec![0u8; 4096];
    let region = Region {
        device: Device::new(kind, 0),
        addr: buf.as_ptr() as u64,
        len: buf.len(),
    };
    // SAFETY: `buf` outlives the registration attempt, which fails.
    let e = unsafe { c.register(region, Access::READ_WRITE) }
        .err()
        .expect("refused");
    assert!(matches!(e, Error::UnsupportedMemory { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("does not move this memory type") && text.contains("HMC_UCX_LIB"),
        "{text}"
    );
    assert_eq!(c.stats().registered, 0);
}
