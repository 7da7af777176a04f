//! `cargo xtask demo`: the main job on loopback, in real processes: one-sided transfers and the RPC demo methods.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::Result;

/// Kills the child when dropped, so a failed demo leaves no server behind.
struct Reaper(Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| format!("finding a free port: {e}"))?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

fn wait_for_port(port: u16, child: &mut Child) -> Result {
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("server exited early with {status}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!(
        "server did not listen on 127.0.0.1:{port} within 20 s"
    ))
}

/// Streams a child's stdout to ours with a prefix, on a thread.
fn relay(child: &mut Child, prefix: &'static str) -> std::thread::JoinHandle<Vec<String>> {
    let out = child.stdout.take().expect("stdout piped");
    std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
            println!("{prefix} {line}");
            lines.push(line);
        }
        lines
    })
}

fn checked(mut cmd: Command, what: &str) -> Result<Vec<String>> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting {what}: {e}"))?;
    let lines = relay(&mut child, "[client]");
    let status = child
        .wait()
        .map_err(|e| format!("waiting for {what}: {e}"))?;
    let lines = lines.join().unwrap_or_default();
    if !status.success() {
        return Err(format!("{what} failed with {status}"));
    }
    Ok(lines)
}

/// Two processes: one serves a registered buffer, the other connects over the control
/// plane, WRITEs a buffer one-sided, READs it back, and both print checksums.
pub fn one_sided(peer: &Path) -> Result {
    println!("== one-sided transfer over TCP (two processes) ==");
    let port = free_port()?;
    let addr = format!("tcp://127.0.0.1:{port}");
    let mut server = Command::new(peer)
        .args([
            "serve",
            "--listen",
            &addr,
            "--len",
            "16777216",
            "--exit-after",
            "1",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting {}: {e}", peer.display()))?;
    let server_out = relay(&mut server, "[server]");
    let mut server = Reaper(server);
    wait_for_port(port, &mut server.0)?;
    let mut client = Command::new(peer);
    client.args(["client", "--connect", &addr, "--len", "16777216"]);
    let client_lines = checked(client, "the one-sided client")?;
    let status = server.0.wait().map_err(|e| e.to_string())?;
    let server_lines = server_out.join().unwrap_or_default();
    if !status.success() {
        return Err(format!("the one-sided server failed with {status}"));
    }
    let sum = |lines: &[String]| {
        lines.iter().rev().find_map(|l| {
            l.split("checksum=")
                .nth(1)
                .map(|s| s.split_whitespace().next().unwrap_or("").to_string())
        })
    };
    match (sum(&client_lines), sum(&server_lines)) {
        (Some(c), Some(s)) if c == s => {
            println!("checksums match on both sides: {c}");
            Ok(())
        }
        (c, s) => Err(format!(
            "checksums differ or are missing: client {c:?}, server {s:?}"
        )),
    }
}

/// The RPC server and client binaries with the three demo methods.
pub fn rpc(server_bin: &Path, client_bin: &Path) -> Result {
    println!("== RPC over TCP: echo, uppercase, complex ==");
    let port = free_port()?;
    let port_s = port.to_string();
    let mut server = Command::new(server_bin)
        .args([
            "--bind-address",
            "127.0.0.1",
            "--port",
            &port_s,
            "--workers",
            "4",
            "--max-connections",
            "68",
            "--max-inflight",
            "64",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting {}: {e}", server_bin.display()))?;
    let _server_out = relay(&mut server, "[server]");
    let mut server = Reaper(server);
    wait_for_port(port, &mut server.0)?;
    let base = ["--server-address", "127.0.0.1", "--port", &port_s];
    for extra in [
        &[
            "--method",
            "echo",
            "--message",
            "hello hmc rpc",
            "--repeat",
            "2",
        ][..],
        &[
            "--method",
            "uppercase",
            "--message",
            "hello hmc rpc",
            "--repeat",
            "3",
        ][..],
        &[
            "--method",
            "complex",
            "--message",
            "typed payload",
            "--values",
            "3,5,8",
        ][..],
    ] {
        let mut c = Command::new(client_bin);
        c.args(base).args(extra);
        checked(c, "the RPC client")?;
    }
    Ok(())
}
