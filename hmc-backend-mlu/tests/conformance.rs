//! The memory conformance kit against the real CNRT runtime and device, where this machine
//! has them; elsewhere, the clean `Unavailable` error they report instead.

mod support;

use hmc_backend_mlu::CnrtApi;
use support::VENDOR;

hmc_testshim::runtime_device_tests!(api: CnrtApi, vendor: VENDOR, probe: hmc_backend_mlu::probe);
