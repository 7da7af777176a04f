//! The binding layer against an ABI shim of `libcnrt` (`tests/shim/cnrt_shim.c`, built
//! here with the C compiler): loading, symbol resolution, direction enums, device context,
//! error mapping, pinned memory and IPC. The shim exports the CNRT symbols over host memory;
//! these tests check our binding layer, they are not a hardware verification.
//!
//! The test bodies are shared with the other runtime-shaped backends
//! (`hmc_testshim::runtime`); the vendor's data is in `support/mod.rs` and the error cases
//! below.

mod support;

use hmc_backend_mlu::CnrtApi;
use hmc_testshim::runtime::{Call, vendor_error_names_library_function_code_and_text};
use rstest::rstest;
use support::VENDOR;

hmc_testshim::runtime_abi_shim_tests!(
    api: CnrtApi,
    vendor: VENDOR,
    probe: hmc_backend_mlu::probe,
    probe_library: hmc_backend_mlu::probe_library,
);

/// Each runtime call HMC makes, failed once with a vendor code, surfaces as
/// `Error::Device` naming the library, the function, the code and the runtime's text.
#[rstest]
#[case::alloc(Call::Alloc, "cnrtMalloc", 100_100, "No sufficient MLU device memory")]
#[case::copy(Call::Copy, "cnrtMemcpy", 100_007, "Failure on system call")]
#[case::bind(Call::Bind, "cnrtSetDevice", 100_005, "Invalid device ordinal")]
#[case::pinned(
    Call::Pinned,
    "cnrtHostMalloc",
    100_100,
    "No sufficient MLU device memory"
)]
#[case::export(Call::Export, "cnrtAcquireMemHandle", 100_006, "Invalid argument")]
#[case::info(Call::Info, "cnrtMemGetInfo", 999, "Unknown error")]
fn abi_shim_vendor_errors_name_library_function_code_and_text(
    #[case] call: Call,
    #[case] function: &'static str,
    #[case] code: i64,
    #[case] text: &str,
) {
    vendor_error_names_library_function_code_and_text::<CnrtApi>(
        &VENDOR,
        shim(),
        call,
        function,
        code,
        text,
    );
}
