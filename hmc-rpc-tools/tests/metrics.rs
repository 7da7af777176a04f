//! `hmc-rpc-server --metrics-addr`: the Prometheus endpoint is scraped before and after
//! calls from the real client binary, and the counters and gauges move with them: calls,
//! bytes, connections, the data plane's buffer pools, and the held-byte budget while a
//! client makes the server hold a request body.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{CLIENT, ServerProc};
use hmc_rpc::{FrameHeader, FrameKind, PayloadMode};

fn scrape(port: u16) -> String {
    let start = Instant::now();
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(mut s) => {
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                write!(
                    s,
                    "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                )
                .unwrap();
                let mut out = String::new();
                s.read_to_string(&mut out).unwrap();
                assert!(out.starts_with("HTTP/1.1 200"), "{out}");
                return out;
            }
            Err(e) => {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "metrics endpoint: {e}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// The value of an unlabelled sample, 0 when absent (nothing recorded yet).
fn value(page: &str, name: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0.0)
}

/// Scrapes until `ok` holds for `name`'s value (10 s at most).
fn wait_for(port: u16, name: &str, ok: impl Fn(f64) -> bool) -> f64 {
    let start = Instant::now();
    loop {
        let page = scrape(port);
        let v = value(&page, name);
        if ok(v) {
            return v;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{name}: {page}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs the client binary against `port` with `args`, and checks it succeeded.
fn client(port: u16, args: &[&str]) {
    let out = Command::new(CLIENT)
        .args(["--server-address", "127.0.0.1", "--port", &port.to_string()])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A server with `--metrics-addr` (and `args`), and the metrics port.
fn server_with_metrics(args: &[&str]) -> (ServerProc, u16) {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let all: Vec<&str> = ["--metrics-addr", &addr]
        .into_iter()
        .chain(args.iter().copied())
        .collect();
    (ServerProc::start(&all, &[], None), port)
}

#[test]
fn the_prometheus_endpoint_counts_calls_bytes_and_connections_as_they_happen() {
    let (server, port) = server_with_metrics(&[]);
    let before = scrape(port);
    client(
        server.port,
        &[
            "--method",
            "echo",
            "--message",
            "hello metrics",
            "--repeat",
            "7",
        ],
    );
    let after = scrape(port);
    let grew = |name: &str| value(&after, name) - value(&before, name);
    assert_eq!(grew("hmc_rpc_server_calls_total"), 7.0, "{after}");
    assert!(
        grew("hmc_rpc_server_bytes_received_total") >= 7.0 * 13.0,
        "{after}"
    );
    assert!(
        grew("hmc_rpc_server_bytes_sent_total") >= 7.0 * 13.0,
        "{after}"
    );
    assert_eq!(value(&after, "hmc_rpc_server_inflight"), 0.0, "{after}");
    assert!(after.contains("hmc_rpc_server_handler_seconds"), "{after}");
    // The client has gone: no connection is left open.
    wait_for(port, "hmc_rpc_server_connections", |v| v == 0.0);
}

#[test]
fn the_data_plane_pools_and_the_held_byte_budget_are_gauges() {
    let held_limit = 256u64 << 20;
    let (server, port) = server_with_metrics(&[
        "--data-plane",
        "tcp",
        "--max-held-bytes",
        &held_limit.to_string(),
    ]);
    let before = scrape(port);
    assert_eq!(
        value(&before, "hmc_rpc_server_held_bytes_limit"),
        held_limit as f64,
        "{before}"
    );
    assert_eq!(
        value(&before, "hmc_rpc_pool_registered_bytes"),
        0.0,
        "{before}"
    );

    // 1 MiB echoes over the data plane: the server registers pooled buffers for them and
    // keeps them idle afterwards.
    let mib = (1u64 << 20).to_string();
    client(
        server.port,
        &[
            "--data-plane",
            "tcp",
            "--payload-bytes",
            &mib,
            "--repeat",
            "3",
        ],
    );
    let after = scrape(port);
    assert!(
        value(&after, "hmc_rpc_pool_registered_bytes") >= (1u64 << 20) as f64,
        "{after}"
    );
    assert_eq!(value(&after, "hmc_rpc_pool_in_use_bytes"), 0.0, "{after}");

    // A request announcing a 1 MiB TCP_STREAM body that never comes: the server charges
    // it whole to its budget at admission, and lets it go when the client leaves.
    let mut held = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    let mut h = FrameHeader::new(FrameKind::Request, 1);
    h.method_id = hmc_rpc::demo::ECHO;
    h.mode = PayloadMode::TcpStream;
    h.payload_len = 1 << 20;
    held.write_all(&h.encode()).unwrap();
    let v = wait_for(port, "hmc_rpc_server_held_bytes", |v| {
        v >= (1u64 << 20) as f64
    });
    assert!(v <= held_limit as f64, "{v}");
    drop(held);
    wait_for(port, "hmc_rpc_server_held_bytes", |v| v == 0.0);
}
