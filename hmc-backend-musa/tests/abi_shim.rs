//! The binding layer against an ABI shim of `libmusart` (`tests/shim/musa_shim.c`, built
//! here with the C compiler): loading, symbol resolution, direction enums, device context,
//! error mapping, pinned memory and IPC. The shim exports the MUSA symbols over host memory;
//! these tests check our binding layer, they are not a hardware verification.
//!
//! The test bodies are shared with the other runtime-shaped backends
//! (`hmc_testshim::runtime`); the vendor's data is in `support/mod.rs` and the error cases
//! below.

mod support;

use hmc_backend_musa::MusaApi;
use hmc_testshim::runtime::{Call, vendor_error_names_library_function_code_and_text};
use rstest::rstest;
use support::VENDOR;

hmc_testshim::runtime_abi_shim_tests!(
    api: MusaApi,
    vendor: VENDOR,
    probe: hmc_backend_musa::probe,
    probe_library: hmc_backend_musa::probe_library,
);

/// Each runtime call HMC makes, failed once with a vendor code, surfaces as
/// `Error::Device` naming the library, the function, the code and the runtime's text.
#[rstest]
#[case::alloc(
    Call::Alloc,
    "musaMalloc",
    2,
    "musaErrorMemoryAllocation: out of memory"
)]
#[case::copy(
    Call::Copy,
    "musaMemcpy",
    700,
    "musaErrorIllegalAddress: an illegal memory access was encountered"
)]
#[case::bind(
    Call::Bind,
    "musaSetDevice",
    101,
    "musaErrorInvalidDevice: invalid device ordinal"
)]
#[case::pinned(
    Call::Pinned,
    "musaHostAlloc",
    2,
    "musaErrorMemoryAllocation: out of memory"
)]
#[case::export(
    Call::Export,
    "musaIpcGetMemHandle",
    1,
    "musaErrorInvalidValue: invalid argument"
)]
#[case::info(Call::Info, "musaMemGetInfo", 999, "musaErrorUnknown: unknown error")]
fn abi_shim_vendor_errors_name_library_function_code_and_text(
    #[case] call: Call,
    #[case] function: &'static str,
    #[case] code: i64,
    #[case] text: &str,
) {
    vendor_error_names_library_function_code_and_text::<MusaApi>(
        &VENDOR,
        shim(),
        call,
        function,
        code,
        text,
    );
}
