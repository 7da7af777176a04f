//! Trust boundaries of `TcpCommunicator` over real sockets: who may NOTIFY and how much it may pin, timeouts after HELLO, pre-shared-secret authentication, and keys revoked by `rekey`.
//!
//! Raw `TcpStream`s write the wire format (see `src/wire.rs`) where an honest initiator
//! would not; assertions are on [`TcpCommunicator::stats`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use hmc_backend_cpu::HostMemory;
use hmc_core::{
    Access, Communicator, ConnBuffer, Deadline, Error, MemSpan, MemSpanMut, Op, PeerAddr,
    RegisteredBuffer, TransferDesc,
};
use hmc_transport_tcp::{AuthSecret, TcpCommunicator, TcpConfig, TcpRemoteKey};
use rstest::rstest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod raw_peer;
use raw_peer::{hello, status};

fn soon() -> Deadline {
    Deadline::after(Duration::from_secs(10))
}

fn comm(config: TcpConfig) -> Arc<TcpCommunicator> {
    let any: PeerAddr = "tcp://127.0.0.1:0".parse().unwrap();
    Arc::new(TcpCommunicator::bind(&any, config).unwrap())
}

/// Short timeouts so the tests stay fast.
fn quick() -> TcpConfig {
    TcpConfig {
        hello_timeout: Duration::from_millis(500),
        idle_timeout: Duration::from_millis(300),
        request_timeout: Duration::from_millis(300),
        ..TcpConfig::default()
    }
}

fn secret(s: &str) -> Option<AuthSecret> {
    Some(AuthSecret::new(s.as_bytes()).unwrap())
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

/// One descriptor covering all of `local` and the start of `key`'s region.
fn whole<'a>(local: &'a Buf, key: &'a TcpRemoteKey) -> [TransferDesc<'a, TcpCommunicator>; 1] {
    [TransferDesc {
        local: local.registration(),
        local_offset: 0,
        remote: key,
        remote_offset: 0,
        len: local.len(),
    }]
}

/// A raw data-plane connection that has said a version-1 HELLO and been admitted.
async fn raw(target: &TcpCommunicator) -> TcpStream {
    let PeerAddr::Tcp(sa) = target.address() else {
        panic!("tcp")
    };
    let mut s = TcpStream::connect(sa).await.unwrap();
    hello(&mut s).await;
    s
}

/// A NOTIFY (3) without a key, or a KEYED NOTIFY (4) with `key` (id and token).
fn notify_request(key: Option<&[u8]>, tag: u64, msg: &[u8]) -> Vec<u8> {
    let mut req = match key {
        Some(k) => {
            let mut r = vec![4u8];
            r.extend_from_slice(k);
            r
        }
        None => vec![3u8],
    };
    req.extend_from_slice(&tag.to_be_bytes());
    req.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    req.extend_from_slice(msg);
    req
}

/// Waits (at most `limit`) until the target closes `s`: end of stream or a reset.
async fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    let mut sink = Vec::new();
    tokio::time::timeout(limit, s.read_to_end(&mut sink))
        .await
        .is_ok()
}

/// Before: 4,096 NOTIFYs of 64 KiB without a key were all queued. Now one without a key
/// over an unauthenticated connection is refused (and read, so the connection goes on),
/// one with a forged or revoked key too, and nothing stays pinned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notify_without_a_live_key_is_refused_and_pins_nothing() {
    let target = comm(TcpConfig::default());
    let region = buffer(&target, &[0; 64], Access::READ);
    let mut s = raw(&target).await;
    for i in 0..64 {
        s.write_all(&notify_request(None, i, &[7; 1024]))
            .await
            .unwrap();
        let (code, msg) = status(&mut s).await.expect("refused");
        assert_eq!(code, 3, "AccessDenied: {msg}");
        assert!(msg.contains("import one of its exported regions"), "{msg}");
    }
    let mut forged = region.export().unwrap().key;
    forged[12] ^= 1;
    s.write_all(&notify_request(Some(&forged), 1, b"forged"))
        .await
        .unwrap();
    let (code, msg) = status(&mut s).await.expect("refused");
    assert_eq!(code, 1, "InvalidKey: {msg}");
    let stats = target.stats();
    assert_eq!(stats.pending_notifications, 0);
    assert_eq!(stats.pending_notification_bytes, 0);
    assert_eq!(stats.refused_notifications, 65);

    // The same connection, with the key of a live registration: taken.
    let key = region.export().unwrap().key;
    s.write_all(&notify_request(Some(&key), 9, b"granted"))
        .await
        .unwrap();
    assert!(status(&mut s).await.is_none(), "a keyed NOTIFY is taken");
    let n = target.recv_notification(soon()).await.unwrap();
    assert_eq!((n.tag, n.msg.as_slice()), (9, &b"granted"[..]));

    // Once the registration is gone, its key no longer admits a NOTIFY.
    drop(region);
    s.write_all(&notify_request(Some(&key), 10, b"late"))
        .await
        .unwrap();
    let (code, _) = status(&mut s).await.expect("refused");
    assert_eq!(code, 1, "InvalidKey after deregistration");
}

