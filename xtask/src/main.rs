//! `cargo xtask`: the workspace's set-up, test, demo, benchmark, matrix and fuzz driver.
//!
//! Every command installs the system packages it needs when they are missing and it runs as
//! root (saying so first), so `cargo xtask test` and `cargo xtask demo` work on a fresh
//! machine. Nothing here is needed to *build* the libraries: vendor libraries are loaded at
//! run time.

mod capi;
mod chaos;
mod cluster;
mod compat;
mod features;
mod python;
mod report;
mod scaffold;
mod tidy;
mod upstream;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

type Result<T = ()> = std::result::Result<T, String>;

const USAGE: &str = "\
usage: cargo xtask <command>

  demo                 server and client on loopback: control plane, one-sided WRITE/READ
                       with checksums, and the RPC demo methods
  demo --cluster       etcd started on loopback, two engines that find each other by name
                       through it and move bytes (checksums verified), etcd stopped
  test [--long]        install what is missing, then tidy checks, the single-transport
                       engine checks (`features`) and the whole test suite
                       (--long adds the long-running soak tests and
                       `pip install ./hmc-py` into a new venv)
  bench <transfer|rpc|ucx|shm|rdma|engine|python|kv|plugin|all> [--quick] [--report]
                       benchmarks side by side with iperf3 / tonic / ucx_perftest /
                       memcpy / Mooncake (engine, python); rows as JSON in
                       target/bench-report/data; --report renders the HTML report
  report [--record NAME -- COMMAND...] [--copy-figures DIR]
                       render target/bench-report/index.html (SVG figures) from the
                       recorded JSON without running anything (--record: first run
                       COMMAND and add its tables to bench NAME's record;
                       --copy-figures: copy the figures and the page to DIR)
  matrix [CRATE...] [--json PATH]
                       per crate (all by default): build it alone with and without its
                       default features, run its tests as `test` does (failing tests
                       named); detect runtimes and devices; print the support table
                       (JSON: target/matrix.json)
  gpu-bundle           build the GPU check (CUDA tests, copy bandwidth, device-staged RPC
                       and one-sided transfers) as release binaries in target/gpu-bundle
                       with run.sh, for a GPU machine that has no Rust toolchain
  hw-bundle <cuda|rocm|mlu|musa|ascend|rdma>
                       the same for one backend, in target/hw-bundle/<kind>: its tests and
                       examples; run.sh prints the support-table row it verifies
  rdma-bundle          build the RDMA check (the transport's tests on a real NIC, our bench,
                       ib_write_bw/ib_read_bw beside it) in target/rdma-bundle with run.sh
  fuzz [target] [--seconds N]
                       build the libFuzzer targets in fuzz/ with stable rustc and run each
                       for N seconds (default 60)
  ucx-wheel [--version V]
                       fetch UCX V (default 1.22.0, CUDA-enabled) from PyPI's libucx-cu12
                       wheel into target/ucx-wheel/V and run the UCX tests against it
                       (HMC_UCX_LIB): binding layout, conformance, faults, RPC data plane
  tidy                 the cheap source checks that `test` also runs
  features             hmc-engine checked with each ONE transport feature (tcp, ucx, shm,
                       rdma, plugin) and with none, warnings failing it; `test` also runs
                       it (seconds on a warm target)
  new-backend NAME [--transport|--memory] [--dir DIR]
                       scaffold an out-of-tree backend crate (default ../NAME) that passes
                       the conformance kit on its first `cargo test`
  cluster-test [--quick]
                       hosts as network namespaces (root): etcd, engines, and faults
                       (link down, SIGKILL, address change, SIGSTOP, etcd restart, tc tbf)
                       with figures
  plugin-kit PLUGIN.so [--case NAME]... [--config KEY=VALUE]... [--list]
                       build hmc-plugin-kit and run the conformance kit against a plugin's
                       shared library through the real loader (each case in its own
                       process; prints N passed, M failed and each failure's expected error)
  deps                 install the system packages the build and tests need (apt, as root)
  compat               vLLM 0.33.0's NixlConnector and SGLang 0.5.23's Mooncake and NIXL
                       KV managers between two processes on CPU memory, on hmc.nixl /
                       hmc.mooncake and on the real packages, every byte checked,
                       requests/s side by side (venvs of their own under target/;
                       gigabytes the first time; not part of `test`)
  install --prefix PREFIX [--debug]
                       build libhmc (release unless --debug) and install it for C and C++:
                       lib/libhmc.so.0 (+ libhmc.a), include/hmc/hmc.h and hmc.hpp,
                       lib/pkgconfig/hmc.pc, lib/cmake/hmc (find_package(hmc))
  chaos [--long]       the fault-injection matrix (every fault kind x transport x
                       operation: deadlines, no late bytes, notifications once, recovery,
                       leaks), its table printed and written to target/chaos/*.json;
                       --long: UCX over tcp and shared memory, the RDMA stand-in, the C
                       plugin, three seeds, 1,000 operations a case
  capi-test            only libhmc's C and C++ checks of `test` (headers, examples over
                       tcp and shm, sanitizers, CMake and pkg-config consumers)
";

/// The UCX that `cargo xtask ucx-wheel` checks by default (PyPI `libucx-cu12`).
const UCX_WHEEL_VERSION: &str = "1.22.0";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("demo") if args.iter().any(|a| a == "--cluster") => {
            cluster::cargo_build_node(&root()).and_then(|node| demo::cluster(&node))
        }
        Some("demo") => demo(),
        Some("test") => test(args.iter().any(|a| a == "--long")),
        Some("bench") => bench(&args[1..]),
        Some("report") => report::command(&args[1..]),
        Some("matrix") => matrix(&args[1..]),
        Some("fuzz") => fuzz(&args[1..]),
        Some("gpu-bundle") => gpu_bundle(),
        Some("hw-bundle") => hw_bundle(&args[1..]),
        Some("rdma-bundle") => rdma_bundle::rdma_bundle(),
        Some("tidy") => tidy::run(&root()),
        Some("features") => features::command(&args[1..]),
        Some("compat") => compat::command(),
        Some("chaos") => chaos::command(&args[1..]),
        Some("deps") => ensure_system_packages(),
        Some("install") => capi::install(&args[1..]),
        Some("capi-test") => ensure_system_packages().and_then(|()| capi::test()),
        Some("cluster-test") => cluster::run(&root(), args.iter().any(|a| a == "--quick")),
        Some("ucx-wheel") => ucx_wheel(&args[1..]),
        Some("new-backend") => scaffold::run(&root(), &args[1..]).map(drop),
        Some("plugin-kit") => plugin_kit(&args[1..]),
        Some("-h" | "--help" | "help") | None => {
            print!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(format!("unknown command `{other}`\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `cargo xtask plugin-kit PLUGIN.so ARGS...`: builds hmc-plugin-kit (release) and runs it
/// from the caller's directory, so a relative plugin path means what the author typed.
fn plugin_kit(args: &[String]) -> Result {
    if args.is_empty() {
        return Err(
            "plugin-kit needs the plugin's .so: cargo xtask plugin-kit PATH [--case NAME]".into(),
        );
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let built = Command::new(&cargo)
        .current_dir(root())
        .args(["build", "--release", "-q", "-p", "hmc-plugin-kit"])
        .status()
        .map_err(|e| format!("running {cargo}: {e}"))?;
    if !built.success() {
        return Err("building hmc-plugin-kit failed".into());
    }
    let kit = root().join("target/release/hmc-plugin-kit");
    let status = Command::new(&kit)
        .args(args)
        .status()
        .map_err(|e| format!("running {}: {e}", kit.display()))?;
    if status.success() {
        Ok(())
    } else {
        Err("the plugin failed the kit (each failure is listed above)".into())
    }
}

/// The workspace root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

fn run(cmd: &mut Command) -> Result {
    eprintln!("xtask: running {cmd:?}");
    let status = cmd
        .status()
        .map_err(|e| format!("could not start {cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed with {status}"))
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.trim_ascii() == b"0")
        .unwrap_or(false)
}

/// A system package the suite needs, and how to tell whether it is present.
struct SystemPackage {
    name: &'static str,
    why: &'static str,
    present: fn() -> bool,
}

fn file_exists_any(paths: &[&str]) -> bool {
    paths.iter().any(|p| Path::new(p).exists())
}

fn on_path(bin: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|d| d.join(bin).is_file()))
        .unwrap_or(false)
}

fn lib_present(name: &str) -> bool {
    Command::new("ldconfig")
        .arg("-p")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(name))
        .unwrap_or(false)
}

const PACKAGES: &[SystemPackage] = &[
    SystemPackage {
        name: "libucx0",
        why: "UCX transport tests load libucp.so.0",
        present: || lib_present("libucp.so.0"),
    },
    SystemPackage {
        name: "libucx-dev",
        why: "the UCX binding test checks struct layouts against ucp.h",
        present: || file_exists_any(&["/usr/include/ucp/api/ucp.h"]),
    },
    SystemPackage {
        name: "ucx-utils",
        why: "ucx_perftest is the UCX benchmark baseline",
        present: || on_path("ucx_perftest"),
    },
    SystemPackage {
        name: "iperf3",
        why: "iperf3 is the TCP benchmark baseline",
        present: || on_path("iperf3"),
    },
    SystemPackage {
        name: "libibverbs1",
        why: "the RDMA binding test checks its symbols against rdma-core's libibverbs.so.1",
        present: || lib_present("libibverbs.so.1"),
    },
    SystemPackage {
        name: "libibverbs-dev",
        why: "the RDMA binding test and its libibverbs stand-in are compiled against verbs.h",
        present: || file_exists_any(&["/usr/include/infiniband/verbs.h"]),
    },
    SystemPackage {
        name: "etcd-server",
        why: "hmc-meta's and the engine's discovery tests start etcd",
        present: || on_path("etcd"),
    },
    SystemPackage {
        name: "protobuf-compiler",
        why: "etcd-client (hmc-meta) compiles etcd's .proto files with protoc at build time",
        present: || on_path("protoc"),
    },
    SystemPackage {
        name: "libprotobuf-dev",
        why: "protoc needs protobuf's well-known .proto files to compile etcd's",
        present: || file_exists_any(&["/usr/include/google/protobuf/descriptor.proto"]),
    },
    SystemPackage {
        name: "python3-venv",
        why: "the Python package's tests run in a venv under target/",
        present: || {
            Command::new("python3")
                .args(["-c", "import ensurepip, venv"])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        },
    },
    SystemPackage {
        name: "python3-pip",
        why: "pip installs maturin, pytest and numpy into that venv",
        present: || {
            Command::new("python3")
                .args(["-m", "pip", "--version"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        },
    },
    SystemPackage {
        name: "gcc",
        why: "the device ABI shims are compiled at test time",
        present: || on_path("cc"),
    },
    SystemPackage {
        name: "g++",
        why: "the C++ header and examples of libhmc are compiled at test time",
        present: || on_path("g++"),
    },
    SystemPackage {
        name: "cmake",
        why: "libhmc's CMake package is checked by building the examples with it",
        present: || on_path("cmake"),
    },
    SystemPackage {
        name: "pkg-config",
        why: "libhmc's hmc.pc is checked by building an example with its flags",
        present: || on_path("pkg-config"),
    },
];

/// Installs missing system packages with apt when running as root; otherwise says what to
/// install.
fn ensure_system_packages() -> Result {
    let missing: Vec<&SystemPackage> = PACKAGES.iter().filter(|p| !(p.present)()).collect();
    if missing.is_empty() {
        return Ok(());
    }
    for p in &missing {
        eprintln!("xtask: system package {} is missing ({})", p.name, p.why);
    }
    let names: Vec<&str> = missing.iter().map(|p| p.name).collect();
    if !is_root() || !on_path("apt-get") {
        return Err(format!(
            "install them first: sudo apt-get install -y {}",
            names.join(" ")
        ));
    }
    eprintln!(
        "xtask: installing {} with apt-get (running as root)",
        names.join(" ")
    );
    run(Command::new("apt-get").args(["update", "-qq"]))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&names)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

fn test(long: bool) -> Result {
    ensure_system_packages()?;
    tidy::run(&root())?;
    // The engine with each transport alone (cargo checks: seconds on a warm target).
    features::run()?;
    for mut step in test_steps(&["--workspace"], true, long) {
        run(&mut step)?;
    }
    // libhmc from C and C++: headers, examples, sanitizers, CMake and pkg-config consumers.
    capi::test()?;
    // Engines on three network namespaces, a link cut and a process killed (root only).
    cluster::run(&root(), true)?;
    // `cargo xtask demo --cluster`, as a user runs it (etcd started and stopped by it).
    demo::cluster(&root().join("target/debug/examples/cluster_node"))?;
    // The Python package: its wheel into target/py-venv, then pytest.
    python::test(long)?;
    if long {
        // `pip install ./hmc-py` as a user runs it (minutes: a release build).
        python::pip_install()?;
    }
    Ok(())
}

/// The cargo commands of `cargo xtask test` for `scope` (`--workspace`, or `-p <crate>`
/// for `cargo xtask matrix`, which runs the same ones per crate so that both give the
/// same verdict). `lib`: the scope has a library (its tests and doc tests run).
fn test_steps(scope: &[&str], lib: bool, long: bool) -> Vec<Command> {
    // Benchmarks and examples are built first (so they cannot rot, and so that the tests
    // that run an example find it in target/<profile>/examples; `cargo test
    // --all-targets` would build examples only as test harnesses). Benchmarks are `cargo
    // xtask bench`'s job to run.
    let mut build = cargo();
    build
        .args(["build"])
        .args(scope)
        .args(["--benches", "--examples"]);
    let mut tests = cargo();
    tests.arg("test").args(scope);
    if lib {
        tests.arg("--lib");
    }
    tests.args(["--bins", "--tests"]);
    if long {
        tests.env("HMC_LONG_TESTS", "1");
    }
    let mut steps = vec![build, tests];
    // Doc tests are not part of --all-targets.
    if lib {
        let mut doc = cargo();
        doc.arg("test").args(scope).arg("--doc");
        steps.push(doc);
    }
    steps
}

fn bench(args: &[String]) -> Result {
    ensure_system_packages()?;
    let quick = args.iter().any(|a| a == "--quick");
    let which = args.first().map(String::as_str).unwrap_or("all");
    // (name, crate, bench target)
    const TRANSFER: (&str, &str, &str) = ("transfer", "hmc-transport-tcp", "transfer");
    const UCX: (&str, &str, &str) = ("ucx", "hmc-transport-ucx", "rma");
    const SHM: (&str, &str, &str) = ("shm", "hmc-transport-shm", "shm");
    const RDMA: (&str, &str, &str) = ("rdma", "hmc-transport-rdma", "overhead");
    const PLUGIN: (&str, &str, &str) = ("plugin", "hmc-plugin", "plugin_vs_static");
    let benches: &[(&str, &str, &str)] = match which {
        "transfer" => &[TRANSFER],
        "ucx" => &[UCX],
        "shm" => &[SHM],
        "rdma" => &[RDMA],
        "plugin" => &[PLUGIN],
        "rpc" | "engine" | "python" | "kv" => &[],
        "all" => &[TRANSFER, UCX, SHM, RDMA, PLUGIN],
        other => {
            return Err(format!(
                "unknown benchmark `{other}`; choose transfer, rpc, ucx, shm, rdma, engine, python, kv, plugin or all"
            ));
        }
    };
    let mut rec = report::Recorder::new(report::report_dir());
    for (name, krate, bench) in benches {
        // Built first, so that the recorded wall time and load are the benchmark's own.
        rec.build(cargo().args(["bench", "-p", krate, "--bench", bench, "--no-run"]))?;
        let mut cmd = cargo();
        cmd.args(["bench", "-p", krate, "--bench", bench, "--"]);
        if quick {
            // The TCP bench takes a flag; the UCX bench reads the environment.
            cmd.arg("--quick").env("HMC_BENCH_QUICK", "1");
        }
        rec.run(name, &mut cmd)?;
    }
    if which == "rpc" || which == "all" {
        bench_rpc(&mut rec, quick)?;
    }
    if which == "engine" || which == "all" {
        bench_engine(&mut rec, quick)?;
    }
    if which == "shm" || which == "all" {
        bench_rpc_shm(&mut rec, quick)?;
    }
    if which == "python" || which == "all" {
        python::bench(&mut rec, quick)?;
    }
    if which == "kv" || which == "all" {
        python::bench_kv(&mut rec, quick)?;
    }
    rec.finish();
    if args.iter().any(|a| a == "--report") {
        let index = report::render(&report::report_dir())?;
        eprintln!("xtask: report written to {}", index.display());
    }
    Ok(())
}

/// HMC_BUFFER RPC echo with the shared-memory data plane beside the TCP one and the
/// TCP_STREAM path, 1 MiB payloads, client and server processes on this host.
fn bench_rpc_shm(rec: &mut report::Recorder, quick: bool) -> Result {
    rec.build(cargo().args(["build", "--release", "-p", "hmc-rpc-tools", "--bins"]))?;
    rec.run(
        "shm",
        &mut data_plane_bench("shm,tcp", "target/hmc-rpc-bench-dp-shm.csv", quick),
    )
}

/// `hmc-rpc-bench`'s HMC_BUFFER pass over `planes`: 1 MiB echo, 1 and 8 clients x 1 and 8
/// in flight, beside the TCP_STREAM path, CSV to `csv`.
fn data_plane_bench(planes: &str, csv: &str, quick: bool) -> Command {
    let mut cmd = Command::new(root().join("target/release/hmc-rpc-bench"));
    cmd.current_dir(root())
        .args(["--no-tonic", "--sizes", "1048576"])
        .args(["--clients", "1,8", "--depths", "1,8"])
        .args(["--data-planes", planes, "--csv", csv])
        .args(["--seconds", if quick { "0.5" } else { "2" }]);
    cmd
}

/// The Mooncake Transfer Engine the engine bench runs beside (PyPI, CPU-only build).
const MOONCAKE: &str = "mooncake-transfer-engine-non-cuda==0.3.13.post1";

/// What the bench drivers import beside the standard library and the system's own package
/// (`mooncake`, `nixl_cu12`, `hmc`: the wheel is installed into every bench venv): every
/// bench venv gets these. `bench_drivers_import_only_what_their_venvs_hold` keeps the list
/// and the drivers' imports together.
const BENCH_DRIVER_PACKAGES: &[&str] = &["numpy"];

/// Python that imports `system` and every [`BENCH_DRIVER_PACKAGES`] module.
fn imports_of(system: &str) -> String {
    std::iter::once(system)
        .chain(BENCH_DRIVER_PACKAGES.iter().copied())
        .map(|m| format!("import {m}\n"))
        .collect()
}

#[cfg(test)]
mod bench_env_tests {
    use super::*;

    /// The third-party modules a bench driver file imports at any depth (`import x`, `from
    /// x import`), the standard library's left out (as this machine's python3 lists it).
    fn third_party_imports(file: &Path) -> Vec<String> {
        let out = Command::new("python3")
            .arg("-c")
            .arg(
                "import ast, sys\n\
                 t = ast.parse(open(sys.argv[1]).read())\n\
                 names = {a.name.split('.')[0] for n in ast.walk(t) if isinstance(n, ast.Import) for a in n.names}\n\
                 names |= {n.module.split('.')[0] for n in ast.walk(t) if isinstance(n, ast.ImportFrom) and n.module and not n.level}\n\
                 print(' '.join(sorted(names - set(sys.stdlib_module_names))))",
            )
            .arg(file)
            .output()
            .expect("python3");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .unwrap()
            .split_whitespace()
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn bench_drivers_import_only_what_their_venvs_hold() {
        // The systems' own packages, installed per venv (hmc's wheel into every one); the
        // rest must be in BENCH_DRIVER_PACKAGES, which every bench venv gets, or a module
        // beside the drivers (`_cpu.py`: the script's folder is first on sys.path).
        let own = ["hmc", "mooncake", "nixl_cu12"];
        let bench = root().join("hmc-py/bench");
        for f in ["bench_kv.py", "bench_python.py", "bench_restart.py"] {
            let file = bench.join(f);
            for m in third_party_imports(&file) {
                let beside = bench.join(format!("{m}.py")).is_file();
                assert!(
                    own.contains(&m.as_str())
                        || BENCH_DRIVER_PACKAGES.contains(&m.as_str())
                        || beside,
                    "{f} imports `{m}`, which the bench venvs do not install: add it to BENCH_DRIVER_PACKAGES"
                );
            }
        }
    }
}

/// `target/mooncake-venv` with Mooncake and what the drivers import (made on first use), or
/// why not.
fn mooncake_python() -> std::result::Result<PathBuf, String> {
    let venv = root().join("target/mooncake-venv");
    let py = venv.join("bin/python");
    let ready = || {
        Command::new(&py)
            .arg("-c")
            .arg(imports_of("mooncake.engine"))
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if ready() {
        return Ok(py);
    }
    eprintln!("xtask: installing {MOONCAKE} into {}", venv.display());
    run(Command::new("python3").arg("-m").arg("venv").arg(&venv))
        .map_err(|e| format!("python3 -m venv: {e}"))?;
    run(Command::new(venv.join("bin/pip"))
        .args(["install", "-q", MOONCAKE])
        .args(BENCH_DRIVER_PACKAGES))
    .map_err(|e| format!("pip install {MOONCAKE}: {e}"))?;
    if ready() {
        Ok(py)
    } else {
        Err("mooncake.engine or a driver's import does not import after the install".into())
    }
}

/// The engine bench: hmc-engine over TCP, then over UCX shared memory, each beside
/// Mooncake's tcp protocol, two processes; then its connection sweep over TCP.
fn bench_engine(rec: &mut report::Recorder, quick: bool) -> Result {
    let py = mooncake_python()
        .map_err(|why| eprintln!("xtask: the engine bench runs without Mooncake: {why}"))
        .ok();
    rec.build(cargo().args(["bench", "-p", "hmc-engine", "--bench", "engine", "--no-run"]))?;
    for (transport, tls) in [("tcp", None), ("ucx", Some("posix,cma,self"))] {
        let mut cmd = cargo();
        cmd.args(["bench", "-p", "hmc-engine", "--bench", "engine", "--"])
            .args(["--transport", transport]);
        if let Some(tls) = tls {
            cmd.env("UCX_TLS", tls);
        }
        if let Some(py) = &py {
            cmd.arg("--mooncake-python").arg(py);
        }
        if quick {
            cmd.arg("--quick");
        }
        rec.run("engine", &mut cmd)?;
    }
    // The connection sweep over TCP: 1 to 1,024 initiator engines and on until connects
    // fail (quick: to 1,024).
    let mut cmd = cargo();
    cmd.args(["bench", "-p", "hmc-engine", "--bench", "engine", "--"])
        .arg("--conn-sweep")
        .arg(if quick {
            "1,2,4,8,16,32,64,128,256,512,1024"
        } else {
            "1,2,4,8,16,32,64,128,256,512,1024,max"
        })
        .args(["--seconds", if quick { "0.5" } else { "2" }]);
    rec.run("engine", &mut cmd)
}

/// `--tonic-bin` of the tonic peer built from `manifest` into `target`, or `--no-tonic`
/// where its source is absent.
fn with_tonic(cmd: &mut Command, manifest: &Path, target: &Path) {
    if manifest.exists() {
        cmd.arg("--tonic-bin")
            .arg(target.join("release/tonic-echo"));
    } else {
        cmd.arg("--no-tonic");
    }
}

fn bench_rpc(rec: &mut report::Recorder, quick: bool) -> Result {
    let tonic_target = root().join("target/tonic-peer");
    let manifest = root().join("../shared/peers/tonic-echo/Cargo.toml");
    if manifest.exists() {
        rec.build(
            cargo()
                .args(["build", "--release", "--manifest-path"])
                .arg(&manifest)
                .env("CARGO_TARGET_DIR", &tonic_target),
        )?;
    } else {
        eprintln!(
            "xtask: {} not found; the RPC bench runs without the tonic column",
            manifest.display()
        );
    }
    rec.build(cargo().args(["build", "--release", "-p", "hmc-rpc-tools", "--bins"]))?;
    let mut cmd = Command::new(root().join("target/release/hmc-rpc-bench"));
    cmd.current_dir(root())
        .args(["--csv", "target/hmc-rpc-bench.csv"]);
    with_tonic(&mut cmd, &manifest, &tonic_target);
    cmd.args(["--seconds", if quick { "0.5" } else { "2" }]);
    rec.run("rpc", &mut cmd)?;
    // The 1 MiB echo of hmc-rpc and tonic beside iperf3 moving bytes both ways: five
    // alternated rounds, medians of the rates, the share of iperf3's and CPU per GiB.
    let mut cmd = Command::new(root().join("target/release/hmc-rpc-bench"));
    cmd.current_dir(root())
        .args(["--vs-iperf3", "5", "--sizes", "1048576"])
        .args(["--clients", "1,8", "--depths", "1,8"]);
    with_tonic(&mut cmd, &manifest, &tonic_target);
    cmd.args(["--seconds", if quick { "0.5" } else { "2" }]);
    rec.run("rpc", &mut cmd)?;
    // HMC_BUFFER rows: the data plane over our TCP communicator and over UCX, beside the
    // TCP_STREAM path and `ucx_perftest -t tag_bw` on the same UCX_TLS; once over UCX's TCP
    // transport and once over shared memory.
    for tls in ["tcp", "posix,cma,self"] {
        let csv = format!("target/hmc-rpc-bench-dp-{}.csv", tls.replace(',', "-"));
        let mut cmd = data_plane_bench("tcp,ucx", &csv, quick);
        cmd.env("UCX_TLS", tls);
        rec.run("rpc", &mut cmd)?;
    }
    // The connection sweep, 1 to 1,024 connections and on until connects fail (quick:
    // to 1,024).
    let mut cmd = Command::new(root().join("target/release/hmc-rpc-bench"));
    cmd.current_dir(root())
        .arg(if quick {
            "--conn-sweep=1,2,4,8,16,32,64,128,256,512,1024"
        } else {
            "--conn-sweep"
        })
        .args(["--seconds", if quick { "0.5" } else { "2" }]);
    rec.run("rpc", &mut cmd)
}

fn demo() -> Result {
    run(cargo().args([
        "build",
        "--release",
        "-p",
        "hmc-transport-tcp",
        "-p",
        "hmc-rpc-tools",
        "--bins",
        // The peer binary is not a default feature of the library.
        "--features",
        "hmc-transport-tcp/peer-bin",
    ]))?;
    let bin = |name: &str| root().join("target/release").join(name);
    demo::one_sided(&bin("hmc-tcp-peer"))?;
    demo::rpc(&bin("hmc-rpc-server"), &bin("hmc-rpc-client"))
}

mod demo;
mod matrix;
mod rdma_bundle;

fn matrix(args: &[String]) -> Result {
    matrix::run(args)
}

fn fuzz(args: &[String]) -> Result {
    let fuzz_dir = root().join("fuzz");
    if !fuzz_dir.join("Cargo.toml").exists() {
        return Err("no fuzz/ crate in this checkout".into());
    }
    let seconds = args
        .windows(2)
        .find(|w| w[0] == "--seconds")
        .map(|w| w[1].clone())
        .unwrap_or_else(|| "60".into());
    let targets: Vec<String> = match args.first().filter(|a| !a.starts_with("--")) {
        Some(t) => vec![t.clone()],
        None => std::fs::read_dir(fuzz_dir.join("fuzz_targets"))
            .map_err(|e| format!("listing fuzz targets: {e}"))?
            .filter_map(|e| {
                e.ok()?
                    .path()
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
            })
            .collect(),
    };
    // libFuzzer instrumentation through stable rustc's codegen flags, so neither cargo-fuzz
    // nor a nightly toolchain is needed (the flags are the ones cargo-fuzz passes).
    let target_dir = root().join("target/fuzz");
    let rustflags = "--cfg fuzzing -Cpasses=sancov-module \
        -Cllvm-args=-sanitizer-coverage-level=4 \
        -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
        -Cllvm-args=-sanitizer-coverage-pc-table \
        -Cllvm-args=-sanitizer-coverage-trace-compares -Cdebug-assertions -Coverflow-checks";
    // An explicit --target keeps RUSTFLAGS away from build scripts and proc macros, which
    // must not be instrumented (they link without libFuzzer).
    let host = Command::new("rustc")
        .arg("-vV")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        })
        .ok_or("could not read the host triple from `rustc -vV`")?;
    run(cargo()
        .current_dir(&fuzz_dir)
        .args(["build", "--release", "--bins", "--target", &host])
        .env(
            "RUSTFLAGS",
            rustflags.split_whitespace().collect::<Vec<_>>().join(" "),
        )
        .env("CARGO_TARGET_DIR", &target_dir))?;
    for t in targets {
        let corpus = target_dir.join("corpus").join(&t);
        std::fs::create_dir_all(&corpus)
            .map_err(|e| format!("creating {}: {e}", corpus.display()))?;
        run(
            Command::new(target_dir.join(&host).join("release").join(&t))
                .arg(&corpus)
                .arg(format!("-max_total_time={seconds}"))
                .arg("-max_len=65536"),
        )?;
    }
    Ok(())
}

/// The GPU check (`cargo xtask hw-bundle cuda`) in `target/gpu-bundle/`, where the README
/// and the device tool's notes have always found it.
fn gpu_bundle() -> Result {
    bundle::build("cuda", &root().join("target/gpu-bundle"))
}

fn hw_bundle(args: &[String]) -> Result {
    let kind = args
        .first()
        .ok_or_else(|| format!("hw-bundle needs a kind: {}", bundle::kinds().join("|")))?;
    bundle::build(kind, &root().join("target/hw-bundle").join(kind))
}

mod bundle;

/// Fetches a newer UCX than Debian's from PyPI (RAPIDS' `libucx-cu12` wheel: libucp, its
/// transports including CUDA ones, headers and `ucx_perftest`) and runs the UCX crate's
/// tests and the RPC data-plane tests with it through `HMC_UCX_LIB`, checking its headers
/// with `HMC_UCX_INCLUDE` and that it is the library loaded (`HMC_EXPECT_UCX_VERSION`).
fn ucx_wheel(args: &[String]) -> Result {
    ensure_system_packages()?;
    let version = args
        .iter()
        .position(|a| a == "--version")
        .and_then(|i| args.get(i + 1))
        .map_or(UCX_WHEEL_VERSION, String::as_str);
    let dir = root().join("target/ucx-wheel").join(version);
    let lib = dir.join("libucx/lib/libucp.so.0");
    if !lib.exists() {
        let dl = dir.join("download");
        std::fs::create_dir_all(&dl).map_err(|e| format!("creating {}: {e}", dl.display()))?;
        run(Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "-q",
            ])
            .arg(format!("libucx-cu12=={version}"))
            .arg("-d")
            .arg(&dl))
        .map_err(|e| {
            format!("{e}\n(needs python3 with pip and access to PyPI: apt-get install python3-pip)")
        })?;
        let wheel = std::fs::read_dir(&dl)
            .map_err(|e| format!("reading {}: {e}", dl.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|x| x == "whl"))
            .ok_or(format!("pip left no wheel in {}", dl.display()))?;
        run(Command::new("python3")
            .args([
                "-c",
                "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])",
            ])
            .arg(&wheel)
            .arg(&dir))?;
        if !lib.exists() {
            return Err(format!("the wheel has no {}", lib.display()));
        }
    }
    eprintln!("xtask: testing against UCX {version} at {}", lib.display());
    // Two runs: `--tests` would apply to every package named in one command line.
    let with_wheel = |cmd: &mut Command| {
        cmd.env("HMC_UCX_LIB", &lib)
            .env("HMC_UCX_INCLUDE", dir.join("libucx/include"))
            .env("HMC_EXPECT_UCX_VERSION", version);
    };
    let mut ucx = cargo();
    ucx.args(["test", "-p", "hmc-transport-ucx", "--tests"]);
    with_wheel(&mut ucx);
    run(&mut ucx)?;
    let mut rpc = cargo();
    rpc.args(["test", "-p", "hmc-rpc", "--test", "data_plane_ucx"]);
    with_wheel(&mut rpc);
    run(&mut rpc)?;
    // The binaries' tests live with the binaries, in hmc-rpc-tools.
    let mut tools = cargo();
    tools.args([
        "test",
        "-p",
        "hmc-rpc-tools",
        "--test",
        "data_plane_processes",
    ]);
    with_wheel(&mut tools);
    run(&mut tools)
}

/// Builds bench `bench` of `krate` (the bench profile) and returns its executable.
fn bench_binary(krate: &str, bench: &str) -> Result<PathBuf> {
    let mut build = cargo();
    build.args([
        "bench",
        "--no-run",
        "--message-format=json",
        "-p",
        krate,
        "--bench",
        bench,
    ]);
    let out = build
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cargo bench --no-run: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "building {krate}'s bench {bench} failed (its errors are above)"
        ));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| json_string_field(line, "executable"))
        .map(PathBuf::from)
        .next_back()
        .ok_or(format!(
            "cargo built no executable for {krate}'s bench {bench}"
        ))
}

/// The value of a top-level `"field":"value"` in one line of cargo's JSON messages (paths
/// here never hold quotes or escapes).
fn json_string_field<'a>(line: &'a str, field: &str) -> Option<&'a str> {
    let key = format!("\"{field}\":\"");
    let start = line.find(&key)? + key.len();
    let end = line[start..].find('"')? + start;
    Some(&line[start..end])
}
