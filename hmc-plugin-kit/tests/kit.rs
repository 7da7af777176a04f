//! hmc-plugin-kit as a plugin author runs it: the binary against the example C plugin (compiled here) and the example Rust plugin, which pass, and against deliberately broken variants of the C plugin, whose failures are reported with the case, what it expected and what happened.

#[path = "../../hmc-plugin/tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::Command;

/// Runs the kit; returns (success, stdout).
fn kit(plugin: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_hmc-plugin-kit"))
        .arg(plugin)
        .args(args)
        .output()
        .expect("run hmc-plugin-kit");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.success(), stdout)
}

fn summary(stdout: &str) -> &str {
    stdout
        .lines()
        .rev()
        .find(|l| l.contains(" passed, "))
        .unwrap_or("(no summary line)")
}

#[test]
fn the_example_c_plugin_passes_every_case_that_applies() {
    let lib = common::build_c_plugin("loopmem", &[]);
    let (ok, out) = kit(&lib, &[]);
    assert!(ok, "{out}");
    // Every case but the two-process ones: loopmem reaches its own process only.
    let total = out.lines().filter(|l| l.starts_with("ok    ")).count();
    assert!(total >= 40, "{out}");
    assert_eq!(
        summary(&out),
        format!("{total} passed, 0 failed, 2 skipped"),
        "{out}"
    );
    for group in ["abi::", "plugin::", "communicator::", "memory::"] {
        assert!(out.contains(&format!("ok    {group}")), "{group}: {out}");
    }
    assert!(
        out.contains("skip  process::a_peer_killed_mid_transfer_fails_it_fast"),
        "{out}"
    );
}

#[test]
fn the_example_rust_plugin_passes_every_case_with_two_processes() {
    let lib = common::build_rust_plugin(false);
    // The TCP transport takes notifications only from authenticated peers.
    let (ok, out) = kit(&lib, &["--config", "auth_secret=plugin-kit-secret-0123"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("ok    process::a_peer_killed_mid_transfer_fails_it_fast"),
        "{out}"
    );
    assert!(
        out.contains("ok    process::a_stopped_peer_times_out_and_serves_again_when_resumed"),
        "{out}"
    );
    assert!(summary(&out).ends_with(" passed, 0 failed"), "{out}");
    // It borrows the TCP transport's wire number, which the kit points out.
    assert!(out.contains("note: transport id 1 is below 128"), "{out}");
}

/// A call that never returns: the case's process is killed after `--timeout`, reported as
/// that case's failure, and the run goes on to the next case.
#[test]
fn a_plugin_call_that_blocks_is_killed_after_the_timeout() {
    let lib = common::build_c_plugin("kit-hang", &["BROKEN_HANG_ON_TRANSFER"]);
    let started = std::time::Instant::now();
    let (ok, out) = kit(
        &lib,
        &[
            "--timeout",
            "2",
            "--case",
            "communicator::batches_move_every_descriptor",
            "--case",
            "abi::loads_through_the_loader",
        ],
    );
    assert!(!ok, "{out}");
    // Both sizes of the case hang and are killed, each reported.
    for size in ["2", "257"] {
        let case = format!("FAIL  communicator::batches_move_every_descriptor::{size}");
        assert!(out.contains(&case), "{out}");
    }
    assert!(out.contains("did not finish in 2 s (--timeout)"), "{out}");
    assert!(out.contains("expected: success (no error)"), "{out}");
    assert!(out.contains("ok    abi::loads_through_the_loader"), "{out}");
    assert!(summary(&out).ends_with("1 passed, 2 failed"), "{out}");
    // Killed, not waited for: the deadline of the case itself is longer.
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "{out}"
    );
}

#[rstest::rstest]
#[case::crash("kit-crash", "BROKEN_CRASH_ON_TRANSFER", "communicator::batches_move_every_descriptor", &["signal 11 (SIGSEGV)", "rerun the case alone under gdb"])]
#[case::table_overrun("kit-overrun", "BROKEN_IGNORES_OUT_SIZE", "abi::fills_no_more_than_offered", &["wrote byte", "past them", "fill at most out_size bytes"])]
#[case::unbounded_queue("kit-unbounded", "BROKEN_UNBOUNDED_NOTIFY", "plugin::a_full_notification_queue_fails_with_a_named_limit", &["were all accepted", "honour max_pending_notifications=N"])]
#[case::no_message("kit-nomsg", "BROKEN_NO_MESSAGE", "abi::errors_carry_a_message", &["without setting the last-error string"])]
fn a_broken_plugin_fails_the_case_that_catches_it(
    #[case] name: &str,
    #[case] define: &str,
    #[case] case: &str,
    #[case] wanted: &[&str],
) {
    let lib = common::build_c_plugin(name, &[define]);
    let (ok, out) = kit(
        &lib,
        &["--case", case, "--case", "abi::loads_through_the_loader"],
    );
    assert!(!ok, "a broken plugin must fail: {out}");
    assert!(out.contains(&format!("FAIL  {case}")), "{out}");
    assert!(out.contains("ok    abi::loads_through_the_loader"), "{out}");
    assert!(out.contains("        expected: "), "{out}");
    for w in wanted {
        assert!(out.contains(w), "`{w}` missing: {out}");
    }
    let failed = out.lines().filter(|l| l.starts_with("FAIL  ")).count();
    assert!(failed >= 1, "{out}");
    assert!(
        summary(&out).contains(&format!(" passed, {failed} failed")),
        "{out}"
    );
}

