//! The tidy checks as tests: the whole workspace must pass them, and each check flags what
//! it should and nothing else.

use super::*;

/// The workspace root (xtask's parent folder).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

#[test]
fn workspace_is_tidy() {
    let problems = problems(&root()).expect("walking the workspace");
    assert!(
        problems.is_empty(),
        "tidy found {} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn allow_list_entries_give_reasons() {
    for (path, why) in SIZE_ALLOWED
        .iter()
        .chain(ENV_ALLOWED)
        .chain(FIGURES_ALLOWED)
    {
        assert!(
            !path.starts_with('/'),
            "{path}: relative to the workspace root"
        );
        assert!(
            path.ends_with(".rs") || path.ends_with('/'),
            "{path}: a file or a folder"
        );
        assert!(why.len() > 10, "{path}: say why it is allowed");
    }
}

#[test]
fn flags_missing_module_doc_and_unexplained_unsafe() {
    let p = check("hmc-x/src/lib.rs", "fn f() { unsafe { g() } }\n");
    assert_eq!(p.len(), 2, "{p:?}");
}

#[test]
fn accepts_documented_module_with_safety_comment() {
    let text =
        "//! What this is for.\n// SAFETY: g has no preconditions.\nfn f() { unsafe { g() } }\n";
    assert!(check("hmc-x/src/lib.rs", text).is_empty());
}

#[test]
fn refuses_println_in_libraries_but_not_binaries() {
    let text = "//! x\nfn f() { println!(\"hi\"); }\n";
    assert_eq!(check("hmc-x/src/lib.rs", text).len(), 1);
    assert!(check("hmc-x/src/bin/tool.rs", text).is_empty());
    // The conformance kit prints its skip notes into the test log.
    assert!(check("hmc-core/src/testing.rs", text).is_empty());
    assert!(check("hmc-core/src/testing/mod.rs", text).is_empty());
}

#[test]
fn flags_trailing_whitespace() {
    let p = check("hmc-x/src/lib.rs", "//! x\nfn f() {} \n");
    assert_eq!(p, ["hmc-x/src/lib.rs:2: trailing whitespace"]);
}

fn file_of(code_lines: usize, test_lines: usize) -> String {
    let mut s = String::from("//! x\n");
    s.push_str(&"fn f() {}\n".repeat(code_lines - 1));
    if test_lines > 0 {
        s.push_str("#[cfg(test)]\nmod tests {\n");
        s.push_str(&"    fn t() {}\n".repeat(test_lines));
        s.push_str("}\n");
    }
    s
}

#[test]
fn size_counts_non_test_lines_only() {
    assert!(check("hmc-x/src/a.rs", &file_of(MAX_LINES, 0)).is_empty());
    assert!(check("hmc-x/src/a.rs", &file_of(MAX_LINES, 500)).is_empty());
    let p = check("hmc-x/src/a.rs", &file_of(MAX_LINES + 1, 0));
    assert!(p[0].contains("1001 lines of non-test code"), "{p:?}");
    // Test files may be as long as they need.
    for path in [
        "hmc-x/tests/big.rs",
        "hmc-x/benches/big.rs",
        "hmc-x/src/proto/tests.rs",
        "hmc-x/src/proto/limits_tests.rs",
    ] {
        assert!(check(path, &file_of(MAX_LINES + 1, 0)).is_empty(), "{path}");
    }
    // Binaries and examples are not test code.
    assert_eq!(
        check("hmc-x/src/bin/tool.rs", &file_of(MAX_LINES + 1, 0)).len(),
        1
    );
}

#[test]
fn env_reads_only_in_allowed_library_files() {
    let text = "//! x\nfn f() { let _ = std::env::var_os(\"HMC_X\"); }\n";
    let p = check("hmc-x/src/lib.rs", text);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p[0].starts_with("hmc-x/src/lib.rs:2: environment read"));
    assert_eq!(
        check("hmc-x/src/lib.rs", &text.replace("var_os", "var")).len(),
        1
    );
    assert!(check("hmc-transport-ucx/src/sys.rs", text).is_empty());
    assert!(check("hmc-x/src/bin/tool.rs", text).is_empty());
    assert!(check("hmc-x/tests/t.rs", text).is_empty());
    assert!(check("xtask/src/main.rs", text).is_empty());
    // Inline unit tests may read the environment.
    let inline = "//! x\n#[cfg(test)]\nmod tests {\n    fn t() { std::env::var(\"X\"); }\n}\n";
    assert!(check("hmc-x/src/lib.rs", inline).is_empty());
}

#[test]
fn flags_measured_figures_in_doc_comments() {
    for line in [
        "/// SipHash was about 1.5% of the CPU of a pipelined 4 KiB echo.",
        "//! async client: about as fast (20 against 21 µs for a 64 B call)",
        "/// takes an answer and builds the next call in 5-8 us). Without it",
        "/// runs that kept polling were faster (p50 66–69 µs in 5 of 5)",
        "/// 2.9–3.3x TCP_STREAM against 2.5–3.0x",
        "//! perftest's put reaches 3.4 GB/s and the echo about 1–1.5 ms.",
        "/// 820,000 RPC/s on one connection",
        "/// a p999 of about 4 ms on two vCPUs",
        "/// 253–254k calls/s there against 178–200k on the default runtime",
    ] {
        assert!(quotes_figure(line), "should flag: {line}");
        let text = format!("//! x\n{line}\nfn f() {{}}\n");
        assert_eq!(check("hmc-x/src/lib.rs", &text).len(), 1, "{line}");
    }
}

#[test]
fn leaves_defaults_limits_and_plain_numbers_alone() {
    for line in [
        "/// How long the progress thread polls before it parks (default 50 µs).",
        "/// Longest park without a wake-up (default 100 ms): a safety net",
        "/// by that work's expected time at 8 GB/s, up to 500 us.",
        "/// Target: HMC within 95% of the copy bandwidth",
        "/// The count once it has stopped changing for 200 ms.",
        "/// Chunks of at most 64 KiB; default 64 KiB.",
        "//! `checksum=0x…`; the last such line of each side is the same value",
        "/// The soak runs 4 x 25 cycles",
        "/// means the worker was quiet for 100 ms",
        "/// x86_64 and aarch64 only",
    ] {
        assert!(!quotes_figure(line), "should not flag: {line}");
    }
    // A limit phrase that ends the line before covers a wrapped figure.
    let text =
        "//! x\n/// the slower of the two (the target: at least\n/// 80%) of the copy\nfn f() {}\n";
    assert!(check("hmc-x/src/lib.rs", text).is_empty());
    // Figures in test files are not checked.
    let text = "//! x\n/// about 1.5% of the CPU\nfn f() {}\n";
    assert!(check("hmc-x/tests/t.rs", text).is_empty());
    // With the allow-list empty, a library file quoting one is flagged.
    assert!(!check("hmc-rpc/src/direct.rs", text).is_empty());
}
