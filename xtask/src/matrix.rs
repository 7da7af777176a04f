//! `cargo xtask matrix`: per crate, builds it alone with and without its default features and runs its tests exactly as `cargo xtask test` does; detects the runtimes and devices of this machine; prints the support table (markdown) and writes it as JSON.
//!
//! The verdict of a crate's tests is the verdict `cargo xtask test` gives them: the same
//! cargo steps ([`crate::test_steps`]), scoped with `-p`, plus `--no-fail-fast` so that
//! every failing test is named, not only the first binary's.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Result, cargo, lib_present};

/// One row of the runtime/device table.
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

/// How one cargo step went.
#[derive(Debug, PartialEq)]
enum Step {
    Ok,
    /// The first error lines cargo printed.
    Failed(String),
}

impl Step {
    fn cell(&self) -> String {
        match self {
            Step::Ok => "ok".into(),
            Step::Failed(why) => format!("FAILED: {}", why.replace('|', "/").replace('\n', " ")),
        }
    }
}

/// A crate's tests, run as `cargo xtask test` runs them.
#[derive(Debug, Default, PartialEq)]
struct Tests {
    passed: u64,
    failed: u64,
    ignored: u64,
    /// Test names that printed FAILED, and test binaries that ended without a result.
    failing: Vec<String>,
    /// Set when a step failed: which one and its first error lines.
    error: Option<String>,
}

impl Tests {
    fn verdict(&self) -> &'static str {
        if self.error.is_none() {
            "passed"
        } else {
            "FAILED"
        }
    }

    fn cell(&self) -> String {
        match &self.error {
            None => format!("{} passed, {} ignored", self.passed, self.ignored),
            Some(_) if !self.failing.is_empty() => format!(
                "FAILED: {} failed, {} passed ({})",
                self.failing.len(),
                self.passed,
                self.failing.join(", ")
            ),
            Some(why) => format!("FAILED: {}", why.replace('|', "/").replace('\n', " ")),
        }
    }
}

struct CrateRow {
    krate: String,
    build_default: Step,
    build_no_default: Step,
    tests: Tests,
}

/// Sums the `test result:` lines of a `cargo test` output.
fn count_results(stdout: &str) -> (u64, u64, u64) {
    let (mut passed, mut failed, mut ignored) = (0, 0, 0);
    for line in stdout.lines().filter(|l| l.starts_with("test result:")) {
        let num = |key: &str| -> u64 {
            line.split(';')
                .find_map(|p| {
                    p.trim()
                        .strip_suffix(key)
                        .and_then(|n| n.trim().rsplit(' ').next()?.parse().ok())
                })
                .unwrap_or(0)
        };
        passed += num(" passed");
        failed += num(" failed");
        ignored += num(" ignored");
    }
    (passed, failed, ignored)
}

/// The tests a `cargo test` output names as failed, and the binaries cargo reports as
/// failed without naming a test (a crash, a timeout kill).
fn failing_tests(stdout: &str, stderr: &str) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for line in stdout.lines() {
        if let Some(name) = line
            .strip_prefix("test ")
            .and_then(|l| l.strip_suffix(" ... FAILED"))
            && !names.iter().any(|n| n == name)
        {
            names.push(name.to_string());
        }
    }
    // `error: test failed, to rerun pass `-p x --test y`` once per failed binary; where a
    // binary named no failing test (it crashed), name the binary.
    let named_binaries = stdout
        .lines()
        .filter(|l| l.starts_with("test result: FAILED"))
        .count();
    let failed_binaries: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("error: test failed, to rerun pass `"))
        .filter_map(|l| l.strip_suffix('`'))
        .collect();
    if failed_binaries.len() > named_binaries {
        for b in failed_binaries {
            names.push(format!("[{b}: ended without a test result]"));
        }
    }
    names
}

