//! Runs the crate's embedding examples as a user would: a typed service in two processes, and a call whose request goes over the HMC_BUFFER data plane.

use hmc_core::testing::run_example as run;

#[test]
fn typed_service_answers_pipelined_calls_and_reports_expiry_by_variant() {
    let out = run("typed_service", &["--calls", "2000"]);
    assert!(
        out.contains("2000 typed calls answered and checked"),
        "{out}"
    );
    assert!(out.contains("as CallError::DeadlineExceeded"), "{out}");
}

#[test]
fn buffer_data_plane_moves_requests_one_sided() {
    let out = run("buffer_data_plane", &["--mib", "1"]);
    assert!(out.contains("3 went HMC_BUFFER"), "{out}");
}
