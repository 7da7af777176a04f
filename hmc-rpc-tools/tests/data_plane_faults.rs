//! The RPC data plane under injected faults, between the real binaries: a server started
//! with `--faults SPEC` whose first three HMC_BUFFER transfers fail, are cut or stall. Each
//! faulted call ends with an error (naming the injected fault, or the deadline) within its
//! timeout plus a slack, never a hang; once the faults stop, the next call's 1 MiB echo is
//! verified byte for byte without restarting anything; the server's descriptors stay flat.
//! The chaos matrix of `hmc-engine/tests/chaos.rs` does the same for the engine's
//! operations; this is its HMC_BUFFER call.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{CLIENT, ServerProc};
use rstest::rstest;

/// Each call's deadline (`--timeout-ms`).
const CALL_TIMEOUT: Duration = Duration::from_millis(1500);
/// How late past it a call may end: process start-up and the connect included.
const SLACK: Duration = Duration::from_secs(5);

/// One 1 MiB echo over `plane` (a fresh client process); its exit, stdout, stderr and time.
fn call(port: u16, plane: &str) -> (bool, String, String, Duration) {
    let start = Instant::now();
    let out = Command::new(CLIENT)
        .args(["--port", &port.to_string(), "--method", "echo"])
        .args(["--data-plane", plane, "--payload-bytes", "1048576"])
        .args(["--timeout-ms", &CALL_TIMEOUT.as_millis().to_string()])
        .output()
        .expect("running hmc-rpc-client");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        start.elapsed(),
    )
}

#[rstest]
#[case::tcp_failed("tcp", "xfer.fail=first:3", "injected fault")]
#[case::tcp_cut("tcp", "xfer.cut=0.5@first:3", "injected fault")]
#[case::tcp_stalled("tcp", "xfer.stall=5s@first:3", "deadline exceeded")]
#[case::shm_failed("shm", "xfer.fail=first:3", "injected fault")]
#[case::shm_cut("shm", "xfer.cut=0.5@first:3", "injected fault")]
fn a_faulted_hmc_buffer_call_fails_in_time_and_the_next_one_is_whole(
    #[case] plane: &str,
    #[case] spec: &str,
    #[case] says: &str,
) {
    let faults = format!("seed=1;{spec}");
    let server = ServerProc::start(&["--data-plane", plane, "--faults", &faults], &[], None);
    let fds_before = server.fds();
    for i in 0..3 {
        let (ok, stdout, stderr, took) = call(server.port, plane);
        assert!(
            !ok,
            "{plane} {spec}: call {i} succeeded under a fault: {stdout}"
        );
        assert!(
            stderr.contains(says),
            "{plane} {spec}: call {i} failed without saying why: {stderr}"
        );
        assert!(
            took < CALL_TIMEOUT + SLACK,
            "{plane} {spec}: call {i} took {took:?}"
        );
    }
    let (ok, stdout, stderr, _) = call(server.port, plane);
    assert!(
        ok && stdout.contains("response[1]=1048576 bytes verified"),
        "{plane} {spec}: the call after the faults: {stdout} {stderr}"
    );
    // The faulted calls' connections and registrations are gone (a stalled transfer's
    // may take its request timeout to wind down).
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.fds() > fds_before + 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        server.fds() <= fds_before + 2,
        "{plane} {spec}: server descriptors {fds_before} -> {}",
        server.fds()
    );
}
