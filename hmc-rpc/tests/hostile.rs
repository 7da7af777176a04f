//! The standing hostile-client suite: raw sockets that break the rules of
//! `docs/protocol.md` on purpose, against a real server on loopback. Each case asserts the
//! limit that answers it (the server's counters, `RunningServer::stats`) and that other
//! clients are unaffected.
//!
//! Set `HMC_HOSTILE_TARGET=tcp://IP:PORT` to aim the socket-level checks at a server you
//! started yourself (for example an older build, with the same limits as flags); the
//! counter checks are then skipped.

use std::time::{Duration, Instant};

use hmc_core::PeerAddr;
use hmc_rpc::frame::{
    Flags, FrameHeader, FrameKind, FrameLimits, HEADER_LEN, PayloadMode, payload_crc,
};
use hmc_rpc::{
    Client, ClientConfig, ConnConfig, Dispatcher, RunningServer, Server, ServerConfig, Status, demo,
};
use rstest::rstest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The server under test: in-process (its counters checked), or the one
/// `HMC_HOSTILE_TARGET` names.
struct Target {
    addr: std::net::SocketAddr,
    server: Option<RunningServer>,
}

impl Target {
    async fn start(config: ServerConfig) -> Target {
        if let Ok(t) = std::env::var("HMC_HOSTILE_TARGET") {
            let PeerAddr::Tcp(addr) = t.parse().expect("HMC_HOSTILE_TARGET=tcp://IP:PORT") else {
                panic!("HMC_HOSTILE_TARGET must be tcp://IP:PORT");
            };
            return Target { addr, server: None };
        }
        let mut d = Dispatcher::new();
        demo::register_demo(&mut d);
        let server = Server::new(d, config)
            .bind(&"tcp://127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let PeerAddr::Tcp(addr) = server.local_addr().clone() else {
            unreachable!()
        };
        Target {
            addr,
            server: Some(server),
        }
    }

    async fn raw(&self) -> TcpStream {
        TcpStream::connect(self.addr).await.unwrap()
    }

    /// The counters, for an in-process server.
    fn stats(&self) -> Option<hmc_rpc::ServerStats> {
        self.server.as_ref().map(|s| s.stats())
    }

