//! Without a library, without a device, or without an RDMA stack in the kernel, a communicator is `Unavailable` with a message saying which; never a panic.

mod common;

use std::path::PathBuf;

use hmc_core::Error;
use hmc_testshim::{run_child_test, test_name};
use hmc_transport_rdma::{RdmaCommunicator, RdmaConfig};

#[test]
fn a_missing_library_is_unavailable_and_names_the_override() {
    let err = RdmaCommunicator::new(RdmaConfig {
        library: Some(PathBuf::from("/nonexistent/libibverbs.so.1")),
        ..RdmaConfig::default()
    })
    .err()
    .expect("no library, no communicator");
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("HMC_IBVERBS_LIB") && text.contains("libibverbs1"),
        "{text}"
    );
}

/// The installed rdma-core on this machine: without a NIC (the CI kernels have no RDMA
/// stack at all) it must be `Unavailable`; on a machine with a NIC it opens.
#[test]
fn the_real_library_opens_a_nic_or_says_why_not() {
    match RdmaCommunicator::new(RdmaConfig {
        library: Some(PathBuf::from(hmc_transport_rdma::sys::LIBRARY)),
        ..RdmaConfig::default()
    }) {
        Ok(c) => eprintln!("a real RDMA device is present: {:?}", c.device()),
        Err(e) => {
            assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
            eprintln!("as expected without a NIC: {e}");
        }
    }
}

#[test]
#[ignore = "run by enosys_from_the_device_list_is_unavailable_saying_so in a child process"]
fn child_without_devices() {
    let err = RdmaCommunicator::new(common::config())
        .err()
        .expect("no devices, no communicator");
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("ibv_get_device_list") && text.contains("ENOSYS"),
        "{text}"
    );
    assert!(text.contains("TCP or UCX"), "{text}");
}

#[test]
fn enosys_from_the_device_list_is_unavailable_saying_so() {
    standin_only!();
    common::standin();
    run_child_test(
        &test_name(module_path!(), "child_without_devices"),
        &[("HMC_FAKE_IBV_DEVICES", "0")],
    )
    .unwrap();
}

#[test]
fn a_device_that_is_not_there_is_unavailable_and_lists_what_is() {
    standin_only!();
    let err = RdmaCommunicator::new(RdmaConfig {
        device: Some("mlx5_9".into()),
        ..common::config()
    })
    .err()
    .expect("no such device");
    let text = err.to_string();
    assert!(
        text.contains("mlx5_9") && text.contains("hmcfake0"),
        "{text}"
    );
}
