//! `cargo xtask chaos [--long]`: the chaos matrix of `hmc-engine/tests/chaos.rs` (every
//! fault kind of `hmc-faults` x transport x operation, each case checked for its deadline,
//! late bytes, notifications seen once, recovery and leaks), with its table printed and
//! written as JSON under `target/chaos/`.
//!
//! Without `--long` it is the quick matrix `cargo xtask test` also runs (tcp and shm, one
//! seed). `--long` is the full one: UCX over `UCX_TLS=tcp` beside tcp, shm, the RDMA
//! stand-in and the example C plugin, then UCX again over shared memory, three seeds and
//! 1,000 operations a case.

use crate::{Result, cargo, root, run};

/// UCX_TLS of the full matrix's second run: UCX's shared-memory transports only.
const UCX_SHARED_MEMORY: &str = "sm,self";

pub fn command(args: &[String]) -> Result {
    let long = args.iter().any(|a| a == "--long");
    let dir = root().join("target/chaos");
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    // (UCX_TLS, the transports to run, the JSON's name)
    let runs: &[(&str, Option<&str>, &str)] = if long {
        &[
            ("tcp", None, "chaos-full.json"),
            (UCX_SHARED_MEMORY, Some("ucx"), "chaos-full-ucx-shm.json"),
        ]
    } else {
        &[("tcp", None, "chaos-quick.json")]
    };
    for (tls, only, json) in runs {
        let out = dir.join(json);
        let mut cmd = cargo();
        cmd.args([
            "test",
            "-p",
            "hmc-engine",
            "--test",
            "chaos",
            "--",
            "--nocapture",
        ])
        .env("HMC_CHAOS", if long { "full" } else { "quick" })
        .env("HMC_CHAOS_JSON", &out)
        .env("UCX_TLS", tls);
        if let Some(only) = only {
            cmd.env("HMC_CHAOS_TRANSPORTS", only);
        }
        run(&mut cmd)?;
        eprintln!("xtask: chaos table written to {}", out.display());
    }
    Ok(())
}
