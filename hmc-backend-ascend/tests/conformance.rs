//! The memory conformance kit against the real ACL runtime and Ascend device, where this
//! machine has them; elsewhere, the clean `Unavailable` error they report instead.

mod support;

use hmc_backend_ascend::AclApi;
use support::VENDOR;

hmc_testshim::runtime_device_tests!(api: AclApi, vendor: VENDOR, probe: hmc_backend_ascend::probe);

/// Without CANN the error names the library, the variable and how to install CANN.
#[test]
fn without_acl_the_error_says_how_to_install_cann() {
    if let Err(e) = hmc_backend_ascend::AscendMemory::with_library("/nonexistent/libascendcl.so", 0)
    {
        let s = e.to_string();
        for want in ["libascendcl", "HMC_ASCEND_LIB", "CANN"] {
            assert!(s.contains(want), "{want} missing from: {s}");
        }
    }
}
