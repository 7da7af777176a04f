//! Source checks over the whole workspace, run as a test (`cargo test -p xtask`, so every
//! `cargo test --workspace` runs them) and by `cargo xtask tidy` / `cargo xtask test`.
//!
//! Each check reports every problem it finds, as `path:line: what is wrong`, so one run
//! lists all there is to fix. The checks:
//!
//! - **Module docs**: every `.rs` file starts with a `//!` line saying what it is for.
//! - **SAFETY comments**: every `unsafe {` block has a `// SAFETY:` comment within the
//!   eight lines above it.
//! - **No prints in libraries**: no `print!`/`println!` in library code (binaries,
//!   examples, tests, benches, xtask and the conformance kit may print).
//! - **No trailing whitespace.**
//! - **File size**: no non-test source file over [`MAX_LINES`] lines. Test code is a file
//!   under a `tests/` or `benches/` folder, a file named `tests.rs` or `*_tests.rs` (so a
//!   `#[cfg(test)]`-only module in its own file is exempt when named that way), and the
//!   lines from a file's top-level `#[cfg(test)] mod …` onwards (the inline unit tests,
//!   which by convention end the file).
//! - **Function length** (`functions.rs`): a function body over
//!   [`functions::WARN_LINES`] lines is a warning (listed by `cargo xtask tidy`), one over
//!   [`functions::MAX_FN_LINES`] a problem unless [`functions::FN_ALLOWED`] names it with a
//!   reason; an entry that no longer names such a function is a problem too.
//! - **Layers** (`layers.rs`): the workspace crates a crate may depend on (the core on
//!   none, the RPC runtime on no transport, transports on no runtime, the engine not on
//!   the tools crate), and no socket in the sans-IO protocol crate.
//! - **File circles** (`circles.rs`): no two modules of a crate reach each other's items
//!   in a loop (a facade and its own files excepted), unless
//!   [`circles::CIRCLES_ALLOWED`] names the circle with a reason.
//! - **Environment reads**: no `env::var`/`env::var_os` in library code except in the
//!   files of [`ENV_ALLOWED`], the named configuration and library loaders. Configuration
//!   belongs in the config structs; an environment variable that silently changes a
//!   library's behaviour is invisible to the application embedding it.
//! - **No benchmark figures in doc comments**: measured figures go stale and belong in
//!   `docs/benchmarks.md`. A `///` or `//!` line is flagged when it has a number followed
//!   by a rate (GB/s, MB/s, GiB/s, Gb/s, RPC/s, calls/s, ops/s), a percentage or a ratio
//!   (a number then `x`), or by a time (µs, us, ns, ms) on a line with a sign of
//!   measurement (about, against, p50/p99/p999, median, mean, took, measured, faster,
//!   slower) or as a range such as `5–8 us`. Lines phrased as defaults or limits
//!   (`default 50 µs`, default:, by default, at most, up to, at least, limit, timeout,
//!   target, budget, on the line or at the end of the line before) are not flagged.
//!   Files of [`FIGURES_ALLOWED`] are skipped.
//!
//! Allow-list entries name files relative to the workspace root, or folders (ending in
//! `/`) for everything under them. An entry whose file no
//! longer exists is ignored (files move when crates are split), and the temporary
//! entries say whose work removes them.

use std::path::{Path, PathBuf};

pub mod circles;
pub mod functions;
pub mod layers;
#[cfg(test)]
mod tests;

/// Longest non-test source file, in lines: a file holds one idea, and an idea may need
/// this many (functions have their own, tighter check).
pub const MAX_LINES: usize = 1500;

/// Non-test files allowed over [`MAX_LINES`], each with the reason (none today).
pub const SIZE_ALLOWED: &[(&str, &str)] = &[];

