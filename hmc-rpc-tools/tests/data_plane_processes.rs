//! HMC_BUFFER between the real binaries, over the TCP communicator and over UCX (`UCX_TLS=tcp`
//! and shared memory): a two-process verified echo with `--data-plane`, and the soak test:
//! connect/call/disconnect cycles from 4 concurrent client processes against one server,
//! with zero errors and the server's fds and RSS flat. UCX must be installed (`libucx0`);
//! these tests never skip.
//!
//! The soak runs 4 x 25 cycles by default and 4 x 2 500 (10 000 cycles) with
//! `HMC_LONG_TESTS=1`.

mod common;

use std::process::{Child, Command, Stdio};

use common::{CLIENT, ServerProc, check};
use rstest::rstest;

/// A data plane to test: `--data-plane` and the `UCX_TLS` both sides get (UCX only).
#[derive(Clone, Copy, Debug)]
struct Plane {
    name: &'static str,
    ucx_tls: Option<&'static str>,
}

const TCP: Plane = Plane {
    name: "tcp",
    ucx_tls: None,
};
const UCX_TCP: Plane = Plane {
    name: "ucx",
    ucx_tls: Some("tcp"),
};
const UCX_SHM: Plane = Plane {
    name: "ucx",
    ucx_tls: Some("posix,cma,self"),
};
const SHM: Plane = Plane {
    name: "shm",
    ucx_tls: None,
};
/// Shared memory to this host's client, UCX (over tcp here) or TCP to the others.
const AUTO: Plane = Plane {
    name: "auto",
    ucx_tls: Some("tcp"),
};

impl Plane {
    fn envs(self) -> Vec<(&'static str, &'static str)> {
        self.ucx_tls.map(|t| ("UCX_TLS", t)).into_iter().collect()
    }

    fn server(self) -> ServerProc {
        ServerProc::start(&["--data-plane", self.name], &self.envs(), None)
    }

    /// `hmc-rpc-client --method echo` on `port` with this data plane (`None`: without one).
    fn client(self, port: u16, data_plane: Option<&str>, extra: &[&str]) -> Command {
        let mut c = Command::new(CLIENT);
        c.args(["--port", &port.to_string(), "--method", "echo"])
            .args(["--data-plane", data_plane.unwrap_or(self.name)])
            .args(extra)
            .envs(self.envs());
        c
    }
}

#[rstest]
#[case::tcp(TCP)]
#[case::ucx_tcp(UCX_TCP)]
#[case::ucx_shared_memory(UCX_SHM)]
#[case::shm(SHM)]
#[case::auto(AUTO)]
fn two_processes_echo_one_mib(#[case] plane: Plane) {
    let server = plane.server();
    let out = check(
        plane
            .client(
                server.port,
                None,
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
        plane
            .client(server.port, Some("none"), &["--payload-bytes", "1048576"])
            .output()
            .unwrap(),
    );
    assert!(out.contains("1048576 bytes verified"), "{out}");
}

#[rstest]
#[case::tcp(TCP)]
#[case::ucx_tcp(UCX_TCP)]
#[case::ucx_shared_memory(UCX_SHM)]
#[case::shm(SHM)]
fn soak_connect_call_disconnect_from_four_client_processes(#[case] plane: Plane) {
    let long = std::env::var("HMC_LONG_TESTS").is_ok_and(|v| v == "1");
    let cycles = if long { 2_500 } else { 25 };
    let server = plane.server();
    let run_round = |cycles: u32| {
        let kids: Vec<Child> = (0..4)
            .map(|_| {
                plane
                    .client(
                        server.port,
                        None,
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
    // Warm up (pools, runtime threads, UCX endpoints), then measure.
    run_round(5);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let (fds0, rss0) = (server.fds(), server.rss_kib());
    run_round(cycles);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let (fds1, rss1) = (server.fds(), server.rss_kib());
    eprintln!(
        "{plane:?}: server fds {fds0} -> {fds1}, RSS {rss0} -> {rss1} KiB after 4 x {cycles} cycles"
    );
    assert!(fds1 <= fds0 + 2, "fds grew from {fds0} to {fds1}");
    assert!(
        rss1 <= rss0 + 16 * 1024,
        "RSS grew from {rss0} to {rss1} KiB"
    );
}
