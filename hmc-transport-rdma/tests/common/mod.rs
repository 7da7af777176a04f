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

/// `HMC_RDMA_HARDWARE=1` (set by the hardware bundle's `run.sh`): the tests use the
/// installed `libibverbs.so.1` (or `$HMC_IBVERBS_LIB`) and a real NIC
/// (`HMC_RDMA_DEVICE` names one; else the first with an active port) instead of the
/// stand-in, and the checks that need the stand-in's fault injection or counters skip.
pub fn hardware() -> bool {
    std::env::var_os("HMC_RDMA_HARDWARE").is_some()
}

/// A configuration that loads the stand-in (a real NIC in [`hardware`] mode).
pub fn config() -> RdmaConfig {
    if hardware() {
        return RdmaConfig {
            device: std::env::var("HMC_RDMA_DEVICE")
                .ok()
                .filter(|d| !d.is_empty()),
            ..RdmaConfig::default()
        };
    }
    RdmaConfig {
        library: Some(standin()),
        ..RdmaConfig::default()
    }
}

/// Skips (returns from) a test that needs the stand-in when running on hardware.
#[macro_export]
macro_rules! standin_only {
    () => {
        if common::hardware() {
            eprintln!("skipped on hardware: this check needs the libibverbs stand-in");
            return;
        }
    };
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
