//! File circles: within a crate, modules that reach each other's items in a loop (`comm.rs`
//! uses `responder.rs`, which uses `comm.rs`). A circle means state kept in one file that
//! the others cannot do without; moving it into a module of its own opens the circle.
//!
//! A module's edges are the other modules its non-test code names through `crate::…` or
//! `super::…` paths (in `use` items and inline). A module naming its own ancestors or
//! descendants is not an edge: a facade and the files it declares are one idea. Circles are
//! the strongly connected components of more than one module.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Circles allowed, each as its modules (sorted, `crate/module` joined by ` `) and the
/// reason. The temporary entries are issue 34's to open.
pub const CIRCLES_ALLOWED: &[(&str, &str)] = &[
    (
        "hmc-py: engine prepared",
        "pyo3 takes one #[pymethods] block per class (without its multiple-pymethods feature), so \
         Engine's prepared-list methods live in engine.rs and the list types they build in \
         prepared.rs, which names Engine back; temporary (issue 34)",
    ),
    (
        "hmc-transport-rdma: comm endpoint target",
        "temporary (issue 34): the communicator's shared state sits in the comm.rs facade, \
         which endpoints and the target both reach; to move into a module of its own",
    ),
];

/// A module path of a crate: `["control", "conn"]` for `src/control/conn.rs`.
type ModPath = Vec<String>;

/// The module path of a source file relative to the crate's `src/`, or `None` for a
/// binary's, example's or build script's file.
fn module_of(rel: &str) -> Option<ModPath> {
    let rel = rel.strip_suffix(".rs")?;
    if rel.starts_with("bin/") || rel == "main" {
        return None;
    }
    let mut parts: Vec<String> = rel.split('/').map(str::to_string).collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    Some(parts)
}

/// The crate-relative paths a line of code names: `crate::a::b` and `crate::{a, b::c}`
/// give `a::b`, `a`, `b::c`; `super::x` (from `module`) gives the parent's `x`.
fn named_paths(code: &str, module: &ModPath) -> Vec<ModPath> {
    let mut out = Vec::new();
    for (root, base) in [("crate::", Vec::new()), ("super::", parent(module))] {
        let mut rest = code;
        while let Some(i) = rest.find(root) {
            let before = rest[..i].chars().last();
            rest = &rest[i + root.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            if let Some(group) = rest.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                for item in group[..end].split(',') {
                    out.push(join(&base, item));
                }
            } else {
                let end = rest
                    .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                    .unwrap_or(rest.len());
                out.push(join(&base, &rest[..end]));
            }
        }
    }
    out
}

fn parent(m: &ModPath) -> ModPath {
    m[..m.len().saturating_sub(1)].to_vec()
}

fn join(base: &ModPath, path: &str) -> ModPath {
    let mut p = base.clone();
    p.extend(
        path.trim()
            .split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty() && *s != "self" && *s != "*")
            .map(str::to_string),
    );
    p
}

/// The longest module of `modules` that `path` starts with.
fn resolve<'a>(path: &ModPath, modules: &'a BTreeSet<ModPath>) -> Option<&'a ModPath> {
    (1..=path.len())
        .rev()
        .find_map(|n| modules.get(&path[..n].to_vec()))
}

fn related(a: &ModPath, b: &ModPath) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// The circles of one crate from its modules' code: each a sorted list of module names
/// (`a::b`).
pub fn circles(files: &[(ModPath, Vec<String>)]) -> Vec<Vec<String>> {
    let modules: BTreeSet<ModPath> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut edges: BTreeMap<&ModPath, BTreeSet<&ModPath>> = BTreeMap::new();
    for (m, code) in files {
        let to = edges.entry(m).or_default();
        for line in code {
            for p in named_paths(line, m) {
                if let Some(t) = resolve(&p, &modules)
                    && !related(m, t)
                {
                    to.insert(t);
                }
            }
        }
    }
    // Modules reachable from each module; two modules are in one circle when each reaches
    // the other (the crates are small: a search per module is enough).
    let reach = |from: &ModPath| -> BTreeSet<&ModPath> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from];
        while let Some(m) = stack.pop() {
            for t in edges.get(m).into_iter().flatten() {
                if seen.insert(*t) {
                    stack.push(t);
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&ModPath, BTreeSet<&ModPath>> =
        modules.iter().map(|m| (m, reach(m))).collect();
    let mut out: BTreeSet<Vec<String>> = BTreeSet::new();
    for (m, r) in &reaches {
        let mut circle: Vec<String> = r
            .iter()
            .filter(|t| reaches[*t].contains(m))
            .map(|t| t.join("::"))
            .collect();
        if circle.len() > 1 {
            circle.sort();
            out.insert(circle);
        }
    }
    out.into_iter().collect()
}

/// Every circle of the workspace at `root`, as `crate: a b c`.
pub fn workspace_circles(root: &Path) -> Vec<String> {
    let mut crates: Vec<_> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().join("src").is_dir())
        .map(|e| e.path())
        .collect();
    crates.sort();
    let mut out = Vec::new();
    for krate in crates {
        let src = krate.join("src");
        let mut paths = Vec::new();
        super::rust_files(&src, &mut paths);
        let mut files = Vec::new();
        for f in paths {
            let rel = f
                .strip_prefix(&src)
                .unwrap_or(&f)
                .to_string_lossy()
                .replace('\\', "/");
            let Some(m) = module_of(&rel) else { continue };
            if super::is_test_file(&rel) {
                continue;
            }
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let end = super::test_module_start(&lines);
            files.push((m, super::functions::code_lines(&lines, end)));
        }
        let name = krate
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        for c in circles(&files) {
            out.push(format!("{name}: {}", c.join(" ")));
        }
    }
    out
}

/// Circles not in [`CIRCLES_ALLOWED`], and entries that name no circle any more.
pub fn problems(root: &Path) -> Vec<String> {
    let found = workspace_circles(root);
    let mut problems: Vec<String> = found
        .iter()
        .filter(|c| !CIRCLES_ALLOWED.iter().any(|(a, _)| a == *c))
        .map(|c| {
            format!(
                "{c}: these files reach each other's items in a circle; move the state they \
                 share into a module of its own (or add `{c}` to CIRCLES_ALLOWED in \
                 xtask/src/tidy/circles.rs with a reason)"
            )
        })
        .collect();
    for (a, _) in CIRCLES_ALLOWED {
        if !found.iter().any(|c| c == a) {
            problems.push(format!(
                "xtask/src/tidy/circles.rs: CIRCLES_ALLOWED names `{a}`, which is no longer a circle; remove the entry"
            ));
        }
    }
    problems
}
