//! Runs the GPU check's device-staging example (`examples/device_staged.rs`) with host memory standing in for the device, so the script a GPU machine runs is itself tested here: two processes, every byte checked, a table printed.

use std::process::Command;

use hmc_core::testing::example_binary;

#[test]
fn device_staged_check_runs_between_two_processes_with_host_memory() {
    let out = Command::new(example_binary("device_staged"))
        .args(["--memory", "host", "--mib", "3", "--iters", "2"])
        .output()
        .expect("run the example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "exit {:?}\n{stdout}\n{stderr}",
        out.status
    );
    for row in [
        "RPC echo, TCP_STREAM",
        "RPC echo, HMC_BUFFER",
        "one-sided WRITE",
        "one-sided READ",
    ] {
        assert!(
            stdout.contains(&format!("| {row}")),
            "no {row} row:\n{stdout}"
        );
    }
}

#[test]
fn device_staged_check_refuses_bad_flags_and_reports_a_missing_gpu() {
    let out = Command::new(example_binary("device_staged"))
        .args(["--mib", "0"])
        .output()
        .expect("run the example");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 1"));
    // Without a CUDA driver (these machines), `--memory cuda` says so and exits 2;
    // with one, this only checks that the flag is accepted.
    let out = Command::new(example_binary("device_staged"))
        .args(["--memory", "cuda", "--mib", "1", "--iters", "1"])
        .output()
        .expect("run the example");
    if !out.status.success() {
        assert_eq!(out.status.code(), Some(2), "{:?}", out);
        assert!(String::from_utf8_lossy(&out.stderr).contains("no CUDA device"));
    }
}
