//! ABANDON (request kind 5) and `Communicator::settle`: once a target answers an ABANDON, the named connection applies no more of its WRITE, even bytes already in its socket; only a connection from the same IP address may abandon one; and `settle` makes a dropped WRITE final, or says why it could not.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hmc_backend_cpu::HostMemory;
use hmc_core::{
    Access, AnyCommunicator, Communicator, ConnBuffer, Deadline, Error, LocalRegistration, MemSpan,
    MemSpanMut, Op, PeerAddr, RegisteredBuffer, RemoteRegion, TransferDesc, TransportId,
};
use hmc_transport_tcp::{TcpCommunicator, TcpConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

mod raw_peer;
use raw_peer::{hello, status};

const CANARY: u8 = 0xC5;
const REQ_WRITE: u8 = 1;
const REQ_ABANDON: u8 = 5;

fn soon() -> Deadline {
    Deadline::after(Duration::from_secs(10))
}

fn comm() -> Arc<TcpCommunicator> {
    let any: PeerAddr = "tcp://127.0.0.1:0".parse().unwrap();
    Arc::new(TcpCommunicator::bind(&any, TcpConfig::default()).unwrap())
}

type Buf = RegisteredBuffer<HostMemory, TcpCommunicator>;

fn buffer(c: &Arc<TcpCommunicator>, len: usize, fill: u8, access: Access) -> Buf {
    let b = RegisteredBuffer::new(Arc::new(HostMemory::new()), c.clone(), len, access).unwrap();
    b.write_at(0, &MemSpan::host(&vec![fill; len])).unwrap();
    b
}

fn contents(b: &Buf) -> Vec<u8> {
    let mut out = vec![0u8; b.len()];
    b.read_at(0, &mut MemSpanMut::host(&mut out)).unwrap();
    out
}

fn target_addr(target: &TcpCommunicator) -> SocketAddr {
    let PeerAddr::Tcp(sa) = target.address() else {
        panic!("a tcp:// target")
    };
    sa
}

/// A raw data-plane connection from `from` (an IP of this host) that has said HELLO.
async fn raw(target: &TcpCommunicator, from: &str) -> TcpStream {
    let sock = TcpSocket::new_v4().unwrap();
    sock.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let mut s = sock.connect(target_addr(target)).await.unwrap();
    hello(&mut s).await;
    s
}

/// An ABANDON naming `conn`.
fn abandon(conn: SocketAddr) -> Vec<u8> {
    let text = conn.to_string();
    let mut req = vec![REQ_ABANDON, text.len() as u8];
    req.extend_from_slice(text.as_bytes());
    req
}

/// The header of a WRITE of `len` bytes at offset 0 of the region `export` describes.
fn write_header(export: &RemoteRegion, len: u64) -> Vec<u8> {
    let mut req = vec![REQ_WRITE];
    req.extend_from_slice(&1u32.to_be_bytes());
    req.extend_from_slice(&export.key);
    req.extend_from_slice(&0u64.to_be_bytes());
    req.extend_from_slice(&len.to_be_bytes());
    req.push(0); // no padding
    req
}

/// Bytes of the WRITE the raw tests leave half-sent.
const HALF_LEN: usize = 64 << 10;

/// A target with a zeroed region of [`HALF_LEN`] bytes, and a raw connection from `from`
/// that sent a WRITE of all of it but only its first half (7s), which the target applied.
async fn half_a_write(from: &str) -> (Arc<TcpCommunicator>, Buf, TcpStream) {
    let target = comm();
    let dst = buffer(&target, HALF_LEN, 0, Access::WRITE);
    let mut victim = raw(&target, from).await;
    send_half(&dst, &mut victim).await;
    (target, dst, victim)
}

/// Sends on `victim` a WRITE of all of `dst` ([`HALF_LEN`] bytes) but only its first half
/// (7s), and waits until the target applied that half.
async fn send_half(dst: &Buf, victim: &mut (impl AsyncWriteExt + Unpin)) {
    let export = dst.export().unwrap();
    victim
        .write_all(&write_header(&export, HALF_LEN as u64))
        .await
        .unwrap();
    victim.write_all(&[7u8; HALF_LEN / 2]).await.unwrap();
    for _ in 0..500 {
        if contents(dst)[HALF_LEN / 2 - 1] == 7 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the first half of the WRITE never landed at the target");
}

/// After the victim's connection was abandoned: canaries over `dst`, then the rest of the
/// victim's WRITE, which reaches the target's socket; the responder must apply none of it.
async fn rest_lands_nothing(dst: &Buf, victim: &mut (impl AsyncWriteExt + Unpin)) {
    dst.write_at(0, &MemSpan::host(&vec![CANARY; HALF_LEN]))
        .unwrap();
    let _ = victim.write_all(&[9u8; HALF_LEN / 2]).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let now = contents(dst);
    assert!(
        now.iter().all(|&b| b == CANARY),
        "byte {:?} of the abandoned WRITE landed after the ABANDON was answered",
        now.iter().position(|&b| b != CANARY)
    );
}

/// The rest of a WRITE sent after its connection was abandoned is not applied, though
/// the connection is still open and the bytes reach the target's socket: the ABANDON,
/// not a reset, stops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_connection_applies_no_more_of_its_write() {
    let (target, dst, mut victim) = half_a_write("127.0.0.1").await;

    let mut other = raw(&target, "127.0.0.1").await;
    other
        .write_all(&abandon(victim.local_addr().unwrap()))
        .await
        .unwrap();
    assert_eq!(status(&mut other).await, None, "the ABANDON is answered 0");
    rest_lands_nothing(&dst, &mut victim).await;
    // The abandoned connection is closed; the one that asked still serves.
    let mut probe = [0u8; 1];
    let closed = tokio::time::timeout(Duration::from_secs(5), victim.read(&mut probe)).await;
    assert!(
        matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
        "the abandoned connection is closed: {closed:?}"
    );
    other
        .write_all(&abandon("127.0.0.1:1".parse().unwrap()))
        .await
        .unwrap();
    assert_eq!(status(&mut other).await, None);
}

/// A raw data-plane connection over the Unix socket of `target`, from a socket bound to
/// the abstract address `name` (as the transport's own dialler binds, with a name the
/// kernel picks), that has said HELLO.
async fn raw_unix(target: &TcpCommunicator, name: &str) -> tokio::net::UnixStream {
    let PeerAddr::Unix(path) = target.address() else {
        panic!("a unix:// target")
    };
    let sock = tokio::net::UnixSocket::new_stream().unwrap();
    sock.bind(format!("\0{name}")).unwrap();
    let mut s = sock.connect(path).await.unwrap();
    hello(&mut s).await;
    s
}

/// Over Unix sockets as over TCP: once a target answered an ABANDON naming a connection
/// by its abstract address, the rest of that connection's WRITE is not applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_a_unix_socket_an_abandoned_connection_applies_no_more_of_its_write() {
    let dir = std::env::temp_dir().join(format!("hmc-tcp-abandon-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let at = PeerAddr::Unix(dir.join("target.sock"));
    let target = Arc::new(TcpCommunicator::bind(&at, TcpConfig::default()).unwrap());
    let dst = buffer(&target, HALF_LEN, 0, Access::WRITE);
    let victim_name = format!("hmc-test-victim-{}", std::process::id());
    let mut victim = raw_unix(&target, &victim_name).await;
    send_half(&dst, &mut victim).await;

    let mut other = raw_unix(&target, &format!("hmc-test-other-{}", std::process::id())).await;
    let hex: String = victim_name.bytes().map(|b| format!("{b:02x}")).collect();
    let text = format!("unix:@{hex}");
    let mut req = vec![REQ_ABANDON, text.len() as u8];
    req.extend_from_slice(text.as_bytes());
    other.write_all(&req).await.unwrap();
    assert_eq!(status(&mut other).await, None, "the ABANDON is answered 0");
    rest_lands_nothing(&dst, &mut victim).await;
    drop((victim, other, target));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A peer at another IP address cannot abandon a connection: it is refused with
/// `AccessDenied` (code 3), the victim's WRITE completes, and the asking connection stays
/// usable; an ABANDON of a connection that is not served is answered 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_same_ip_may_abandon_and_unknown_connections_answer_zero() {
    const LEN: usize = HALF_LEN;
    let (target, dst, mut victim) = half_a_write("127.0.0.2").await;

    let mut attacker = raw(&target, "127.0.0.1").await;
    attacker
        .write_all(&abandon(victim.local_addr().unwrap()))
        .await
        .unwrap();
    let refused = status(&mut attacker).await;
    match &refused {
        Some((3, msg)) => assert!(msg.contains("same IP address"), "{msg}"),
        other => panic!("expected AccessDenied (3), got {other:?}"),
    }

    victim.write_all(&[7u8; LEN / 2]).await.unwrap();
    assert_eq!(
        status(&mut victim).await,
        None,
        "the victim's WRITE completes"
    );
    assert!(contents(&dst).iter().all(|&b| b == 7));

    // Still in step: an unknown connection (and one long gone) answers 0.
    for gone in ["127.0.0.1:1", "[::1]:2"] {
        attacker
            .write_all(&abandon(gone.parse().unwrap()))
            .await
            .unwrap();
        let got = status(&mut attacker).await;
        if gone.starts_with('[') {
            // Another IP address than the asker's: refused, even when nothing is there.
            assert!(matches!(got, Some((3, _))), "{got:?}");
        } else {
            assert_eq!(got, None);
        }
    }
    // A malformed address is an error status, and the connection stays usable.
    attacker
        .write_all(&[REQ_ABANDON, 3, b'x', b'y', b'z'])
        .await
        .unwrap();
    assert!(matches!(status(&mut attacker).await, Some((5, m)) if m.contains("neither an IP")));
    // A Unix socket's connection cannot be named over TCP.
    let unix = b"unix:@0a0b0c0d0e";
    let mut req = vec![REQ_ABANDON, unix.len() as u8];
    req.extend_from_slice(unix);
    attacker.write_all(&req).await.unwrap();
    assert!(matches!(status(&mut attacker).await, Some((3, m)) if m.contains("same user")));
    attacker
        .write_all(&abandon("127.0.0.1:1".parse().unwrap()))
        .await
        .unwrap();
    assert_eq!(status(&mut attacker).await, None);
}

/// WRITEs whose futures are dropped mid-way, each followed by `settle`: once it returns
/// `Ok`, canaries written at the target stay. A `settle` with nothing to settle returns
/// `Ok` at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_settle_a_dropped_write_lands_nothing_more() {
    const LEN: usize = 32 << 20;
    let target = comm();
    let init = comm();
    let dst = buffer(&target, LEN, 0, Access::WRITE);
    let src = buffer(&init, LEN, 7, Access::READ);
    let ep = init.connect(&target.address(), soon()).await.unwrap();
    let key = init.import(&ep, &dst.export().unwrap()).unwrap();
    init.settle(&ep, soon()).await.unwrap();
    let mut dropped = 0;
    for round in 0..12u64 {
        let batch = [TransferDesc::new(src.registration(), 0, &key, 0, LEN)];
        let cut = Duration::from_micros(300 + 400 * round);
        let write = init.transfer(&ep, Op::Write, &batch, soon());
        if tokio::time::timeout(cut, write).await.is_ok() {
            continue;
        }
        dropped += 1;
        init.settle(&ep, soon()).await.unwrap();
        dst.write_at(0, &MemSpan::host(&vec![CANARY; LEN])).unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = contents(&dst);
        assert!(
            now.iter().all(|&b| b == CANARY),
            "round {round}: byte {:?} landed after settle returned",
            now.iter().position(|&b| b != CANARY)
        );
    }
    assert!(
        dropped > 0,
        "no WRITE was dropped mid-way; the test saw nothing"
    );
    // The endpoint still works.
    let batch = [TransferDesc::new(src.registration(), 0, &key, 0, LEN)];
    init.transfer(&ep, Op::Write, &batch, soon()).await.unwrap();
    assert!(contents(&dst).iter().all(|&b| b == 7));
}

/// A target of the wire version before ABANDON: it takes WRITEs (this one never answers
/// them) and closes a connection on "unknown request kind 5", as the old responder did.
async fn old_target() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut head = [0u8; 7];
                s.read_exact(&mut head).await?;
                let mut from = vec![0u8; u16::from_be_bytes([head[5], head[6]]) as usize];
                s.read_exact(&mut from).await?;
                let me = addr.to_string();
                let mut answer = b"HMTC\x01\x00".to_vec();
                answer.extend_from_slice(&(me.len() as u16).to_be_bytes());
                answer.extend_from_slice(me.as_bytes());
                s.write_all(&answer).await?;
                let kind = s.read_u8().await?;
                if kind == REQ_WRITE {
                    // Swallows the WRITE and never answers.
                    let mut sink = vec![0u8; 1 << 16];
                    while s.read(&mut sink).await? > 0 {}
                    return Ok::<_, std::io::Error>(());
                }
                let msg = format!("unknown request kind {kind}");
                let mut status = vec![5u8];
                status.extend_from_slice(&[0u8; 24]);
                status.extend_from_slice(&(msg.len() as u16).to_be_bytes());
                status.extend_from_slice(msg.as_bytes());
                s.write_all(&status).await?;
                Ok(())
            });
        }
    });
    addr
}

