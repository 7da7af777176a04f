//! The tidy checks as tests: the whole workspace must pass them, and each check flags what
//! it should and nothing else.

use super::*;
use rstest::rstest;

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
    let want = format!("{} lines of non-test code", MAX_LINES + 1);
    assert!(p[0].contains(&want), "{p:?}");
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

/// A file holding one function whose body spans `lines` lines (signature to closing brace).
fn file_with_fn(name: &str, lines: usize) -> String {
    let mut s = format!("//! x\npub fn {name}() {{\n");
    s.push_str(&"    let _ = 1;\n".repeat(lines - 2));
    s.push_str("}\n");
    s
}

#[test]
fn function_length_fails_over_the_limit_only() {
    let at = file_with_fn("long", functions::MAX_FN_LINES);
    assert!(check("hmc-x/src/a.rs", &at).is_empty());
    let over = file_with_fn("long", functions::MAX_FN_LINES + 1);
    let p = check("hmc-x/src/a.rs", &over);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].contains("fn long is 151 lines") && p[0].contains("FN_ALLOWED"),
        "{p:?}"
    );
    // Tests may be long; so may an allowed function.
    assert!(check("hmc-x/tests/t.rs", &over).is_empty());
    let allowed = file_with_fn("communicator_cases", 151);
    assert!(check("hmc-core/src/testing/cases.rs", &allowed).is_empty());
    // The allow-list names one function of one file, not the name everywhere.
    assert_eq!(check("hmc-core/src/testing/other.rs", &allowed).len(), 1);
}

#[rstest]
#[case::plain("pub fn f() {\n    g();\n}\n", &[("f", 3)])]
#[case::brace_in_string("fn f() {\n    let s = \"}}}\";\n    h();\n}\n", &[("f", 4)])]
#[case::brace_in_raw_string("fn f() {\n    let s = r#\"}\"}\"#;\n}\n", &[("f", 3)])]
#[case::brace_in_multiline_string("fn f() {\n    let s = \"\n}\n\";\n}\n", &[("f", 5)])]
#[case::brace_in_char("fn f() {\n    let c = '}';\n    let d = '\\'';\n}\n", &[("f", 4)])]
#[case::lifetimes("fn f<'a>(x: &'a str) -> &'a str {\n    x\n}\n", &[("f", 3)])]
#[case::brace_in_comments("fn f() {\n    // }\n    /* } */\n}\n", &[("f", 4)])]
#[case::declaration_has_no_body("trait T {\n    fn f(&self);\n    fn g(&self) {}\n}\n", &[("g", 1)])]
#[case::multiline_signature("pub async fn f(\n    a: u8,\n) -> u8 {\n    a\n}\n", &[("f", 5)])]
#[case::nested("fn outer() {\n    fn inner() {\n    }\n}\n", &[("outer", 4), ("inner", 2)])]
#[case::fn_pointer_type_is_no_function("struct S {\n    f: fn(u8) -> u8,\n}\n", &[])]
fn functions_are_measured_from_signature_to_closing_brace(
    #[case] text: &str,
    #[case] want: &[(&str, usize)],
) {
    let lines: Vec<&str> = text.lines().collect();
    let got: Vec<(String, usize)> = functions::functions(&lines, lines.len())
        .into_iter()
        .map(|f| (f.name, f.lines))
        .collect();
    let want: Vec<(String, usize)> = want.iter().map(|(n, l)| (n.to_string(), *l)).collect();
    assert_eq!(got, want, "{text}");
}

#[test]
fn function_allow_list_entries_name_a_function_and_give_a_reason() {
    for (entry, why) in functions::FN_ALLOWED {
        let (path, name) = entry.rsplit_once("::").expect("path::function");
        assert!(path.ends_with(".rs") && !name.is_empty(), "{entry}");
        assert!(why.len() > 20, "{entry}: say why it is allowed");
        assert!(root().join(path).exists(), "{entry}: no such file");
    }
}

#[rstest]
#[case::core_on_a_backend("hmc-core", "hmc-backend-cpu")]
#[case::rpc_on_a_transport("hmc-rpc", "hmc-transport-tcp")]
#[case::rpc_on_the_tools("hmc-rpc", "hmc-rpc-tools")]
#[case::rpc_on_the_chooser("hmc-rpc", "hmc-transports")]
#[case::chooser_on_rpc("hmc-transports", "hmc-rpc")]
#[case::transport_on_rpc("hmc-transport-ucx", "hmc-rpc")]
#[case::transport_on_another("hmc-transport-shm", "hmc-transport-tcp")]
#[case::backend_on_a_transport("hmc-backend-cuda", "hmc-transport-rdma")]
#[case::engine_on_the_tools("hmc-engine", "hmc-rpc-tools")]
#[case::engine_on_a_transport("hmc-engine", "hmc-transport-tcp")]
#[case::proto_on_a_socket_layer("hmc-rpc-proto", "hmc-transport-kit")]
#[case::kit_on_a_transport("hmc-transport-kit", "hmc-transport-tcp")]
#[case::kit_on_rpc("hmc-transport-kit", "hmc-rpc")]
fn layering_flags_a_dependency_across_a_layer(#[case] krate: &str, #[case] dep: &str) {
    let p = layers::check_crate(krate, &[dep.to_string()]);
    assert_eq!(p.len(), 1, "{krate} -> {dep}: {p:?}");
    assert!(
        p[0].contains(dep) && p[0].contains("across a layer"),
        "{p:?}"
    );
}

