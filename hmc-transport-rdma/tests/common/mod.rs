//! Shared by the integration tests: the stand-in `libibverbs.so.1` built once per test binary, and communicators over it.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use hmc_backend_cpu::HostMemory;
use hmc_core::testing::Peers;
use hmc_transport_rdma::{RdmaCommunicator, RdmaConfig};

/// The stand-in library, compiled from `hmc-testshim/shim/ibverbs_standin.c`.
pub fn standin() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ibverbs-standin");
        hmc_testshim::build_ibverbs_standin(&dir)
            .unwrap_or_else(|e| panic!("build the libibverbs stand-in: {e}"))
    })
    .clone()
}

/// A configuration that loads the stand-in.
pub fn config() -> RdmaConfig {
    RdmaConfig {
        library: Some(standin()),
        ..RdmaConfig::default()
    }
}

/// A communicator over the stand-in.
pub fn comm() -> Arc<RdmaCommunicator> {
    comm_with(config())
}

/// A communicator over the stand-in with `config`.
pub fn comm_with(config: RdmaConfig) -> Arc<RdmaCommunicator> {
    Arc::new(RdmaCommunicator::new(config).expect("an RDMA communicator over the stand-in"))
}

/// Two fresh communicators and host memory, for the conformance kit.
pub async fn peers() -> Option<Peers<RdmaCommunicator, HostMemory>> {
    Some(Peers {
        a: comm(),
        b: comm(),
        memory: Arc::new(HostMemory::new()),
    })
}
