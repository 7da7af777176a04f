//! Runs the crate's example as a user would: `one_sided` starts its target process itself, hands the region over as a ticket on the command line, and checks every byte on both sides.

use std::process::Command;

use hmc_core::testing::example_binary;

#[test]
fn one_sided_example_writes_and_reads_between_two_processes() {
    let out = Command::new(example_binary("one_sided"))
        .args(["--mib", "3"])
        .output()
        .expect("run the example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "exit {:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("[initiator] READ 3145728 bytes, checked"),
        "{stdout}"
    );
    assert!(
        stdout.contains("all 3145728 bytes it wrote arrived intact"),
        "{stdout}"
    );
    assert!(
        stdout.contains("every byte checked on both sides"),
        "{stdout}"
    );
}

#[test]
fn one_sided_example_refuses_a_malformed_ticket() {
    let out = Command::new(example_binary("one_sided"))
        .args(["initiator", "hmc-region:tcp://127.0.0.1:1#AR"])
        .output()
        .expect("run the example");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not a region ticket"), "{stderr}");
}