/// The first `error` line of a cargo output and the lines after it, up to `max`.
fn first_error(stderr: &str, max: usize) -> String {
    let lines: Vec<&str> = stderr.lines().collect();
    match lines.iter().position(|l| l.starts_with("error")) {
        Some(at) => lines[at..]
            .iter()
            .take(max)
            .copied()
            .collect::<Vec<_>>()
            .join("\n"),
        None => lines
            .iter()
            .rev()
            .take(max)
            .rev()
            .copied()
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

fn step(cmd: &mut Command) -> (Step, String, String) {
    eprintln!("xtask: matrix: {cmd:?}");
    match cmd.output() {
        Ok(out) => {
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            let s = if out.status.success() {
                Step::Ok
            } else {
                Step::Failed(first_error(&stderr, 4))
            };
            (s, stdout, stderr)
        }
        Err(e) => (
            Step::Failed(format!("could not run cargo: {e}")),
            String::new(),
            String::new(),
        ),
    }
}

/// The workspace's crates: every `hmc-*` member, then xtask.
fn crates(root: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("hmc-") && root.join(n).join("Cargo.toml").exists())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names.push("xtask".into());
    names
}

fn check_crate(root: &Path, krate: &str) -> CrateRow {
    let scope = ["-p", krate];
    let (build_default, ..) = step(cargo().arg("build").args(scope));
    let (build_no_default, ..) = step(
        cargo()
            .arg("build")
            .args(scope)
            .arg("--no-default-features"),
    );
    let lib = root.join(krate).join("src/lib.rs").exists();
    let mut tests = Tests::default();
    for mut cmd in crate::test_steps(&scope, lib, false) {
        let is_test = cmd.get_args().next().is_some_and(|a| a == "test");
        if is_test {
            cmd.arg("--no-fail-fast");
        }
        cmd.env_remove("HMC_LONG_TESTS");
        let (s, stdout, stderr) = step(&mut cmd);
        let (p, f, i) = count_results(&stdout);
        tests.passed += p;
        tests.failed += f;
        tests.ignored += i;
        tests.failing.extend(failing_tests(&stdout, &stderr));
        if let Step::Failed(why) = s {
            let what = cmd
                .get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(" ");
            // The whole output, for the failures' messages.
            let log = root.join("target/matrix-logs").join(format!("{krate}.log"));
            let _ = std::fs::create_dir_all(log.parent().expect("a folder"));
            let saved = std::fs::write(&log, format!("$ cargo {what}\n{stdout}\n{stderr}")).is_ok();
            tests.error = Some(format!("`cargo {what}`: {why}"));
            if saved {
                eprintln!("xtask: matrix: {krate}: output in {}", log.display());
            }
            break;
        }
    }
    let row = CrateRow {
        krate: krate.to_string(),
        build_default,
        build_no_default,
        tests,
    };
    eprintln!(
        "xtask: matrix: {krate}: build {}, --no-default-features {}, tests {}",
        row.build_default.cell(),
        row.build_no_default.cell(),
        row.tests.cell()
    );
    for name in &row.tests.failing {
        eprintln!("xtask: matrix: {krate}: FAILED {name}");
    }
    row
}

fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json_step(s: &Step) -> String {
    match s {
        Step::Ok => "{\"ok\":true}".into(),
        Step::Failed(why) => format!("{{\"ok\":false,\"error\":{}}}", json_str(why)),
    }
}

fn to_json(host: &str, rows: &[CrateRow], components: &[(&Component, String, String)]) -> String {
    let list = |items: Vec<String>| format!("[{}]", items.join(","));
    let crates = rows
        .iter()
        .map(|r| {
            let t = &r.tests;
            format!(
                "{{\"crate\":{},\"build_default_features\":{},\"build_no_default_features\":{},\
                 \"tests\":{{\"verdict\":{},\"passed\":{},\"failed\":{},\"ignored\":{},\
                 \"failing\":{},\"error\":{}}}}}",
                json_str(&r.krate),
                json_step(&r.build_default),
                json_step(&r.build_no_default),
                json_str(t.verdict()),
                t.passed,
                t.failed,
                t.ignored,
                list(t.failing.iter().map(|n| json_str(n)).collect()),
                t.error.as_deref().map_or("null".into(), json_str),
            )
        })
        .collect();
    let comps = components
        .iter()
        .map(|(c, rt, dev)| {
            format!(
                "{{\"component\":{},\"crate\":{},\"runtime\":{},\"device\":{}}}",
                json_str(c.name),
                json_str(c.krate),
                json_str(rt),
                json_str(dev)
            )
        })
        .collect();
    format!(
        "{{\"host\":{},\"crates\":{},\"components\":{},\"rdma_devices\":{}}}\n",
        json_str(host),
        list(crates),
        list(comps),
        list(rdma_devices().iter().map(|d| json_str(d)).collect())
    )
}

/// Builds and tests every crate, prints the support table, writes the JSON; fails when any
/// crate failed, naming them.
pub fn run(args: &[String]) -> Result {
    crate::ensure_system_packages()?;
    let root = crate::root();
    let json_path = args
        .iter()
        .position(|a| a == "--json")
        .and_then(|i| args.get(i + 1))
        .map_or_else(|| root.join("target/matrix.json"), PathBuf::from);
    // Crates named on the command line (all by default).
    let only: Vec<&String> = args
        .iter()
        .enumerate()
        .filter(|(i, a)| !a.starts_with("--") && (*i == 0 || args[i - 1] != "--json"))
        .map(|(_, a)| a)
        .collect();
    let all = crates(&root);
    if let Some(unknown) = only.iter().find(|k| !all.contains(k)) {
        return Err(format!(
            "no crate `{unknown}` in this workspace; crates: {}",
            all.join(", ")
        ));
    }
    let rows: Vec<CrateRow> = all
        .iter()
        .filter(|k| only.is_empty() || only.contains(k))
        .map(|k| check_crate(&root, k))
        .collect();
    let components: Vec<(&Component, String, String)> = COMPONENTS
        .iter()
        .map(|c| (c, runtime(c), device(c)))
        .collect();
    let host = format!(
        "{}, {} cores",
        Command::new("uname")
            .arg("-srm")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default(),
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );

    println!("Support matrix on {host}\n");
    println!(
        "| crate | builds alone (default features) | builds alone (`--no-default-features`) | tests (as `cargo xtask test` runs them) |"
    );
    println!("| --- | --- | --- | --- |");
    for r in &rows {
        println!(
            "| `{}` | {} | {} | {} |",
            r.krate,
            r.build_default.cell(),
            r.build_no_default.cell(),
            r.tests.cell()
        );
    }
    println!("\n| component | crate | runtime | device |");
    println!("| --- | --- | --- | --- |");
    for (c, rt, dev) in &components {
        println!("| {} | `{}` | {rt} | {dev} |", c.name, c.krate);
    }
    let rdma = rdma_devices();
    println!(
        "| RDMA devices | - | n/a | {} |",
        if rdma.is_empty() {
            "none".to_string()
        } else {
            rdma.join(", ")
        }
    );

    if let Some(dir) = json_path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    std::fs::write(&json_path, to_json(&host, &rows, &components))
        .map_err(|e| format!("writing {}: {e}", json_path.display()))?;
    eprintln!("xtask: matrix: JSON in {}", json_path.display());
    let failed: Vec<&str> = rows
        .iter()
        .filter(|r| {
            r.tests.error.is_some() || r.build_default != Step::Ok || r.build_no_default != Step::Ok
        })
        .map(|r| r.krate.as_str())
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("the matrix has failures: {}", failed.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STDOUT: &str = "\
running 3 tests
test a::ok ... ok
test a::broken ... FAILED
test b::ignored ... ignored
test result: FAILED. 1 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s

running 2 tests
test c::fine ... ok
test c::also_fine ... ok
test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s
";

    #[test]
    fn results_are_summed_and_failing_tests_named() {
        assert_eq!(count_results(STDOUT), (3, 1, 1));
        let stderr = "error: test failed, to rerun pass `-p x --lib`\n";
        assert_eq!(failing_tests(STDOUT, stderr), vec!["a::broken".to_string()]);
    }

    #[test]
    fn a_binary_that_crashed_is_named_though_no_test_printed_failed() {
        let stderr = "error: test failed, to rerun pass `-p x --lib`\n\
                      error: test failed, to rerun pass `-p x --test two_process`\n";
        assert_eq!(
            failing_tests(STDOUT, stderr),
            vec![
                "a::broken".to_string(),
                "[-p x --lib: ended without a test result]".to_string(),
                "[-p x --test two_process: ended without a test result]".to_string(),
            ]
        );
    }

    #[test]
    fn the_first_error_and_what_follows_it_is_kept() {
        let stderr = "   Compiling x\nwarning: w\nerror[E0425]: cannot find value `y`\n --> src/lib.rs:1:1\n  |\n\nmore\n";
        assert_eq!(
            first_error(stderr, 2),
            "error[E0425]: cannot find value `y`\n --> src/lib.rs:1:1"
        );
    }

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_str("a\"b\\c\nd\u{1}"), "\"a\\\"b\\\\c\\nd\\u0001\"");
    }

    #[test]
    fn the_matrix_runs_what_xtask_test_runs_scoped_to_the_crate() {
        let steps: Vec<String> = crate::test_steps(&["-p", "hmc-rpc"], true, false)
            .iter()
            .map(|c| {
                c.get_args()
                    .map(|a| a.to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        assert_eq!(
            steps,
            [
                "build -p hmc-rpc --benches --examples",
                "test -p hmc-rpc --lib --bins --tests",
                "test -p hmc-rpc --doc",
            ]
        );
        // A crate without a library has no --lib and no doc tests.
        assert_eq!(crate::test_steps(&["-p", "x"], false, false).len(), 2);
    }
}