    /// Waits up to `within` for the counters to satisfy `f` (connection tasks update them
    /// as they run); skipped for an external target.
    async fn wait_for(
        &self,
        within: Duration,
        what: &str,
        f: impl Fn(&hmc_rpc::ServerStats) -> bool,
    ) {
        let Some(s) = &self.server else {
            return;
        };
        let end = Instant::now() + within;
        loop {
            let st = s.stats();
            if f(&st) {
                return;
            }
            assert!(Instant::now() < end, "{what}: {st:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A well-behaved client still gets its echo answered.
    async fn assert_serves_others(&self) {
        let c = Client::connect(&PeerAddr::Tcp(self.addr), ClientConfig::default())
            .await
            .unwrap();
        let got = c.call(demo::ECHO, "still here").await.unwrap();
        assert_eq!(&got[..], b"still here");
    }
}

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

fn stream_request(id: u64, len: u64) -> Vec<u8> {
    let mut h = header(FrameKind::Request, id);
    h.mode = PayloadMode::TcpStream;
    h.payload_len = len;
    frame(&h, &[])
}

fn data(id: u64, total: u64, chunk: &[u8], end: bool) -> Vec<u8> {
    let mut h = header(FrameKind::Data, id);
    h.mode = PayloadMode::TcpStream;
    h.payload_len = total;
    h.body_len = chunk.len() as u32;
    if end {
        h.flags = Flags::END;
    }
    frame(&h, chunk)
}

/// A whole streamed request of `len` bytes (`keep_last`: without its last chunk).
fn streamed(id: u64, len: usize, keep_last: bool) -> Vec<u8> {
    const CHUNK: usize = 256 << 10;
    let mut v = stream_request(id, len as u64);
    let body = vec![b'z'; CHUNK];
    let mut sent = 0;
    while sent < len {
        let n = CHUNK.min(len - sent);
        if keep_last && sent + n == len {
            break;
        }
        sent += n;
        v.extend_from_slice(&data(id, len as u64, &body[..n], sent == len));
    }
    v
}

/// Reads one frame, or `None` at EOF/reset or after `within`.
async fn read_frame(s: &mut TcpStream, within: Duration) -> Option<(FrameHeader, Vec<u8>)> {
    let mut hb = [0u8; HEADER_LEN];
    match tokio::time::timeout(within, s.read_exact(&mut hb)).await {
        Ok(Ok(_)) => {}
        _ => return None,
    }
    let h = FrameHeader::decode(&hb, &FrameLimits::default()).unwrap();
    let mut body = vec![0u8; h.body_len as usize];
    s.read_exact(&mut body).await.ok()?;
    Some((h, body))
}

/// True when the server closed the connection (EOF or reset) within `within`, after
/// reading and dropping any frames before that.
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let end = tokio::time::Instant::now() + within;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match tokio::time::timeout_at(end, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

fn small_limits() -> ConnConfig {
    ConnConfig {
        max_conn_held_bytes: 16 << 20,
        max_tx_backlog: 1 << 20,
        write_stall_timeout: Duration::from_secs(2),
        stream_idle_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(1),
        ..ConnConfig::default()
    }
}

fn config(conn: ConnConfig) -> ServerConfig {
    ServerConfig {
        conn,
        max_held_bytes: 256 << 20,
        ..ServerConfig::default()
    }
}

/// Issue 22, failure 1: 1 MiB streamed echoes sent without reading the answers. The
/// server stops reading once `max_tx_backlog` answers wait, holds a bounded amount, and
/// drops the connection after `write_stall_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_throttled_then_dropped() {
    // A long idle timeout: answers that the kernel's buffers took leave the server with
    // nothing in flight, and this test is about the answers it still holds.
    let t = Target::start(config(ConnConfig {
        idle_timeout: Duration::from_secs(60),
        ..small_limits()
    }))
    .await;
    let mut s = t.raw().await;
    let req = streamed(0, 1 << 20, false);
    let mut written = 0usize;
    let start = Instant::now();
    let mut id = 1;
    // Write for up to 1.5 s; a server that keeps reading takes everything.
    while start.elapsed() < Duration::from_millis(1500) {
        let mut r = req.clone();
        // Patch the request id into every frame of this request.
        let mut at = 0;
        while at < r.len() {
            let mut h =
                FrameHeader::decode(&r[at..at + HEADER_LEN], &FrameLimits::default()).unwrap();
            h.request_id = id;
            r[at..at + HEADER_LEN].copy_from_slice(&h.encode());
            at += HEADER_LEN + h.body_len as usize;
        }
        match tokio::time::timeout(Duration::from_millis(300), s.write_all(&r)).await {
            Ok(Ok(())) => written += r.len(),
            _ => break,
        }
        id += 1;
    }
    // Loopback socket buffers take a few MiB each way; the server itself keeps at most
    // its backlog and one request in reassembly.
    assert!(
        written < 48 << 20,
        "the server kept reading: {} MiB accepted from a client that reads nothing",
        written >> 20
    );
    if let Some(st) = t.stats() {
        assert!(
            st.held_bytes_peak <= (16 << 20) + (2 << 20),
            "held bytes past the connection budget: {st:?}"
        );
    }
    t.wait_for(
        Duration::from_secs(5),
        "closed by write_stall_timeout",
        |s| s.closed_write_stall == 1,
    )
    .await;
    t.wait_for(Duration::from_secs(2), "every held byte released", |s| {
        s.held_bytes == 0
    })
    .await;
    t.assert_serves_others().await;
}

/// Issue 22, failure 2: streams that never send END. Two connections x four 8 MiB
/// bodies, each missing its last chunk: each connection gets two admitted within
/// `max_conn_held_bytes` (16 MiB) and two OVERLOADED, and the admitted ones are failed
/// after `stream_idle_timeout`, freeing everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_that_never_end_are_bounded_and_reaped() {
    let t = Target::start(config(small_limits())).await;
    let mut conns = Vec::new();
    for _ in 0..2 {
        let mut s = t.raw().await;
        for id in 1..=4 {
            s.write_all(&streamed(id, 8 << 20, true)).await.unwrap();
        }
        conns.push(s);
    }
    for s in &mut conns {
        let mut statuses = Vec::new();
        let mut reasons = Vec::new();
        while statuses.len() < 4 {
            let (h, body) = read_frame(s, Duration::from_secs(5))
                .await
                .expect("every stream answered within stream_idle_timeout");
            if h.kind == FrameKind::Response {
                statuses.push(h.status);
                reasons.push(String::from_utf8_lossy(&body).into_owned());
            }
        }
        let overloaded = statuses
            .iter()
            .filter(|s| **s == Status::OVERLOADED)
            .count();
        let stalled = statuses
            .iter()
            .filter(|s| **s == Status::DEADLINE_EXCEEDED)
            .count();
        assert_eq!((overloaded, stalled), (2, 2), "{statuses:?} {reasons:?}");
        assert!(
            reasons.iter().any(|r| r.contains("max_conn_held_bytes")),
            "{reasons:?}"
        );
        assert!(
            reasons.iter().any(|r| r.contains("stream_idle_timeout")),
            "{reasons:?}"
        );
    }
    if let Some(st) = t.stats() {
        assert!(st.held_bytes_peak <= 2 * (16 << 20) + (1 << 20), "{st:?}");
        assert_eq!(st.streams_stalled, 4, "{st:?}");
        assert_eq!(st.refused_conn_budget, 4, "{st:?}");
    }
    t.wait_for(Duration::from_secs(2), "every held byte released", |s| {
        s.held_bytes == 0
    })
    .await;
    t.assert_serves_others().await;
}

/// Issue 22, failure 3: stream headers announcing 2^40 bytes, refused PAYLOAD_TOO_LARGE,
/// whose DATA never comes. Past `max_inflight_per_conn` such unfinished refusals the
/// connection is closed instead of keeping an entry for each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_streams_cannot_pile_up() {
    let t = Target::start(config(ConnConfig {
        max_inflight: 16,
        ..small_limits()
    }))
    .await;
    let mut s = t.raw().await;
    let mut burst = Vec::new();
    for id in 1..=2000u64 {
        burst.extend_from_slice(&stream_request(id, 1 << 40));
    }
    // The server may close before taking all of it.
    let _ = s.write_all(&burst).await;
    let mut too_large = 0;
    let mut goaway = None;
    while let Some((h, body)) = read_frame(&mut s, Duration::from_secs(3)).await {
        match h.kind {
            FrameKind::Response if h.status == Status::PAYLOAD_TOO_LARGE => too_large += 1,
            FrameKind::GoAway => {
                goaway = Some((h.status, String::from_utf8_lossy(&body).into_owned()));
                break;
            }
            _ => {}
        }
    }
    let (status, why) = goaway.expect("GOAWAY once refusals pile up");
    assert_eq!(status, Status::OVERLOADED, "{why}");
    assert!(why.contains("max_inflight_per_conn"), "{why}");
    assert_eq!(too_large, 16);
    if let Some(st) = t.stats() {
        assert_eq!(st.closed_skipped_streams, 1, "{st:?}");
    }
    t.assert_serves_others().await;
}

/// Issue 22, failure 8: a 16 MiB streamed echo, then `shutdown(SHUT_WR)`: the whole
/// answer still arrives before the server closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_close_still_gets_the_whole_answer() {
    let t = Target::start(config(ConnConfig::default())).await;
    let s = t.raw().await;
    let (mut rd, mut wr) = s.into_split();
    let len = 16 << 20;
    let req = streamed(7, len, false);
    let writer = tokio::spawn(async move {
        wr.write_all(&req).await.unwrap();
        wr.shutdown().await.unwrap();
        wr
    });
    let mut got = 0usize;
    let mut status = None;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), rd.read_to_end(&mut buf))
        .await
        .expect("the server closes once it has answered")
        .unwrap();
    let _wr = writer.await.unwrap();
    let mut at = 0;
    while at + HEADER_LEN <= buf.len() {
        let h = FrameHeader::decode(&buf[at..at + HEADER_LEN], &FrameLimits::default()).unwrap();
        match h.kind {
            FrameKind::Response => status = Some(h.status),
            FrameKind::Data => got += h.body_len as usize,
            _ => {}
        }
        at += HEADER_LEN + h.body_len as usize;
    }
    assert_eq!(status, Some(Status::OK));
    assert_eq!(
        got, len,
        "every byte of the answer arrived before the close"
    );
    t.wait_for(Duration::from_secs(2), "half-close counted", |s| {
        s.half_closed == 1
    })
    .await;
}