/// Pending notifications are bounded in bytes as well as in count, and zero pending
/// notifications refuses every NOTIFY with an error that names the limit.
#[rstest]
#[case::byte_budget(4096, 100, "max_pending_notification_bytes")]
#[case::no_notifications_at_all(0, 1 << 20, "max_pending_notifications")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_notifications_are_bounded_in_count_and_bytes(
    #[case] max_pending: usize,
    #[case] max_bytes: usize,
    #[case] limit_named: &str,
) {
    let target = comm(TcpConfig {
        max_pending_notifications: max_pending,
        max_pending_notification_bytes: max_bytes,
        ..TcpConfig::default()
    });
    let region = buffer(&target, &[0; 64], Access::READ);
    let sender = comm(TcpConfig::default());
    let ep = sender.connect(&target.address(), soon()).await.unwrap();
    sender.import(&ep, &region.export().unwrap()).unwrap();
    let mut sent = 0;
    let err = loop {
        match sender.notify(&ep, sent, &[1; 60], soon()).await {
            Ok(()) => sent += 1,
            Err(e) => break e,
        }
        assert!(sent < 10, "the budget never filled");
    };
    assert!(
        matches!(err, Error::LimitExceeded { limit, .. } if limit == limit_named),
        "{err:?}"
    );
    assert!(err.to_string().contains("raise"), "{err}");
    let stats = target.stats();
    assert_eq!(stats.pending_notifications, sent);
    assert_eq!(stats.pending_notification_bytes, sent * 60);
    assert!(stats.pending_notification_bytes <= max_bytes as u64);
    assert_eq!(stats.refused_notifications, 1);
    if sent > 0 {
        // Receiving frees the budget.
        target.recv_notification(soon()).await.unwrap();
        assert_eq!(target.stats().pending_notification_bytes, (sent - 1) * 60);
        sender.notify(&ep, 99, &[1; 60], soon()).await.unwrap();
    }
}

/// Before: 200 idle connections were still open after 12 s. Now each admitted connection
/// that sends nothing is closed after `idle_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_after_idle_timeout() {
    let target = comm(quick());
    let mut idle = Vec::new();
    for _ in 0..20 {
        idle.push(raw(&target).await);
    }
    assert_eq!(target.stats().accepted_connections, 20);
    let start = Instant::now();
    for s in &mut idle {
        assert!(
            closed_within(s, Duration::from_secs(3)).await,
            "an idle connection stayed open"
        );
    }
    assert!(start.elapsed() < Duration::from_secs(3));
    let stats = target.stats();
    assert_eq!(stats.closed_idle_timeout, 20, "{stats:?}");
    assert_eq!(stats.open_connections, 0, "{stats:?}");

    // An honest initiator whose pooled connection was closed meanwhile dials a new one.
    let region = buffer(&target, &[4; 32], Access::READ);
    let initiator = comm(quick());
    let ep = initiator.connect(&target.address(), soon()).await.unwrap();
    let key = initiator.import(&ep, &region.export().unwrap()).unwrap();
    let local = buffer(&initiator, &[0; 32], Access::READ_WRITE);
    let d = [TransferDesc::<TcpCommunicator> {
        local: local.registration(),
        local_offset: 0,
        remote: &key,
        remote_offset: 0,
        len: 32,
    }];
    tokio::time::sleep(Duration::from_millis(500)).await;
    initiator.transfer(&ep, Op::Read, &d, soon()).await.unwrap();
    assert_eq!(contents(&local), vec![4; 32]);
}

