//! `cargo xtask compat`: the stacks' own connector classes on hmc's work-alikes and on the
//! real packages, between two processes on CPU memory, every byte checked: vLLM 0.33.0's
//! `NixlConnector` (`hmc-py/compat/vllm_nixl.py`) on `hmc.nixl` and NIXL 1.5.1, and SGLang
//! 0.5.23's `MooncakeKVManager` and `NixlKVManager` (`hmc-py/compat/sglang_disagg.py`) on
//! `hmc.mooncake`/`hmc.nixl` and Mooncake 0.3.13/NIXL 1.5.1.
//!
//! Each stack gets a venv of its own under `target/` (`pip install --no-deps` of the stack,
//! then the pinned list of what its connector modules import,
//! `hmc-py/compat/requirements-*.txt`, then the release wheel of `hmc-py`). The first run
//! downloads gigabytes (torch with its CUDA libraries), so this is not part of `cargo xtask
//! test`. Every harness prints one JSON line per result; this prints them side by side and
//! writes them to `target/compat/results.json`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{Result, root, run};

/// One stack: its venv, the pinned stack and requirement list, and the harness runs.
struct Stack {
    name: &'static str,
    venv: &'static str,
    package: &'static str,
    requirements: &'static str,
    /// The module whose import says the venv is made.
    probe: &'static str,
    /// Arguments of each harness run (the harness file first).
    runs: &'static [&'static [&'static str]],
    /// The harness runs again with [`DECODE_KILLED`] on hmc's work-alike of each of these
    /// backends: a decode killed mid-run, every request concluded with the stack's reasons.
    decode_killed: &'static [&'static str],
}

/// A failure run's arguments (after `--backend B --package hmc`).
const DECODE_KILLED: &[&str] = &["--requests", "24", "--kill-decode-after", "8"];

const STACKS: &[Stack] = &[
    Stack {
        name: "vLLM",
        venv: "target/compat-vllm-venv",
        package: "vllm==0.33.0",
        requirements: "hmc-py/compat/requirements-vllm.txt",
        probe: "vllm.distributed.kv_transfer.kv_connector.factory",
        runs: &[&["hmc-py/compat/vllm_nixl.py", "--package", "hmc,nixl"]],
        decode_killed: &[],
    },
    Stack {
        name: "SGLang",
        venv: "target/compat-sglang-venv",
        package: "sglang==0.5.23",
        requirements: "hmc-py/compat/requirements-sglang.txt",
        probe: "sglang.srt.disaggregation.mooncake.conn",
        runs: &[
            &[
                "hmc-py/compat/sglang_disagg.py",
                "--backend",
                "mooncake",
                "--package",
                "hmc",
            ],
            &[
                "hmc-py/compat/sglang_disagg.py",
                "--backend",
                "mooncake",
                "--package",
                "real",
            ],
            &[
                "hmc-py/compat/sglang_disagg.py",
                "--backend",
                "nixl",
                "--package",
                "hmc",
            ],
            &[
                "hmc-py/compat/sglang_disagg.py",
                "--backend",
                "nixl",
                "--package",
                "real",
            ],
        ],
        decode_killed: &["mooncake", "nixl"],
    },
];

/// The venv of `stack`, made on first use, with the hmc wheel `wheel` installed; its python.
fn venv(stack: &Stack, wheel: &Path) -> Result<PathBuf> {
    let dir = root().join(stack.venv);
    let py = dir.join("bin/python");
    let ready = Command::new(&py)
        .args(["-c", &format!("import {}", stack.probe)])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ready {
        eprintln!(
            "xtask: making {} ({} and {}, from PyPI: gigabytes the first time)",
            dir.display(),
            stack.package,
            stack.requirements
        );
        run(Command::new("python3").arg("-m").arg("venv").arg(&dir))?;
        run(Command::new(&py).args(["-m", "pip", "install", "-q", "--no-deps", stack.package]))?;
        run(Command::new(&py)
            .args(["-m", "pip", "install", "-q", "-r"])
            .arg(root().join(stack.requirements)))?;
    }
    crate::python::install_built(&py, wheel)?;
    Ok(py)
}

/// `cargo xtask compat`: every stack's harness runs; fails when one run fails (a wrong
/// byte, a missing request, a process that did not start), after running the others.
pub fn command() -> Result {
    let wheel = crate::python::release_wheel()?;
    let mut results: Vec<String> = Vec::new();
    let mut failed: Vec<String> = Vec::new();
    for stack in STACKS {
        let py = venv(stack, &wheel)?;
        let harness = stack.runs.first().map_or("", |r| r[0]);
        let failure_runs = stack.decode_killed.iter().map(|b| {
            [harness, "--backend", b, "--package", "hmc"]
                .into_iter()
                .chain(DECODE_KILLED.iter().copied())
                .collect::<Vec<_>>()
        });
        let all: Vec<Vec<&str>> = stack
            .runs
            .iter()
            .map(|r| r.to_vec())
            .chain(failure_runs)
            .collect();
        for args in &all {
            let what = format!("{} {}", stack.name, args[1..].join(" "));
            eprintln!("xtask: compat: {what}");
            let out = Command::new(&py)
                .current_dir(root())
                .args(args)
                .stderr(Stdio::inherit())
                .output()
                .map_err(|e| format!("running {what}: {e}"))?;
            let text = String::from_utf8_lossy(&out.stdout);
            let lines: Vec<&str> = text.lines().filter(|l| l.starts_with('{')).collect();
            if !out.status.success() || lines.is_empty() {
                failed.push(format!("{what} ({})", out.status));
            }
            results.extend(lines.iter().map(|l| l.to_string()));
        }
    }
    let dir = root().join("target/compat");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let json = format!("[\n{}\n]\n", results.join(",\n"));
    std::fs::write(dir.join("results.json"), json).map_err(|e| format!("results.json: {e}"))?;
    println!("\n## The stacks' connectors, side by side (target/compat/results.json)\n");
    for line in &results {
        println!("{line}");
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("compat runs failed: {}", failed.join("; ")))
    }
}
