//! What the shared test bodies of `hmc-testshim` need to know about MUSA and its ABI shim.

use hmc_core::DeviceKind;
use hmc_testshim::runtime::ShimVendor;

/// MUSA's names, codes and texts, as the backend and `tests/shim/musa_shim.c` use them.
pub const VENDOR: ShimVendor = ShimVendor {
    library: "libmusart",
    env: "HMC_MUSA_LIB",
    kind: DeviceKind::MUSA,
    name: "MUSA",
    shim_stem: "musa_shim",
    runtime_version: 40_000,
    malloc: "musaMalloc",
    free: "musaFree",
    memcpy: "musaMemcpy",
    invalid_value: 1,
    partial_source: "int musaRuntimeGetVersion(int *v) { *v = 60000000; return 0; }\n",
    partial_missing: "musaGetDeviceCount",
    no_device_text: "musaErrorNoDevice",
};