/// A started request must arrive whole (and its bulk bytes keep moving) within
/// `request_timeout`; otherwise the connection is closed.
#[rstest]
#[case::write_header_cut_short(&[1, 0, 0])]
#[case::notify_body_cut_short(&[4])]
#[case::write_data_stalls(&[1])]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_stalls_is_closed_after_request_timeout(#[case] start_of: &[u8]) {
    let target = comm(quick());
    let region = buffer(&target, &[0; 4096], Access::READ_WRITE);
    let key = region.export().unwrap().key;
    let mut s = raw(&target).await;
    let mut req = start_of.to_vec();
    match start_of {
        [4] => {
            // A whole header announcing 1000 bytes, then 10 of them.
            req.extend_from_slice(&key);
            req.extend_from_slice(&1u64.to_be_bytes());
            req.extend_from_slice(&1000u32.to_be_bytes());
            req.extend_from_slice(&[0; 10]);
        }
        [1] => {
            // A whole WRITE header for 4096 bytes, then 100 of them.
            req.extend_from_slice(&1u32.to_be_bytes());
            req.extend_from_slice(&key);
            req.extend_from_slice(&0u64.to_be_bytes());
            req.extend_from_slice(&4096u64.to_be_bytes());
            req.push(0);
            req.extend_from_slice(&[9; 100]);
        }
        _ => {}
    }
    s.write_all(&req).await.unwrap();
    let start = Instant::now();
    assert!(
        closed_within(&mut s, Duration::from_secs(3)).await,
        "a stalled request held its connection"
    );
    assert!(start.elapsed() >= Duration::from_millis(250));
    let stats = target.stats();
    assert_eq!(stats.closed_request_timeout, 1, "{stats:?}");
    assert_eq!(stats.closed_idle_timeout, 0, "{stats:?}");
    assert_eq!(stats.pending_notifications, 0);
}

/// Before: a NOTIFY announcing 4 GiB was read (and dropped) byte by byte, holding its
/// connection for as long as the sender liked. Now it is refused from its header, before
/// any of its body is read, and the connection closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notify_announcing_four_gib_is_refused_from_its_header() {
    let target = comm(TcpConfig::default());
    let region = buffer(&target, &[0; 64], Access::READ);
    let mut s = raw(&target).await;
    let mut req = vec![4u8];
    req.extend_from_slice(&region.export().unwrap().key);
    req.extend_from_slice(&1u64.to_be_bytes());
    req.extend_from_slice(&u32::MAX.to_be_bytes());
    s.write_all(&req).await.unwrap();
    let (code, msg) = tokio::time::timeout(Duration::from_secs(3), status(&mut s))
        .await
        .expect("answered from the header, without waiting for the body")
        .expect("refused");
    assert_eq!(code, 4, "LimitExceeded: {msg}");
    assert!(msg.contains("max_notify_len"), "{msg}");
    assert!(closed_within(&mut s, Duration::from_secs(3)).await);
    assert_eq!(target.stats().refused_notifications, 1);
}

