//! The real `hmc-rpc-server` and `hmc-rpc-client` binaries, as separate processes, over TCP
//! and a Unix socket, for all three methods; and graceful shutdown on SIGTERM.

mod common;

use std::process::Command;

use common::{CLIENT, ServerProc};
use rstest::rstest;

/// The server as the issue runs it (its connection and in-flight limits), on a free port
/// and optionally a Unix socket.
fn server(uds: Option<&std::path::Path>) -> ServerProc {
    ServerProc::start(
        &["--max-connections", "68", "--max-inflight", "64"],
        &[],
        uds,
    )
}

fn client(target: &[String], args: &[&str]) -> String {
    let out = Command::new(CLIENT)
        .args(target)
        .args(args)
        .output()
        .expect("running hmc-rpc-client");
    assert!(
        out.status.success(),
        "client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[rstest]
#[case::tcp(false)]
#[case::unix(true)]
fn server_and_client_binaries_serve_all_three_methods(#[case] unix: bool) {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("rpc.sock");
    let server = server(Some(&sock));
    let target: Vec<String> = if unix {
        vec!["--uds-path".into(), sock.display().to_string()]
    } else {
        vec![
            "--server-address".into(),
            "127.0.0.1".into(),
            "--port".into(),
            server.port.to_string(),
        ]
    };
    let out = client(
        &target,
        &[
            "--method",
            "uppercase",
            "--message",
            "hello hmc rpc",
            "--repeat",
            "3",
        ],
    );
    assert_eq!(
        out,
        "response[1]=HELLO HMC RPC\nresponse[2]=HELLO HMC RPC\nresponse[3]=HELLO HMC RPC\n\
         Completed 3 uppercase RPC call(s)\n"
    );
    let out = client(&target, &["--method", "echo", "--message", "ping pong"]);
    assert_eq!(out, "response[1]=ping pong\nCompleted 1 echo RPC call(s)\n");
    let out = client(
        &target,
        &[
            "--method",
            "complex",
            "--message",
            "typed payload",
            "--values",
            "3,5,8",
        ],
    );
    assert_eq!(
        out,
        "response[1]=label=TYPED PAYLOAD count=3 sum=16 min=3 max=8 mean=5.333\n\
         Completed 1 complex RPC call(s)\n"
    );
}

#[test]
fn client_reports_a_missing_server_clearly() {
    let out = Command::new(CLIENT)
        .args(["--port", "1", "--method", "echo"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is an RPC server listening there?"), "{err}");
}

#[test]
fn sigterm_shuts_the_server_down_gracefully() {
    let mut server = server(None);
    let target = vec!["--port".to_string(), server.port.to_string()];
    client(&target, &["--method", "echo", "--message", "x"]);
    let status = server.sigterm();
    assert!(status.success(), "{status:?}");
}

/// CPU time (user + system, in clock ticks) a process has used so far.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which is in parentheses and may contain spaces).
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the full line: 12 and 13 after the name.
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

#[test]
fn idle_server_with_an_idle_connection_uses_no_cpu() {
    let server = server(None);
    // An open, idle connection: the client connects, calls once, then sleeps.
    let mut idle = std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    let mut h = hmc_rpc::FrameHeader::new(hmc_rpc::FrameKind::Ping, 1);
    h.status = hmc_rpc::Status::OK;
    std::io::Write::write_all(&mut idle, &h.encode()).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let before = cpu_ticks(server.child.id());
    std::thread::sleep(std::time::Duration::from_secs(2));
    let used = cpu_ticks(server.child.id()) - before;
    // 2 s at 100 ticks/s; a busy-polling thread would use ~200 ticks.
    assert!(used <= 2, "idle server used {used} CPU ticks in 2 s");
    drop(idle);
}

/// `--auth-secret-file` on both binaries: a client with the server's secret is served; one
/// without it is refused, and says which setting is missing.
#[test]
fn the_binaries_authenticate_rpc_connections_with_a_secret_file() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "the-binaries-shared-secret\n").unwrap();
    let secret = secret.display().to_string();
    let server = ServerProc::start(&["--auth-secret-file", &secret], &[], None);
    let target = [
        "--server-address".to_string(),
        "127.0.0.1".into(),
        "--port".into(),
        server.port.to_string(),
    ];
    let out = client(&target, &["--auth-secret-file", &secret, "--repeat", "2"]);
    assert!(out.contains("Completed 2 echo"), "{out}");
    let refused = Command::new(CLIENT)
        .args(&target)
        .args(["--timeout-ms", "3000"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(why.contains("auth_secret"), "{why}");
}
