//! Real child processes: 64 MiB each way with one-sided WRITE and READ, and a target killed mid-transfer.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmc_backend_cpu::HostMemory;
use hmc_core::{
    Access, Communicator, ConnBuffer, Deadline, Error, Op, PeerAddr, RegisteredBuffer,
    RemoteRegion, TransferDesc,
};
use hmc_transport_tcp::{ControlPlane, ControlPlaneConfig, TcpCommunicator, TcpConfig};

const PEER: &str = env!("CARGO_BIN_EXE_hmc-tcp-peer");
const LEN: usize = 64 << 20;

/// Kills the child if the test ends early.
struct Reaper(Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `hmc-tcp-peer serve` on a kernel-chosen port; returns it and its control address.
fn start_server(extra: &[&str]) -> (Reaper, BufReader<ChildStdout>, PeerAddr) {
    let len = LEN.to_string();
    let mut child = Command::new(PEER)
        .args(["serve", "--listen", "tcp://127.0.0.1:0", "--len", &len])
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start hmc-tcp-peer serve");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).expect("server's first line");
    let addr = first
        .split("control plane at ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap_or_else(|| panic!("unexpected first line: {first:?}"))
        .parse()
        .expect("control address");
    (Reaper(child), out, addr)
}

fn last_checksum(lines: &[String]) -> Option<String> {
    lines.iter().rev().find_map(|l| {
        l.split("checksum=")
            .nth(1)
            .map(|s| s.split_whitespace().next().unwrap_or("").to_string())
    })
}

/// Waits for a child with a limit, so a hang fails the test instead of blocking CI.
fn wait_within(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            start.elapsed() < limit,
            "child still running after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sixty_four_mib_each_way_between_two_processes() {
    let (mut server, server_out, addr) = start_server(&["--exit-after", "1"]);
    let server_lines =
        std::thread::spawn(move || server_out.lines().map_while(Result::ok).collect::<Vec<_>>());
    let client = Command::new(PEER)
        .args([
            "client",
            "--connect",
            &addr.to_string(),
            "--len",
            &LEN.to_string(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start hmc-tcp-peer client");
    let mut client = Reaper(client);
    let client_out = BufReader::new(client.0.stdout.take().unwrap());
    let client_lines =
        std::thread::spawn(move || client_out.lines().map_while(Result::ok).collect::<Vec<_>>());
    let limit = Duration::from_secs(120);
    assert!(wait_within(&mut client.0, limit).success(), "client failed");
    assert!(wait_within(&mut server.0, limit).success(), "server failed");
    let (client_lines, server_lines) = (client_lines.join().unwrap(), server_lines.join().unwrap());
    let both = format!("client: {client_lines:#?}\nserver: {server_lines:#?}");
    assert!(
        server_lines
            .iter()
            .any(|l| l.contains("(matches the client's)")),
        "the server did not verify the WRITE\n{both}"
    );
    assert!(
        client_lines
            .iter()
            .any(|l| l.contains("the inverse of what was written")),
        "the client did not verify the READ\n{both}"
    );
    let (c, s) = (last_checksum(&client_lines), last_checksum(&server_lines));
    assert!(c.is_some() && c == s, "checksums differ\n{both}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_target_mid_transfer_ends_in_an_error_before_the_deadline() {
    let (server, _out, addr) = start_server(&["--exit-after", "0"]);
    let deadline_after = Duration::from_secs(30);
    let soon = || Deadline::after(Duration::from_secs(20));
    let control = ControlPlane::bind(1, &[], ControlPlaneConfig::default())
        .await
        .unwrap();
    control.connect(0, &addr, soon()).await.unwrap();
    let data: PeerAddr = control.recv(0, soon()).await.unwrap();
    let region: RemoteRegion = control.recv(0, soon()).await.unwrap();
    let comm = Arc::new(
        TcpCommunicator::bind(&"tcp://127.0.0.1:0".parse().unwrap(), TcpConfig::default()).unwrap(),
    );
    let ep = comm.connect(&data, soon()).await.unwrap();
    let key = comm.import(&ep, &region).unwrap();
    let local = RegisteredBuffer::new(
        Arc::new(HostMemory::new()),
        comm.clone(),
        LEN,
        Access::READ_WRITE,
    )
    .unwrap();
    let d = [TransferDesc::<TcpCommunicator> {
        local: local.registration(),
        local_offset: 0,
        remote: &key,
        remote_offset: 0,
        len: LEN,
    }];
    // One full round first: the path works before the kill.
    comm.transfer(&ep, Op::Write, &d, soon()).await.unwrap();

    let pid = server.0.id();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        // SAFETY: plain syscall on our own child's pid, which has not been reaped yet.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    });
    let start = Instant::now();
    let mut outcome = Ok(());
    for i in 0..1000 {
        let op = if i % 2 == 0 { Op::Write } else { Op::Read };
        outcome = comm
            .transfer(&ep, op, &d, Deadline::after(deadline_after))
            .await;
        if outcome.is_err() {
            break;
        }
    }
    killer.join().unwrap();
    let err = outcome.expect_err("transfers to a killed process must fail");
    assert!(
        !matches!(err, Error::DeadlineExceeded { .. }),
        "the loss must be detected, not timed out: {err}"
    );
    assert!(
        start.elapsed() < deadline_after,
        "error came after the deadline"
    );
    assert!(matches!(err, Error::Peer { .. }), "{err:?}");
    // New work on the endpoint fails fast too.
    let again = comm
        .transfer(&ep, Op::Read, &d, Deadline::after(Duration::from_secs(5)))
        .await;
    assert!(matches!(again, Err(Error::Peer { .. })), "{again:?}");
    drop(server);
}

/// `hmc-tcp-peer --auth-secret-file`: a process without the secret cannot take the
/// client's rank, and a client with the same file completes the session.
#[test]
fn the_peers_authenticate_with_a_secret_file() {
    let path = std::env::temp_dir().join(format!("hmc-peer-secret-{}", std::process::id()));
    std::fs::write(&path, b"a-secret-for-the-two-peers\n").unwrap();
    let file = path.to_str().unwrap();
    let (mut server, _out, addr) = start_server(&[
        "--exit-after",
        "1",
        "--len",
        "65536",
        "--auth-secret-file",
        file,
    ]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let err = rt.block_on(async {
        let impostor = ControlPlane::bind(1, &[], ControlPlaneConfig::default())
            .await
            .unwrap();
        impostor
            .connect(0, &addr, Deadline::after(Duration::from_secs(10)))
            .await
            .unwrap_err()
    });
    assert!(err.to_string().contains("requires authentication"), "{err}");
    let client = Command::new(PEER)
        .args(["client", "--connect", &addr.to_string(), "--len", "65536"])
        .args(["--auth-secret-file", file])
        .stdout(Stdio::null())
        .spawn()
        .expect("start hmc-tcp-peer client");
    let mut client = Reaper(client);
    let limit = Duration::from_secs(60);
    assert!(wait_within(&mut client.0, limit).success(), "client failed");
    assert!(wait_within(&mut server.0, limit).success(), "server failed");
    std::fs::remove_file(&path).unwrap();
}
