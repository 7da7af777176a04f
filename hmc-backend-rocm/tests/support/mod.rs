//! What the shared test bodies of `hmc-testshim` need to know about HIP and its ABI shim.

use hmc_core::DeviceKind;
use hmc_testshim::runtime::ShimVendor;

/// HIP's names, codes and texts, as the backend and `tests/shim/hip_shim.c` use them.
pub const VENDOR: ShimVendor = ShimVendor {
    library: "libamdhip64",
    env: "HMC_HIP_LIB",
    kind: DeviceKind::ROCM,
    name: "HIP",
    shim_stem: "hip_shim",
    runtime_version: 60_200_000,
    malloc: "hipMalloc",
    free: "hipFree",
    memcpy: "hipMemcpy",
    invalid_value: 1,
    partial_source: "int hipRuntimeGetVersion(int *v) { *v = 60000000; return 0; }\n",
    partial_missing: "hipGetDeviceCount",
    no_device_text: "hipErrorNoDevice",
};
