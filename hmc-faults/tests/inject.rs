//! Each initiator-side fault over real TCP and shared-memory communicators (two in one
//! process, as the transports' own tests run them): what lands, what the error is, and
//! that the plan's next decision is honoured.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hmc_backend_cpu::HostMemory;
use hmc_core::{
    Access, AnyCommunicator, Communicator, ConnBuffer, Deadline, Error, MemSpan, MemSpanMut, Op,
    RegisteredBuffer, TransferDesc,
};
use hmc_faults::{FaultPlan, FaultSpec, Faulty};

type Comm = Faulty<AnyCommunicator>;
type Buf = RegisteredBuffer<HostMemory, Comm>;

/// The secret both TCP peers share, so that notifications need no region key first.
fn secret() -> hmc_transport_tcp::AuthSecret {
    hmc_transport_tcp::AuthSecret::new(*b"hmc-faults-test-secret").unwrap()
}

fn open(transport: &str) -> AnyCommunicator {
    match transport {
        "tcp" => AnyCommunicator::new(
            hmc_transport_tcp::TcpCommunicator::bind(
                &"tcp://127.0.0.1:0".parse().unwrap(),
                hmc_transport_tcp::TcpConfig {
                    auth_secret: Some(secret()),
                    ..Default::default()
                },
            )
            .unwrap(),
        ),
        "shm" => AnyCommunicator::new(
            hmc_transport_shm::ShmCommunicator::bind(Default::default()).unwrap(),
        ),
        other => panic!("no transport {other} in these tests"),
    }
}

/// An initiator with `spec`'s faults and a target with none.
fn pair(transport: &str, spec: &str) -> (Arc<Comm>, Arc<Comm>) {
    let plan = |s: &str| FaultPlan::new(s.parse::<FaultSpec>().unwrap());
    (
        Arc::new(Faulty::new(open(transport), plan(spec))),
        Arc::new(Faulty::new(open(transport), plan(""))),
    )
}

fn buffer(side: &Arc<Comm>, bytes: &[u8]) -> Buf {
    let buf = RegisteredBuffer::new(
        Arc::new(HostMemory::new()),
        side.clone(),
        bytes.len(),
        Access::READ_WRITE,
    )
    .unwrap();
    buf.write_at(0, &MemSpan::host(bytes)).unwrap();
    buf
}

fn contents(buf: &Buf) -> Vec<u8> {
    let mut out = vec![0u8; buf.len()];
    buf.read_at(0, &mut MemSpanMut::host(&mut out)).unwrap();
    out
}

fn soon() -> Deadline {
    Deadline::after(Duration::from_secs(10))
}

/// Source and target buffers of `len` bytes, the target imported on a fresh endpoint.
struct Setup {
    a: Arc<Comm>,
    b: Arc<Comm>,
    ep: <Comm as Communicator>::Endpoint,
    key: <Comm as Communicator>::RemoteKey,
    src: Buf,
    dst: Buf,
    before: Vec<u8>,
}

async fn setup(transport: &str, spec: &str, len: usize) -> Setup {
    let (a, b) = pair(transport, spec);
    let ep = a.connect(&b.address(), soon()).await.unwrap();
    let src = buffer(&a, &hmc_core::testing::pattern(1, len));
    let before = hmc_core::testing::pattern(2, len);
    let dst = buffer(&b, &before);
    let key = a.import(&ep, &dst.export().unwrap()).unwrap();
    Setup {
        a,
        b,
        ep,
        key,
        src,
        dst,
        before,
    }
}

impl Setup {
    async fn write(&self, len: usize, deadline: Deadline) -> hmc_core::Result<()> {
        let d = [TransferDesc::new(
            self.src.registration(),
            0,
            &self.key,
            0,
            len,
        )];
        self.a.transfer(&self.ep, Op::Write, &d, deadline).await
    }

    /// The target still holds what it held; a WRITE now lands whole.
    async fn untouched_then_the_retry_lands(&self, len: usize) {
        assert_eq!(contents(&self.dst), self.before, "no byte moved");
        self.write(len, soon()).await.unwrap();
        assert_eq!(contents(&self.dst), contents(&self.src));
    }
}

