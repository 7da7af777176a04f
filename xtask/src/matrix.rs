//! `cargo xtask matrix`: detects the runtimes and devices of this machine, runs every test that can run here, and prints the support table.

use std::path::Path;
use std::process::Command;

use crate::{Result, cargo, lib_present};

/// One row of the support table.
struct Component {
    name: &'static str,
    krate: &'static str,
    /// Library file names (any one will do) and the variable that points elsewhere.
    libs: &'static [&'static str],
    env: Option<&'static str>,
    /// Device nodes or sysfs paths whose presence means hardware is here.
    devices: &'static [&'static str],
    /// The backend's own probe: what its runtime reports about devices.
    probe: Option<fn() -> String>,
}

/// Summarises a backend probe: device names, or the `Unavailable` reason.
fn summarise<T: std::fmt::Debug>(r: hmc_core::Result<Vec<T>>) -> String {
    match r {
        Ok(devs) if devs.is_empty() => "runtime found, no device".into(),
        Ok(devs) => format!("{} device(s)", devs.len()),
        Err(e) => format!("unavailable: {}", e.to_string().replace('|', "/")),
    }
}

const COMPONENTS: &[Component] = &[
    Component {
        name: "host memory",
        krate: "hmc-backend-cpu",
        libs: &[],
        env: None,
        devices: &[],
        probe: None,
    },
    Component {
        name: "TCP/UDS transport",
        krate: "hmc-transport-tcp",
        libs: &[],
        env: None,
        devices: &[],
        probe: None,
    },
    Component {
        name: "UCX transport",
        krate: "hmc-transport-ucx",
        libs: &["libucp.so.0"],
        env: Some("HMC_UCX_LIB"),
        devices: &[],
        probe: None,
    },
    Component {
        name: "RDMA verbs transport",
        krate: "hmc-transport-rdma",
        libs: &["libibverbs.so.1"],
        env: Some("HMC_IBVERBS_LIB"),
        devices: &["/dev/infiniband/uverbs0"],
        probe: None,
    },
    Component {
        name: "RPC runtime",
        krate: "hmc-rpc",
        libs: &[],
        env: None,
        devices: &[],
        probe: None,
    },
    Component {
        name: "CUDA",
        krate: "hmc-backend-cuda",
        libs: &["libcuda.so.1", "libcuda.so"],
        env: None,
        devices: &["/dev/nvidia0"],
        probe: Some(|| summarise(hmc_backend_cuda::probe())),
    },
    Component {
        name: "ROCm / Hygon DCU",
        krate: "hmc-backend-rocm",
        libs: hmc_backend_rocm::LIBRARY_CANDIDATES,
        env: Some(hmc_backend_rocm::LIBRARY_ENV),
        devices: &["/dev/kfd"],
        probe: Some(|| summarise(hmc_backend_rocm::probe())),
    },
    Component {
        name: "Cambricon MLU",
        krate: "hmc-backend-mlu",
        libs: hmc_backend_mlu::LIBRARY_CANDIDATES,
        env: Some(hmc_backend_mlu::LIBRARY_ENV),
        devices: &["/dev/cambricon_dev0"],
        probe: Some(|| summarise(hmc_backend_mlu::probe())),
    },
    Component {
        name: "Moore Threads MUSA",
        krate: "hmc-backend-musa",
        libs: hmc_backend_musa::LIBRARY_CANDIDATES,
        env: Some(hmc_backend_musa::LIBRARY_ENV),
        devices: &["/dev/mtgpu.0", "/dev/dri/renderD128-mt"],
        probe: Some(|| summarise(hmc_backend_musa::probe())),
    },
];

fn rdma_devices() -> Vec<String> {
    std::fs::read_dir("/sys/class/infiniband")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn runtime(c: &Component) -> String {
    if let Some(var) = c.env.and_then(|v| std::env::var(v).ok().map(|p| (v, p))) {
        let (name, path) = var;
        return if Path::new(&path).exists() {
            format!("{name}={path}")
        } else {
            format!("{name} points to a missing file")
        };
    }
    if c.libs.is_empty() {
        return "built in".into();
    }
    let found = |l: &&&str| {
        if l.starts_with('/') {
            Path::new(l).exists()
        } else {
            lib_present(l)
        }
    };
    match c.libs.iter().find(found) {
        Some(l) => format!("{l} found"),
        None => format!("{} not found", c.libs[0]),
    }
}

fn device(c: &Component) -> String {
    if c.devices.is_empty() {
        return "n/a".into();
    }
    let node = match c.devices.iter().find(|d| Path::new(d).exists()) {
        Some(d) => format!("{d} present"),
        None => "no device node".into(),
    };
    match c.probe {
        Some(probe) => format!("{node}; probe: {}", probe()),
        None => node,
    }
}

/// Runs one crate's tests; returns "passed N" or "FAILED …".
fn run_tests(krate: &str) -> String {
    if !crate::root().join(krate).join("Cargo.toml").exists() {
        return "crate not in this checkout".into();
    }
    eprintln!("xtask: matrix: testing {krate}");
    let out = cargo()
        .args(["test", "-p", krate, "--all-targets"])
        .output();
    let Ok(out) = out else {
        return "could not run cargo".into();
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let (mut passed, mut failed, mut ignored) = (0u64, 0u64, 0u64);
    for line in text.lines().filter(|l| l.starts_with("test result:")) {
        let num = |key: &str| -> u64 {
            line.split(';')
                .find_map(|p| {
                    p.trim().strip_suffix(key).map(|n| {
                        n.trim()
                            .rsplit(' ')
                            .next()
                            .unwrap_or("0")
                            .parse()
                            .unwrap_or(0)
                    })
                })
                .unwrap_or(0)
        };
        passed += num(" passed");
        failed += num(" failed");
        ignored += num(" ignored");
    }
    if out.status.success() {
        format!("{passed} passed, {ignored} ignored")
    } else {
        format!("FAILED ({failed} failed, {passed} passed)")
    }
}

/// Prints the support table as markdown.
pub fn run() -> Result {
    crate::ensure_system_packages()?;
    let mut rows = Vec::new();
    for c in COMPONENTS {
        rows.push(format!(
            "| {} | `{}` | {} | {} | {} |",
            c.name,
            c.krate,
            runtime(c),
            device(c),
            run_tests(c.krate)
        ));
    }
    let rdma = rdma_devices();
    let rdma_cell = if rdma.is_empty() {
        "none".to_string()
    } else {
        rdma.join(", ")
    };
    rows.push(format!(
        "| RDMA devices | (transport not built yet) | n/a | {rdma_cell} | n/a |"
    ));
    let host = Command::new("uname")
        .arg("-srm")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    println!(
        "Support matrix on {host}, {} cores\n",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    println!("| component | crate | runtime | device | tests here |");
    println!("| --- | --- | --- | --- | --- |");
    for r in rows {
        println!("{r}");
    }
    Ok(())
}
