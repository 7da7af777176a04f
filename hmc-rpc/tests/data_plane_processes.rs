//! HMC_BUFFER between the real binaries: a two-process verified echo with `--data-plane`,
//! and the soak test: connect/call/disconnect cycles from 4 concurrent client processes
//! against one server, with zero errors and the server's fds and RSS flat.
//!
//! The soak runs 4 x 25 cycles by default and 4 x 2 500 (10 000 cycles) with
//! `HMC_LONG_TESTS=1`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

const SERVER: &str = env!("CARGO_BIN_EXE_hmc-rpc-server");
const CLIENT: &str = env!("CARGO_BIN_EXE_hmc-rpc-client");

struct ServerProc {
    child: Child,
    port: u16,
}

impl ServerProc {
    fn start(data_plane: &str) -> Self {
        let mut child = Command::new(SERVER)
            .args([
                "--bind-address",
                "127.0.0.1",
                "--port",
                "0",
                "--workers",
                "2",
            ])
            .args(["--data-plane", data_plane])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting hmc-rpc-server");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let port = line
            .trim()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in `{line}`"));
        ServerProc { child, port }
    }

    fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .unwrap()
            .count()
    }

    fn rss_kib(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn client_cmd(port: u16, data_plane: &str, extra: &[&str]) -> Command {
    let mut c = Command::new(CLIENT);
    c.args(["--port", &port.to_string(), "--method", "echo"])
        .args(["--data-plane", data_plane])
        .args(extra);
    c
}

fn check(out: std::process::Output) -> String {
    assert!(
        out.status.success(),
        "client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn two_processes_echo_one_mib_over_the_tcp_data_plane() {
    let server = ServerProc::start("tcp");
    let out = check(
        client_cmd(
            server.port,
            "tcp",
            &["--payload-bytes", "1048576", "--repeat", "3"],
        )
        .output()
        .unwrap(),
    );
    assert!(
        out.starts_with(
            "response[1]=1048576 bytes verified\nresponse[2]=1048576 bytes verified\n\
             response[3]=1048576 bytes verified\n"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "data plane: 3 HMC_BUFFER calls, 3 responses in buffer, 0 fallbacks, 2 registrations"
        ),
        "{out}"
    );
    // A client without a data plane streams to the same server.
    let out = check(
        client_cmd(server.port, "none", &["--payload-bytes", "1048576"])
            .output()
            .unwrap(),
    );
    assert!(out.contains("1048576 bytes verified"), "{out}");
}

#[test]
fn soak_connect_call_disconnect_from_four_client_processes() {
    let long = std::env::var("HMC_LONG_TESTS").is_ok_and(|v| v == "1");
    let cycles = if long { 2_500 } else { 25 };
    let server = ServerProc::start("tcp");
    let run_round = |cycles: u32| {
        let kids: Vec<Child> = (0..4)
            .map(|_| {
                client_cmd(
                    server.port,
                    "tcp",
                    &["--payload-bytes", "131072", "--cycles", &cycles.to_string()],
                )
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
            })
            .collect();
        for k in kids {
            let out = check(k.wait_with_output().unwrap());
            assert!(
                out.contains(&format!(
                    "Completed {cycles} echo RPC call(s) in {cycles} connection cycles, 0 errors"
                )),
                "{out}"
            );
            assert!(
                out.contains(&format!("data plane: {cycles} HMC_BUFFER calls")),
                "{out}"
            );
        }
    };
    // Warm up (pools, runtime threads), then measure.
    run_round(5);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (fds0, rss0) = (server.fds(), server.rss_kib());
    run_round(cycles);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (fds1, rss1) = (server.fds(), server.rss_kib());
    eprintln!("server fds {fds0} -> {fds1}, RSS {rss0} -> {rss1} KiB after 4 x {cycles} cycles");
    assert!(fds1 <= fds0 + 2, "fds grew from {fds0} to {fds1}");
    assert!(
        rss1 <= rss0 + 16 * 1024,
        "RSS grew from {rss0} to {rss1} KiB"
    );
}