#[rstest::rstest]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_write_lands_exactly_its_prefix_and_fails(#[values("tcp", "shm")] transport: &str) {
    let s = setup(transport, "xfer.cut=0.5", 8192).await;
    // Two descriptors, 3000 + 5192 bytes: the cut at 4096 splits the second.
    let d = [
        TransferDesc::new(s.src.registration(), 0, &s.key, 0, 3000),
        TransferDesc::new(s.src.registration(), 3000, &s.key, 3000, 5192),
    ];
    let e =
        s.a.transfer(&s.ep, Op::Write, &d, soon())
            .await
            .unwrap_err();
    assert!(matches!(e, Error::Peer { .. }), "{e:?}");
    assert!(e.to_string().contains("after 4096 of 8192 bytes"), "{e}");
    let after = contents(&s.dst);
    let src = contents(&s.src);
    assert_eq!(&after[..4096], &src[..4096], "the prefix landed");
    assert_eq!(&after[4096..], &s.before[4096..], "nothing past it did");
}

/// A batch the transport would refuse gets the transport's error, not the injected one,
/// and the cut moves none of it.
#[rstest::rstest]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_batch_the_transport_would_refuse_moves_nothing(
    #[values("tcp", "shm")] transport: &str,
) {
    let s = setup(transport, "xfer.cut=0.5", 8192).await;
    let d = [
        TransferDesc::new(s.src.registration(), 0, &s.key, 0, 4096),
        TransferDesc::new(s.src.registration(), 4096, &s.key, 8000, 4096),
    ];
    let e =
        s.a.transfer(&s.ep, Op::Write, &d, soon())
            .await
            .unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { .. }), "{e:?}");
    assert_eq!(contents(&s.dst), s.before);
}

#[rstest::rstest]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_transfer_ends_at_its_deadline_having_moved_nothing(
    #[values("tcp", "shm")] transport: &str,
) {
    let s = setup(transport, "xfer.stall=10s@first:1", 4096).await;
    let start = Instant::now();
    let e = s
        .write(4096, Deadline::after(Duration::from_millis(300)))
        .await
        .unwrap_err();
    let took = start.elapsed();
    assert!(e.is_deadline(), "{e:?}");
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "{took:?}"
    );
    // The stall was for the first transfer only.
    s.untouched_then_the_retry_lands(4096).await;
}

#[rstest::rstest]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_transfer_moves_nothing_and_the_next_succeeds(
    #[values("tcp", "shm")] transport: &str,
) {
    let s = setup(transport, "xfer.fail=first:1", 4096).await;
    let e = s.write(4096, soon()).await.unwrap_err();
    assert!(e.is_retryable() && matches!(e, Error::Peer { .. }), "{e:?}");
    assert!(e.to_string().contains("xfer.fail"), "{e}");
    s.untouched_then_the_retry_lands(4096).await;
}

#[rstest::rstest]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_after_n_fails_the_next_operation_and_every_later_one(
    #[values("tcp", "shm")] transport: &str,
) {
    let s = setup(transport, "disconnect.after=3", 512).await;
    for i in 0..3 {
        s.write(512, soon())
            .await
            .unwrap_or_else(|e| panic!("op {i}: {e}"));
    }
    for _ in 0..2 {
        let e = s.write(512, soon()).await.unwrap_err();
        assert!(matches!(e, Error::Peer { .. }), "{e:?}");
        assert!(e.to_string().contains("disconnect.after"), "{e}");
    }
    let e = s.a.notify(&s.ep, 1, b"x", soon()).await.unwrap_err();
    assert!(matches!(e, Error::Peer { .. }), "{e:?}");
    // A new connection is a new endpoint, with its own count.
    let ep = s.a.connect(&s.b.address(), soon()).await.unwrap();
    let key = s.a.import(&ep, &s.dst.export().unwrap()).unwrap();
    let d = [TransferDesc::new(s.src.registration(), 0, &key, 0, 512)];
    s.a.transfer(&ep, Op::Write, &d, soon()).await.unwrap();
}

#[rstest::rstest]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_peer_needs_a_new_connection_and_new_keys(
    #[values("tcp", "shm")] transport: &str,
) {
    let s = setup(transport, "restart.after=2", 256).await;
    // A second connection to the same peer, connected before the restart.
    let other = s.a.connect(&s.b.address(), soon()).await.unwrap();
    s.write(256, soon()).await.unwrap();
    s.write(256, soon()).await.unwrap();
    let e = s.write(256, soon()).await.unwrap_err();
    assert!(e.to_string().contains("restarted"), "{e}");
    // The restart ended it too.
    let e = s.a.notify(&other, 1, b"x", soon()).await.unwrap_err();
    assert!(e.to_string().contains("restarted"), "{e}");
    let ep = s.a.connect(&s.b.address(), soon()).await.unwrap();
    // The key imported before the restart is stale even on the new endpoint.
    let d = [TransferDesc::new(s.src.registration(), 0, &s.key, 0, 256)];
    let e = s.a.transfer(&ep, Op::Write, &d, soon()).await.unwrap_err();
    assert!(matches!(e, Error::InvalidKey(_)), "{e:?}");
    let key = s.a.import(&ep, &s.dst.export().unwrap()).unwrap();
    let d = [TransferDesc::new(s.src.registration(), 0, &key, 0, 256)];
    s.a.transfer(&ep, Op::Write, &d, soon()).await.unwrap();
}

