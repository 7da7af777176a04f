//! The memory conformance kit against the real CNRT runtime and device, where this machine
//! has them; elsewhere, the clean `Unavailable` error they report instead.

use hmc_backend_mlu::{MluMemory, probe};
use hmc_core::Error;

fn real_device() -> Option<MluMemory> {
    MluMemory::new(0).ok()
}

mod device {
    use super::*;
    hmc_core::memory_conformance!(real_device());
}

mod pinned {
    use super::*;
    hmc_core::memory_conformance!(real_device().map(|m| m.pinned()));
}

fn assert_unavailable_names_library_and_variable(err: &Error) {
    match err {
        Error::Unavailable { what, hint, .. } => {
            assert!(
                what.contains("libcnrt") || what.contains("MLU"),
                "names what was looked for: {err}"
            );
            assert!(
                hint.contains("HMC_CNRT_LIB") || hint.contains("ordinal"),
                "says how to fix it: {err}"
            );
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[test]
fn without_a_runtime_or_device_new_and_probe_are_unavailable_not_a_panic() {
    match (MluMemory::new(0), probe()) {
        (Ok(_), Ok(devices)) => assert!(!devices.is_empty(), "a device was found"),
        (Err(e), Err(p)) => {
            assert_unavailable_names_library_and_variable(&e);
            assert_unavailable_names_library_and_variable(&p);
        }
        (a, b) => panic!("new and probe disagree: {a:?} vs {b:?}"),
    }
}

#[test]
fn a_library_path_that_does_not_exist_is_unavailable_with_the_variable_named() {
    let err = MluMemory::with_library("/nonexistent/libcnrt.so", 0).unwrap_err();
    assert_unavailable_names_library_and_variable(&err);
    assert!(err.to_string().contains("/nonexistent/libcnrt.so"), "{err}");
    assert!(err.is_permanent());
}
