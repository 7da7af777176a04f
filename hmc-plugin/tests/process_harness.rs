//! `hmc_core::testing::process` over a plugin: the peer is a real process (`hmc-plugin-peer` with the rtcp example plugin), SIGKILLed or SIGSTOPped while transfers to it run.

mod common;

use std::process::Command;
use std::sync::Arc;

use hmc_backend_cpu::HostMemory;
use hmc_core::testing::process::{self, PeerProcess};
use hmc_plugin::PluginCommunicator;

fn spawn_peer() -> PeerProcess {
    let lib = common::build_rust_plugin(false);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hmc-plugin-peer"));
    cmd.arg(&lib).arg("bind=127.0.0.1");
    PeerProcess::spawn(cmd)
}

fn local() -> Arc<PluginCommunicator> {
    Arc::new(PluginCommunicator::open(common::rtcp(), "bind=127.0.0.1\n").unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_killed_mid_transfer_fails_it_fast() {
    let peer = spawn_peer();
    process::peer_killed_mid_transfer(local(), Arc::new(HostMemory::new()), peer, 1 << 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_peer_times_out_and_serves_again_when_resumed() {
    let peer = spawn_peer();
    process::peer_stopped_mid_transfer(local(), Arc::new(HostMemory::new()), peer, 1 << 20).await;
}