/// Pre-shared-secret authentication on the data plane, in every combination.
#[rstest]
#[case::both_with_the_same_secret(secret("the-shared-secret"), secret("the-shared-secret"), None)]
#[case::neither(None, None, None)]
#[case::wrong_secret(
    secret("the-shared-secret"),
    secret("another-secret!!"),
    Some("failed authentication")
)]
#[case::initiator_without_one(secret("the-shared-secret"), None, Some("requires authentication"))]
#[case::target_without_one(None, secret("the-shared-secret"), Some("does not use authentication"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_plane_authentication(
    #[case] target_secret: Option<AuthSecret>,
    #[case] initiator_secret: Option<AuthSecret>,
    #[case] refusal: Option<&str>,
) {
    let with = |s| TcpConfig {
        auth_secret: s,
        ..TcpConfig::default()
    };
    let authenticated = target_secret.is_some();
    let target = comm(with(target_secret));
    let initiator = comm(with(initiator_secret));
    let region = buffer(&target, &[6; 64], Access::READ);
    let connected = initiator.connect(&target.address(), soon()).await;
    match refusal {
        Some(why) => {
            let err = connected.unwrap_err();
            assert!(matches!(err, Error::Peer { .. }), "{err:?}");
            assert!(err.to_string().contains(why), "{err}");
            // The target refused too, before admitting anything.
            let start = Instant::now();
            while target.stats().auth_failures == 0 {
                assert!(start.elapsed() < Duration::from_secs(3), "not counted");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(target.stats().accepted_connections, 0);
        }
        None => {
            let ep = connected.unwrap();
            let key = initiator.import(&ep, &region.export().unwrap()).unwrap();
            let local = buffer(&initiator, &[0; 64], Access::READ_WRITE);
            let d = [TransferDesc::<TcpCommunicator> {
                local: local.registration(),
                local_offset: 0,
                remote: &key,
                remote_offset: 0,
                len: 64,
            }];
            initiator.transfer(&ep, Op::Read, &d, soon()).await.unwrap();
            assert_eq!(contents(&local), vec![6; 64]);
            // Without an imported key, only an authenticated connection may notify.
            let bare = initiator.connect(&target.address(), soon()).await.unwrap();
            let sent = initiator.notify(&bare, 5, b"hi", soon()).await;
            assert_eq!(sent.is_ok(), authenticated, "{sent:?}");
            assert_eq!(target.stats().auth_failures, 0);
        }
    }
}

/// A raw peer that skips authentication gets no request served: its version-1 HELLO is
/// refused, and the connection is closed before anything else is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unauthenticated_raw_peer_is_closed_before_any_request() {
    let target = comm(TcpConfig {
        auth_secret: secret("the-shared-secret"),
        ..quick()
    });
    let region = buffer(&target, &[0x5a; 64], Access::READ);
    let PeerAddr::Tcp(sa) = target.address() else {
        panic!("tcp")
    };
    let mut s = TcpStream::connect(sa).await.unwrap();
    let me = b"tcp://127.0.0.1:9";
    let mut req = b"HMTC\x01".to_vec();
    req.extend_from_slice(&(me.len() as u16).to_be_bytes());
    req.extend_from_slice(me);
    // A READ right behind the HELLO, hoping it is served.
    req.push(2);
    req.extend_from_slice(&1u32.to_be_bytes());
    req.extend_from_slice(&region.export().unwrap().key);
    req.extend_from_slice(&0u64.to_be_bytes());
    req.extend_from_slice(&64u64.to_be_bytes());
    s.write_all(&req).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(3), s.read_to_end(&mut answer))
        .await
        .expect("closed");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.contains("requires authentication"), "{text}");
    assert!(!answer.windows(8).any(|w| w == [0x5a; 8]), "bytes leaked");
    assert_eq!(target.stats().auth_failures, 1);
    assert_eq!(target.stats().accepted_connections, 0);
}

/// `rekey` revokes every key exported so far: a transfer (or NOTIFY) with one is refused
/// like a forged key, and a new export works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rekey_revokes_exported_keys_and_a_new_export_works() {
    let target = comm(TcpConfig::default());
    let initiator = comm(TcpConfig::default());
    let region = buffer(&target, &[8; 256], Access::READ_WRITE);
    let ep = initiator.connect(&target.address(), soon()).await.unwrap();
    let old = initiator.import(&ep, &region.export().unwrap()).unwrap();
    let local = buffer(&initiator, &[0; 256], Access::READ_WRITE);
    let with = |key| whole(&local, key);
    initiator
        .transfer(&ep, Op::Read, &with(&old), soon())
        .await
        .unwrap();
    let before = region.export().unwrap().key;
    assert!(target.rekey(region.registration()).unwrap());
    let after = region.export().unwrap();
    assert_ne!(after.key, before, "a new token");
    assert_eq!(after.key[..8], before[..8], "the same region id");
    for op in [Op::Read, Op::Write] {
        let err = initiator
            .transfer(&ep, op, &with(&old), soon())
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidKey(_)), "{op:?}: {err:?}");
    }
    let err = initiator
        .notify(&ep, 1, b"stale", soon())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidKey(_)), "{err:?}");
    let fresh = initiator.import(&ep, &after).unwrap();
    local.write_at(0, &MemSpan::host(&[3; 256])).unwrap();
    initiator
        .transfer(&ep, Op::Write, &with(&fresh), soon())
        .await
        .unwrap();
    assert_eq!(contents(&region), vec![3; 256]);
    initiator.notify(&ep, 2, b"fresh", soon()).await.unwrap();
    // A registration of another communicator is not this one's to rekey.
    assert!(matches!(
        initiator.rekey(region.registration()),
        Err(Error::InvalidArgument(_))
    ));
}
