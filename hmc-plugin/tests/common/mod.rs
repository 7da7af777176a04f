//! Test support: builds the example C plugin (and its deliberately broken variants) with the system C compiler (hmc-testshim's shim builder), and opens communicators through the loader.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use hmc_plugin::{Plugin, PluginCommunicator, PluginConfig, TransportRegistry};
use hmc_testshim::shim::{ShimSpec, build_shim};

/// hmc-plugin's folder, also when another crate's tests include this module by path.
pub fn crate_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../hmc-plugin"))
}

/// Compiles examples-plugins/loopmem/loopmem.c as `lib<name>.so` with `defines`
/// (`-D` arguments), C11, `-Wall -Wextra -Werror`, through hmc-testshim's shim
/// builder (rebuilt only when the source, the header or the command changed).
pub fn build_c_plugin(name: &str, defines: &[&str]) -> PathBuf {
    let mut spec = ShimSpec::new(name, crate_dir().join("examples-plugins/loopmem/loopmem.c"))
        .include_dir(crate_dir().join("include"))
        .depends_on(crate_dir().join("include/hmc_plugin.h"))
        .out_dir(PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("c-plugins"))
        .define(format!("LOOPMEM_NAME=\"{name}\""));
    for flag in ["-std=c11", "-O2", "-Wextra", "-Werror"] {
        spec = spec.flag(flag);
    }
    for d in defines {
        spec = spec.define(*d);
    }
    if !defines.is_empty() {
        // A broken variant leaves some functions out of its table.
        spec = spec.flag("-Wno-unused-function");
    }
    build_shim(&spec).unwrap_or_else(|e| panic!("loopmem.c ({defines:?}): {e}"))
}

/// The loopmem plugin, found and loaded through the search path.
pub fn loopmem() -> Arc<Plugin> {
    let path = build_c_plugin("loopmem", &[]);
    let registry = TransportRegistry::discover(&PluginConfig {
        search_path: vec![path],
    });
    registry
        .discovery()
        .get("loopmem")
        .unwrap_or_else(|| panic!("loopmem not loaded:\n{}", registry.report()))
        .clone()
}

/// A loopmem communicator.
pub fn open_loopmem() -> Arc<PluginCommunicator> {
    Arc::new(PluginCommunicator::open(loopmem(), "bind=127.0.0.1\n").expect("open loopmem"))
}

/// Builds examples-plugins/rtcp (a cdylib outside the workspace) with cargo, into the
/// workspace's target folder, and returns the library. `release` picks the profile.
pub fn build_rust_plugin(release: bool) -> PathBuf {
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = crate_dir().join("examples-plugins/rtcp");
    // Resolve the plugin's dependencies as the workspace does, not to whatever is newest.
    let lock = dir.join("Cargo.lock");
    if !lock.exists() {
        std::fs::copy(crate_dir().join("../Cargo.lock"), &lock).unwrap();
    }
    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("rust-plugins");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(&cargo);
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(dir.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target);
    if release {
        cmd.arg("--release");
    }
    let output = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cargo}: {e}"));
    assert!(
        output.status.success(),
        "building the rtcp example plugin failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    target
        .join(if release { "release" } else { "debug" })
        .join("libhmc_plugin_rtcp.so")
}

/// The rtcp plugin (debug build), loaded through the search path.
pub fn rtcp() -> Arc<Plugin> {
    let path = build_rust_plugin(false);
    let registry = TransportRegistry::discover(&PluginConfig {
        search_path: vec![path],
    });
    registry
        .discovery()
        .get("rtcp")
        .unwrap_or_else(|| panic!("rtcp not loaded:\n{}", registry.report()))
        .clone()
}
