//! `hmc-rpc-server --metrics-addr`: the Prometheus endpoint is scraped before and after
//! calls from the real client binary, and the counters and gauges move with them.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{CLIENT, ServerProc};

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

#[test]
fn the_prometheus_endpoint_counts_calls_bytes_and_connections_as_they_happen() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let server = ServerProc::start(&["--metrics-addr", &addr], &[], None);
    let before = scrape(port);
    let calls = |method: &str, message: &str, n: u32| {
        let out = Command::new(CLIENT)
            .args([
                "--server-address",
                "127.0.0.1",
                "--port",
                &server.port.to_string(),
            ])
            .args([
                "--method",
                method,
                "--message",
                message,
                "--repeat",
                &n.to_string(),
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    calls("echo", "hello metrics", 7);
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
    let start = Instant::now();
    while value(&scrape(port), "hmc_rpc_server_connections") != 0.0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{}",
            scrape(port)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
