//! The settings exchange (`docs/protocol.md`, "Connection settings"): a server says what
//! data plane it has before a client tries one, a v1 client that never asks is served as
//! before, and a client facing a v1 server (no exchange) falls back as before.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::data_plane::{demo_dispatcher, tcp_comm};
use common::frames::request;
use hmc_core::PeerAddr;
use hmc_rpc::frame::{FrameHeader, FrameLimits, HEADER_LEN};
use hmc_rpc::proto::{ServerConn, ServerEvent};
use hmc_rpc::settings::{SETTINGS_METHOD, Settings, features};
use hmc_rpc::{CallError, Client, ClientConfig, ConnConfig, Server, ServerConfig, Status, demo};

async fn server(with_plane: bool) -> hmc_rpc::RunningServer {
    let s = Server::new(demo_dispatcher(), ServerConfig::default());
    let addr: PeerAddr = "tcp://127.0.0.1:0".parse().unwrap();
    if with_plane {
        s.with_data_plane(tcp_comm()).bind(&addr).await.unwrap()
    } else {
        s.bind(&addr).await.unwrap()
    }
}

fn read_frame(s: &mut TcpStream) -> (FrameHeader, Vec<u8>) {
    let mut hb = [0u8; HEADER_LEN];
    s.read_exact(&mut hb).unwrap();
    let h = FrameHeader::decode(&hb, &FrameLimits::default()).unwrap();
    let mut body = vec![0u8; h.body_len as usize];
    s.read_exact(&mut body).unwrap();
    (h, body)
}

fn port(s: &hmc_rpc::RunningServer) -> u16 {
    match s.local_addr() {
        PeerAddr::Tcp(a) => a.port(),
        other => panic!("{other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_says_which_data_plane_it_has_and_v1_clients_need_not_ask() {
    for with_plane in [false, true] {
        let s = server(with_plane).await;
        let p = port(&s);
        tokio::task::spawn_blocking(move || {
            let mut c = TcpStream::connect(("127.0.0.1", p)).unwrap();
            // A v1 client: a call straight away, no settings.
            c.write_all(&request(1, demo::ECHO, b"v1")).unwrap();
            let (h, body) = read_frame(&mut c);
            assert_eq!((h.status, body.as_slice()), (Status::OK, &b"v1"[..]));
            // The exchange.
            let mine = Settings {
                features: features::SETTINGS,
                ..Settings::default()
            };
            c.write_all(&request(2, SETTINGS_METHOD, &mine.encode()))
                .unwrap();
            let (h, body) = read_frame(&mut c);
            assert_eq!(h.status, Status::OK);
            let theirs = Settings::decode(&body).unwrap();
            assert!(theirs.features & features::SETTINGS != 0);
            assert!(theirs.features & features::HALF_CLOSE != 0);
            assert_eq!(theirs.max_payload_len, Some(64 << 20));
            let tcp = u16::from(hmc_core::TransportId::TCP.wire_id());
            if with_plane {
                assert_eq!(theirs.data_planes, vec![tcp]);
                assert_eq!(theirs.data_plane_threshold, Some(64 << 10));
            } else {
                assert!(theirs.data_planes.is_empty());
            }
            // Malformed settings: BAD_PAYLOAD, the connection stays.
            c.write_all(&request(3, SETTINGS_METHOD, &[0, 1, 0, 2, 0, 0]))
                .unwrap();
            assert_eq!(read_frame(&mut c).0.status, Status::BAD_PAYLOAD);
            c.write_all(&request(4, demo::ECHO, b"still")).unwrap();
            assert_eq!(read_frame(&mut c).0.status, Status::OK);
        })
        .await
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_a_data_plane_sends_large_payloads_streamed_to_a_server_without_one() {
    let s = server(false).await;
    let c = Client::connect(s.local_addr(), ClientConfig::default())
        .await
        .unwrap()
        .with_data_plane(tcp_comm());
    let big = Bytes::from(vec![7u8; 1 << 20]);
    // No refusal first: the server said it has no data plane.
    for _ in 0..3 {
        assert_eq!(c.call(demo::ECHO, big.clone()).await.unwrap(), big);
    }
    let st = c.data_plane_stats().unwrap();
    assert_eq!((st.buffer_calls, st.failures), (0, 0), "{st:?}");
    // Each of them is counted as a fallback, not passed over in silence.
    assert_eq!(st.fallbacks, 3, "{st:?}");
    // A small call never was a data-plane call: not a fallback.
    c.call(demo::ECHO, Bytes::from_static(b"small"))
        .await
        .unwrap();
    assert_eq!(c.data_plane_stats().unwrap().fallbacks, 3);
    // And with a server that has one, the payloads go HMC_BUFFER.
    let s2 = server(true).await;
    let c2 = Client::connect(s2.local_addr(), ClientConfig::default())
        .await
        .unwrap()
        .with_data_plane(tcp_comm());
    assert_eq!(c2.call(demo::ECHO, big.clone()).await.unwrap(), big);
    assert_eq!(c2.data_plane_stats().unwrap().buffer_calls, 1);
}

/// A v1 server: the protocol core without the settings exchange and without a data plane,
/// echoing every call (a settings request reaches "the handlers" and is unknown).
fn v1_server() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let p = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let mut core = ServerConn::new(ConnConfig::default(), Instant::now());
        let mut buf = vec![0u8; 1 << 20];
        loop {
            match s.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => core.handle_input(&buf[..n], Instant::now()),
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => return,
            }
            while let Some(ev) = core.poll_event() {
                if let ServerEvent::Call(c) = ev {
                    let (status, body) = if c.method_id == SETTINGS_METHOD {
                        (
                            Status::UNKNOWN_METHOD,
                            Bytes::from_static(b"no such method"),
                        )
                    } else {
                        (Status::OK, c.payload)
                    };
                    core.respond(c.request_id, c.method_id, status, body, Instant::now());
                }
            }
            loop {
                let out = core.pending_tx().to_vec();
                if out.is_empty() {
                    break;
                }
                if s.write_all(&out).is_err() {
                    return;
                }
                core.advance_tx(out.len());
            }
        }
    });
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_a_v1_server_the_client_tries_once_then_streams() {
    let p = v1_server();
    let addr: PeerAddr = format!("tcp://127.0.0.1:{p}").parse().unwrap();
    let c = Client::connect(&addr, ClientConfig::default())
        .await
        .unwrap()
        .with_data_plane(tcp_comm());
    let big = Bytes::from(vec![3u8; 256 << 10]);
    // The first large call goes HMC_BUFFER (a v1 server cannot say it has no data plane)
    // and is refused; it is not replayed.
    match c.call(demo::ECHO, big.clone()).await {
        Err(CallError::Status { status, .. }) => assert_eq!(status, Status::DATA_PLANE),
        other => panic!("{other:?}"),
    }
    // Then TCP_STREAM on this connection.
    assert_eq!(c.call(demo::ECHO, big.clone()).await.unwrap(), big);
    assert_eq!(
        c.call(demo::ECHO, "small").await.unwrap(),
        Bytes::from("small")
    );
}