/// The kit holds a plugin to the ABI minor it declares: a free-text HMC_ERR_LIMIT message
/// passes for a plugin of ABI 1.1 (the rule that it begins with the limit's name came with
/// 1.2), and fails the same case for one that declares 1.2.
#[rstest::rstest]
#[case::abi_1_1("kit-limit-1-1", "DECLARE_ABI_MINOR=1", true)]
#[case::abi_1_2("kit-limit-1-2", "DECLARE_ABI_MINOR=2", false)]
fn the_limit_message_rule_applies_from_the_minor_that_states_it(
    #[case] name: &str,
    #[case] minor: &str,
    #[case] passes: bool,
) {
    let lib = common::build_c_plugin(name, &["LIMIT_MESSAGE_FREE_TEXT", minor]);
    let case = "plugin::a_full_notification_queue_fails_with_a_named_limit";
    let (ok, out) = kit(&lib, &["--case", case]);
    assert_eq!(ok, passes, "{out}");
    if !passes {
        assert!(out.contains("begins with the limit's name"), "{out}");
    }
}

/// The kit holds a plugin to the ABI minor it declares, for the terminal-state rule of
/// 1.3 (no byte of a transfer lands in either side's memory after its end): loopmem built
/// to go on copying after it reported a WRITE released or past its deadline fails both
/// cases of the rule when it declares 1.3, and they are skipped as not promised when it
/// declares 1.2.
#[rstest::rstest]
#[case::abi_1_3("kit-late-1-3", "DECLARE_ABI_MINOR=3", false)]
#[case::abi_1_2("kit-late-1-2", "DECLARE_ABI_MINOR=2", true)]
fn the_terminal_state_rule_applies_from_the_minor_that_states_it(
    #[case] name: &str,
    #[case] minor: &str,
    #[case] passes: bool,
) {
    let lib = common::build_c_plugin(name, &["BROKEN_LATE_BYTES", minor]);
    let case = "communicator::an_abandoned_write_lands_nothing_after_settle";
    let (ok, out) = kit(&lib, &["--case", case]);
    assert_eq!(ok, passes, "{out}");
    for how in ["dropped", "deadline"] {
        if passes {
            assert!(
                out.contains(&format!(
                    "skip  {case}::{how} (not promised by ABI 1.2: the plugin declares that \
                     minor, and this rule came with ABI 1.3"
                )),
                "{out}"
            );
        } else {
            assert!(out.contains(&format!("FAIL  {case}::{how}")), "{out}");
        }
    }
    if passes {
        assert_eq!(summary(&out), "0 passed, 0 failed, 2 skipped", "{out}");
    } else {
        assert!(
            out.contains("landed at the target after settle returned"),
            "{out}"
        );
        assert_eq!(summary(&out), "0 passed, 2 failed", "{out}");
    }
}

#[test]
fn a_file_the_loader_refuses_is_one_failure_with_the_loaders_message() {
    let lib = common::build_c_plugin("kit-major", &["BROKEN_MAJOR"]);
    let (ok, out) = kit(&lib, &[]);
    assert!(!ok, "{out}");
    assert!(out.contains("FAIL  abi::loads_through_the_loader"), "{out}");
    assert!(out.contains("built for HMC plugin ABI 2."), "{out}");
    assert_eq!(summary(&out), "0 passed, 1 failed", "{out}");
}

#[test]
fn list_names_each_case_with_what_it_expects() {
    let lib = common::build_c_plugin("loopmem", &[]);
    let (ok, out) = kit(
        &lib,
        &[
            "--list",
            "--case",
            "communicator::access_rights_are_enforced",
        ],
    );
    assert!(ok, "{out}");
    assert!(
        out.contains("communicator::access_rights_are_enforced\n"),
        "{out}"
    );
    assert!(out.contains("expected: AccessDenied"), "{out}");
    let (ok, out) = kit(&lib, &["--case", "nonesuch"]);
    assert!(!ok && out.contains("no case matches"), "{out}");
}
