//! Cheap source checks run by `cargo xtask test`: module docs, SAFETY comments, no `println!` in libraries, no trailing whitespace.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        let name = name.to_string_lossy();
        if p.is_dir() {
            if !matches!(name.as_ref(), "target" | "tgt" | ".git" | "fuzz")
                && !name.starts_with('.')
            {
                rust_files(&p, out);
            }
        } else if name.ends_with(".rs") {
            out.push(p);
        }
    }
}

/// Problems in one file's text, as human-readable lines.
fn check(path: &Path, text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let shown = path.display();
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    if !first.starts_with("//!") {
        problems.push(format!(
            "{shown}: must start with a `//!` line saying what the module is for"
        ));
    }
    let is_library = !shown.to_string().contains("/src/bin/")
        && !shown.to_string().ends_with("main.rs")
        && !shown.to_string().contains("/tests/")
        && !shown.to_string().contains("/benches/")
        && !shown.to_string().contains("/examples/")
        && !shown.to_string().contains("xtask/")
        // The conformance kit runs inside test binaries; its skip notes go to the test log.
        && !shown.to_string().ends_with("testing.rs");
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let n = i + 1;
        if line.ends_with(' ') || line.ends_with('\t') {
            problems.push(format!("{shown}:{n}: trailing whitespace"));
        }
        let code = line.trim_start();
        if is_library
            && !code.starts_with("//")
            && (code.contains("println!(") || code.contains("print!("))
        {
            problems.push(format!(
                "{shown}:{n}: print in library code; log with tracing instead"
            ));
        }
        let in_string = code
            .find('"')
            .is_some_and(|q| code.find("unsafe {").is_some_and(|u| q < u));
        if code.contains("unsafe {")
            && !in_string
            && !code.starts_with("//")
            && !code.starts_with("unsafe fn")
            && !code.contains("unsafe fn")
        {
            // Look back a few lines for the SAFETY comment (attributes and the statement
            // head may sit between).
            let from = i.saturating_sub(8);
            let has = lines[from..=i].iter().any(|l| l.contains("SAFETY:"));
            if !has {
                problems.push(format!(
                    "{shown}:{n}: `unsafe` block without a `// SAFETY:` comment just above"
                ));
            }
        }
    }
    problems
}

/// Runs the checks over every `.rs` file of the workspace.
pub fn run(root: &Path) -> Result<(), String> {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    let mut problems = Vec::new();
    for f in &files {
        let text =
            std::fs::read_to_string(f).map_err(|e| format!("reading {}: {e}", f.display()))?;
        let rel = f.strip_prefix(root).unwrap_or(f);
        problems.extend(check(rel, &text));
    }
    if problems.is_empty() {
        eprintln!("xtask: tidy: {} files clean", files.len());
        Ok(())
    } else {
        Err(format!(
            "tidy found {} problem(s):\n{}",
            problems.len(),
            problems.join("\n")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_missing_module_doc_and_unexplained_unsafe() {
        let p = check(Path::new("hmc-x/src/lib.rs"), "fn f() { unsafe { g() } }\n");
        assert_eq!(p.len(), 2, "{p:?}");
    }

    #[test]
    fn accepts_documented_module_with_safety_comment() {
        let text = "//! What this is for.\n// SAFETY: g has no preconditions.\nfn f() { unsafe { g() } }\n";
        assert!(check(Path::new("hmc-x/src/lib.rs"), text).is_empty());
    }

    #[test]
    fn refuses_println_in_libraries_but_not_binaries() {
        let text = "//! x\nfn f() { println!(\"hi\"); }\n";
        assert_eq!(check(Path::new("hmc-x/src/lib.rs"), text).len(), 1);
        assert!(check(Path::new("hmc-x/src/bin/tool.rs"), text).is_empty());
    }
}