/// Also seen: a PING reset the idle timeout, so pinging sockets held every connection
/// slot forever. Liveness counts calls: pinging sockets are closed as idle and the slots
/// come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pings_do_not_keep_connection_slots() {
    let t = Target::start(ServerConfig {
        max_connections: 4,
        ..config(small_limits())
    })
    .await;
    let mut socks = Vec::new();
    for _ in 0..4 {
        socks.push(t.raw().await);
    }
    let start = Instant::now();
    let mut open = socks.len();
    let mut nonce = 0;
    while open > 0 && start.elapsed() < Duration::from_secs(4) {
        nonce += 1;
        let ping = frame(&FrameHeader::new(FrameKind::Ping, nonce), &[]);
        open = 0;
        for s in &mut socks {
            if s.write_all(&ping).await.is_ok()
                && !closed_within(s, Duration::from_millis(50)).await
            {
                open += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        open, 0,
        "pinging sockets were still open after 4 s (idle_timeout 1 s)"
    );
    t.wait_for(Duration::from_secs(2), "closed as idle", |s| {
        s.closed_idle >= 4
    })
    .await;
    t.assert_serves_others().await;
}

/// Rules that held before the resource-bounds work, kept from regressing: each bad
/// frame gets a GOAWAY(PROTOCOL) naming the problem, and the server serves others.
#[rstest]
#[case::bad_header_crc("crc")]
#[case::duplicate_id("duplicate")]
#[case::response_to_server("response")]
#[case::data_without_stream("orphan-data")]
#[case::oversized_body("oversized")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_abuse_gets_goaway(#[case] case: &str) {
    let t = Target::start(config(small_limits())).await;
    let mut s = t.raw().await;
    let bytes = match case {
        "crc" => {
            let mut b = inline_request(1, b"x");
            b[44] ^= 0xff;
            b
        }
        "duplicate" => {
            let mut b = stream_request(1, 1 << 20);
            b.extend_from_slice(&stream_request(1, 1 << 20));
            b
        }
        "response" => frame(&header(FrameKind::Response, 1), &[]),
        "orphan-data" => data(9, 100, &[0u8; 100], true),
        "oversized" => {
            let mut h = header(FrameKind::Data, 1);
            h.mode = PayloadMode::TcpStream;
            h.payload_len = 1 << 30;
            h.body_len = 1 << 30;
            h.encode().to_vec()
        }
        other => unreachable!("{other}"),
    };
    s.write_all(&bytes).await.unwrap();
    let mut goaway = None;
    while let Some((h, body)) = read_frame(&mut s, Duration::from_secs(3)).await {
        if h.kind == FrameKind::GoAway {
            goaway = Some((h.status, String::from_utf8_lossy(&body).into_owned()));
            break;
        }
    }
    let (status, why) = goaway.expect("a GOAWAY");
    assert_eq!(status, Status::PROTOCOL, "{why}");
    assert!(closed_within(&mut s, Duration::from_secs(3)).await);
    t.assert_serves_others().await;
}

