//! `cargo xtask hw-bundle <cuda|rocm|mlu|musa|ascend|rdma>` (and `gpu-bundle`, its CUDA case): one backend's hardware checks as stripped release binaries and a `run.sh`, for a machine that has the hardware but no Rust toolchain.
//!
//! A bundle holds the backend crate's own tests (its unit tests and the integration tests
//! that reach real hardware when it is there, not the ABI-shim tests, which need a C
//! compiler and check nothing a device would not) and the examples that measure it.
//! `run.sh` refuses to claim anything on a machine without the device (the tests would
//! only log skips there), runs everything, writes `<kind>-check.txt` to `$OUT` (or the
//! bundle), and ends with the README support-table row the run verifies, or the steps
//! that failed.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Result, cargo, json_string_field, root, run};

/// What one kind of hardware's bundle holds.
struct Kind {
    name: &'static str,
    krate: &'static str,
    /// Integration tests to include beside the unit tests (`None`: all of them).
    tests: Option<&'static [&'static str]>,
    /// Examples to build and run: package, example, arguments.
    examples: &'static [(&'static str, &'static str, &'static str)],
    /// Paths one of which exists where the hardware is.
    devices: &'static [&'static str],
    /// A vendor tool that describes the hardware (its failure is not an error).
    describe: &'static str,
    /// A Python bench of the package to run there (script under `hmc-py/bench`, its
    /// arguments): the bundle then carries the release wheel and the script, and `run.sh`
    /// installs them (with NIXL's wheel where PyPI is reachable) into a venv of its own.
    python: Option<(&'static str, &'static str)>,
    /// The support table's component cell, and what a passing run verifies.
    component: &'static str,
    verifies: &'static str,
}

const KINDS: &[Kind] = &[
    Kind {
        name: "cuda",
        krate: "hmc-backend-cuda",
        tests: Some(&["conformance", "cuda"]),
        examples: &[
            ("hmc-backend-cuda", "cuda_bandwidth", "256 20"),
            (
                "hmc-rpc",
                "device_staged",
                "--memory cuda --mib 64 --iters 5",
            ),
        ],
        devices: &["/dev/nvidia0"],
        describe: "nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv",
        python: Some(("bench_kv_vram.py", "--rounds 5 --seconds 1")),
        component: "`hmc-backend-cuda`",
        verifies: "memory kit, async copies, IPC and DMA-BUF export on the GPU; copy bandwidth; \
                   device-staged RPC echo and one-sided WRITE/READ between two processes; \
                   the KV pattern on VRAM (hmc by IPC and over TCP beside cuMemcpy and NIXL)",
    },
    Kind {
        name: "rocm",
        krate: "hmc-backend-rocm",
        tests: Some(&["conformance"]),
        examples: &[(
            "hmc-rpc",
            "device_staged",
            "--memory rocm --mib 64 --iters 5",
        )],
        devices: &["/dev/kfd"],
        describe: "rocm-smi --showproductname",
        python: None,
        component: "`hmc-backend-rocm` (AMD, Hygon DCU)",
        verifies: "memory kit and device binding on the GPU; device-staged RPC echo and \
                   one-sided WRITE/READ between two processes",
    },
    Kind {
        name: "mlu",
        krate: "hmc-backend-mlu",
        tests: Some(&["conformance"]),
        examples: &[],
        devices: &["/dev/cambricon_dev0"],
        describe: "cnmon info",
        python: None,
        component: "`hmc-backend-mlu` (Cambricon)",
        verifies: "memory kit and device binding on the MLU",
    },
    Kind {
        name: "musa",
        krate: "hmc-backend-musa",
        tests: Some(&["conformance"]),
        examples: &[],
        devices: &["/dev/mtgpu.0", "/dev/dri/renderD128-mt"],
        describe: "mthreads-gmi",
        python: None,
        component: "`hmc-backend-musa` (Moore Threads)",
        verifies: "memory kit and device binding on the GPU",
    },
    Kind {
        name: "ascend",
        krate: "hmc-backend-ascend",
        tests: Some(&["conformance"]),
        examples: &[],
        devices: &["/dev/davinci0"],
        describe: "npu-smi info",
        python: None,
        component: "`hmc-backend-ascend` (Huawei Ascend NPU)",
        verifies: "memory kit and device binding on the NPU",
    },
    Kind {
        name: "rdma",
        krate: "hmc-transport-rdma",
        tests: None,
        examples: &[],
        devices: &["/sys/class/infiniband"],
        describe: "ibv_devices",
        python: None,
        component: "`hmc-transport-rdma`",
        verifies: "the transport's tests over the machine's RDMA devices",
    },
];

/// The kinds `hw-bundle` takes.
pub fn kinds() -> Vec<&'static str> {
    KINDS.iter().map(|k| k.name).collect()
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

