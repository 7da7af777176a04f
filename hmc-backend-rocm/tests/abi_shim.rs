//! The binding layer against an ABI shim of `libamdhip64` (`tests/shim/hip_shim.c`, built
//! here with the C compiler): loading, symbol resolution, direction enums, device context,
//! error mapping, pinned memory and IPC. The shim exports the HIP symbols over host memory;
//! these tests check our binding layer, they are not a hardware verification.
//!
//! The test bodies are shared with the other runtime-shaped backends
//! (`hmc_testshim::runtime`); the vendor's data is in `support/mod.rs` and the error cases
//! below.

mod support;

use hmc_backend_rocm::HipApi;
use hmc_testshim::runtime::{Call, vendor_error_names_library_function_code_and_text};
use rstest::rstest;
use support::VENDOR;

hmc_testshim::runtime_abi_shim_tests!(
    api: HipApi,
    vendor: VENDOR,
    probe: hmc_backend_rocm::probe,
    probe_library: hmc_backend_rocm::probe_library,
);

/// Each runtime call HMC makes, failed once with a vendor code, surfaces as
/// `Error::Device` naming the library, the function, the code and the runtime's text.
#[rstest]
#[case::alloc(Call::Alloc, "hipMalloc", 2, "hipErrorOutOfMemory: out of memory")]
#[case::copy(
    Call::Copy,
    "hipMemcpy",
    700,
    "hipErrorIllegalAddress: an illegal memory access was encountered"
)]
#[case::bind(
    Call::Bind,
    "hipSetDevice",
    101,
    "hipErrorInvalidDevice: invalid device ordinal"
)]
#[case::pinned(Call::Pinned, "hipHostMalloc", 2, "hipErrorOutOfMemory: out of memory")]
#[case::export(
    Call::Export,
    "hipIpcGetMemHandle",
    1,
    "hipErrorInvalidValue: invalid argument"
)]
#[case::info(Call::Info, "hipMemGetInfo", 999, "hipErrorUnknown: unknown error")]
fn abi_shim_vendor_errors_name_library_function_code_and_text(
    #[case] call: Call,
    #[case] function: &'static str,
    #[case] code: i64,
    #[case] text: &str,
) {
    vendor_error_names_library_function_code_and_text::<HipApi>(
        &VENDOR,
        shim(),
        call,
        function,
        code,
        text,
    );
}

/// `hipDeviceSynchronize` (what registering a DLPack tensor waits on) is bound and called
/// on the buffer's device.
#[test]
fn abi_shim_device_synchronize_is_bound_and_called() {
    let control = hmc_testshim::ShimControl::open(shim());
    let mem = shim_device(1);
    let before = control.device_syncs();
    assert!(
        mem.synchronize().unwrap(),
        "the shim exports hipDeviceSynchronize"
    );
    assert_eq!(control.device_syncs(), before + 1);
    control.fail_next("hipDeviceSynchronize", 700);
    let err = mem.synchronize().unwrap_err().to_string();
    assert!(err.contains("hipDeviceSynchronize"), "{err}");
}
