//! `cargo xtask rdma-bundle`: the RDMA check for a host with an InfiniBand or RoCE NIC, as release binaries with a `run.sh` that needs no Rust toolchain: the transport's tests on the real device, our bench, and `ib_write_bw`/`ib_read_bw` (Debian `perftest`) beside it.

use std::path::PathBuf;
use std::process::Command;

use crate::{Result, cargo, json_string_field, root, run};

/// Builds `target/rdma-bundle/` (test binaries, the bench, `run.sh`).
pub fn rdma_bundle() -> Result {
    let dir = root().join("target/rdma-bundle");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let mut names = Vec::new();
    let builds: [&[&str]; 2] = [
        &[
            "test",
            "--release",
            "--no-run",
            "--message-format=json",
            "-p",
            "hmc-transport-rdma",
            "--test",
            "conformance",
            "--test",
            "faults",
            "--test",
            "churn",
            "--test",
            "unavailable",
        ],
        &[
            "bench",
            "--no-run",
            "--message-format=json",
            "-p",
            "hmc-transport-rdma",
            "--bench",
            "overhead",
        ],
    ];
    for args in builds {
        let out = cargo()
            .args(args)
            .output()
            .map_err(|e| format!("cargo {}: {e}", args[0]))?;
        if !out.status.success() {
            return Err(format!(
                "building the RDMA check failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Some(exe) = json_string_field(line, "executable") else {
                continue;
            };
            let src = PathBuf::from(exe);
            let stem = src
                .file_name()
                .ok_or(format!("odd path {}", src.display()))?
                .to_string_lossy()
                .into_owned();
            // `conformance-<hash>` → `conformance`.
            let name = stem
                .rsplit_once('-')
                .map_or(stem.as_str(), |(n, _)| n)
                .to_string();
            std::fs::copy(&src, dir.join(&name)).map_err(|e| format!("copying {name}: {e}"))?;
            names.push(name);
        }
    }
    names.sort();
    let want = ["churn", "conformance", "faults", "overhead", "unavailable"];
    if names != want {
        return Err(format!("expected the binaries {want:?}, found {names:?}"));
    }
    let mut strip = Command::new("strip");
    for n in &names {
        strip.arg(dir.join(n));
    }
    run(&mut strip)?;
    let sh = dir.join("run.sh");
    std::fs::write(&sh, RUN_SH).map_err(|e| format!("writing {}: {e}", sh.display()))?;
    run(Command::new("chmod").arg("+x").arg(&sh))?;
    eprintln!(
        "xtask: RDMA check bundled in {}; on a host with an RDMA NIC (rdma-core and perftest \
         installed) run `bash {}/run.sh` (HMC_RDMA_DEVICE picks the device, \
         HMC_RDMA_GID_INDEX the GID for perftest on RoCE); it writes rdma-check.txt to $OUT",
        dir.display(),
        dir.display()
    );
    Ok(())
}

const RUN_SH: &str = r#"#!/usr/bin/env bash
# The RDMA check, built by `cargo xtask rdma-bundle`: hmc-transport-rdma's tests on a real
# NIC (two communicators, and two processes, over the same device), our bench, and
# perftest's ib_write_bw / ib_read_bw at the same sizes. Needs rdma-core (libibverbs1,
# ibverbs-providers) and perftest. Target: our bandwidth >= 90% of ib_write_bw at 64 KiB+.
set -uo pipefail
cd "$(dirname "$0")"
out="${OUT:-.}/rdma-check.txt"
dev="${HMC_RDMA_DEVICE:-$(ibv_devices 2>/dev/null | awk 'NR > 2 { print $1; exit }')}"
export HMC_RDMA_HARDWARE=1
[ -n "$dev" ] && export HMC_RDMA_DEVICE="$dev"
gid=${HMC_RDMA_GID_INDEX:+-x $HMC_RDMA_GID_INDEX}
{
echo "device: ${dev:-none found}"
ibv_devinfo ${dev:+-d "$dev"} 2>&1 || echo "ibv_devinfo: not available"
for t in unavailable conformance faults churn; do
  echo "== $t"; ./$t --test-threads=1 2>&1
done
echo "== hmc-transport-rdma bench (overhead, then bandwidth)"; ./overhead 2>&1
for tool in ib_write_bw ib_read_bw; do
  if ! command -v $tool > /dev/null; then echo "== $tool: not installed (apt-get install perftest)"; continue; fi
  for size in 65536 1048576 16777216; do
    n=$(( size >= 16777216 ? 100 : 2000 ))
    echo "== $tool -s $size -n $n"
    $tool ${dev:+-d "$dev"} $gid -s $size -n $n > /tmp/hmc-perftest-server.txt 2>&1 &
    server=$!
    sleep 1
    $tool ${dev:+-d "$dev"} $gid -s $size -n $n localhost 2>&1
    wait $server
  done
done
} | tee "$out"
"#;
