//! The server and client over real loopback sockets: out-of-order completion, deadlines,
//! cancel, overload, graceful shutdown, panics, malformed frames, stalls, disconnects and
//! reconnects.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::frames::{read_frame_within, request};
use hmc_core::PeerAddr;
use hmc_rpc::frame::{FrameHeader, FrameKind, FrameLimits, HEADER_LEN, PayloadMode, payload_crc};
use hmc_rpc::{
    CallError, CallOptions, Client, ClientConfig, ConnConfig, RunningServer, Server, ServerConfig,
    Status, demo,
};
use rstest::rstest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod common;

use common::methods::{
    BLOCKING_SLEEP, PANIC, SLEEP, WAIT_CANCEL, assert_complex_answer, complex_request, dispatcher,
};

async fn start(config: ServerConfig) -> (RunningServer, Arc<AtomicUsize>) {
    let c = Arc::new(AtomicUsize::new(0));
    let s = Server::new(dispatcher(c.clone()), config)
        .bind(&"tcp://127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    (s, c)
}

fn tcp_addr(s: &RunningServer) -> std::net::SocketAddr {
    match s.local_addr() {
        PeerAddr::Tcp(a) => *a,
        other => panic!("not tcp: {other}"),
    }
}

#[rstest]
#[case::ipv4("tcp://127.0.0.1:0")]
#[case::ipv6("tcp://[::1]:0")]
#[case::unix("unix")]
#[tokio::test]
async fn all_three_methods_answer_over_each_socket_kind(#[case] addr: &str) {
    let dir = tempfile::tempdir().unwrap();
    let addr: PeerAddr = if addr == "unix" {
        PeerAddr::Unix(dir.path().join("rpc.sock"))
    } else {
        addr.parse().unwrap()
    };
    let s = match Server::new(dispatcher(Default::default()), ServerConfig::default())
        .bind(&addr)
        .await
    {
        Ok(s) => s,
        Err(e) if addr.to_string().contains("::1") => {
            eprintln!("skipping IPv6: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let c = Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap();
    assert_eq!(&c.call(demo::ECHO, "abc").await.unwrap()[..], b"abc");
    let up: String = c
        .call_typed(demo::UPPERCASE, &"hello hmc rpc".to_string())
        .await
        .unwrap();
    assert_eq!(up, "HELLO HMC RPC");
    let r: demo::ComplexResponse = c
        .call_typed(demo::COMPLEX, &complex_request())
        .await
        .unwrap();
    assert_complex_answer(&r);
    s.shutdown().await;
}

#[tokio::test]
async fn slow_and_fast_calls_complete_out_of_order_on_one_connection() {
    let (s, _) = start(ServerConfig::default()).await;
    let c = Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap();
    let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for ms in [300u64, 1, 200, 2, 100, 3] {
        let c = c.clone();
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let r: u64 = c.call_typed(SLEEP, &ms).await.unwrap();
            assert_eq!(r, ms);
            order.lock().push(ms);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().clone();
    assert_eq!(&order[3..], &[100, 200, 300], "{order:?}");
    assert!(order[..3].iter().all(|ms| *ms < 10), "{order:?}");
}

#[tokio::test]
async fn many_verified_calls_share_one_persistent_connection() {
    let n: usize = if std::env::var("HMC_LONG_TESTS").is_ok() {
        200_000
    } else {
        5_000
    };
    let (s, _) = start(ServerConfig::default()).await;
    let c = Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for w in 0..16usize {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            for i in (w..n).step_by(16) {
                let body = format!("call-{i}-{}", "x".repeat(i % 97));
                let r = c.call(demo::ECHO, body.clone()).await.unwrap();
                assert_eq!(&r[..], body.as_bytes());
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(s.connections(), 1);
}

/// 4 clients x N concurrent verified calls (N = 100,000 with HMC_LONG_TESTS=1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_clients_make_concurrent_verified_calls() {
    let n: usize = if std::env::var("HMC_LONG_TESTS").is_ok() {
        100_000
    } else {
        2_000
    };
    let (s, _) = start(ServerConfig::default()).await;
    let mut tasks = Vec::new();
    let mut clients = Vec::new();
    for client in 0..4usize {
        let c = Client::connect(s.local_addr(), ClientConfig::default())
            .await
            .unwrap();
        clients.push(c.clone());
        for lane in 0..8usize {
            let c = c.clone();
            tasks.push(tokio::spawn(async move {
                for i in (lane..n).step_by(8) {
                    let body = format!("{client}:{i}");
                    let r = c.call(demo::ECHO, body.clone()).await.unwrap();
                    assert_eq!(&r[..], body.as_bytes());
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(s.connections(), 4, "one persistent connection per client");
    drop(clients);
}

#[test]
fn blocking_client_calls_from_plain_threads() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (s, _) = rt.block_on(start(ServerConfig::default()));
    let addr = s.local_addr().clone();
    let threads: Vec<_> = (0..3)
        .map(|t| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let c = hmc_rpc::BlockingClient::connect(&addr, ClientConfig::default()).unwrap();
                for i in 0..50 {
                    let msg = format!("t{t} call {i}");
                    let up: String = c.call_typed(demo::UPPERCASE, &msg).unwrap();
                    assert_eq!(up, msg.to_uppercase());
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    rt.block_on(s.shutdown());
}

#[tokio::test]
async fn hmc_buffer_request_without_a_data_plane_is_answered_data_plane() {
    let (s, _) = start(ServerConfig::default()).await;
    let mut raw = TcpStream::connect(tcp_addr(&s)).await.unwrap();
    let mut h = FrameHeader::new(FrameKind::Request, 9);
    h.method_id = demo::ECHO;
    h.mode = PayloadMode::HmcBuffer;
    h.payload_len = 1 << 20;
    h.body_len = 4;
    h.payload_crc = payload_crc(&[1, 2, 3, 4]);
    let mut b = h.encode().to_vec();
    b.extend_from_slice(&[1, 2, 3, 4]);
    raw.write_all(&b).await.unwrap();
    let (r, body) = read_frame(&mut raw).await;
    assert_eq!((r.request_id, r.status), (9, Status::DATA_PLANE));
    assert!(String::from_utf8_lossy(&body).contains("data plane"));
    // The connection stays usable.
    raw.write_all(&request(10, demo::ECHO, b"ok"))
        .await
        .unwrap();
    let (r, body) = read_frame(&mut raw).await;
    assert_eq!(
        (r.request_id, r.status, &body[..]),
        (10, Status::OK, &b"ok"[..])
    );
}

#[tokio::test]
async fn large_payloads_stream_without_blocking_small_calls() {
    let (s, _) = start(ServerConfig::default()).await;
    let c = Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap();
    let big: Vec<u8> = (0..8 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let big = Bytes::from(big);
    let c2 = c.clone();
    let b2 = big.clone();
    let large = tokio::spawn(async move { c2.call(demo::ECHO, b2).await.unwrap() });
    // Small calls keep completing while the 8 MiB payload is in flight both ways.
    for i in 0..50 {
        let r = c.call(demo::ECHO, format!("small {i}")).await.unwrap();
        assert_eq!(r, format!("small {i}").as_bytes());
    }
    assert_eq!(large.await.unwrap(), big);
}

#[tokio::test]
async fn deadline_passes_and_the_call_reports_it() {
    let (s, _) = start(ServerConfig::default()).await;
    let c = Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap();
    let opts = CallOptions {
        timeout: Some(Duration::from_millis(50)),
        ..CallOptions::default()
    };
    let e = c
        .call_typed_with::<u64, u64>(SLEEP, &2_000, opts)
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(Status::DEADLINE_EXCEEDED), "{e}");
    // The connection stays usable.
    assert_eq!(&c.call(demo::ECHO, "ok").await.unwrap()[..], b"ok");
}

/// Calls that arrive together are started one after another; a call whose deadline passes
/// while an earlier one of the same read runs in place (a handler that works before its
/// first await) is answered DEADLINE_EXCEEDED and never runs.
#[tokio::test]
async fn expired_work_in_a_batch_is_not_started_after_a_slow_inline_handler() {
    const STALL: u32 = 200;
    const COUNT: u32 = 201;
    let ran = Arc::new(AtomicUsize::new(0));
    let mut d = hmc_rpc::Dispatcher::new();
    d.register_raw(STALL, |_ctx, b| {
        // Works in place before returning a ready future: the connection task runs it.
        std::thread::sleep(Duration::from_millis(60));
        async move { Ok(b) }
    });
    let r = ran.clone();
    d.register_raw(COUNT, move |_ctx, b| {
        r.fetch_add(1, Ordering::SeqCst);
        async move { Ok(b) }
    });
    let s = Server::new(d, ServerConfig::default())
        .bind(&"tcp://127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let mut raw = TcpStream::connect(tcp_addr(&s)).await.unwrap();
    let mut late = request(2, COUNT, b"late");
    let mut h = FrameHeader::decode(&late[..HEADER_LEN], &FrameLimits::default()).unwrap();
    h.deadline_us = 20_000;
    late[..HEADER_LEN].copy_from_slice(&h.encode());
    // One write, so that the server parses both from one read.
    raw.write_all(&[request(1, STALL, b"slow"), late].concat())
        .await
        .unwrap();
    let mut answers = Vec::new();
    for _ in 0..2 {
        let (h, body) = read_frame(&mut raw).await;
        answers.push((h.request_id, h.status, body));
    }
    answers.sort_by_key(|a| a.0);
    assert_eq!((answers[0].0, answers[0].1), (1, Status::OK));
    assert_eq!(answers[0].2, b"slow");
    assert_eq!((answers[1].0, answers[1].1), (2, Status::DEADLINE_EXCEEDED));
    assert_eq!(ran.load(Ordering::SeqCst), 0, "the expired call ran");
    s.shutdown().await;
}

#[tokio::test]
async fn blocking_handler_sees_its_remaining_deadline() {
    let (s, _) = start(ServerConfig::default()).await;
    let c = Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap();
    let opts = CallOptions {
        timeout: Some(Duration::from_secs(5)),
        ..CallOptions::default()
    };
    let left: u64 = c
        .call_typed_with(BLOCKING_SLEEP, &10u64, opts)
        .await
        .unwrap();
    assert!(left > 3_000 && left < 5_000, "{left}");
}

#[tokio::test]
async fn dropping_a_call_cancels_it_on_the_server() {
    let (s, cancelled) = start(ServerConfig::default()).await;
    let c = Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap();
    let r = tokio::time::timeout(Duration::from_millis(100), c.call(WAIT_CANCEL, "")).await;
    assert!(r.is_err(), "the handler only returns once cancelled");
    for _ in 0..100 {
        if cancelled.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        cancelled.load(Ordering::SeqCst),
        1,
        "handler saw the cancel"
    );
    assert_eq!(&c.call(demo::ECHO, "after").await.unwrap()[..], b"after");
}

/// One connection cannot take all of `max_inflight_total` while another has calls in
/// flight: past three quarters of it, a connection holding its share is refused, and the
/// other's calls are still admitted. Alone, a connection may use it all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_connection_keeps_a_share_of_max_inflight_total() {
    let config = ServerConfig {
        max_inflight_total: 8,
        ..ServerConfig::default()
    };
    let (s, _) = start(config).await;
    let greedy = Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap();
    let other = Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap();
    let call = |c: &Client, ms: u64| {
        let c = c.clone();
        tokio::spawn(async move { c.call_typed::<u64, u64>(SLEEP, &ms).await })
    };
    let long = call(&other, 900);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let tasks: Vec<_> = (0..12).map(|_| call(&greedy, 500)).collect();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let theirs: Vec<_> = (0..2).map(|_| call(&other, 10)).collect();
    for t in theirs {
        t.await
            .unwrap()
            .expect("the other connection's calls are admitted");
    }
    let (mut ok, mut refused) = (0, 0);
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => ok += 1,
            Err(e) if e.status() == Some(Status::OVERLOADED) => {
                assert!(e.to_string().contains("max_inflight_total"), "{e}");
                refused += 1
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!((ok, refused), (5, 7));
    long.await.unwrap().unwrap();
    // Alone (the other connection idle), one connection takes all eight.
    let all: Vec<_> = (0..8).map(|_| call(&greedy, 200)).collect();
    for t in all {
        t.await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn overload_is_answered_overloaded_not_dropped() {
    let config = ServerConfig {
        max_inflight_total: 4,
        ..ServerConfig::default()
    };
    let (s, _) = start(config).await;
    let c = Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for _ in 0..12 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            c.call_typed::<u64, u64>(SLEEP, &300).await
        }));
    }
    let mut ok = 0;
    let mut overloaded = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => ok += 1,
            Err(e) if e.status() == Some(Status::OVERLOADED) => {
                assert!(e.to_string().contains("max_inflight_total"), "{e}");
                overloaded += 1
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!((ok, overloaded), (4, 8));
}

#[tokio::test]
async fn connection_limit_refuses_extra_connections_with_goaway() {
    let config = ServerConfig {
        max_connections: 1,
        ..ServerConfig::default()
    };
    let (s, _) = start(config).await;
    let c = Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap();
    c.call(demo::ECHO, "first").await.unwrap();
    let mut raw = TcpStream::connect(tcp_addr(&s)).await.unwrap();
    let (h, body) = read_frame(&mut raw).await;
    assert_eq!((h.kind, h.status), (FrameKind::GoAway, Status::OVERLOADED));
    assert!(String::from_utf8_lossy(&body).contains("max_connections"));
    c.call(demo::ECHO, "still served").await.unwrap();
}

#[tokio::test]
async fn panicking_handler_answers_internal_and_the_server_lives_on() {
    let (s, _) = start(ServerConfig::default()).await;
    let c = Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap();
    let e = c.call(PANIC, "").await.unwrap_err();
    assert_eq!(e.status(), Some(Status::INTERNAL));
    assert!(e.to_string().contains("handler bug"), "{e}");
    assert_eq!(&c.call(demo::ECHO, "alive").await.unwrap()[..], b"alive");
}

#[tokio::test]
async fn unknown_method_and_bad_payload_get_their_status() {
    let (s, _) = start(ServerConfig::default()).await;
    let c = Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap();
    let e = c.call(999, "").await.unwrap_err();
    assert_eq!(e.status(), Some(Status::UNKNOWN_METHOD), "{e}");
    // A string whose bytes are not UTF-8.
    let e = c
        .call(demo::UPPERCASE, vec![0, 0, 0, 2, 0xff, 0xfe])
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(Status::BAD_PAYLOAD), "{e}");
    assert!(e.to_string().contains("UTF-8"), "{e}");
    // A bad option tag inside the composite request.
    let e = c
        .call(demo::COMPLEX, vec![0, 0, 0, 0, 0, 0, 0, 1, 0, 0])
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(Status::BAD_PAYLOAD), "{e}");
}

#[tokio::test]
async fn graceful_shutdown_finishes_inflight_and_refuses_new_calls() {
    let (s, _) = start(ServerConfig::default()).await;
    let c = Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap();
    let c2 = c.clone();
    let slow = tokio::spawn(async move { c2.call_typed::<u64, u64>(SLEEP, &300).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let handle = s.shutdown_handle();
    handle.shutdown();
    // The call in flight finishes.
    assert_eq!(slow.await.unwrap().unwrap(), 300);
    s.wait().await;
    // New calls cannot get in: the listener is closed.
    let e = c.call(demo::ECHO, "late").await.unwrap_err();
    assert!(
        matches!(e, CallError::Connect(_)) || e.status() == Some(Status::SHUTTING_DOWN),
        "{e}"
    );
}

#[tokio::test]
async fn requests_racing_the_goaway_are_answered_shutting_down() {
    let (s, _) = start(ServerConfig::default()).await;
    let mut raw = TcpStream::connect(tcp_addr(&s)).await.unwrap();
    // One slow call keeps the connection draining.
    raw.write_all(&request(
        1,
        SLEEP,
        &hmc_rpc::RpcCodec::encode(&300u64).unwrap(),
    ))
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    s.shutdown_handle().shutdown();
    let (h, _) = read_frame(&mut raw).await;
    assert_eq!(
        (h.kind, h.status),
        (FrameKind::GoAway, Status::SHUTTING_DOWN)
    );
    raw.write_all(&request(2, demo::ECHO, b"new"))
        .await
        .unwrap();
    let (h, _) = read_frame(&mut raw).await;
    assert_eq!((h.request_id, h.status), (2, Status::SHUTTING_DOWN));
    let (h, _) = read_frame(&mut raw).await;
    assert_eq!((h.request_id, h.status), (1, Status::OK));
    s.wait().await;
}

/// One frame from `s`, within 5 s.
async fn read_frame(s: &mut TcpStream) -> (FrameHeader, Vec<u8>) {
    read_frame_within(s, Duration::from_secs(5)).await
}

fn damage(case: &str) -> Vec<u8> {
    let good = request(1, demo::ECHO, b"hello");
    let mut b = good.clone();
    let recrc = |b: &mut Vec<u8>| {
        let c = crc32c::crc32c(&b[0..44]);
        b[44..48].copy_from_slice(&c.to_be_bytes());
    };
    match case {
        "magic" => {
            b[0] = 0;
            recrc(&mut b)
        }
        "version" => {
            b[2] = 9;
            recrc(&mut b)
        }
        "reserved_flags" => {
            b[5] = 0x80;
            recrc(&mut b)
        }
        "unknown_kind" => {
            b[3] = 42;
            recrc(&mut b)
        }
        "header_crc" => b[10] ^= 0xff,
        "payload_crc" => *b.last_mut().unwrap() ^= 1,
        "body_over_limit" => {
            let mut h = FrameHeader::decode(&good[..48], &FrameLimits::default()).unwrap();
            h.kind = FrameKind::Data;
            h.mode = PayloadMode::TcpStream;
            h.payload_len = 1 << 40;
            h.body_len = 1 << 30;
            b = h.encode().to_vec();
        }
        "inline_len_mismatch" => {
            b[35] = 4;
            recrc(&mut b)
        }
        "data_without_stream" => {
            let mut h = FrameHeader::new(FrameKind::Data, 5);
            h.mode = PayloadMode::TcpStream;
            h.payload_len = 1;
            h.body_len = 1;
            b = h.encode().to_vec();
            b.push(0);
        }
        "duplicate_id" => {
            let slow = request(1, SLEEP, &hmc_rpc::RpcCodec::encode(&1000u64).unwrap());
            b = [slow.clone(), slow].concat();
        }
        other => panic!("{other}"),
    }
    b
}

#[rstest]
#[case::magic("magic", "bad magic")]
#[case::version("version", "version")]
#[case::reserved_flags("reserved_flags", "reserved flag")]
#[case::unknown_kind("unknown_kind", "frame kind")]
#[case::header_crc("header_crc", "header CRC32C")]
#[case::payload_crc("payload_crc", "payload CRC32C")]
#[case::body_over_limit("body_over_limit", "max_body_len")]
#[case::inline_len_mismatch("inline_len_mismatch", "INLINE")]
#[case::data_without_stream("data_without_stream", "no open stream")]
#[case::duplicate_id("duplicate_id", "duplicate request id")]
#[tokio::test]
async fn malformed_frame_gets_goaway_and_others_are_still_served(
    #[case] case: &str,
    #[case] reason: &str,
) {
    let (s, _) = start(ServerConfig::default()).await;
    let good = Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap();
    let mut raw = TcpStream::connect(tcp_addr(&s)).await.unwrap();
    raw.write_all(&damage(case)).await.unwrap();
    let (h, body) = read_frame(&mut raw).await;
    assert_eq!((h.kind, h.status), (FrameKind::GoAway, Status::PROTOCOL));
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains(reason), "{case}: {text}");
    // The server closes that connection...
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), raw.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap_or(0);
    assert!(n < 1000);
    // ...and serves everyone else.
    assert_eq!(&good.call(demo::ECHO, "fine").await.unwrap()[..], b"fine");
}

#[tokio::test]
async fn half_header_stall_is_closed_after_frame_timeout() {
    let config = ServerConfig {
        conn: ConnConfig {
            frame_timeout: Duration::from_millis(200),
            ..ConnConfig::default()
        },
        ..ServerConfig::default()
    };
    let (s, _) = start(config).await;
    let mut raw = TcpStream::connect(tcp_addr(&s)).await.unwrap();
    raw.write_all(&request(1, demo::ECHO, b"x")[..20])
        .await
        .unwrap();
    let (h, body) = read_frame(&mut raw).await;
    assert_eq!(h.kind, FrameKind::GoAway);
    assert!(String::from_utf8_lossy(&body).contains("frame_timeout"));
}

#[tokio::test]
async fn disconnect_mid_stream_frees_the_connection_and_server_lives_on() {
    let (s, _) = start(ServerConfig::default()).await;
    {
        let mut raw = TcpStream::connect(tcp_addr(&s)).await.unwrap();
        let mut h = FrameHeader::new(FrameKind::Request, 1);
        h.method_id = demo::ECHO;
        h.mode = PayloadMode::TcpStream;
        h.payload_len = 1 << 20;
        raw.write_all(&h.encode()).await.unwrap();
        let mut d = h;
        d.kind = FrameKind::Data;
        d.body_len = 1000;
        raw.write_all(&d.encode()).await.unwrap();
        raw.write_all(&[7u8; 1000]).await.unwrap();
    }
    for _ in 0..100 {
        if s.connections() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(s.connections(), 0);
    let c = Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap();
    assert_eq!(&c.call(demo::ECHO, "ok").await.unwrap()[..], b"ok");
}

#[tokio::test]
async fn lost_connection_fails_calls_in_flight_and_next_call_reconnects() {
    // A one-shot fake server: reads one request, then drops the connection.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (s, _) = start(ServerConfig::default()).await;
    let real = tcp_addr(&s);
    let fake = tokio::spawn(async move {
        let (mut sock, _) = l.accept().await.unwrap();
        let mut b = [0u8; 48];
        sock.read_exact(&mut b).await.unwrap();
        drop(sock);
        // Then forward the next connection to the real server.
        let (mut sock, _) = l.accept().await.unwrap();
        let mut up = TcpStream::connect(real).await.unwrap();
        let _ = tokio::io::copy_bidirectional(&mut sock, &mut up).await;
    });
    let c = Client::connect(&PeerAddr::Tcp(addr), ClientConfig::default())
        .await
        .unwrap();
    let e = c.call(demo::ECHO, "x").await.unwrap_err();
    assert!(matches!(e, CallError::ConnectionLost(_)), "{e}");
    assert!(e.to_string().contains("not replayed"));
    assert_eq!(&c.call(demo::ECHO, "again").await.unwrap()[..], b"again");
    fake.abort();
}

#[tokio::test]
async fn a_tcp_communicator_slots_in_as_the_data_plane() {
    use hmc_transport_tcp::{TcpCommunicator, TcpConfig};
    let dp = Arc::new(
        TcpCommunicator::bind(&"tcp://127.0.0.1:0".parse().unwrap(), TcpConfig::default()).unwrap(),
    );
    let server = Server::new(dispatcher(Default::default()), ServerConfig::default())
        .with_data_plane(dp.clone());
    assert!(server.data_plane().is_some());
    let s = server
        .bind(&"tcp://127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let c: Client<TcpCommunicator> = Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap()
        .with_data_plane(dp.clone());
    assert!(c.data_plane().is_some());
    // Payloads still travel INLINE / TCP_STREAM until HMC_BUFFER lands.
    assert_eq!(&c.call(demo::ECHO, "via C").await.unwrap()[..], b"via C");
    let big = Bytes::from(vec![9u8; 100_000]);
    assert_eq!(c.call(demo::ECHO, big.clone()).await.unwrap(), big);
}
