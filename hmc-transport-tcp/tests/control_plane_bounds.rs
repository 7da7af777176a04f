//! Trust boundaries of the control plane over real sockets: what departed ranks and unknown kinds leave behind, receive budgets, and pre-shared-secret authentication.
//!
//! Assertions are on [`ControlPlane::stats`]; raw `TcpStream`s write the wire format
//! (`[u32 length][u16 kind][body]` after a HELLO) where a peer would misbehave.

use std::time::{Duration, Instant};

use hmc_core::{Deadline, Error, PeerAddr};
use hmc_transport_tcp::{AuthSecret, ControlPlane, ControlPlaneConfig, ControlPlaneStats};
use rstest::rstest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn soon() -> Deadline {
    Deadline::after(Duration::from_secs(10))
}

fn any() -> PeerAddr {
    "tcp://127.0.0.1:0".parse().unwrap()
}

fn secret(s: &str) -> Option<AuthSecret> {
    Some(AuthSecret::new(s.as_bytes()).unwrap())
}

/// Dials `addr` with a raw socket and completes a version-1 HELLO as `rank`.
async fn raw_hello(addr: &PeerAddr, rank: u32) -> tokio::net::TcpStream {
    let PeerAddr::Tcp(sa) = addr else {
        panic!("tcp")
    };
    let mut s = tokio::net::TcpStream::connect(sa).await.unwrap();
    let mut hello = b"HMCP\x01".to_vec();
    hello.extend_from_slice(&rank.to_be_bytes());
    s.write_all(&hello).await.unwrap();
    let mut ack = [0u8; 12];
    s.read_exact(&mut ack).await.unwrap();
    assert_eq!(ack[5], 0, "HELLO accepted");
    s
}

fn frame(kind: u16, body: &[u8]) -> Vec<u8> {
    let mut f = ((body.len() + 2) as u32).to_be_bytes().to_vec();
    f.extend_from_slice(&kind.to_be_bytes());
    f.extend_from_slice(body);
    f
}

