//! Bad input to `TcpCommunicator`: lying initiators on raw sockets, garbage and silent connections, wrong keys, limits. Each gets a clear error, no memory outside a registered region is touched, and other peers carry on.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hmc_backend_cpu::HostMemory;
use hmc_core::{
    Access, Communicator, ConnBuffer, Deadline, Device, DeviceKind, Error, MemSpan, MemSpanMut, Op,
    PeerAddr, Region, RegisteredBuffer, TransferDesc,
};
use hmc_transport_tcp::{TcpCommunicator, TcpConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod raw_peer;
use raw_peer::{hello, status};

fn soon() -> Deadline {
    Deadline::after(Duration::from_secs(10))
}

fn any() -> PeerAddr {
    "tcp://127.0.0.1:0".parse().unwrap()
}

fn comm(config: TcpConfig) -> Arc<TcpCommunicator> {
    Arc::new(TcpCommunicator::bind(&any(), config).unwrap())
}

type Buf = RegisteredBuffer<HostMemory, TcpCommunicator>;

fn buffer(c: &Arc<TcpCommunicator>, bytes: &[u8], access: Access) -> Buf {
    let b =
        RegisteredBuffer::new(Arc::new(HostMemory::new()), c.clone(), bytes.len(), access).unwrap();
    b.write_at(0, &MemSpan::host(bytes)).unwrap();
    b
}

fn contents(b: &Buf) -> Vec<u8> {
    let mut out = vec![0u8; b.len()];
    b.read_at(0, &mut MemSpanMut::host(&mut out)).unwrap();
    out
}

/// A raw data-plane connection that has said HELLO, for sending requests no honest
/// initiator would.
async fn raw(target: &TcpCommunicator) -> TcpStream {
    let PeerAddr::Tcp(sa) = target.address() else {
        panic!("tcp")
    };
    let mut s = TcpStream::connect(sa).await.unwrap();
    hello(&mut s).await;
    s
}

/// One descriptor as the wire carries it.
fn wire_desc(key: &[u8], offset: u64, len: u64) -> Vec<u8> {
    let mut d = key.to_vec();
    d.extend_from_slice(&offset.to_be_bytes());
    d.extend_from_slice(&len.to_be_bytes());
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lying_initiator_cannot_reach_past_a_region_or_around_its_rights() {
    let target = comm(TcpConfig::default());
    // Two neighbouring buffers: the lies below aim past the first into the second.
    let guarded = buffer(&target, &[0x11; 4096], Access::READ);
    let neighbour = buffer(&target, &[0x22; 4096], Access::READ_WRITE);
    let key = guarded.export().unwrap().key;
    let mut s = raw(&target).await;

    // WRITE to a read-only region, with the bytes following: refused, drained, in step.
    let mut req = vec![1u8];
    req.extend_from_slice(&1u32.to_be_bytes());
    req.extend_from_slice(&wire_desc(&key, 0, 16));
    req.push(0); // no padding
    req.extend_from_slice(&[0xEE; 16]);
    s.write_all(&req).await.unwrap();
    let (code, msg) = status(&mut s).await.expect("refused");
    assert_eq!(code, 3, "AccessDenied: {msg}");

    // READ past the end (the initiator's own check skipped): refused.
    for (offset, len) in [(4000, 97), (u64::MAX - 1, 2), (4097, 0), (0, u64::MAX)] {
        let mut req = vec![2u8];
        req.extend_from_slice(&1u32.to_be_bytes());
        req.extend_from_slice(&wire_desc(&key, offset, len));
        s.write_all(&req).await.unwrap();
        let (code, _) = status(&mut s).await.expect("refused");
        assert_eq!(code, 2, "OutOfBounds for offset {offset} len {len}");
    }

    // A wrong token and an unknown region id: InvalidKey.
    let mut forged = key.clone();
    forged[20] ^= 1;
    let mut unknown = key.clone();
    unknown[..8].copy_from_slice(&u64::MAX.to_be_bytes());
    for k in [&forged, &unknown] {
        let mut req = vec![2u8];
        req.extend_from_slice(&1u32.to_be_bytes());
        req.extend_from_slice(&wire_desc(k, 0, 16));
        s.write_all(&req).await.unwrap();
        let (code, msg) = status(&mut s).await.expect("refused");
        assert_eq!(code, 1, "InvalidKey: {msg}");
    }

    // After all that the connection still serves an honest READ.
    let mut req = vec![2u8];
    req.extend_from_slice(&1u32.to_be_bytes());
    req.extend_from_slice(&wire_desc(&key, 4080, 16));
    s.write_all(&req).await.unwrap();
    assert!(status(&mut s).await.is_none());
    let pad = s.read_u8().await.unwrap() as usize;
    assert!(pad < 64, "padding {pad}");
    s.read_exact(&mut [0u8; 64][..pad]).await.unwrap();
    let mut got = [0u8; 16];
    s.read_exact(&mut got).await.unwrap();
    assert_eq!(got, [0x11; 16]);

    // Descriptor lengths whose sum overflows: a protocol error, and the connection closes.
    let mut req = vec![1u8];
    req.extend_from_slice(&2u32.to_be_bytes());
    req.extend_from_slice(&wire_desc(&key, 0, u64::MAX));
    req.extend_from_slice(&wire_desc(&key, 0, 2));
    req.push(0); // no padding
    s.write_all(&req).await.unwrap();
    let (code, msg) = status(&mut s).await.expect("refused");
    assert_eq!(code, 5, "{msg}");
    assert!(msg.contains("overflow"), "{msg}");
    let mut rest = Vec::new();
    assert_eq!(
        s.read_to_end(&mut rest).await.unwrap(),
        0,
        "closed after a protocol error"
    );

    assert_eq!(contents(&guarded), vec![0x11; 4096]);
    assert_eq!(contents(&neighbour), vec![0x22; 4096]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_batches_and_unknown_requests_close_only_that_connection() {
    let target = comm(TcpConfig {
        max_batch_descs: 4,
        ..TcpConfig::default()
    });
    let region = buffer(&target, &[7; 64], Access::READ_WRITE);
    let mut big = raw(&target).await;
    let mut req = vec![2u8];
    req.extend_from_slice(&5u32.to_be_bytes());
    big.write_all(&req).await.unwrap();
    let (code, msg) = status(&mut big).await.expect("refused");
    assert_eq!(code, 5);
    assert!(msg.contains("max_batch_descs"), "{msg}");

    let mut odd = raw(&target).await;
    odd.write_all(&[0x7f]).await.unwrap();
    let (_, msg) = status(&mut odd).await.expect("refused");
    assert!(msg.contains("unknown request kind 127"), "{msg}");

    // An honest initiator with a larger batch limit splits its batch, and the target still
    // serves it (each request within the target's limit).
    let initiator = comm(TcpConfig {
        max_batch_descs: 4,
        ..TcpConfig::default()
    });
    let ep = initiator.connect(&target.address(), soon()).await.unwrap();
    let key = initiator.import(&ep, &region.export().unwrap()).unwrap();
    let local = buffer(&initiator, &[0; 64], Access::READ_WRITE);
    let batch: Vec<_> = (0..10)
        .map(|i| TransferDesc::<TcpCommunicator> {
            local: local.registration(),
            local_offset: i * 6,
            remote: &key,
            remote_offset: (i * 6) as u64,
            len: 6,
        })
        .collect();
    initiator
        .transfer(&ep, Op::Read, &batch, soon())
        .await
        .unwrap();
    assert_eq!(&contents(&local)[..60], &[7; 60]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_silent_connections_do_not_disturb_transfers() {
    let target = comm(TcpConfig {
        hello_timeout: Duration::from_millis(200),
        ..TcpConfig::default()
    });
    let region = buffer(&target, &[3; 1024], Access::READ);
    let PeerAddr::Tcp(sa) = target.address() else {
        panic!()
    };
    let mut garbage = TcpStream::connect(sa).await.unwrap();
    garbage.write_all(b"\x00\xff garbage").await.unwrap();
    let mut silent = TcpStream::connect(sa).await.unwrap();

    let initiator = comm(TcpConfig::default());
    let ep = initiator.connect(&target.address(), soon()).await.unwrap();
    let key = initiator.import(&ep, &region.export().unwrap()).unwrap();
    let local = buffer(&initiator, &[0; 1024], Access::READ_WRITE);
    let d = [TransferDesc::<TcpCommunicator> {
        local: local.registration(),
        local_offset: 0,
        remote: &key,
        remote_offset: 0,
        len: 1024,
    }];
    initiator.transfer(&ep, Op::Read, &d, soon()).await.unwrap();
    assert_eq!(contents(&local), vec![3; 1024]);

    let start = Instant::now();
    let mut sink = Vec::new();
    let refusal = garbage.read_to_end(&mut sink).await;
    assert!(
        refusal.is_err() || String::from_utf8_lossy(&sink).contains("bad HELLO magic"),
        "{sink:?}"
    );
    silent.read_to_end(&mut sink).await.unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "hello_timeout was not applied"
    );
    initiator.transfer(&ep, Op::Read, &d, soon()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_to_something_that_is_not_a_peer_fails_clearly() {
    let a = comm(TcpConfig::default());
    // A listener that accepts and says nothing: the HELLO answer never comes.
    let quiet = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = PeerAddr::Tcp(quiet.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let (s, _) = quiet.accept().await.unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
        drop(s);
    });
    let start = Instant::now();
    let err = a
        .connect(&addr, Deadline::after(Duration::from_millis(300)))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::DeadlineExceeded { .. }), "{err:?}");
    assert!(start.elapsed() < Duration::from_secs(2));
    held.abort();

    // A listener that answers with something else.
    let chatty = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = PeerAddr::Tcp(chatty.local_addr().unwrap());
    tokio::spawn(async move {
        let (mut s, _) = chatty.accept().await.unwrap();
        let _ = s.write_all(b"SSH-2.0-OpenSSH_9.6\r\n").await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    });
    let err = a.connect(&addr, soon()).await.unwrap_err();
    assert!(matches!(err, Error::Protocol(_)), "{err:?}");
    assert!(err.to_string().contains("bad HELLO magic"), "{err}");

    let err = a
        .connect(&"tcp://127.0.0.1:1".parse().unwrap(), soon())
        .await
        .unwrap_err();
    assert_eq!(
        err.io_kind(),
        Some(std::io::ErrorKind::ConnectionRefused),
        "{err:?}"
    );
    assert!(err.is_connection_refused() && err.is_retryable(), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_belong_to_their_endpoint_and_device_memory_is_refused() {
    let target = comm(TcpConfig::default());
    let a = comm(TcpConfig::default());
    let region = buffer(&target, &[1; 64], Access::READ_WRITE);
    let ep1 = a.connect(&target.address(), soon()).await.unwrap();
    let ep2 = a.connect(&target.address(), soon()).await.unwrap();
    let key1 = a.import(&ep1, &region.export().unwrap()).unwrap();
    let local = buffer(&a, &[0; 64], Access::READ_WRITE);
    let d = [TransferDesc::<TcpCommunicator> {
        local: local.registration(),
        local_offset: 0,
        remote: &key1,
        remote_offset: 0,
        len: 64,
    }];
    let err = a.transfer(&ep2, Op::Read, &d, soon()).await.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    a.transfer(&ep1, Op::Read, &d, soon()).await.unwrap();

    let mut short = region.export().unwrap();
    short.key.pop();
    assert!(matches!(a.import(&ep1, &short), Err(Error::InvalidKey(_))));

    let gpu = Region {
        device: Device::new(DeviceKind::CUDA, 0),
        addr: 0x1000,
        len: 64,
    };
    // SAFETY: the registration is refused, so the region is never touched.
    let err = unsafe { a.register(gpu, Access::READ) }.unwrap_err();
    assert!(matches!(err, Error::UnsupportedMemory { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_and_notification_limits_name_themselves() {
    let small = comm(TcpConfig {
        max_registered_bytes: 8192,
        max_pending_notifications: 2,
        max_notify_len: 16,
        ..TcpConfig::default()
    });
    let first = buffer(&small, &[0; 8192], Access::READ);
    let err = RegisteredBuffer::new(Arc::new(HostMemory::new()), small.clone(), 1, Access::READ)
        .err()
        .expect("over the budget");
    assert!(
        matches!(
            err,
            Error::LimitExceeded {
                limit: "max_registered_bytes",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("max_registered_bytes"), "{err}");
    drop(first);
    assert_eq!(
        small.registered_bytes(),
        0,
        "deregistration returns the budget"
    );
    let again = buffer(&small, &[0; 8192], Access::READ);

    let sender = comm(TcpConfig::default());
    let ep = sender.connect(&small.address(), soon()).await.unwrap();
    // The key that proves `small` granted this endpoint access; notify sends it.
    sender.import(&ep, &again.export().unwrap()).unwrap();
    let err = sender.notify(&ep, 1, &[0; 17], soon()).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::LimitExceeded {
                limit: "max_notify_len",
                ..
            }
        ),
        "{err:?}"
    );
    sender.notify(&ep, 1, b"one", soon()).await.unwrap();
    sender.notify(&ep, 2, b"two", soon()).await.unwrap();
    let err = sender.notify(&ep, 3, b"three", soon()).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::LimitExceeded {
                limit: "max_pending_notifications",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(small.recv_notification(soon()).await.unwrap().msg, b"one");
    sender.notify(&ep, 3, b"three", soon()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_ends_waiters_and_refuses_new_work() {
    let a = comm(TcpConfig::default());
    let waiter = {
        let a = a.clone();
        tokio::spawn(async move { a.recv_notification(soon()).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    a.close();
    assert!(matches!(waiter.await.unwrap(), Err(Error::Closed(_))));
    let err = a
        .connect(&"tcp://127.0.0.1:1".parse().unwrap(), soon())
        .await;
    assert!(matches!(err, Err(Error::Closed(_))), "{err:?}");
    let err = RegisteredBuffer::new(Arc::new(HostMemory::new()), a.clone(), 64, Access::READ);
    assert!(matches!(err, Err(Error::Closed(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_limit_are_refused_with_the_limit_named() {
    let target = comm(TcpConfig {
        max_accepted_connections: 1,
        ..TcpConfig::default()
    });
    let a = comm(TcpConfig::default());
    let first = a.connect(&target.address(), soon()).await.unwrap();
    let err = a.connect(&target.address(), soon()).await.unwrap_err();
    assert!(matches!(err, Error::Peer { .. }), "{err:?}");
    assert!(
        err.to_string().contains("max_accepted_connections"),
        "{err}"
    );
    // The first endpoint is unaffected, and its connection slot frees when it is dropped.
    let region = buffer(&target, &[5; 32], Access::READ);
    let key = a.import(&first, &region.export().unwrap()).unwrap();
    let local = buffer(&a, &[0; 32], Access::READ_WRITE);
    let d = [TransferDesc::<TcpCommunicator> {
        local: local.registration(),
        local_offset: 0,
        remote: &key,
        remote_offset: 0,
        len: 32,
    }];
    a.transfer(&first, Op::Read, &d, soon()).await.unwrap();
    assert_eq!(contents(&local), vec![5; 32]);
    drop(first);
    let start = Instant::now();
    loop {
        match a.connect(&target.address(), soon()).await {
            Ok(_) => break,
            Err(e) => assert!(
                start.elapsed() < Duration::from_secs(5),
                "slot never freed: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