/// Library files that may read the environment, each with the reason.
pub const ENV_ALLOWED: &[(&str, &str)] = &[
    (
        "hmc-transport-rdma/src/sys.rs",
        "library loader: `$HMC_IBVERBS_LIB` names the libibverbs to open when the config names none",
    ),
    (
        "hmc-transport-ucx/src/sys.rs",
        "library loader: `$HMC_UCX_LIB` names the libucp to open when the config names none",
    ),
    (
        "hmc-backend-runtime/src/load.rs",
        "library loader: each backend's `$HMC_<VENDOR>_LIB` names the vendor library to open",
    ),
    (
        "hmc-transport-ucx/src/comm.rs",
        "UCX itself reads `UCX_TLS`/`UCX_MM_ERROR_HANDLING` from the environment, so the \
         communicator reads them too to know which soft options UCX will accept",
    ),
    (
        "hmc-transports/src/env.rs",
        "the transports' one reader of the environment: `Environment::read`, called only by \
         `Options::from_env`, which programs (the engine, the binaries) call once",
    ),
    (
        "hmc-transport-ucx/src/config.rs",
        "config loader: `UcxConfig::from_env` reads `HMC_UCX_DIRECT` (defaults do not)",
    ),
    (
        "hmc-plugin/src/load.rs",
        "plugin loader: `$HMC_PLUGIN_PATH` is searched before `PluginConfig::search_path`",
    ),
    (
        "hmc-testshim/src/shim.rs",
        "test-time shim builder: `$CC` names the C compiler and `$OUT_DIR` a build script's \
         output folder, as for every C build run from cargo",
    ),
    (
        "hmc-testshim/src/runtime.rs",
        "test-support crate (publish = false): a child test process reads the IPC handle \
         its parent test passed",
    ),
];

/// Files whose doc comments may quote measured figures, each with the reason (none:
/// figures live in `docs/benchmarks.md`).
pub const FIGURES_ALLOWED: &[(&str, &str)] = &[];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        let name = name.to_string_lossy();
        if p.is_dir() {
            if !matches!(name.as_ref(), "target" | "tgt" | "fuzz") && !name.starts_with('.') {
                rust_files(&p, out);
            }
        } else if name.ends_with(".rs") {
            out.push(p);
        }
    }
}

/// Whether the whole file is test code (see the module docs).
fn is_test_file(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    path.split('/').any(|c| c == "tests" || c == "benches")
        || name == "tests.rs"
        || name.ends_with("_tests.rs")
}

/// Whether the file is library code (not a binary, example, test, bench or xtask).
fn is_library(path: &str) -> bool {
    !is_test_file(path)
        && !path.contains("/src/bin/")
        && !path.ends_with("main.rs")
        && !path.ends_with("build.rs")
        && !path.contains("/examples/")
        && !path.starts_with("xtask/")
        && !in_binary_crate(path)
}

/// Whether the file belongs to a crate that is only a binary (a `src/main.rs`, no
/// `src/lib.rs`): its modules are the program's, which prints.
fn in_binary_crate(path: &str) -> bool {
    let Some((krate, _)) = path.split_once("/src/") else {
        return false;
    };
    let src = crate::root().join(krate).join("src");
    src.join("main.rs").exists() && !src.join("lib.rs").exists()
}

/// Index of the line where a file's trailing inline test module starts (its
/// `#[cfg(test)]` at column 0 followed by a `mod` line), or the line count.
fn test_module_start(lines: &[&str]) -> usize {
    lines
        .iter()
        .enumerate()
        .position(|(i, l)| {
            l.trim_end() == "#[cfg(test)]"
                && lines
                    .get(i + 1)
                    .is_some_and(|n| n.starts_with("mod ") || n.starts_with("pub mod "))
        })
        .unwrap_or(lines.len())
}

/// Whether `path` is in `list`: named exactly, or under an entry ending in `/` (a folder).
fn allowed(list: &[(&str, &str)], path: &str) -> bool {
    list.iter()
        .any(|(p, _)| *p == path || (p.ends_with('/') && path.starts_with(p)))
}

const RATE_UNITS: &[&str] = &[
    "GB/s", "MB/s", "GiB/s", "MiB/s", "Gb/s", "Gbit/s", "RPC/s", "calls/s", "ops/s",
];
const TIME_UNITS: &[&str] = &["µs", "us", "ns", "ms"];
const MEASURED: &[&str] = &[
    "about", "against", "p50", "p99", "median", "mean", "took", "measured", "faster", "slower",
];
const LIMIT_PHRASES: &[&str] = &[
    "default:",
    "defaults:",
    "by default",
    "at most",
    "up to",
    "at least",
    "limit",
    "timeout",
    "target",
    "budget",
];

/// Whether a lower-cased line phrases a figure as a default or limit: one of
/// [`LIMIT_PHRASES`], or `default` followed by a number (`default 50 µs`).
fn limit_phrased(lower: &str) -> bool {
    LIMIT_PHRASES.iter().any(|p| lower.contains(p))
        || lower
            .match_indices("default ")
            .any(|(i, m)| lower[i + m.len()..].starts_with(|c: char| c.is_ascii_digit()))
}

