//! The Python package `hmc` (crate `hmc-py`) in `cargo xtask test` and `cargo xtask bench
//! python`: a venv under `target/`, the wheel built with maturin (libhmc's C API staged
//! into it) and installed into it, then the C API used from the installed package, and the
//! pytest suite or the benchmark beside Mooncake's Python API.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{Result, root, run};

/// The maturin that builds the wheel (also the PEP 517 backend of hmc-py/pyproject.toml).
const MATURIN: &str = "maturin==1.16.0";

/// `target/py-venv` with maturin, pytest and numpy (made on first use); its python.
fn venv() -> Result<PathBuf> {
    let venv = root().join("target/py-venv");
    let py = venv.join("bin/python");
    let ready = || {
        Command::new(&py)
            .args(["-c", "import maturin, pytest, numpy"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if ready() {
        return Ok(py);
    }
    eprintln!(
        "xtask: making {} (maturin, pytest, numpy from PyPI)",
        venv.display()
    );
    make_venv(&venv)?;
    run(Command::new(&py).args(["-m", "pip", "install", "-q", MATURIN, "pytest", "numpy"]))?;
    if ready() {
        Ok(py)
    } else {
        Err(format!(
            "{} lacks maturin, pytest or numpy after the install",
            venv.display()
        ))
    }
}

/// `python3 -m venv DIR`; its python.
fn make_venv(dir: &Path) -> Result<PathBuf> {
    run(Command::new("python3").arg("-m").arg("venv").arg(dir))
        .map_err(|e| format!("python3 -m venv: {e} (apt-get install python3-venv)"))?;
    Ok(dir.join("bin/python"))
}

/// The release wheel of hmc-py (abi3, for this platform), built into
/// `target/py-wheels/release`; for bundles that carry the Python package to a machine
/// without a toolchain.
pub fn release_wheel() -> Result<PathBuf> {
    let py = venv()?;
    build_wheel(&py, &py, true)
}

/// Where [`build_wheel`] stages libhmc for maturin (ignored by git; the `include` of
/// hmc-py/pyproject.toml names it, since maturin leaves out what git ignores).
const CAPI_STAGE: &str = "hmc-py/python/hmc/_capi";

/// Builds the wheel (`--release` or the dev profile) for `python` into
/// `target/py-wheels/<profile>`, with libhmc's headers, library and `hmc.pc` inside (built
/// first, in the same profile); its path.
fn build_wheel(venv_py: &Path, python: &Path, release: bool) -> Result<PathBuf> {
    let profile = if release { "release" } else { "dev" };
    let out = root().join("target/py-wheels").join(profile);
    let _ = std::fs::remove_dir_all(&out);
    let maturin = venv_py.with_file_name("maturin");
    let mut build = Command::new(&maturin);
    build
        .current_dir(root())
        .args(["build", "-q", "-m", "hmc-py/Cargo.toml", "-o"])
        .arg(&out)
        .args(["--interpreter"])
        .arg(python);
    if release {
        build.arg("--release");
    }
    // libhmc, the C API, into the package (hmc.get_include(), ...): staged where
    // hmc-py/pyproject.toml's `include` names it, removed once maturin has packed it.
    let stage = crate::capi::stage_for_wheel(release, &root().join(CAPI_STAGE))?;
    run(&mut build)?;
    drop(stage);
    std::fs::read_dir(&out)
        .map_err(|e| format!("reading {}: {e}", out.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or(format!("maturin left no wheel in {}", out.display()))
}

/// Builds the wheel (`--release` or the dev profile) into `target/py-wheels/<profile>` and
/// installs it into the environment of `python`.
fn install_wheel(venv_py: &Path, python: &Path, release: bool) -> Result {
    let wheel = build_wheel(venv_py, python, release)?;
    install_built(python, &wheel)
}

/// Installs the built `wheel` into the environment of `python` (in place of any hmc).
pub(crate) fn install_built(python: &Path, wheel: &Path) -> Result {
    run(Command::new(python)
        .args([
            "-m",
            "pip",
            "install",
            "-q",
            "--force-reinstall",
            "--no-deps",
        ])
        .arg(wheel))
}

/// Builds the wheel into `target/py-venv` and runs the pytest suite (hmc-py/tests), then
/// the peers' own suites against the work-alikes ([`crate::upstream`]). With
/// `long`, the NIXL and Mooncake comparisons also run the real NIXL 1.5.1 and Mooncake
/// 0.3.13 (`target/nixl-venv`, `target/mooncake-venv`, made on first use) through
/// `HMC_NIXL_PYTHON` and `HMC_MOONCAKE_PYTHON`.
pub fn test(long: bool) -> Result {
    let py = venv()?;
    let wheel = build_wheel(&py, &py, false)?;
    install_built(&py, &wheel)?;
    // The C API the wheel carries, used as a `pip install` user would.
    crate::capi::wheel_test(&py)?;
    let mut cmd = Command::new(&py);
    cmd.current_dir(root().join("hmc-py"))
        .args(["-m", "pytest", "-q", "tests"])
        // tests/test_capi_paths.py: this wheel must carry the C API.
        .env("HMC_TEST_WHEEL_CAPI", "1");
    if long {
        match nixl_python() {
            Ok(nixl) => {
                cmd.env("HMC_NIXL_PYTHON", nixl);
            }
            Err(why) => eprintln!("xtask: the NIXL comparisons run without NIXL: {why}"),
        }
        match crate::mooncake_python() {
            Ok(mc) => {
                cmd.env("HMC_MOONCAKE_PYTHON", mc);
            }
            Err(why) => eprintln!("xtask: the Mooncake comparisons run without Mooncake: {why}"),
        }
    }
    run(&mut cmd)?;
    // The peers' own suites, where their source is found (skipped, saying so, elsewhere).
    let Some(src) = crate::upstream::nixl_source() else {
        crate::upstream::say_nixl_skipped();
        return Ok(());
    };
    let upstream = crate::upstream::venv()?;
    install_built(&upstream, &wheel)?;
    crate::upstream::nixl(&upstream, &src, long)
}

/// `cargo xtask test --long`: `pip install './hmc-py[test]'`, as the README tells a user,
/// into a venv made afresh (`target/pip-venv`), then the package tests there (the README's
/// example among them). The steps above build the wheel with maturin directly; this is
/// the PEP 517 path, pip fetching maturin into a build environment of its own.
pub fn pip_install() -> Result {
    let venv = root().join("target/pip-venv");
    let _ = std::fs::remove_dir_all(&venv);
    let py = make_venv(&venv)?;
    run(Command::new(&py).current_dir(root()).args([
        "-m",
        "pip",
        "install",
        "-q",
        "./hmc-py[test]",
    ]))?;
    // test_capi_paths.py: a build from source has no C API, and says how to get it.
    run(Command::new(&py).current_dir(root().join("hmc-py")).args([
        "-m",
        "pytest",
        "-q",
        "tests/test_package.py",
        "tests/test_capi_paths.py",
    ]))
}

/// `cargo xtask bench python`: a release wheel installed beside Mooncake (in
/// `target/mooncake-venv`, or alone in `target/py-venv` when Mooncake cannot be installed),
/// then `hmc-py/bench/bench_python.py`, with the engine bench's TCP floor beside it.
pub fn bench(rec: &mut crate::report::Recorder, quick: bool) -> Result {
    let venv_py = venv()?;
    let (python, mooncake) = match crate::mooncake_python() {
        Ok(p) => (p, true),
        Err(why) => {
            eprintln!("xtask: the Python bench runs without Mooncake: {why}");
            (venv_py.clone(), false)
        }
    };
    rec.build_with(|| install_wheel(&venv_py, &python, true))?;
    // The engine bench's `--floor-client` measures the TCP floor beside each round.
    let floor = rec.build_with(|| crate::bench_binary("hmc-engine", "engine"))?;
    let mut cmd = Command::new(&python);
    cmd.current_dir(root())
        .arg("hmc-py/bench/bench_python.py")
        .args(["--seconds", if quick { "0.5" } else { "2" }])
        .arg("--floor")
        .arg(floor);
    if !mooncake {
        cmd.arg("--no-mooncake");
    }
    rec.run("python", &mut cmd)
}

/// NIXL's Python package the KV bench runs beside (CPU-only with DRAM over its bundled UCX;
/// `--no-deps`: its torch requirement is only for its examples).
const NIXL: &str = "nixl-cu12==1.5.1";

/// `target/nixl-venv` with NIXL and numpy (made on first use), or why not.
fn nixl_python() -> std::result::Result<PathBuf, String> {
    let venv = root().join("target/nixl-venv");
    let py = venv.join("bin/python");
    let ready = || {
        Command::new(&py)
            .arg("-c")
            .arg(crate::imports_of("nixl_cu12._api"))
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if ready() {
        return Ok(py);
    }
    eprintln!("xtask: installing {NIXL} into {}", venv.display());
    make_venv(&venv)?;
    run(Command::new(&py).args(["-m", "pip", "install", "-q", "--no-deps", NIXL]))?;
    run(Command::new(&py)
        .args(["-m", "pip", "install", "-q"])
        .args(crate::BENCH_DRIVER_PACKAGES))?;
    if ready() {
        Ok(py)
    } else {
        Err("nixl_cu12 does not import after the install".into())
    }
}

/// `cargo xtask bench kv`: `hmc-py/bench/bench_kv.py`, a request's KV blocks in vLLM's
/// pattern, hmc (a release wheel) beside NIXL and Mooncake (each in its venv, with the same
/// wheel), memcpy and the engine bench's TCP floor, in one run; then
/// `hmc-py/bench/bench_restart.py`, a restarted peer under NIXL's API on both.
pub fn bench_kv(rec: &mut crate::report::Recorder, quick: bool) -> Result {
    let venv_py = venv()?;
    rec.build_with(|| install_wheel(&venv_py, &venv_py, true))?;
    let mut cmd = Command::new(&venv_py);
    cmd.current_dir(root()).arg("hmc-py/bench/bench_kv.py");
    // The restarted-peer bench: hmc.nixl beside NIXL under NIXL's API.
    let mut restart = Command::new(&venv_py);
    restart
        .current_dir(root())
        .arg("hmc-py/bench/bench_restart.py");
    for (flag, found) in [
        ("--nixl-python", nixl_python()),
        ("--mooncake-python", crate::mooncake_python()),
    ] {
        match found {
            Ok(py) => {
                // The same wheel there: the driver of each system imports hmc for its
                // helpers only when it is hmc's, but the venvs share one build.
                rec.build_with(|| install_wheel(&venv_py, &py, true))?;
                if flag == "--nixl-python" {
                    restart.arg(flag).arg(&py);
                }
                cmd.arg(flag).arg(py);
            }
            Err(why) => eprintln!("xtask: the KV bench runs without {flag}: {why}"),
        }
    }
    let floor = rec.build_with(|| crate::bench_binary("hmc-engine", "engine"))?;
    cmd.arg("--floor").arg(floor);
    if quick {
        cmd.args(["--rounds", "3", "--seconds", "0.3", "--prep", "100000"]);
        restart.args(["--rounds", "2"]);
    }
    rec.run("kv", &mut cmd)?;
    rec.run("kv-restart", &mut restart)
}
