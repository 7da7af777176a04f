//! What the shared test bodies of `hmc-testshim` need to know about MLU and its ABI shim.

use hmc_core::DeviceKind;
use hmc_testshim::runtime::ShimVendor;

/// MLU's names, codes and texts, as the backend and `tests/shim/cnrt_shim.c` use them.
pub const VENDOR: ShimVendor = ShimVendor {
    library: "libcnrt",
    env: "HMC_CNRT_LIB",
    kind: DeviceKind::MLU,
    name: "MLU",
    shim_stem: "cnrt_shim",
    runtime_version: 60_701,
    malloc: "cnrtMalloc",
    free: "cnrtFree",
    memcpy: "cnrtMemcpy",
    invalid_value: 100_006,
    partial_source: "void cnrtGetLibVersion(int *a, int *b, int *c) { *a = 6; *b = 0; *c = 0; }\n",
    partial_missing: "cnrtGetDeviceCount",
    no_device_text: "No MLU device found",
};
