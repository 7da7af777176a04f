//! `DirectClient` against a real server over loopback TCP and a Unix socket: the demo methods, many verified calls on one connection, INLINE and TCP_STREAM payloads (it has no data plane, so no HMC_BUFFER), deadlines with a CANCEL the server sees, server errors, a server restart (the call in flight fails, the next reconnects), GOAWAY on shutdown, and calls from several threads.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hmc_core::PeerAddr;
use hmc_rpc::{
    CallError, CallOptions, ClientConfig, DirectClient, RunningServer, Server, ServerConfig,
    Status, demo,
};
use rstest::rstest;

mod common;

use common::methods::{SLEEP, WAIT_CANCEL, assert_complex_answer, complex_request, dispatcher};

/// A server on its own runtime thread, so the test thread can block in the direct client.
struct Bg {
    rt: tokio::runtime::Runtime,
    server: Option<RunningServer>,
    cancelled: Arc<AtomicUsize>,
}

impl Bg {
    fn start(addr: &PeerAddr) -> Bg {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let cancelled = Arc::new(AtomicUsize::new(0));
        let server = rt.block_on(
            Server::new(dispatcher(cancelled.clone()), ServerConfig::default()).bind(addr),
        );
        Bg {
            rt,
            server: Some(server.unwrap()),
            cancelled,
        }
    }

    fn addr(&self) -> PeerAddr {
        self.server.as_ref().unwrap().local_addr().clone()
    }

    fn stop(&mut self) {
        if let Some(s) = self.server.take() {
            self.rt.block_on(s.shutdown());
        }
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        self.stop();
    }
}

#[rstest]
#[case::tcp("tcp")]
#[case::unix("unix")]
fn the_demo_methods_and_many_verified_calls_on_one_connection(#[case] kind: &str) {
    let dir = tempfile::tempdir().unwrap();
    let addr: PeerAddr = if kind == "unix" {
        PeerAddr::Unix(dir.path().join("rpc.sock"))
    } else {
        "tcp://127.0.0.1:0".parse().unwrap()
    };
    let bg = Bg::start(&addr);
    let c = DirectClient::connect(&bg.addr(), ClientConfig::default()).unwrap();
    assert_eq!(&c.call(demo::ECHO, "abc").unwrap()[..], b"abc");
    let up: String = c
        .call_typed(demo::UPPERCASE, &"hello hmc rpc".to_string())
        .unwrap();
    assert_eq!(up, "HELLO HMC RPC");
    let r: demo::ComplexResponse = c.call_typed(demo::COMPLEX, &complex_request()).unwrap();
    assert_complex_answer(&r);
    for i in 0..2_000u32 {
        let body = format!("call {i}");
        assert_eq!(
            &c.call(demo::ECHO, body.clone()).unwrap()[..],
            body.as_bytes()
        );
    }
}

/// INLINE, the largest INLINE, and TCP_STREAM payloads of several chunks, both ways (the
/// modes a client without a data plane uses).
#[rstest]
#[case::inline(100)]
#[case::inline_max(4096)]
#[case::stream(4097)]
#[case::stream_mib(3 << 20)]
fn inline_and_stream_payloads_round_trip(#[case] len: usize) {
    let bg = Bg::start(&"tcp://127.0.0.1:0".parse().unwrap());
    let c = DirectClient::connect(&bg.addr(), ClientConfig::default()).unwrap();
    let body: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
    for _ in 0..3 {
        assert_eq!(&c.call(demo::ECHO, body.clone()).unwrap()[..], &body[..]);
    }
}

#[test]
fn a_deadline_fails_the_call_in_time_cancels_it_and_the_connection_goes_on() {
    let bg = Bg::start(&"tcp://127.0.0.1:0".parse().unwrap());
    let c = DirectClient::connect(&bg.addr(), ClientConfig::default()).unwrap();
    let t = Instant::now();
    let e = c
        .call_with(
            WAIT_CANCEL,
            Bytes::new(),
            CallOptions {
                timeout: Some(Duration::from_millis(100)),
                ..CallOptions::default()
            },
        )
        .unwrap_err();
    // Whichever side's clock fires first: ours (a CANCEL goes out) or the server's (it
    // answers DEADLINE_EXCEEDED and cancels the handler).
    assert_eq!(e.status(), Some(Status::DEADLINE_EXCEEDED), "{e}");
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(100) && took < Duration::from_secs(5),
        "{took:?}"
    );
    // The same connection serves the next call; the handler was cancelled.
    assert_eq!(&c.call(demo::ECHO, "after").unwrap()[..], b"after");
    let until = Instant::now() + Duration::from_secs(5);
    while bg.cancelled.load(Ordering::SeqCst) == 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        bg.cancelled.load(Ordering::SeqCst),
        1,
        "the handler saw the cancel"
    );
    // A slow call inside its deadline still succeeds.
    let ms: u64 = {
        let r = c
            .call_with(
                SLEEP,
                hmc_rpc::RpcCodec::encode(&50u64).unwrap(),
                CallOptions {
                    timeout: Some(Duration::from_secs(5)),
                    ..CallOptions::default()
                },
            )
            .unwrap();
        hmc_rpc::RpcCodec::decode(&r).unwrap()
    };
    assert_eq!(ms, 50);
}

