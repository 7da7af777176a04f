//! `--data-plane rdma` between the real binaries, each loading the user-space `libibverbs.so.1` stand-in through `HMC_IBVERBS_LIB` (a check of the wiring and of the transport's use of verbs across two processes, not of a NIC): verified echoes from 64 KiB to 16 MiB.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{CLIENT, ServerProc, check};

fn standin() -> String {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ibverbs-standin");
    hmc_testshim::build_ibverbs_standin(&dir)
        .expect("build the libibverbs stand-in")
        .display()
        .to_string()
}

#[test]
fn two_processes_echo_over_rdma_from_64_kib_to_16_mib() {
    let lib = standin();
    let envs = [("HMC_IBVERBS_LIB", lib.as_str())];
    let server = ServerProc::start(&["--data-plane", "rdma"], &envs, None);
    for len in [64 << 10, 1 << 20, 16 << 20] {
        let out = check(
            Command::new(CLIENT)
                .args(["--port", &server.port.to_string(), "--method", "echo"])
                .args(["--data-plane", "rdma", "--payload-bytes", &len.to_string()])
                .args(["--repeat", "2"])
                .envs(envs)
                .output()
                .unwrap(),
        );
        assert!(
            out.starts_with(&format!(
                "response[1]={len} bytes verified\nresponse[2]={len} bytes verified\n"
            )),
            "{out}"
        );
        assert!(
            out.contains("data plane: 2 HMC_BUFFER calls, 2 responses in buffer, 0 fallbacks"),
            "{out}"
        );
    }
}

#[test]
fn without_a_device_the_rdma_data_plane_fails_with_the_reason() {
    let out = Command::new(CLIENT)
        .args(["--port", "1", "--method", "echo", "--data-plane", "rdma"])
        .env("HMC_IBVERBS_LIB", standin())
        .env("HMC_FAKE_IBV_DEVICES", "0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ibv_get_device_list") && err.contains("unavailable"),
        "{err}"
    );
}
