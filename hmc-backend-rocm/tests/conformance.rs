//! The memory conformance kit against the real HIP runtime and device, where this machine
//! has them; elsewhere, the clean `Unavailable` error they report instead.

mod support;

use hmc_backend_rocm::HipApi;
use support::VENDOR;

hmc_testshim::runtime_device_tests!(api: HipApi, vendor: VENDOR, probe: hmc_backend_rocm::probe);
