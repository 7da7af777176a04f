//! Runs the engine's two samples as a user would (each starts its second process itself):
//! the HIXL quick-start flow and the prefill -> decode KV pull, every byte checked.

use hmc_core::testing::run_example as run;

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