/// Whether the end of the line before a flagged one phrases what follows as a default or
/// limit (a sentence wrapped between the phrase and the figure).
fn limit_phrased_before(previous: Option<&str>) -> bool {
    previous.is_some_and(|p| {
        let p = p.to_lowercase();
        let tail: String = p
            .chars()
            .rev()
            .take(40)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        limit_phrased(&tail)
    })
}

/// Whether a doc-comment line quotes a measured figure (see the module docs).
fn quotes_figure(doc: &str) -> bool {
    let lower = doc.to_lowercase();
    if limit_phrased(&lower) {
        return false;
    }
    let measured = lower
        .split(|c: char| !c.is_alphanumeric())
        .any(|w| MEASURED.contains(&w) || w == "p999");
    let chars: Vec<char> = doc.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let starts_number = chars[i].is_ascii_digit()
            && (i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_'));
        if !starts_number {
            i += 1;
            continue;
        }
        // A number, possibly with decimals and a range (`2.9–3.3`, `5-8`).
        let start = i;
        let mut ranged = false;
        loop {
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            if i + 1 < chars.len() && matches!(chars[i], '–' | '-') && chars[i + 1].is_ascii_digit()
            {
                ranged = true;
                i += 1;
                continue;
            }
            break;
        }
        let number: String = chars[start..i].iter().collect();
        // Thousands and millions (`180k RPC/s`).
        if i < chars.len() && matches!(chars[i], 'k' | 'M') {
            i += 1;
        }
        let rest: String = chars[i..].iter().collect();
        let ends = |unit: &str| {
            rest.strip_prefix(unit)
                .is_some_and(|after| !after.starts_with(|c: char| c.is_alphanumeric()))
        };
        let spaced = rest.strip_prefix(' ').unwrap_or(&rest).to_string();
        let ends_spaced = |unit: &str| {
            spaced
                .strip_prefix(unit)
                .is_some_and(|after| !after.starts_with(|c: char| c.is_alphanumeric()))
        };
        if RATE_UNITS.iter().any(|u| ends_spaced(u))
            || ends_spaced("%")
            || (ends("x") && number != "0")
            || ((measured || ranged) && TIME_UNITS.iter().any(|u| ends_spaced(u)))
        {
            return true;
        }
    }
    false
}

/// Problems in one file's text, as human-readable lines. `path` is relative to the
/// workspace root, with `/` separators.
fn check(path: &str, text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    if !first.starts_with("//!") {
        problems.push(format!(
            "{path}: must start with a `//!` line saying what the module is for"
        ));
    }
    let test_file = is_test_file(path);
    let library = is_library(path)
        // The conformance kit runs inside test binaries; its skip notes go to the test log.
        && !path.ends_with("/testing.rs")
        && !path.contains("/src/testing/");
    let lines: Vec<&str> = text.lines().collect();
    let code_end = if test_file {
        0
    } else {
        test_module_start(&lines)
    };
    if code_end > MAX_LINES && !allowed(SIZE_ALLOWED, path) {
        problems.push(format!(
            "{path}: {code_end} lines of non-test code, over {MAX_LINES}; split it by job"
        ));
    }
    for f in functions::functions(&lines, code_end) {
        if f.lines > functions::MAX_FN_LINES && !functions::allowed(path, &f.name) {
            problems.push(format!(
                "{path}:{}: fn {} is {} lines, over {}; split it into named steps (or add \
                 `{path}::{}` to FN_ALLOWED in xtask/src/tidy/functions.rs with a reason)",
                f.line,
                f.name,
                f.lines,
                functions::MAX_FN_LINES,
                f.name
            ));
        }
    }
    let env_checked = library && !allowed(ENV_ALLOWED, path);
    let figures_checked = !test_file && !allowed(FIGURES_ALLOWED, path);
    for (i, line) in lines.iter().enumerate() {
        let n = i + 1;
        if line.ends_with(' ') || line.ends_with('\t') {
            problems.push(format!("{path}:{n}: trailing whitespace"));
        }
        let code = line.trim_start();
        let comment = code.starts_with("//");
        if library && !comment && (code.contains("println!(") || code.contains("print!(")) {
            problems.push(format!(
                "{path}:{n}: print in library code; log with tracing instead"
            ));
        }
        if env_checked
            && i < code_end
            && !comment
            && (code.contains("env::var(") || code.contains("env::var_os("))
        {
            problems.push(format!(
                "{path}:{n}: environment read in library code; take it from a config struct \
                 (or add the file to ENV_ALLOWED in xtask/src/tidy.rs with a reason)"
            ));
        }
        if figures_checked
            && i < code_end
            && (code.starts_with("///") || code.starts_with("//!"))
            && quotes_figure(code)
            && !limit_phrased_before(i.checked_sub(1).map(|p| lines[p]))
        {
            problems.push(format!(
                "{path}:{n}: measured figure in a doc comment; put it in docs/benchmarks.md \
                 and link there"
            ));
        }
        let in_string = code
            .find('"')
            .is_some_and(|q| code.find("unsafe {").is_some_and(|u| q < u));
        if code.contains("unsafe {")
            && !in_string
            && !comment
            && !code.starts_with("unsafe fn")
            && !code.contains("unsafe fn")
        {
            // Look back a few lines for the SAFETY comment (attributes and the statement
            // head may sit between).
            let from = i.saturating_sub(8);
            let has = lines[from..=i].iter().any(|l| l.contains("SAFETY:"));
            if !has {
                problems.push(format!(
                    "{path}:{n}: `unsafe` block without a `// SAFETY:` comment just above"
                ));
            }
        }
    }
    problems
}

