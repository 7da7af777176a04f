//! The peers' own test suites against the work-alikes, in `cargo xtask test`: NIXL's
//! `test/python/test_nixl_api.py` against `hmc.nixl` (`hmc-py/tests/upstream/
//! run_nixl_suite.py`) and Mooncake's wheel tests against `hmc.mooncake`
//! (`run_mooncake_suite.py`), with only their import lines rewritten; under `--long`, the
//! same suites against the real packages, to keep the baseline honest.
//!
//! The peers' code is not part of this repository. Each suite runs where its source tree is
//! found: `HMC_NIXL_SRC` / `HMC_MOONCAKE_SRC` (a checkout or a bare git repository), or the
//! read-only mirrors this project's machines keep under `/work/.mirror`. Where neither is
//! there (a CI machine reaches package registries only), the suite is skipped and the
//! output says so and how to run it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{Result, root, run};

/// NIXL's test imports torch at its top: the interpreter that runs the suite has it. The
/// PyPI wheel (CUDA-enabled, with its NVIDIA libraries: gigabytes) is installed only where
/// the suite runs.
const TORCH: &str = "torch==2.15.0";

/// The NIXL the suite is checked against under `--long` (`nixl_cu12`, `--no-deps`).
const NIXL: &str = "nixl-cu12==1.5.1";

/// Where the source tree of `name` is: `$var`, else the machine's mirror, else `None`.
fn source(var: &str, mirror: &str) -> Option<PathBuf> {
    if let Some(v) = std::env::var_os(var) {
        return Some(PathBuf::from(v));
    }
    let m = Path::new("/work/.mirror").join(mirror).join("repo");
    m.exists().then_some(m)
}

/// `target/upstream-venv`: torch, pytest, pytest-timeout, numpy and the dev wheel of hmc
/// (`wheel`), made on first use; its python.
fn venv(wheel: &Path) -> Result<PathBuf> {
    let venv = root().join("target/upstream-venv");
    let py = venv.join("bin/python");
    let ready = Command::new(&py)
        .args(["-c", "import torch, pytest, pytest_timeout, numpy"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ready {
        eprintln!(
            "xtask: making {} ({TORCH}, pytest, pytest-timeout, numpy from PyPI)",
            venv.display()
        );
        run(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
        run(Command::new(&py).args([
            "-m",
            "pip",
            "install",
            "-q",
            TORCH,
            "numpy",
            "pytest",
            "pytest-timeout",
        ]))?;
    }
    crate::python::install_built(&py, wheel)?;
    Ok(py)
}

/// Runs NIXL's API suite against `hmc.nixl` (and, with `long`, against NIXL 1.5.1), the
/// hmc wheel `wheel` installed for it; skipped, saying so, where NIXL's source is absent.
pub fn nixl(wheel: &Path, long: bool) -> Result {
    let Some(src) = source("HMC_NIXL_SRC", "ai-dynamo+nixl") else {
        eprintln!(
            "xtask: NIXL's own suite (test/python/test_nixl_api.py) SKIPPED: no NIXL source \
             tree here; set HMC_NIXL_SRC to a checkout of github.com/ai-dynamo/nixl to run it"
        );
        return Ok(());
    };
    let py = venv(wheel)?;
    let runner = root().join("hmc-py/tests/upstream/run_nixl_suite.py");
    run(Command::new(&py).arg(&runner).arg("--src").arg(&src))?;
    if long {
        run(Command::new(&py).args(["-m", "pip", "install", "-q", "--no-deps", NIXL]))?;
        run(Command::new(&py)
            .arg(&runner)
            .arg("--src")
            .arg(&src)
            .arg("--real"))?;
    }
    Ok(())
}
