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

/// `cargo xtask demo --cluster`: etcd started here on loopback, an engine that serves
/// 16 MiB under the name `prefill-0`, another named `decode-0` that finds it by name through
/// etcd and reads it three times with checksums verified; then both engines and etcd stop.
pub fn cluster(node: &Path) -> Result {
    println!("== two engines that find each other through etcd ==");
    let dir = std::env::temp_dir().join(format!("hmc-demo-cluster-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let (client_port, peer_port) = (free_port()?, free_port()?);
    let log = std::fs::File::create(dir.join("etcd.log")).map_err(|e| e.to_string())?;
    let etcd = Command::new(crate::cluster::etcd_binary()?)
        .args(crate::cluster::etcd_args(
            &dir,
            "127.0.0.1",
            client_port,
            peer_port,
        ))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("starting etcd: {e}"))?;
    let mut etcd = Reaper(etcd);
    wait_for_port(client_port, &mut etcd.0)?;
    let url = format!("etcd://127.0.0.1:{client_port}/hmc-demo");
    println!(
        "[etcd] listening on 127.0.0.1:{client_port} (log and data in {}); engines register under /hmc-demo/members/",
        dir.display()
    );
    // The job's secret: both engines authenticate their metadata exchange and data plane
    // with it (a file of mode 0600, so that it stays out of `ps` and of other users).
    let secret = dir.join("job.secret");
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .map_err(|e| format!("/dev/urandom: {e}"))?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(&secret, hex).map_err(|e| format!("{}: {e}", secret.display()))?;
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(|e| format!("{}: {e}", secret.display()))?;
    println!(
        "[demo] the engines share the secret in {} (auth_secret_file)",
        secret.display()
    );
    let secret = secret.to_string_lossy().into_owned();
    let engine = |args: &[&str]| {
        Command::new(node)
            .args(args)
            .args(["--metadata", &url, "--ip", "127.0.0.1"])
            .args(["--auth-secret-file", &secret])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", node.display()))
    };
    let mut serve = engine(&["serve", "--name", "prefill-0", "--mib", "16"])?;
    let serve_out = relay(&mut serve, "[prefill-0]");
    let mut serve = Reaper(serve);
    // The puller retries its lookup by name until the server has registered.
    let mut pull = engine(&[
        "pull",
        "--name",
        "decode-0",
        "--peer",
        "prefill-0",
        "--rounds",
        "3",
    ])?;
    let pull_out = relay(&mut pull, "[decode-0]");
    let mut pull = Reaper(pull);
    // Its standard input stays open while it runs (`wait` would close it: "stop").
    let _running = pull.0.stdin.take();
    let status = pull.0.wait().map_err(|e| e.to_string())?;
    let lines = pull_out.join().unwrap_or_default();
    // Closing its standard input stops the server, which deregisters itself.
    drop(serve.0.stdin.take());
    let served = serve.0.wait().map_err(|e| e.to_string())?;
    let _ = serve_out.join();
    drop(etcd);
    println!("[etcd] stopped");
    let summary = lines
        .iter()
        .find(|l| l.starts_with("SUMMARY"))
        .cloned()
        .unwrap_or_default();
    if !status.success() || !served.success() || !summary.starts_with("SUMMARY ok=3 failed=0 ") {
        return Err(format!(
            "the cluster demo failed (puller {status}, server {served}): {summary:?}; etcd's log: {}",
            dir.join("etcd.log").display()
        ));
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "decode-0 found prefill-0 by name through etcd and read its 16 MiB three times, checksums verified"
    );
    Ok(())
}
