//! NIXL's own Python API suite against the work-alike, in `cargo xtask test`:
//! `test/python/test_nixl_api.py` against `hmc.nixl` (`hmc-py/tests/upstream/
//! run_nixl_suite.py`), with only its import lines rewritten; under `--long`, against NIXL
//! 1.5.1 too, to keep the baseline honest. (Mooncake's wheel tests need no torch and run
//! from the pytest suite: `hmc-py/tests/test_mooncake_upstream.py`.)
//!
//! The peers' code is not part of this repository. The suite runs where NIXL's source tree
//! is found: `HMC_NIXL_SRC` (a checkout or a bare git repository), or the read-only mirror
//! this project's machines keep under `/work/.mirror`. Where neither is there (a CI machine
//! reaches package registries only), it is skipped and the output says so and how to run it.

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
pub fn source(var: &str, mirror: &str) -> Option<PathBuf> {
    if let Some(v) = std::env::var_os(var) {
        return Some(PathBuf::from(v));
    }
    let m = Path::new("/work/.mirror").join(mirror).join("repo");
    m.exists().then_some(m)
}

/// NIXL's source tree, if this machine has one (`HMC_NIXL_SRC`, or the mirror).
pub fn nixl_source() -> Option<PathBuf> {
    source("HMC_NIXL_SRC", "ai-dynamo+nixl")
}

/// Says that NIXL's suite was skipped, and how to run it.
pub fn say_nixl_skipped() {
    eprintln!(
        "xtask: NIXL's own suite (test/python/test_nixl_api.py) SKIPPED: no NIXL source \
         tree here; set HMC_NIXL_SRC to a checkout of github.com/ai-dynamo/nixl to run it"
    );
}

/// `target/upstream-venv`: torch, pytest, pytest-timeout and numpy, made on first use (the
/// caller installs hmc's wheel); its python.
pub fn venv() -> Result<PathBuf> {
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
    Ok(py)
}

/// Runs NIXL's API suite from `src` against `hmc.nixl` in `py` (a [`venv`] with hmc's
/// wheel), and with `long` against NIXL 1.5.1 too.
pub fn nixl(py: &Path, src: &Path, long: bool) -> Result {
    let runner = root().join("hmc-py/tests/upstream/run_nixl_suite.py");
    run(Command::new(py).arg(&runner).arg("--src").arg(src))?;
    if long {
        run(Command::new(py).args(["-m", "pip", "install", "-q", "--no-deps", NIXL]))?;
        run(Command::new(py)
            .arg(&runner)
            .arg("--src")
            .arg(src)
            .arg("--real"))?;
    }
    Ok(())
}