/// Polls `stats` until `done` holds, for at most a few seconds.
async fn until(hub: &ControlPlane, done: impl Fn(&ControlPlaneStats) -> bool) -> ControlPlaneStats {
    let start = Instant::now();
    loop {
        let s = hub.stats();
        if done(&s) || start.elapsed() > Duration::from_secs(5) {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Before: ranks that sent frames of a kind nobody receives and left kept them in memory
/// for good, and fresh rank numbers added more. Now frames of unknown kinds are dropped
/// on arrival, and what departed ranks left unreceived is dropped after
/// `departed_retention`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn departed_ranks_and_unknown_kinds_leave_nothing_behind() {
    let hub = ControlPlane::bind(
        0,
        &[any()],
        ControlPlaneConfig {
            departed_retention: Duration::from_millis(200),
            ..ControlPlaneConfig::default()
        },
    )
    .await
    .unwrap();
    let body = vec![0xAB; 32 << 10];
    for rank in 1..=4u32 {
        let mut raw = raw_hello(&hub.local_addrs()[0], rank).await;
        for _ in 0..16 {
            // Kind 999: registered by nobody. Kind 1 (`Vec<u8>`): built in, never received.
            raw.write_all(&frame(999, &body)).await.unwrap();
            raw.write_all(&frame(1, &body)).await.unwrap();
        }
        let s = until(&hub, |s| {
            s.dropped_unknown_kind == 16 * u64::from(rank)
                && s.queued_messages == 16 * u64::from(rank)
        })
        .await;
        assert_eq!(s.dropped_unknown_kind, 16 * u64::from(rank), "{s:?}");
        assert_eq!(s.queued_messages, 16 * u64::from(rank), "{s:?}");
        drop(raw);
    }
    assert!(hub.stats().queued_bytes > 0);
    let s = until(&hub, |s| s.queued_bytes == 0 && s.peers == 0).await;
    assert_eq!(s.queued_bytes, 0, "{s:?}");
    assert_eq!(s.queued_messages, 0, "{s:?}");
    assert_eq!(s.dropped_departed, 64, "{s:?}");
    let err = hub.recv::<Vec<u8>>(1, soon()).await.unwrap_err();
    assert!(err.to_string().contains("disconnected"), "{err}");
}

/// A registered kind is kept before anyone receives it; a peer that sends faster than the
/// application receives is held to its byte budget, and all peers to the total one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_budgets_push_back_on_senders() {
    let config = ControlPlaneConfig {
        max_queued_bytes_per_peer: 64 << 10,
        max_queued_bytes: 96 << 10,
        ..ControlPlaneConfig::default()
    };
    let hub = ControlPlane::bind(0, &[any()], config).await.unwrap();
    let one = ControlPlane::bind(1, &[], ControlPlaneConfig::default())
        .await
        .unwrap();
    let two = ControlPlane::bind(2, &[], ControlPlaneConfig::default())
        .await
        .unwrap();
    one.connect(0, &hub.local_addrs()[0], soon()).await.unwrap();
    two.connect(0, &hub.local_addrs()[0], soon()).await.unwrap();
    let piece = |i: u8| vec![i; 16 << 10];
    for i in 0..10 {
        one.send(0, &piece(i), soon()).await.unwrap();
    }
    let s = until(&hub, |s| s.queued_bytes == 64 << 10).await;
    assert_eq!(s.queued_bytes, 64 << 10, "rank 1 held to 64 KiB: {s:?}");
    for i in 0..4 {
        two.send(0, &piece(100 + i), soon()).await.unwrap();
    }
    let s = until(&hub, |s| s.queued_bytes == 96 << 10).await;
    assert_eq!(s.queued_bytes, 96 << 10, "all ranks held to 96 KiB: {s:?}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(hub.stats().queued_bytes, 96 << 10, "no more was read");
    // Receiving makes room; everything arrives, in order.
    for i in 0..10 {
        assert_eq!(hub.recv::<Vec<u8>>(1, soon()).await.unwrap(), piece(i));
    }
    for i in 0..4 {
        assert_eq!(
            hub.recv::<Vec<u8>>(2, soon()).await.unwrap(),
            piece(100 + i)
        );
    }
    assert_eq!(hub.stats().queued_bytes, 0);
    assert_eq!(hub.stats().dropped_unknown_kind, 0);
}

/// Before: the first process that said "rank 1" was rank 1. Now, with a secret, a
/// process without it (or with another) is refused, and the real rank still gets in.
#[rstest]
#[case::same_secret(secret("control-secret-1"), secret("control-secret-1"), None)]
#[case::neither(None, None, None)]
#[case::wrong_secret(
    secret("control-secret-1"),
    secret("control-secret-2"),
    Some("failed authentication")
)]
#[case::dialler_without_one(secret("control-secret-1"), None, Some("requires authentication"))]
#[case::listener_without_one(None, secret("control-secret-1"), Some("does not use authentication"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_plane_authentication(
    #[case] hub_secret: Option<AuthSecret>,
    #[case] dialler_secret: Option<AuthSecret>,
    #[case] refusal: Option<&str>,
) {
    let with = |s: Option<AuthSecret>| ControlPlaneConfig {
        auth_secret: s,
        ..ControlPlaneConfig::default()
    };
    let hub = ControlPlane::bind(0, &[any()], with(hub_secret.clone()))
        .await
        .unwrap();
    let dialler = ControlPlane::bind(1, &[], with(dialler_secret))
        .await
        .unwrap();
    let connected = dialler.connect(0, &hub.local_addrs()[0], soon()).await;
    match refusal {
        Some(why) => {
            let err = connected.unwrap_err();
            assert!(matches!(err, Error::Peer { .. }), "{err:?}");
            assert!(err.to_string().contains(why), "{err}");
            let s = until(&hub, |s| s.auth_failures == 1).await;
            assert_eq!(s.auth_failures, 1, "{s:?}");
            assert!(hub.peers().is_empty(), "the impostor holds no rank");
            // The real rank 1, with the hub's setting, gets in afterwards.
            let real = ControlPlane::bind(1, &[], with(hub_secret)).await.unwrap();
            real.connect(0, &hub.local_addrs()[0], soon())
                .await
                .unwrap();
            real.send(0, &"genuine".to_string(), soon()).await.unwrap();
            assert_eq!(hub.recv::<String>(1, soon()).await.unwrap(), "genuine");
        }
        None => {
            connected.unwrap();
            dialler.send(0, &"hi".to_string(), soon()).await.unwrap();
            assert_eq!(hub.recv::<String>(1, soon()).await.unwrap(), "hi");
            hub.send(1, &"back".to_string(), soon()).await.unwrap();
            assert_eq!(dialler.recv::<String>(0, soon()).await.unwrap(), "back");
            assert_eq!(hub.stats().auth_failures, 0);
        }
    }
}

/// A raw peer that skips authentication and sends frames right behind its HELLO gets
/// none of them queued: the connection is refused before anything else is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unauthenticated_raw_peer_gets_nothing_queued() {
    let hub = ControlPlane::bind(
        0,
        &[any()],
        ControlPlaneConfig {
            auth_secret: secret("control-secret-1"),
            ..ControlPlaneConfig::default()
        },
    )
    .await
    .unwrap();
    let PeerAddr::Tcp(sa) = hub.local_addrs()[0].clone() else {
        panic!("tcp")
    };
    let mut s = tokio::net::TcpStream::connect(sa).await.unwrap();
    let mut req = b"HMCP\x01".to_vec();
    req.extend_from_slice(&1u32.to_be_bytes());
    req.extend_from_slice(&frame(2, b"let me in"));
    s.write_all(&req).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(3), s.read_to_end(&mut answer))
        .await
        .expect("closed");
    assert!(
        String::from_utf8_lossy(&answer).contains("requires authentication"),
        "{answer:?}"
    );
    let st = hub.stats();
    assert_eq!((st.peers, st.queued_messages, st.auth_failures), (0, 0, 1));
}
