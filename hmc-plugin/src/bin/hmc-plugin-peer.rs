//! `hmc-plugin-peer PLUGIN.so CONFIG`: a peer process for two-process tests (`hmc_core::testing::process`): opens the plugin's communicator with CONFIG (`\n` separates lines), serves a 1 MiB region, prints `ADDRESS DESCRIPTOR_HEX`, and serves until killed.

use std::sync::Arc;

use hmc_core::{Access, Communicator, Device, Region};
use hmc_plugin::{Plugin, PluginCommunicator};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (Some(path), Some(config)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: hmc-plugin-peer PLUGIN.so CONFIG");
        return std::process::ExitCode::from(2);
    };
    let plugin = match Plugin::load(path.as_ref()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let comm = match PluginCommunicator::open(plugin, &config.replace("\\n", "\n")) {
        Ok(c) => Arc::new(c),
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let memory = vec![0u8; 1 << 20].into_boxed_slice();
    let region = Region {
        device: Device::HOST,
        addr: memory.as_ptr() as u64,
        len: memory.len(),
    };
    // SAFETY: `memory` lives until the process ends, after the registration.
    let reg = match unsafe { comm.register(region, Access::READ_WRITE) } {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let hex: String = match comm.export(&reg) {
        Ok(r) => r.encode().iter().map(|b| format!("{b:02x}")).collect(),
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    println!("{} {hex}", comm.address());
    std::future::pending::<std::process::ExitCode>().await
}
