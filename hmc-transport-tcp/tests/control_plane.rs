//! The control plane over real TCP and Unix sockets: ranks, typed messages, duplicate and unknown ranks, bad peers, limits, closing, and many threads at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use hmc_core::{Deadline, Error, PeerAddr, RemoteRegion, Result};
use hmc_transport_tcp::{ControlMessage, ControlPlane, ControlPlaneConfig};
use rstest::rstest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn soon() -> Deadline {
    Deadline::after(Duration::from_secs(10))
}

fn listen_addr(kind: &str) -> PeerAddr {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    match kind {
        "tcp" => "tcp://127.0.0.1:0".parse().unwrap(),
        _ => PeerAddr::Unix(std::env::temp_dir().join(format!(
            "hmc-cp-{}-{}.sock",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ))),
    }
}

async fn bind(rank: u32, kind: &str) -> ControlPlane {
    ControlPlane::bind(rank, &[listen_addr(kind)], ControlPlaneConfig::default())
        .await
        .expect("bind")
}

/// An application message type, as users define them.
#[derive(Debug, PartialEq)]
struct Job {
    id: u64,
    name: String,
}

impl ControlMessage for Job {
    const KIND: u16 = 300;
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.id.to_be_bytes());
        out.extend_from_slice(self.name.as_bytes());
    }
    fn decode(bytes: &[u8]) -> Result<Self> {
        if bytes.len() < 8 {
            return Err(Error::Protocol("a Job is at least 8 bytes".into()));
        }
        Ok(Job {
            id: u64::from_be_bytes(bytes[..8].try_into().unwrap()),
            name: String::from_utf8(bytes[8..].to_vec())
                .map_err(|e| Error::Protocol(e.to_string()))?,
        })
    }
}

