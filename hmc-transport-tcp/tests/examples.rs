//! Runs the crate's example as a user would: `one_sided` starts its target process itself, hands the region over as a ticket on the command line, and checks every byte on both sides.

use std::process::Command;

use hmc_core::testing::{example_binary, run_example};

#[test]
fn one_sided_example_writes_and_reads_between_two_processes() {
    let stdout = run_example("one_sided", &["--mib", "3"]);
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

#[test]
fn the_readme_embedding_program_is_the_embed_example_and_runs() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("../README.md")).expect("README.md");
    let block = readme
        .split_once("<!-- embed.rs -->\n```rust\n")
        .and_then(|(_, rest)| rest.split_once("```\n<!-- /embed.rs -->"))
        .map(|(block, _)| block)
        .expect("the README's Embedding section holds the program between its markers");
    let example = std::fs::read_to_string(root.join("examples/embed.rs")).unwrap();
    assert_eq!(
        block, example,
        "README.md and examples/embed.rs differ: copy one to the other"
    );
    let out = Command::new(example_binary("embed"))
        .output()
        .expect("run the example");
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("wrote 1048576 bytes through hmc-region:tcp://")
    );
}
