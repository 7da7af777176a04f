//! Runs the engine's two samples as a user would (each starts its second process itself):
//! the HIXL quick-start flow and the prefill -> decode KV pull, every byte checked.

use std::process::Command;

use hmc_core::testing::example_binary;

fn run(name: &str, args: &[&str]) -> String {
    let out = Command::new(example_binary(name))
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
