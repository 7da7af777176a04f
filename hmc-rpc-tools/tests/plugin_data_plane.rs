//! `--data-plane NAME` with a transport plugin: the real server and client binaries, two processes, HMC_BUFFER over the example Rust plugin (hmc-plugin/examples-plugins/rtcp, built here), and `--list-transports` saying what loaded and what was refused.

mod common;
#[path = "../../hmc-plugin/tests/common/mod.rs"]
mod plugins;

use std::process::Command;

use common::{CLIENT, SERVER, ServerProc, check};

#[test]
fn list_transports_names_built_ins_plugins_and_refusals() {
    let rtcp = plugins::build_rust_plugin(false);
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("libjunk.so");
    std::fs::write(&junk, b"not a library").unwrap();
    let out = Command::new(SERVER)
        .arg("--list-transports")
        .arg("--plugin-path")
        .arg(&rtcp)
        .arg("--plugin-path")
        .arg(dir.path())
        .output()
        .unwrap();
    let text = check(out);
    assert!(text.contains("tcp") && text.contains("ucx"), "{text}");
    assert!(text.contains("loaded  rtcp"), "{text}");
    // A folder's files are loaded by name only: listed, not loaded.
    assert!(
        text.contains("waiting junk") && text.contains("libjunk.so"),
        "{text}"
    );
    assert!(!text.contains("cannot be loaded"), "{text}");
}

#[test]
fn two_processes_echo_over_a_plugin_data_plane() {
    let rtcp = plugins::build_rust_plugin(false);
    let path = rtcp.to_str().unwrap();
    let server = ServerProc::start(&["--data-plane", "rtcp", "--plugin-path", path], &[], None);
    let out = check(
        Command::new(CLIENT)
            .args(["--port", &server.port.to_string(), "--method", "echo"])
            .args(["--data-plane", "rtcp", "--plugin-path", path])
            .args(["--payload-bytes", "1048576", "--repeat", "3"])
            .output()
            .unwrap(),
    );
    assert!(out.contains("response[3]=1048576 bytes verified"), "{out}");
    assert!(
        out.contains("data plane: 3 HMC_BUFFER calls, 3 responses in buffer, 0 fallbacks"),
        "{out}"
    );
    // A client on another data plane than the server's (shm; rtcp speaks tcp's wire, so a
    // tcp client would be served): its large calls stream over the RPC connection, each
    // counted as a fallback, with one warning for the connection.
    let out = Command::new(CLIENT)
        .args(["--port", &server.port.to_string(), "--method", "echo"])
        .args(["--data-plane", "shm"])
        .args(["--payload-bytes", "1048576", "--repeat", "3"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains("response[3]=1048576 bytes verified"),
        "{stdout}"
    );
    assert!(
        stdout.contains("data plane: 0 HMC_BUFFER calls, 0 responses in buffer, 3 fallbacks"),
        "{stdout}"
    );
    assert_eq!(
        stderr
            .matches("the server has no data plane of this client's transport")
            .count(),
        1,
        "{stderr}"
    );
    // A name nobody provides is refused up front, naming what exists.
    let out = Command::new(CLIENT)
        .args(["--port", &server.port.to_string(), "--data-plane", "nosuch"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no transport named `nosuch`"),
        "{err}"
    );
}
