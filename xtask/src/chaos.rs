//! `cargo xtask chaos [--long]`: the chaos matrix of `hmc-engine/tests/chaos.rs` (every
//! fault kind of `hmc-faults` x transport x operation, each case checked for its deadline,
//! late bytes, notifications seen once, recovery and leaks), with its table printed and
//! written as JSON under `target/chaos/`.
//!
//! Without `--long` it is the quick matrix `cargo xtask test` also runs (tcp and shm, one
//! seed). `--long` is the full one: UCX over `UCX_TLS=tcp` beside tcp, shm, the RDMA
//! stand-in and the example C plugin, then UCX again over shared memory. On each transport
//! it runs the leak cases first (faults that fire again and again x every operation,
//! 1,000 operations a case: descriptors, threads, staging chunks and resident memory
//! checked after them), then every fault x operation for two seeds of 40 operations; the
//! table's first line says the counts (`hmc-engine/tests/chaos.rs`: `LEAK_OPS`,
//! `FULL_OPS`, `FULL_SEEDS`).

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
    let mut failed = Vec::new();
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
        let start = std::time::Instant::now();
        // A red run does not skip the next: each writes its table.
        let result = run(&mut cmd);
        eprintln!(
            "xtask: chaos (UCX_TLS={tls}) took {:.0} s, {}; table written to {}",
            start.elapsed().as_secs_f64(),
            if result.is_ok() { "green" } else { "RED" },
            out.display()
        );
        if let Err(e) = result {
            failed.push(format!("UCX_TLS={tls}: {e}"));
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("chaos matrix red: {}", failed.join("; ")))
    }
}
