//! The memory conformance kit against a real CUDA device, where this machine has one;
//! elsewhere, the clean `Unavailable` error reported instead of cudarc's panic.

use hmc_backend_cuda::{CudaMemory, probe};
use hmc_core::Error;

fn real_device() -> Option<CudaMemory> {
    CudaMemory::new(0).ok()
}

mod device {
    use super::*;
    hmc_core::memory_conformance!(real_device());
}

mod pinned {
    use super::*;
    hmc_core::memory_conformance!(real_device().map(|m| m.pinned()));
}

fn assert_clean_unavailable(err: &Error) {
    match err {
        Error::Unavailable { what, hint, .. } => {
            assert!(what.contains("CUDA"), "names what was looked for: {err}");
            assert!(hint.contains("libcuda.so.1"), "says how to fix it: {err}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[test]
fn without_a_driver_or_device_new_and_probe_are_unavailable_not_a_panic() {
    match (CudaMemory::new(0), probe()) {
        (Ok(_), Ok(devices)) => assert!(!devices.is_empty()),
        (Err(e), Err(p)) => {
            assert_clean_unavailable(&e);
            assert_clean_unavailable(&p);
            assert!(e.is_permanent());
        }
        (a, b) => panic!("new and probe disagree: {a:?} vs {b:?}"),
    }
}

#[test]
fn an_ordinal_past_the_device_count_is_unavailable() {
    let err = CudaMemory::new(4096).unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
}
