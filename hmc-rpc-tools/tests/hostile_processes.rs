//! The hostile-client check that needs the real `hmc-rpc-server` binary (moved here from
//! `hmc-rpc/tests/hostile.rs` with the binaries): idle connections' memory.

mod common;

use std::time::Duration;

use hmc_rpc::demo;
use hmc_rpc::frame::{FrameHeader, FrameKind, HEADER_LEN, payload_crc};

fn header(kind: FrameKind, id: u64) -> FrameHeader {
    let mut h = FrameHeader::new(kind, id);
    h.method_id = demo::ECHO;
    h
}

fn frame(h: &FrameHeader, body: &[u8]) -> Vec<u8> {
    let mut v = h.encode().to_vec();
    v.extend_from_slice(body);
    v
}

fn inline_request(id: u64, body: &[u8]) -> Vec<u8> {
    let mut h = header(FrameKind::Request, id);
    h.payload_len = body.len() as u64;
    h.body_len = body.len() as u32;
    h.payload_crc = payload_crc(body);
    frame(&h, body)
}

/// Issue 22, failure 9: idle connections were 262 KiB each (an input buffer per
/// connection). Input buffers are now taken on demand from a shared pool: 400 idle
/// connections to the real server binary cost at most 16 KiB each.
#[test]
fn idle_connections_cost_at_most_16_kib_each() {
    let server = common::ServerProc::start(&[], &[], None);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], server.port));
    // Warm up: one call, so that one-time allocations are not counted.
    {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(&inline_request(1, b"warm")).unwrap();
        let mut hb = [0u8; HEADER_LEN + 4];
        s.read_exact(&mut hb).unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    let before = server.rss_kib();
    let n = 400;
    let socks: Vec<_> = (0..n)
        .map(|_| std::net::TcpStream::connect(addr).unwrap())
        .collect();
    // Let the server accept and park every one.
    std::thread::sleep(Duration::from_millis(800));
    let after = server.rss_kib();
    let per = (after.saturating_sub(before)) as f64 / n as f64;
    assert!(
        per <= 16.0,
        "{per:.1} KiB per idle connection ({before} -> {after} KiB for {n})"
    );
    drop(socks);
}
