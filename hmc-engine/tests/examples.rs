//! Runs the engine's two samples as a user would (each starts its second process itself):
//! the HIXL quick-start flow and the prefill -> decode KV pull, every byte checked.

use std::path::PathBuf;
use std::process::Command;

/// `target/<profile>/examples/<name>`, which `cargo test` builds with the tests.
fn example(name: &str) -> PathBuf {
    let deps = std::env::current_exe().expect("the test binary's path");
    let profile = deps
        .parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>/deps/<test>");
    let exe = profile.join("examples").join(name);
    assert!(
        exe.exists(),
        "{} is missing: run the whole suite (`cargo test -p hmc-engine`), which builds the examples",
        exe.display()
    );
    exe
}

fn run(name: &str, args: &[&str]) -> String {
    let out = Command::new(example(name))
        .args(args)
        .output()
        .expect("run the example");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "exit {:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn the_quickstart_writes_notifies_and_reads_back_between_two_processes() {
    let out = run("quickstart", &["--mib", "3"]);
    assert!(out.contains("[target] checksums match"), "{out}");
    assert!(out.contains("every byte checked on both sides"), "{out}");
}

#[test]
fn the_decoder_pulls_a_prefilled_requests_blocks_with_matching_checksums() {
    let out = run("kv_prefill_decode", &[]);
    assert!(out.contains("96 block checksums match"), "{out}");
}
