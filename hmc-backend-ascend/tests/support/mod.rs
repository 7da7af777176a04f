//! What the shared test bodies of `hmc-testshim` need to know about ACL and its ABI shim.

use hmc_core::DeviceKind;
use hmc_testshim::runtime::ShimVendor;

/// ACL's names, codes and texts, as the backend and `tests/shim/acl_shim.c` use them.
pub const VENDOR: ShimVendor = ShimVendor {
    library: "libascendcl",
    env: "HMC_ASCEND_LIB",
    kind: DeviceKind::ASCEND,
    name: "Ascend",
    shim_stem: "acl_shim",
    // aclrtGetVersion's 8.1.0 in the shim, as major * 10000 + minor * 100 + patch.
    runtime_version: 80_100,
    malloc: "aclrtMalloc",
    free: "aclrtFree",
    memcpy: "aclrtMemcpy",
    invalid_value: 107_000,
    partial_source: "int aclInit(const char *p) { (void)p; return 0; }\n",
    partial_missing: "aclrtGetVersion",
    no_device_text: "[shim] aclrtGetDeviceCount: no device",
};
