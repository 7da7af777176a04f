//! Runs the hmc-core memory conformance kit against `HostMemory` in each configuration.

use hmc_backend_cpu::{HostMemory, HostMemoryConfig};

mod plain {
    use super::*;
    hmc_core::memory_conformance!(Some(HostMemory::new()));
}

mod huge_pages {
    use super::*;
    hmc_core::memory_conformance!(Some(HostMemory::with_config(HostMemoryConfig {
        huge_pages: true,
        mlock: false
    })));
}
