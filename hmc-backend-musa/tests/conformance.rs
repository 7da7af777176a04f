//! The memory conformance kit against the real MUSA runtime and device, where this machine
//! has them; elsewhere, the clean `Unavailable` error they report instead.

mod support;

use hmc_backend_musa::MusaApi;
use support::VENDOR;

hmc_testshim::runtime_device_tests!(api: MusaApi, vendor: VENDOR, probe: hmc_backend_musa::probe);
