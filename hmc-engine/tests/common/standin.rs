//! The RDMA transport over the user-space libibverbs stand-in (not a NIC), which the
//! engine tests open beside the transports `open_transport` knows by name.

use std::path::PathBuf;

use hmc_core::AnyCommunicator;

/// The stand-in library, built once per target dir (`target/tmp/ibverbs-standin`).
pub fn standin_library() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/tmp/ibverbs-standin");
    hmc_testshim::build_ibverbs_standin(&dir).expect("build the stand-in")
}

/// An RDMA communicator over the stand-in library (MR rights kept as a NIC keeps them).
pub fn rdma_standin() -> AnyCommunicator {
    let c = hmc_transport_rdma::RdmaCommunicator::new(hmc_transport_rdma::RdmaConfig {
        library: Some(standin_library()),
        ..Default::default()
    })
    .unwrap();
    AnyCommunicator::new(c)
}