/// `settle` with a WRITE dropped at a target that does not know ABANDON: an error that
/// names the cause and the fix, not `Ok`; the same through `AnyCommunicator`, which
/// forwards `settle` (its default would answer `Ok`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settle_at_an_older_target_says_the_end_is_not_final() {
    let tcp = comm();
    let addr = old_target().await;
    settle_after_a_dropped_write(&*tcp, &tcp, addr).await;
    let any = AnyCommunicator::from_arc(tcp.clone());
    settle_after_a_dropped_write(&any, &tcp, addr).await;
}

/// Drops a WRITE to the older target at `addr` by its deadline, then expects `settle` to
/// name the older version.
async fn settle_after_a_dropped_write<C: Communicator>(
    init: &C,
    tcp: &Arc<TcpCommunicator>,
    addr: SocketAddr,
) {
    let src = RegisteredBuffer::new(
        Arc::new(HostMemory::new()),
        tcp.clone(),
        1 << 20,
        Access::READ,
    )
    .unwrap();
    // SAFETY: `src` owns the memory and outlives `reg` (declared after it, dropped first).
    let reg = unsafe { init.register(src.registration().region(), Access::READ) }.unwrap();
    let peer = PeerAddr::Tcp(addr);
    let ep = init.connect(&peer, soon()).await.unwrap();
    let mut key = Vec::new();
    key.extend_from_slice(&1u64.to_be_bytes());
    key.extend_from_slice(&[0x11; 16]);
    let remote = RemoteRegion {
        transport: TransportId::TCP,
        region: hmc_core::Region {
            device: hmc_core::Device::HOST,
            addr: 0x1000,
            len: 1 << 20,
        },
        access: Access::WRITE,
        key,
    };
    let key = init.import(&ep, &remote).unwrap();
    let batch = [TransferDesc::new(&reg, 0, &key, 0, 1 << 20)];
    let r = init
        .transfer(
            &ep,
            Op::Write,
            &batch,
            Deadline::after(Duration::from_millis(200)),
        )
        .await;
    assert!(matches!(r, Err(Error::DeadlineExceeded { .. })), "{r:?}");
    let settled = init.settle(&ep, soon()).await;
    match settled {
        Err(Error::Unsupported(msg)) => {
            assert!(msg.contains("unknown request kind 5"), "{msg}");
            assert!(msg.contains("upgrade the target"), "{msg}");
        }
        other => panic!("expected Unsupported naming the old version, got {other:?}"),
    }
}