#[test]
fn server_errors_come_back_as_statuses() {
    let bg = Bg::start(&"tcp://127.0.0.1:0".parse().unwrap());
    let c = DirectClient::connect(&bg.addr(), ClientConfig::default()).unwrap();
    let e = c.call(9_999, "x").unwrap_err();
    assert_eq!(e.status(), Some(Status::UNKNOWN_METHOD), "{e}");
    // A body the typed method cannot decode.
    let e = c.call(demo::UPPERCASE, vec![0xFFu8; 3]).unwrap_err();
    assert_eq!(e.status(), Some(Status::BAD_PAYLOAD), "{e}");
    assert_eq!(&c.call(demo::ECHO, "ok").unwrap()[..], b"ok");
}

#[test]
fn a_lost_server_fails_the_call_and_the_next_call_reconnects() {
    let mut bg = Bg::start(&"tcp://127.0.0.1:0".parse().unwrap());
    let addr = bg.addr();
    let c = DirectClient::connect(&addr, ClientConfig::default()).unwrap();
    assert_eq!(&c.call(demo::ECHO, "one").unwrap()[..], b"one");
    bg.stop();
    // The old connection is gone: the call fails (never replayed), or finds the GOAWAY,
    // reconnects, and fails to connect, since nothing listens.
    let e = c.call(demo::ECHO, "two").unwrap_err();
    assert!(
        matches!(
            e,
            CallError::ConnectionLost(_) | CallError::Connect(_) | CallError::Status { .. }
        ),
        "{e}"
    );
    // A new server on the same address: the next call reconnects.
    let bg2 = Bg::start(&addr);
    let mut ok = None;
    for _ in 0..3 {
        match c.call(demo::ECHO, "three") {
            Ok(b) => {
                ok = Some(b);
                break;
            }
            Err(e) => eprintln!("retrying after: {e}"),
        }
    }
    assert_eq!(&ok.expect("reconnected")[..], b"three");
    drop(bg2);
}

#[test]
fn calls_from_several_threads_take_turns_on_the_connection() {
    let bg = Bg::start(&"tcp://127.0.0.1:0".parse().unwrap());
    let c = Arc::new(DirectClient::connect(&bg.addr(), ClientConfig::default()).unwrap());
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                for i in 0..500 {
                    let body = format!("thread {t} call {i}");
                    assert_eq!(
                        &c.call(demo::ECHO, body.clone()).unwrap()[..],
                        body.as_bytes()
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// A server that accepts and never reads: a large request cannot go out before its
/// deadline. The call fails in time with DEADLINE_EXCEEDED, and the next call does not reuse
/// the connection with half a frame on it (it reconnects).
#[test]
fn a_deadline_passing_mid_write_fails_the_call_and_retires_the_connection() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = PeerAddr::Tcp(l.local_addr().unwrap());
    // Returns the accepted sockets, so they stay open (unread) until the test joins.
    let accepted =
        std::thread::spawn(move || l.incoming().take(2).map(|s| s.unwrap()).collect::<Vec<_>>());
    let c = DirectClient::connect(&addr, ClientConfig::default()).unwrap();
    let opts = CallOptions {
        timeout: Some(Duration::from_millis(200)),
        ..CallOptions::default()
    };
    let t = Instant::now();
    let e = c
        .call_with(demo::ECHO, vec![7u8; 32 << 20], opts)
        .unwrap_err();
    assert_eq!(e.status(), Some(Status::DEADLINE_EXCEEDED), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // The next call opens a second connection (the listener's second accept).
    let e = c.call_with(demo::ECHO, "x", opts).unwrap_err();
    assert_eq!(e.status(), Some(Status::DEADLINE_EXCEEDED), "{e}");
    assert_eq!(
        accepted.join().unwrap().len(),
        2,
        "a fresh connection for the second call"
    );
}