#[rstest]
#[case::rpc_on_core("hmc-rpc", "hmc-core")]
#[case::rpc_on_proto("hmc-rpc", "hmc-rpc-proto")]
#[case::rpc_on_the_kit("hmc-rpc", "hmc-transport-kit")]
#[case::transport_on_the_kit("hmc-transport-tcp", "hmc-transport-kit")]
#[case::plugin_host_on_the_kit("hmc-plugin", "hmc-transport-kit")]
#[case::tools_on_transports("hmc-rpc-tools", "hmc-transport-tcp")]
#[case::engine_on_the_kit("hmc-engine", "hmc-transport-kit")]
#[case::engine_on_the_chooser("hmc-engine", "hmc-transports")]
#[case::chooser_on_transports("hmc-transports", "hmc-transport-tcp")]
#[case::transport_on_a_backend("hmc-transport-tcp", "hmc-backend-cpu")]
fn layering_allows_a_dependency_downwards(#[case] krate: &str, #[case] dep: &str) {
    assert!(
        layers::check_crate(krate, &[dep.to_string()]).is_empty(),
        "{krate} -> {dep}"
    );
}

#[test]
fn manifests_are_read_for_dependencies_only() {
    let manifest = "[package]\nname = \"hmc-rpc\"\n\n[dependencies]\nhmc-core.workspace = true\n\
                    tokio = { workspace = true }\n\n[dev-dependencies]\nhmc-transport-tcp.workspace = true\n";
    assert_eq!(layers::dependencies(manifest), ["hmc-core"]);
    assert_eq!(layers::all_dependencies(manifest), ["hmc-core", "tokio"]);
    let p = layers::check_sans_io("hmc-rpc-proto", &layers::all_dependencies(manifest));
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p[0].contains("tokio"), "{p:?}");
}

fn modules(files: &[(&str, &[&str])]) -> Vec<(Vec<String>, Vec<String>)> {
    files
        .iter()
        .map(|(m, code)| {
            let path = if m.is_empty() {
                Vec::new()
            } else {
                m.split("::").map(str::to_string).collect()
            };
            (path, code.iter().map(|l| l.to_string()).collect())
        })
        .collect()
}

#[test]
fn circles_are_found_through_crate_and_super_paths() {
    // comm -> responder (crate::), responder -> comm (super::), a third file outside.
    let files = modules(&[
        ("", &["mod comm;", "mod responder;", "mod wire;"]),
        (
            "comm",
            &["use crate::responder::serve;", "use crate::wire;"],
        ),
        ("responder", &["use super::comm::Shared;"]),
        ("wire", &["pub fn f() {}"]),
    ]);
    assert_eq!(circles::circles(&files), [vec!["comm", "responder"]]);
    // Grouped use items count too.
    let files = modules(&[
        ("a", &["use crate::{b::X, wire};"]),
        ("b", &["fn f() { crate::a::g() }"]),
        ("wire", &[]),
    ]);
    assert_eq!(circles::circles(&files), [vec!["a", "b"]]);
}

#[test]
fn a_facade_and_its_own_files_are_no_circle() {
    // control.rs declares control/conn.rs; they name each other freely.
    let files = modules(&[
        (
            "control",
            &["use self::conn::Conn;", "fn f() { conn::g() }"],
        ),
        (
            "control::conn",
            &["use super::Shared;", "use crate::control::KIND;"],
        ),
        ("other", &["use crate::control::conn::Conn;"]),
    ]);
    assert!(circles::circles(&files).is_empty());
    // A one-way chain is no circle either.
    let files = modules(&[
        ("a", &["use crate::b;"]),
        ("b", &["use crate::c;"]),
        ("c", &[]),
    ]);
    assert!(circles::circles(&files).is_empty());
}

#[test]
fn circle_allow_list_entries_give_reasons() {
    for (entry, why) in circles::CIRCLES_ALLOWED {
        let (krate, modules) = entry.split_once(": ").expect("crate: modules");
        assert!(root().join(krate).is_dir(), "{entry}: no such crate");
        assert!(
            modules.split(' ').count() > 1,
            "{entry}: a circle has two modules or more"
        );
        assert!(why.len() > 40, "{entry}: say why it is allowed");
    }
}