#[rstest]
#[case::tcp("tcp")]
#[case::unix_socket("unix")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranks_exchange_typed_messages_both_ways(#[case] kind: &str) {
    let a = bind(0, kind).await;
    let b = bind(1, kind).await;
    b.connect(0, &a.local_addrs()[0], soon()).await.unwrap();
    a.wait_for_peer(1, soon()).await.unwrap();
    assert_eq!(a.peers(), vec![1]);
    assert_eq!(b.peers(), vec![0]);

    // Kinds are filed apart: a Job sent first does not block a String receive. (Job is
    // registered, so it is kept although nobody has asked for one yet.)
    a.register_kind::<Job>();
    let job = Job {
        id: 7,
        name: "kv-pull".into(),
    };
    b.send(0, &job, soon()).await.unwrap();
    b.send(0, &"hello".to_string(), soon()).await.unwrap();
    assert_eq!(a.recv::<String>(1, soon()).await.unwrap(), "hello");
    assert_eq!(a.recv::<Job>(1, soon()).await.unwrap(), job);

    let region: RemoteRegion = RemoteRegion {
        transport: hmc_core::TransportId::TCP,
        region: hmc_core::Region {
            device: hmc_core::Device::HOST,
            addr: 0x1000,
            len: 4096,
        },
        access: hmc_core::Access::READ,
        key: vec![1; 24],
    };
    a.send(1, &region, soon()).await.unwrap();
    for i in 0..100u32 {
        a.send(1, &i.to_be_bytes().to_vec(), soon()).await.unwrap();
    }
    assert_eq!(b.recv::<RemoteRegion>(0, soon()).await.unwrap(), region);
    for i in 0..100u32 {
        let got: Vec<u8> = b.recv(0, soon()).await.unwrap();
        assert_eq!(
            got,
            i.to_be_bytes(),
            "messages from one peer arrive in order"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_listens_on_tcp_and_a_unix_socket_at_once() {
    let hub = ControlPlane::bind(
        0,
        &[listen_addr("tcp"), listen_addr("unix")],
        ControlPlaneConfig::default(),
    )
    .await
    .unwrap();
    let over_tcp = bind(1, "tcp").await;
    let over_uds = bind(2, "tcp").await;
    over_tcp
        .connect(0, &hub.local_addrs()[0], soon())
        .await
        .unwrap();
    over_uds
        .connect(0, &hub.local_addrs()[1], soon())
        .await
        .unwrap();
    over_tcp
        .send(0, &"via tcp".to_string(), soon())
        .await
        .unwrap();
    over_uds
        .send(0, &"via uds".to_string(), soon())
        .await
        .unwrap();
    assert_eq!(hub.recv::<String>(1, soon()).await.unwrap(), "via tcp");
    assert_eq!(hub.recv::<String>(2, soon()).await.unwrap(), "via uds");
    assert_eq!(hub.peers(), vec![1, 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_connection_claiming_a_connected_rank_is_refused_and_the_first_kept() {
    let hub = bind(0, "tcp").await;
    let first = bind(5, "tcp").await;
    let impostor = bind(5, "tcp").await;
    first
        .connect(0, &hub.local_addrs()[0], soon())
        .await
        .unwrap();
    hub.wait_for_peer(5, soon()).await.unwrap();
    let err = impostor
        .connect(0, &hub.local_addrs()[0], soon())
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::Peer { .. }), "{err:?}");
    assert!(text.contains("already connected"), "{text}");
    // The original connection was not swapped out.
    first
        .send(0, &"still me".to_string(), soon())
        .await
        .unwrap();
    assert_eq!(hub.recv::<String>(5, soon()).await.unwrap(), "still me");
    hub.send(5, &"to the first".to_string(), soon())
        .await
        .unwrap();
    assert_eq!(
        first.recv::<String>(0, soon()).await.unwrap(),
        "to the first"
    );
    // Connecting twice from the same side is refused locally.
    let err = first
        .connect(0, &hub.local_addrs()[0], soon())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("already connected"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_own_and_unknown_ranks_get_clear_errors() {
    let a = bind(0, "tcp").await;
    let b = bind(1, "tcp").await;
    // Rank 0 is listening at that address, not rank 3.
    let err = b.connect(3, &a.local_addrs()[0], soon()).await.unwrap_err();
    assert!(err.to_string().contains("is rank 0, not rank 3"), "{err}");
    // A process cannot claim the listener's rank, nor connect to itself.
    let twin = bind(0, "tcp").await;
    let err = twin.connect(1, &b.local_addrs()[0], soon()).await;
    assert!(err.is_ok(), "rank 0 may connect to rank 1: {err:?}");
    let clash = bind(1, "tcp").await;
    let err = clash
        .connect(1, &b.local_addrs()[0], soon())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    let err = b
        .connect(0, &twin.local_addrs()[0], soon())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("already connected"), "{err}");
    // Unknown ranks.
    let err = a.send(9, &"x".to_string(), soon()).await.unwrap_err();
    assert!(
        err.to_string().contains("rank 9") && err.to_string().contains("not connected"),
        "{err}"
    );
    let err = a.recv::<String>(9, soon()).await.unwrap_err();
    assert!(err.to_string().contains("not connected"), "{err}");
    // Nobody listening.
    let dead: PeerAddr = "tcp://127.0.0.1:1".parse().unwrap();
    let err = a.connect(4, &dead, soon()).await.unwrap_err();
    assert!(err.is_connection_refused(), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_messages_are_refused_at_the_sender_and_disconnect_at_the_receiver() {
    let config = ControlPlaneConfig {
        max_frame_len: 1024,
        ..ControlPlaneConfig::default()
    };
    let a = ControlPlane::bind(0, &[listen_addr("tcp")], config.clone())
        .await
        .unwrap();
    let b = ControlPlane::bind(1, &[], config).await.unwrap();
    b.connect(0, &a.local_addrs()[0], soon()).await.unwrap();
    let err = b.send(0, &vec![0u8; 1025], soon()).await.unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(
            err,
            Error::LimitExceeded {
                limit: "max_frame_len",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(text.contains("raise"), "{text}");
    b.send(0, &vec![0u8; 1024], soon()).await.unwrap();
    assert_eq!(a.recv::<Vec<u8>>(1, soon()).await.unwrap().len(), 1024);

    // A raw peer that announces a 1 GiB frame is cut off; the others carry on.
    let mut raw = raw_hello(&a.local_addrs()[0], 7).await;
    a.wait_for_peer(7, soon()).await.unwrap();
    raw.write_all(&(1u32 << 30).to_be_bytes()).await.unwrap();
    let err = a.recv::<Vec<u8>>(7, soon()).await.unwrap_err();
    assert!(err.to_string().contains("max_frame_len"), "{err}");
    b.send(0, &"after".to_string(), soon()).await.unwrap();
    assert_eq!(a.recv::<String>(1, soon()).await.unwrap(), "after");
}

/// Dials `addr` with a raw socket and completes a HELLO as `rank`.
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_silent_connections_are_dropped_and_others_carry_on() {
    let config = ControlPlaneConfig {
        hello_timeout: Duration::from_millis(200),
        ..ControlPlaneConfig::default()
    };
    let hub = ControlPlane::bind(0, &[listen_addr("tcp")], config)
        .await
        .unwrap();
    let PeerAddr::Tcp(sa) = hub.local_addrs()[0].clone() else {
        panic!()
    };
    let mut garbage = tokio::net::TcpStream::connect(sa).await.unwrap();
    // Exactly one HELLO's worth, so the hub has read it all when it hangs up.
    garbage.write_all(b"GET / HTT").await.unwrap();
    let mut silent = tokio::net::TcpStream::connect(sa).await.unwrap();
    let mut wrong_version = tokio::net::TcpStream::connect(sa).await.unwrap();
    wrong_version
        .write_all(b"HMCP\x09\x00\x00\x00\x03")
        .await
        .unwrap();

    // The hub closes each of them: reads end (EOF or a refusal, then EOF).
    let mut sink = Vec::new();
    let start = Instant::now();
    garbage.read_to_end(&mut sink).await.unwrap();
    silent.read_to_end(&mut sink).await.unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "hello_timeout was not applied"
    );
    let mut refusal = Vec::new();
    wrong_version.read_to_end(&mut refusal).await.unwrap();
    assert!(
        String::from_utf8_lossy(&refusal).contains("version 9 is not supported"),
        "{refusal:?}"
    );
    assert!(hub.peers().is_empty());

    let good = bind(1, "tcp").await;
    good.connect(0, &hub.local_addrs()[0], soon())
        .await
        .unwrap();
    good.send(0, &"fine".to_string(), soon()).await.unwrap();
    assert_eq!(hub.recv::<String>(1, soon()).await.unwrap(), "fine");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_wakes_every_waiter_with_an_error() {
    let a = Arc::new(bind(0, "tcp").await);
    let b = bind(1, "tcp").await;
    b.connect(0, &a.local_addrs()[0], soon()).await.unwrap();
    a.wait_for_peer(1, soon()).await.unwrap();
    let waiters: Vec<_> = (0..8)
        .map(|i| {
            let a = a.clone();
            tokio::spawn(async move {
                if i % 2 == 0 {
                    a.recv::<String>(1, soon()).await.map(drop)
                } else {
                    a.wait_for_peer(42, soon()).await
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let start = Instant::now();
    a.close();
    for w in waiters {
        let r = w.await.unwrap();
        assert!(matches!(r, Err(Error::Closed(_))), "{r:?}");
    }
    assert!(start.elapsed() < Duration::from_secs(2));
    assert!(matches!(
        a.send(1, &"x".to_string(), soon()).await,
        Err(Error::Closed(_))
    ));
    // The peer learns that the connection is gone.
    let err = b.recv::<String>(0, soon()).await.unwrap_err();
    assert!(matches!(err, Error::Peer { .. }), "{err:?}");
    assert!(err.to_string().contains("disconnected"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_leaves_wakes_its_receivers_and_its_queued_messages_stay() {
    let a = bind(0, "unix").await;
    let b = bind(1, "unix").await;
    b.connect(0, &a.local_addrs()[0], soon()).await.unwrap();
    b.send(0, &"last words".to_string(), soon()).await.unwrap();
    a.wait_for_peer(1, soon()).await.unwrap();
    // Wait until the message is in, then let b go.
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(b);
    assert_eq!(a.recv::<String>(1, soon()).await.unwrap(), "last words");
    let err = a.recv::<String>(1, soon()).await.unwrap_err();
    assert!(err.to_string().contains("disconnected"), "{err}");
    // The rank may come back.
    let b2 = bind(1, "unix").await;
    b2.connect(0, &a.local_addrs()[0], soon()).await.unwrap();
    b2.send(0, &"back".to_string(), soon()).await.unwrap();
    assert_eq!(a.recv::<String>(1, soon()).await.unwrap(), "back");
}

#[test]
fn many_threads_send_and_receive_at_once() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let hub = Arc::new(rt.block_on(bind(0, "tcp")));
    let spokes: Vec<Arc<ControlPlane>> = (1..=4)
        .map(|r| {
            let c = rt.block_on(bind(r, "tcp"));
            rt.block_on(c.connect(0, &hub.local_addrs()[0], soon()))
                .unwrap();
            Arc::new(c)
        })
        .collect();
    const N: u32 = 200;
    std::thread::scope(|scope| {
        // Each spoke sends from its own OS thread; the hub receives from four threads.
        for spoke in &spokes {
            let handle = rt.handle().clone();
            scope.spawn(move || {
                for i in 0..N {
                    handle
                        .block_on(spoke.send(0, &i.to_be_bytes().to_vec(), soon()))
                        .unwrap();
                }
            });
        }
        for r in 1..=4u32 {
            let (hub, handle) = (hub.clone(), rt.handle().clone());
            scope.spawn(move || {
                for i in 0..N {
                    let got: Vec<u8> = handle.block_on(hub.recv(r, soon())).unwrap();
                    assert_eq!(got, i.to_be_bytes(), "rank {r} message {i}");
                }
            });
        }
    });
}