/// Every hostile client above at once, in rounds, beside a well-behaved client whose
/// calls must all succeed; afterwards the server holds nothing. Two rounds by default,
/// a minute of rounds with `cargo xtask test --long` (`HMC_LONG_TESTS`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hostile_mix_leaves_nothing_behind() {
    let long = std::env::var_os("HMC_LONG_TESTS").is_some();
    let t = Target::start(config(ConnConfig {
        max_inflight: 16,
        ..small_limits()
    }))
    .await;
    let addr = t.addr;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let good = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let c = Client::connect(&PeerAddr::Tcp(addr), ClientConfig::default())
                .await
                .unwrap();
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let body = vec![b'g'; if n.is_multiple_of(2) { 64 } else { 200 << 10 }];
                let got = c.call(demo::ECHO, body.clone()).await.unwrap();
                assert_eq!(got.len(), body.len());
                n += 1;
            }
            n
        })
    };
    let started = Instant::now();
    let run_for = if long {
        Duration::from_secs(60)
    } else {
        Duration::ZERO
    };
    let mut rounds = 0;
    while rounds < 2 || started.elapsed() < run_for {
        rounds += 1;
        let mut tasks = tokio::task::JoinSet::new();
        // Never reads its answers.
        tasks.spawn(async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            for id in 1..=8 {
                let mut r = streamed(id, 1 << 20, false);
                let mut at = 0;
                while at < r.len() {
                    let mut h =
                        FrameHeader::decode(&r[at..at + HEADER_LEN], &FrameLimits::default())
                            .unwrap();
                    h.request_id = id;
                    r[at..at + HEADER_LEN].copy_from_slice(&h.encode());
                    at += HEADER_LEN + h.body_len as usize;
                }
                if tokio::time::timeout(Duration::from_millis(200), s.write_all(&r))
                    .await
                    .is_err()
                {
                    break;
                }
            }
        });
        // Bodies that never end.
        tasks.spawn(async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            for id in 1..=3 {
                let _ = s.write_all(&streamed(id, 4 << 20, true)).await;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        });
        // Refusals that never send their DATA.
        tasks.spawn(async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            let mut burst = Vec::new();
            for id in 1..=100u64 {
                burst.extend_from_slice(&stream_request(id, 1 << 40));
            }
            let _ = s.write_all(&burst).await;
            let _ = closed_within(&mut s, Duration::from_secs(1)).await;
        });
        // Half-closes after an echo.
        tasks.spawn(async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(&streamed(1, 2 << 20, false)).await.unwrap();
            s.shutdown().await.unwrap();
            let mut buf = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
            assert!(buf.len() > 2 << 20, "the answer came whole: {}", buf.len());
        });
        // Pings only.
        tasks.spawn(async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            for n in 0..3 {
                let ping = frame(&FrameHeader::new(FrameKind::Ping, n), &[]);
                if s.write_all(&ping).await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        while let Some(r) = tasks.join_next().await {
            r.unwrap();
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let calls = good.await.unwrap();
    assert!(calls > 0);
    t.wait_for(
        Duration::from_secs(6),
        "nothing held once the hostile clients are gone",
        |s| s.held_bytes == 0 && s.connections == 0,
    )
    .await;
}