/// Builds the bundle of `kind` into `dir` (emptied first).
pub fn build(kind: &str, dir: &Path) -> Result {
    let k = KINDS.iter().find(|k| k.name == kind).ok_or_else(|| {
        format!(
            "no hardware bundle `{kind}`; choose one of {}",
            kinds().join(", ")
        )
    })?;
    if !root().join(k.krate).join("Cargo.toml").exists() {
        return Err(format!(
            "{} is not in this checkout, so there is nothing to bundle for `{kind}`",
            k.krate
        ));
    }
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let mut test_build = cargo();
    test_build.args([
        "test",
        "--release",
        "--no-run",
        "--message-format=json",
        "-p",
        k.krate,
        "--lib",
    ]);
    match k.tests {
        Some(tests) => tests.iter().for_each(|t| {
            test_build.args(["--test", t]);
        }),
        None => {
            test_build.arg("--tests");
        }
    }
    eprintln!("xtask: running {test_build:?}");
    let out = test_build
        .output()
        .map_err(|e| format!("cargo test --no-run: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "building the {} tests failed:\n{}",
            k.krate,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let mut binaries = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(exe) = json_string_field(line, "executable") {
            let src = PathBuf::from(exe);
            let name = src
                .file_name()
                .ok_or(format!("odd test path {}", src.display()))?
                .to_string_lossy()
                .into_owned();
            if name.contains("shim") {
                continue;
            }
            std::fs::copy(&src, dir.join(&name)).map_err(|e| format!("copying {name}: {e}"))?;
            binaries.push(name);
        }
    }
    if let Some(tests) = k.tests
        && binaries.len() != tests.len() + 1
    {
        return Err(format!(
            "expected the unit tests and {tests:?} of {}, found {binaries:?}",
            k.krate
        ));
    }
    let mut steps: Vec<(String, String)> = binaries
        .iter()
        .map(|b| (b.clone(), format!("./{b} --test-threads=1")))
        .collect();
    if !k.examples.is_empty() {
        let mut build = cargo();
        build.args(["build", "--release"]);
        for (pkg, ex, _) in k.examples {
            build.args(["-p", pkg, "--example", ex]);
        }
        run(&mut build)?;
        for (_, ex, args) in k.examples {
            let built = target_dir().join("release/examples").join(ex);
            std::fs::copy(&built, dir.join(ex)).map_err(|e| format!("copying {ex}: {e}"))?;
            binaries.push(ex.to_string());
            steps.push((ex.to_string(), format!("./{ex} {args}")));
        }
    }
    if let Some((script, args)) = k.python {
        let wheel = crate::python::release_wheel()?;
        let name = wheel
            .file_name()
            .ok_or("a wheel path without a file name")?
            .to_string_lossy()
            .into_owned();
        std::fs::copy(&wheel, dir.join(&name)).map_err(|e| format!("copying {name}: {e}"))?;
        // The bench and the CPU accounting it imports from its folder.
        for file in [script, "_cpu.py"] {
            std::fs::copy(root().join("hmc-py/bench").join(file), dir.join(file))
                .map_err(|e| format!("copying {file}: {e}"))?;
        }
        steps.push((script.to_string(), python_step(&name, script, args)));
    }
    // Without debug info a bundle is a few MiB (the device tool carries at most 64).
    let mut strip = Command::new("strip");
    binaries.iter().for_each(|b| {
        strip.arg(dir.join(b));
    });
    run(&mut strip)?;
    let sh = dir.join("run.sh");
    std::fs::write(&sh, script(k, &steps)).map_err(|e| format!("writing {}: {e}", sh.display()))?;
    run(Command::new("chmod").arg("+x").arg(&sh))?;
    eprintln!(
        "xtask: {kind} check bundled in {} ({} binaries); on a machine with the hardware run \
         `bash {}/run.sh` (device tool: carry [\"{}\"])",
        dir.display(),
        binaries.len(),
        dir.display(),
        dir.strip_prefix(root()).unwrap_or(dir).display()
    );
    Ok(())
}

/// The `run.sh` command of a Python bench: a venv with the wheel and numpy (required),
/// NIXL 1.5.1 where pip reaches it (optional: the bench says it left NIXL out), the bench.
fn python_step(wheel: &str, script: &str, args: &str) -> String {
    format!(
        "{{ python3 -m venv py-venv && py-venv/bin/pip install -q numpy ./{wheel}; }} && \
         {{ py-venv/bin/pip install -q --no-deps nixl-cu12==1.5.1 || \
         echo 'nixl-cu12 not installed: the NIXL row is left out'; }} && \
         py-venv/bin/python {script} {args}"
    )
}

/// The bundle's `run.sh`: device check, each step with its exit status, and the support
/// table row the run verifies (or the steps that failed).
fn script(k: &Kind, steps: &[(String, String)]) -> String {
    let devices = k
        .devices
        .iter()
        .map(|d| format!("[ -e {d} ]"))
        .collect::<Vec<_>>()
        .join(" || ");
    let mut s = format!(
        "#!/usr/bin/env bash\n\
         # The {name} check, built by `cargo xtask hw-bundle {name}`: {krate}'s tests and the\n\
         # examples that measure it, as binaries for a machine without a Rust toolchain.\n\
         set -uo pipefail\n\
         cd \"$(dirname \"$0\")\"\n\
         out=\"${{OUT:-.}}/{name}-check.txt\"\n\
         exec > >(tee \"$out\") 2>&1\n\
         if ! {{ {devices}; }}; then\n\
         \x20 echo \"no {name} hardware here ({list} absent): nothing verified\"\n\
         \x20 exit 2\n\
         fi\n\
         {describe} || true\n\
         failed=()\n",
        name = k.name,
        krate = k.krate,
        list = k.devices.join(", "),
        describe = k.describe,
    );
    for (label, cmd) in steps {
        s.push_str(&format!(
            "echo \"== {label}\"; {cmd} || failed+=(\"{label}\")\n"
        ));
    }
    // Single quotes keep the row's backticks from being run as commands.
    s.push_str(&format!(
        "component='| {component} |'\n\
         verifies='| {verifies} |'\n\
         echo\n\
         echo '== the support table row this run verifies'\n\
         if [ ${{#failed[@]}} -eq 0 ]; then\n\
         \x20 echo \"$component verified on hardware ($(date -u +%F), cargo xtask hw-bundle {name}) $verifies\"\n\
         else\n\
         \x20 echo \"$component FAILED on hardware ($(date -u +%F)): ${{failed[*]}} $verifies\"\n\
         \x20 exit 1\n\
         fi\n",
        component = k.component,
        name = k.name,
        verifies = k.verifies.split_whitespace().collect::<Vec<_>>().join(" "),
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_names_its_crate_devices_and_row() {
        assert_eq!(kinds(), ["cuda", "rocm", "mlu", "musa", "ascend", "rdma"]);
        for k in KINDS {
            assert!(
                !k.devices.is_empty() && k.component.contains(k.krate),
                "{}",
                k.name
            );
        }
    }

    #[test]
    fn the_script_refuses_without_hardware_and_prints_the_row_it_verifies() {
        let k = &KINDS[1];
        let s = script(
            k,
            &[(
                "conformance-1".into(),
                "./conformance-1 --test-threads=1".into(),
            )],
        );
        assert!(s.contains("if ! { [ -e /dev/kfd ]; }; then"), "{s}");
        assert!(s.contains("nothing verified"), "{s}");
        assert!(s.contains("./conformance-1 --test-threads=1 || failed+=(\"conformance-1\")"));
        assert!(
            s.contains("component='| `hmc-backend-rocm` (AMD, Hygon DCU) |'"),
            "{s}"
        );
        assert!(s.contains("echo \"$component verified on hardware"), "{s}");
        assert!(s.contains("FAILED on hardware"), "{s}");
        // bash would reject an unbalanced script; a cheap structural check here.
        assert_eq!(s.matches("\nfi\n").count(), 2, "{s}");
    }

    #[test]
    fn the_gpu_bundle_runs_the_kv_pattern_on_vram_in_a_venv_of_its_own() {
        let k = KINDS.iter().find(|k| k.name == "cuda").unwrap();
        let (script_name, args) = k.python.expect("the CUDA bundle carries a Python bench");
        assert!(
            root().join("hmc-py/bench").join(script_name).exists(),
            "{script_name} is not in hmc-py/bench"
        );
        let step = python_step("hmc-0.1.0-cp311-abi3-linux_x86_64.whl", script_name, args);
        let s = script(k, &[(script_name.to_string(), step)]);
        assert!(
            s.contains("pip install -q numpy ./hmc-0.1.0-cp311-abi3-linux_x86_64.whl"),
            "{s}"
        );
        assert!(s.contains("nixl-cu12==1.5.1 ||"), "NIXL is optional: {s}");
        assert!(
            s.contains("py-venv/bin/python bench_kv_vram.py --rounds 5"),
            "{s}"
        );
        // The whole script parses as bash.
        let path = std::env::temp_dir().join(format!("hmc-gpu-run-{}.sh", std::process::id()));
        std::fs::write(&path, &s).unwrap();
        let ok = Command::new("bash").arg("-n").arg(&path).status().unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(ok.success(), "bash -n refused:\n{s}");
    }

    #[test]
    fn an_unknown_kind_lists_the_known_ones() {
        let e = build("tpu", Path::new("/nonexistent")).unwrap_err();
        assert!(e.contains("cuda, rocm, mlu, musa, ascend, rdma"), "{e}");
    }
}