#[rstest::rstest]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connects_are_refused_or_delayed_as_the_plan_says(#[values("tcp", "shm")] transport: &str) {
    let spec = "seed=11;connect.refuse=0.5";
    let (a, b) = pair(transport, spec);
    // A twin plan of the same spec predicts every decision.
    let twin = FaultPlan::new(spec.parse().unwrap());
    let mut seen = (0, 0);
    for i in 0..12 {
        let refused = twin.connect().refuse;
        match a.connect(&b.address(), soon()).await {
            Err(e) if refused => {
                assert!(e.is_connection_refused(), "connect {i}: {e:?}");
                seen.0 += 1;
            }
            Ok(_) if !refused => seen.1 += 1,
            other => panic!(
                "connect {i}: the plan said refused={refused}, got {:?}",
                other.err()
            ),
        }
    }
    assert!(
        seen.0 > 0 && seen.1 > 0,
        "both outcomes under seed 11: {seen:?}"
    );

    let (a, b) = pair(
        transport,
        "connect.refuse=first:1;connect.delay=200ms@first:2",
    );
    let start = Instant::now();
    let e = a.connect(&b.address(), soon()).await.unwrap_err();
    assert!(e.is_connection_refused(), "{e:?}");
    assert!(
        start.elapsed() >= Duration::from_millis(200),
        "delayed, then refused"
    );
    // A delay past the deadline ends the connect at the deadline.
    let e = a
        .connect(&b.address(), Deadline::after(Duration::from_millis(50)))
        .await
        .unwrap_err();
    assert!(e.is_deadline(), "{e:?}");
    let start = Instant::now();
    a.connect(&b.address(), soon()).await.unwrap();
    assert!(start.elapsed() < Duration::from_millis(200));
}

#[rstest::rstest]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_are_dropped_duplicated_or_delayed_on_the_side_asked(
    #[values("tcp", "shm")] transport: &str,
) {
    // Sender side: the first is dropped, the second doubled.
    let (a, b) = pair(transport, "notify.drop=first:1;notify.dup=first:2");
    let ep = a.connect(&b.address(), soon()).await.unwrap();
    for tag in 1..=3 {
        a.notify(&ep, tag, &[tag as u8], soon()).await.unwrap();
    }
    let mut tags = Vec::new();
    for _ in 0..3 {
        tags.push(b.recv_notification(soon()).await.unwrap().tag);
    }
    assert_eq!(tags, [2, 2, 3]);
    let none = b
        .recv_notification(Deadline::after(Duration::from_millis(100)))
        .await;
    assert!(none.unwrap_err().is_deadline());

    // Receiver side: the first is held 300 ms, and still comes first.
    let plan = FaultPlan::new(
        "notify.at=receiver;notify.delay=300ms@first:1"
            .parse()
            .unwrap(),
    );
    let b = Arc::new(Faulty::new(open(transport), plan));
    let ep = a.connect(&b.address(), soon()).await.unwrap();
    // `a` still drops nothing more: its drop and dup were for the first two.
    a.notify(&ep, 7, b"late", soon()).await.unwrap();
    a.notify(&ep, 8, b"next", soon()).await.unwrap();
    let start = Instant::now();
    let e = b
        .recv_notification(Deadline::after(Duration::from_millis(50)))
        .await
        .unwrap_err();
    assert!(e.is_deadline(), "held, not lost: {e:?}");
    let first = b.recv_notification(soon()).await.unwrap();
    assert_eq!(first.tag, 7);
    assert!(
        start.elapsed() >= Duration::from_millis(250),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(b.recv_notification(soon()).await.unwrap().tag, 8);
}

#[rstest::rstest]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_are_slowed(#[values("tcp", "shm")] transport: &str) {
    let (a, _b) = pair(transport, "register.slow=150ms@first:1");
    let start = Instant::now();
    let _slow = buffer(&a, &[0u8; 64]);
    assert!(start.elapsed() >= Duration::from_millis(150));
    let start = Instant::now();
    let _fast = buffer(&a, &[0u8; 64]);
    assert!(start.elapsed() < Duration::from_millis(150));
}
