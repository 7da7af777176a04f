//! What the tests that run the real `hmc-rpc-server` and `hmc-rpc-client` binaries share:
//! a server process on a free port, killed on drop, with its fds and RSS readable.

// Each test binary uses part of this module.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};

pub const SERVER: &str = env!("CARGO_BIN_EXE_hmc-rpc-server");
pub const CLIENT: &str = env!("CARGO_BIN_EXE_hmc-rpc-client");

/// A server process on a free loopback port; killed on drop.
pub struct ServerProc {
    pub child: Child,
    pub port: u16,
}

impl ServerProc {
    /// Starts `hmc-rpc-server --bind-address 127.0.0.1 --port 0 --workers 2` with `args`
    /// and `envs`, and waits for the line that names its address (and, with `uds`, the
    /// Unix socket's line). The server's stderr goes to the test's.
    pub fn start(args: &[&str], envs: &[(&str, &str)], uds: Option<&Path>) -> Self {
        let mut cmd = Command::new(SERVER);
        cmd.args([
            "--bind-address",
            "127.0.0.1",
            "--port",
            "0",
            "--workers",
            "2",
        ])
        .args(args)
        .envs(envs.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
        if let Some(p) = uds {
            cmd.arg("--uds-path").arg(p);
        }
        let mut child = cmd.spawn().expect("starting hmc-rpc-server");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let port = line
            .trim()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in `{line}`"));
        if uds.is_some() {
            line.clear();
            out.read_line(&mut line).unwrap();
            assert!(line.contains("unix://"), "{line}");
        }
        ServerProc { child, port }
    }

    /// Open file descriptors of the server.
    pub fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .unwrap()
            .count()
    }

    /// Resident memory of the server, KiB.
    pub fn rss_kib(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }

    /// Sends SIGTERM and waits for the exit.
    pub fn sigterm(&mut self) -> ExitStatus {
        // SAFETY: `kill` with a pid we own and a valid signal number has no memory effects.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        assert_eq!(rc, 0);
        self.child.wait().unwrap()
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client run's stdout, after asserting that it succeeded.
pub fn check(out: Output) -> String {
    assert!(
        out.status.success(),
        "client failed: {} {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}