/// Every `.rs` file of the workspace at `root`: (path relative to it, text), sorted.
fn workspace_files(root: &Path) -> Result<Vec<(String, String)>, String> {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    files.sort();
    if files.is_empty() {
        return Err(format!("no .rs files under {}", root.display()));
    }
    files
        .iter()
        .map(|f| {
            let text =
                std::fs::read_to_string(f).map_err(|e| format!("reading {}: {e}", f.display()))?;
            let rel = f.strip_prefix(root).unwrap_or(f);
            Ok((rel.to_string_lossy().replace('\\', "/"), text))
        })
        .collect()
}

/// The non-test functions of a file (none for a test file).
fn file_functions(path: &str, text: &str) -> Vec<functions::Function> {
    if is_test_file(path) {
        return Vec::new();
    }
    let lines: Vec<&str> = text.lines().collect();
    functions::functions(&lines, test_module_start(&lines))
}

/// Every problem in the workspace at `root`, sorted by file.
pub fn problems(root: &Path) -> Result<Vec<String>, String> {
    let files = workspace_files(root)?;
    let mut problems = Vec::new();
    for (rel, text) in &files {
        problems.extend(check(rel, text));
    }
    // An allow-list entry names a function that still needs it.
    for (entry, _) in functions::FN_ALLOWED {
        let (path, name) = entry.rsplit_once("::").unwrap_or((entry, ""));
        let still = files.iter().any(|(rel, text)| {
            rel == path
                && file_functions(rel, text)
                    .iter()
                    .any(|f| f.name == name && f.lines > functions::MAX_FN_LINES)
        });
        if !still {
            problems.push(format!(
                "xtask/src/tidy/functions.rs: FN_ALLOWED names `{entry}`, which is no longer a \
                 function over {} lines; remove the entry",
                functions::MAX_FN_LINES
            ));
        }
    }
    problems.extend(layers::problems(root));
    problems.extend(circles::problems(root));
    Ok(problems)
}

/// Functions over [`functions::WARN_LINES`] lines: `path:line: fn name (N lines)`.
pub fn warnings(root: &Path) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for (rel, text) in workspace_files(root)? {
        for f in file_functions(&rel, &text) {
            if f.lines > functions::WARN_LINES {
                out.push(format!(
                    "{rel}:{}: fn {} ({} lines)",
                    f.line, f.name, f.lines
                ));
            }
        }
    }
    Ok(out)
}

/// Runs the checks over every `.rs` file of the workspace (`cargo xtask tidy`).
pub fn run(root: &Path) -> Result<(), String> {
    let problems = problems(root)?;
    let warnings = warnings(root)?;
    if !warnings.is_empty() {
        eprintln!(
            "xtask: tidy: {} function(s) over {} lines (worth splitting into named steps):\n  {}",
            warnings.len(),
            functions::WARN_LINES,
            warnings.join("\n  ")
        );
    }
    if problems.is_empty() {
        eprintln!("xtask: tidy: clean");
        Ok(())
    } else {
        Err(format!(
            "tidy found {} problem(s):\n{}",
            problems.len(),
            problems.join("\n")
        ))
    }
}
