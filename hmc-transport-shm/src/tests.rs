//! Unit tests of the side channel: grants refused on the wire, revocation waiting for a hung
//! peer (one that took a lease and never releases it), and cached leases invalidated by
//! deregistration and rekey.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmc_backend_cpu::HostMemory;
use hmc_core::{
    Access, Communicator, ConnBuffer, Deadline, Error, LocalRegistration, MemSpan, Op, PeerAddr,
    RegisteredBuffer, TransferDesc,
};
use rstest::rstest;

use crate::wire::{self, Msg, Refusal, TOKEN_LEN};
use crate::{ShmCommunicator, ShmConfig};

fn bind(revoke: Duration) -> Arc<ShmCommunicator> {
    Arc::new(
        ShmCommunicator::bind(ShmConfig {
            revoke_timeout: revoke,
            ..ShmConfig::default()
        })
        .unwrap(),
    )
}

/// A raw side-channel client: says Hello, reads Welcome.
fn raw_client(c: &ShmCommunicator) -> UnixStream {
    let PeerAddr::Unix(path) = c.address() else {
        panic!("unix address expected")
    };
    let mut s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    wire::write_msg(
        &mut s,
        &Msg::Hello {
            version: wire::VERSION,
            addr: "unix:///raw".into(),
        },
    )
    .unwrap();
    let body = wire::read_frame(&mut s, wire::MAX_FRAME).unwrap().unwrap();
    assert!(matches!(Msg::decode(&body).unwrap(), Msg::Welcome { .. }));
    s
}

fn ask(s: &mut UnixStream, id: u64, token: [u8; TOKEN_LEN], op: Op, offset: u64, len: u64) -> Msg {
    wire::write_msg(
        s,
        &Msg::Grant {
            req: 7,
            id,
            token,
            op,
            offset,
            len,
        },
    )
    .unwrap();
    Msg::decode(&wire::read_frame(s, wire::MAX_FRAME).unwrap().unwrap()).unwrap()
}

fn key_of(buf: &RegisteredBuffer<HostMemory, ShmCommunicator>) -> (u64, [u8; TOKEN_LEN]) {
    let k = buf.export().unwrap().key;
    (
        u64::from_be_bytes(k[..8].try_into().unwrap()),
        k[8..].try_into().unwrap(),
    )
}

#[rstest]
#[case::forged_token(1, 0, Op::Read, 0, 16, Some(Refusal::InvalidKey))]
#[case::unknown_id(0, 99, Op::Read, 0, 16, Some(Refusal::InvalidKey))]
#[case::past_the_end(0, 0, Op::Read, 4000, 200, Some(Refusal::OutOfBounds))]
#[case::write_to_read_only(0, 0, Op::Write, 0, 16, Some(Refusal::AccessDenied))]
#[case::good(0, 0, Op::Read, 4000, 96, None)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_are_checked_at_the_target(
    #[case] token_flip: u8,
    #[case] id_shift: u64,
    #[case] op: Op,
    #[case] offset: u64,
    #[case] len: u64,
    #[case] want: Option<Refusal>,
) {
    let t = bind(Duration::from_secs(1));
    let buf =
        RegisteredBuffer::new(Arc::new(HostMemory::new()), t.clone(), 4096, Access::READ).unwrap();
    let (id, mut token) = key_of(&buf);
    token[3] ^= token_flip;
    let mut s = raw_client(&t);
    match (ask(&mut s, id + id_shift, token, op, offset, len), want) {
        (Msg::Refused { why, .. }, Some(w)) => assert_eq!(why, w),
        (Msg::Granted { len: l, addr, .. }, None) => {
            assert_eq!((l, addr), (4096, buf.registration().entry_addr()));
        }
        (m, w) => panic!("{m:?} when {w:?} was expected"),
    }
    assert_eq!(t.outstanding_leases(), usize::from(want.is_none()));
    drop(s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocation_waits_for_a_hung_peer_then_gives_up() {
    let revoke = Duration::from_millis(400);
    let t = bind(revoke);
    let buf =
        RegisteredBuffer::new(Arc::new(HostMemory::new()), t.clone(), 4096, Access::READ).unwrap();
    let (id, token) = key_of(&buf);
    let mut hung = raw_client(&t);
    assert!(matches!(
        ask(&mut hung, id, token, Op::Read, 0, 8),
        Msg::Granted { .. }
    ));
    assert_eq!(t.outstanding_leases(), 1);
    let start = Instant::now();
    drop(buf); // The peer never answers Revoke.
    let took = start.elapsed();
    assert!(took >= revoke, "gave up early, after {took:?}");
    assert!(took < revoke + Duration::from_secs(1), "overran: {took:?}");
    assert_eq!(t.outstanding_leases(), 0);
    // The Revoke reached the hung peer.
    let body = wire::read_frame(&mut hung, wire::MAX_FRAME)
        .unwrap()
        .unwrap();
    assert!(matches!(Msg::decode(&body).unwrap(), Msg::Revoke { leases } if leases.len() == 1));
    hung.flush().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_closing_releases_its_leases_at_once() {
    let t = bind(Duration::from_secs(5));
    let buf =
        RegisteredBuffer::new(Arc::new(HostMemory::new()), t.clone(), 4096, Access::READ).unwrap();
    let (id, token) = key_of(&buf);
    let mut s = raw_client(&t);
    assert!(matches!(
        ask(&mut s, id, token, Op::Read, 0, 8),
        Msg::Granted { .. }
    ));
    drop(s);
    let start = Instant::now();
    drop(buf);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
}

#[rstest]
#[case::deregistered(false)]
#[case::rekeyed(true)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_leases_die_with_their_key(#[case] rekey: bool) {
    let (a, b) = (bind(Duration::from_secs(5)), bind(Duration::from_secs(5)));
    let mem = Arc::new(HostMemory::new());
    let target = RegisteredBuffer::new(mem.clone(), b.clone(), 4096, Access::READ_WRITE).unwrap();
    target.write_at(0, &MemSpan::host(&[3u8; 4096])).unwrap();
    let local = RegisteredBuffer::new(mem, a.clone(), 4096, Access::READ_WRITE).unwrap();
    let ep = a.connect(&b.address(), Deadline::default()).await.unwrap();
    let key = a.import(&ep, &target.export().unwrap()).unwrap();
    let d = [TransferDesc {
        local: local.registration(),
        local_offset: 0,
        remote: &key,
        remote_offset: 0,
        len: 4096,
    }];
    for _ in 0..3 {
        a.transfer(&ep, Op::Read, &d, Deadline::default())
            .await
            .unwrap();
    }
    assert_eq!(ep.cached_leases(), 1, "one lease serves repeated transfers");
    assert_eq!(b.outstanding_leases(), 1);
    let start = Instant::now();
    let _keep = if rekey {
        assert!(b.rekey(target.registration()).unwrap());
        Some(target)
    } else {
        drop(target);
        None
    };
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "a live peer releases promptly"
    );
    assert_eq!(ep.cached_leases(), 0);
    assert_eq!(b.outstanding_leases(), 0);
    let err = a.transfer(&ep, Op::Read, &d, Deadline::default()).await;
    assert!(matches!(err, Err(Error::InvalidKey(_))), "{err:?}");
    if let Some(t) = &_keep {
        let fresh = a.import(&ep, &t.export().unwrap()).unwrap();
        let d = [TransferDesc {
            remote: &fresh,
            ..d[0]
        }];
        a.transfer(&ep, Op::Read, &d, Deadline::default())
            .await
            .unwrap();
    }
}

#[rstest]
#[case::just_over_the_limit(1)]
#[case::four_gib(u32::MAX as usize - (4 << 10) - wire::FRAME_SLACK)]
fn a_frame_over_the_targets_limit_closes_the_side_channel(#[case] over: usize) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _guard = rt.enter();
    let target = Arc::new(
        ShmCommunicator::bind(ShmConfig {
            max_notify_len: 4 << 10,
            ..ShmConfig::default()
        })
        .unwrap(),
    );
    let mut s = raw_client(&target);
    let len = (4 << 10) + wire::FRAME_SLACK + over;
    s.write_all(&(len as u32).to_le_bytes()).unwrap();
    // The target allocates nothing for it and hangs up.
    let mut rest = Vec::new();
    let n = std::io::Read::read_to_end(&mut s, &mut rest).unwrap();
    assert_eq!(n, 0, "closed without an answer");
}

/// Shared memory (`alloc_registered`) of `b` that `a` reads through its mapping, keyed by
/// the control page from the second use on: the first transfer is granted (it carries the
/// memfd), the rekey revokes that lease, and from then on no lease is asked for.
async fn mapped_and_rekeyed(
    revoke: Duration,
) -> (
    Arc<ShmCommunicator>,
    Arc<ShmCommunicator>,
    crate::ShmEndpoint,
    crate::ShmRegistration,
    RegisteredBuffer<HostMemory, ShmCommunicator>,
) {
    let (a, b) = (bind(revoke), bind(revoke));
    let target = b
        .alloc_registered(64 << 10, Access::READ_WRITE)
        .unwrap()
        .unwrap();
    let local = RegisteredBuffer::new(
        Arc::new(HostMemory::new()),
        a.clone(),
        64 << 10,
        Access::READ_WRITE,
    )
    .unwrap();
    let ep = a.connect(&b.address(), Deadline::default()).await.unwrap();
    let key = a.import(&ep, &b.export(&target).unwrap()).unwrap();
    read_all(&a, &ep, &local, &key).await.unwrap();
    assert_eq!((ep.mapped_regions(), b.outstanding_leases()), (1, 1));
    assert!(b.rekey(&target).unwrap());
    assert_eq!(b.outstanding_leases(), 0);
    (a, b, ep, target, local)
}

async fn read_all(
    a: &ShmCommunicator,
    ep: &crate::ShmEndpoint,
    local: &RegisteredBuffer<HostMemory, ShmCommunicator>,
    key: &crate::ShmRemoteKey,
) -> hmc_core::Result<()> {
    let d = [TransferDesc {
        local: local.registration(),
        local_offset: 0,
        remote: key,
        remote_offset: 0,
        len: 64 << 10,
    }];
    a.transfer(ep, Op::Read, &d, Deadline::default()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mapped_keys_are_checked_on_the_control_page_and_stale_ones_refused() {
    let (a, b, ep, target, local) = mapped_and_rekeyed(Duration::from_secs(5)).await;
    let stale = a.import(&ep, &b.export(&target).unwrap()).unwrap();
    for _ in 0..3 {
        read_all(&a, &ep, &local, &stale).await.unwrap();
    }
    assert_eq!(
        (b.outstanding_leases(), ep.cached_leases()),
        (0, 0),
        "copies through the mapping ask for no lease"
    );
    // The next use: the key of the previous one reaches nothing, the new one works.
    let start = Instant::now();
    assert!(b.rekey(&target).unwrap());
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "no peer to wait for"
    );
    let e = read_all(&a, &ep, &local, &stale).await.unwrap_err();
    assert!(matches!(e, Error::InvalidKey(_)), "{e}");
    let fresh = a.import(&ep, &b.export(&target).unwrap()).unwrap();
    read_all(&a, &ep, &local, &fresh).await.unwrap();
    drop(target);
    let e = read_all(&a, &ep, &local, &fresh).await.unwrap_err();
    assert!(matches!(e, Error::InvalidKey(_)), "deregistered: {e}");
}

/// A peer stopped in the middle of a chunk: its copy is announced on `target`'s control
/// page (the page the peer maps is this very memory's last page) under the current key and
/// never withdrawn. Drop it before `target`, which unmaps the page.
fn stopped_peer_copy(
    b: &ShmCommunicator,
    target: &crate::ShmRegistration,
) -> crate::control::Announced<'static> {
    let r = target.region();
    let map_len = r.len.div_ceil(4096) * 4096 + crate::control::CONTROL_LEN;
    // SAFETY: the allocation's own mapping, alive while `target` is; callers drop the
    // announcement before `target`.
    let page = unsafe { crate::control::Page::at(r.addr as *mut u8, map_len) }.unwrap();
    let export = b.export(target).unwrap();
    let word = crate::control::token_words(export.key[8..].try_into().unwrap());
    page.enter(word).expect("the key is current")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_stuck_mid_chunk_fails_the_rekey_so_the_memory_is_not_reused() {
    let revoke = Duration::from_millis(300);
    let (a, b, ep, target, local) = mapped_and_rekeyed(revoke).await;
    let key = a.import(&ep, &b.export(&target).unwrap()).unwrap();
    read_all(&a, &ep, &local, &key).await.unwrap();
    let stuck = stopped_peer_copy(&b, &target);
    let start = Instant::now();
    let e = b.rekey(&target).unwrap_err();
    let took = start.elapsed();
    assert!(matches!(e, Error::DeadlineExceeded { .. }), "{e}");
    assert!(e.to_string().contains("revoke_timeout"), "{e}");
    assert!(took >= revoke, "gave up early, after {took:?}");
    assert!(took < revoke + Duration::from_secs(1), "overran: {took:?}");
    // The old key is dead all the same: nothing new starts under it.
    let e = read_all(&a, &ep, &local, &key).await.unwrap_err();
    assert!(matches!(e, Error::InvalidKey(_)), "{e}");
    drop(stuck);
    assert!(
        b.rekey(&target).unwrap(),
        "the copy ended: rekeying works again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_of_mapped_memory_is_used_in_place_and_holds_off_the_owners_rekey() {
    let (a, b, ep, target, local) = mapped_and_rekeyed(Duration::from_secs(5)).await;
    let key = a.import(&ep, &b.export(&target).unwrap()).unwrap();
    let pattern: Vec<u8> = (0..64 << 10).map(|i| (i % 251) as u8).collect();
    local.write_at(0, &MemSpan::host(&pattern)).unwrap();
    let d = [TransferDesc {
        local: local.registration(),
        local_offset: 0,
        remote: &key,
        remote_offset: 0,
        len: 64 << 10,
    }];
    a.transfer(&ep, Op::Write, &d, Deadline::default())
        .await
        .unwrap();
    let view = a.view(&ep, &key, 100, 1000, Access::READ).unwrap();
    let view = view.expect("mapped shared memory has a view");
    assert_eq!(view.as_slice().unwrap(), &pattern[100..1100]);
    let w = a.view(&ep, &key, 0, 16, Access::WRITE).unwrap().unwrap();
    w.write(0, &[7; 16]).unwrap();
    drop(w);
    read_all(&a, &ep, &local, &key).await.unwrap();
    let mut back = vec![0u8; 16];
    local
        .read_at(0, &mut hmc_core::MemSpanMut::host(&mut back))
        .unwrap();
    assert_eq!(back, [7; 16], "written in place, seen by a transfer");
    let e = a.view(&ep, &key, 64 << 10, 1, Access::READ).unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
    // The owner's rekey waits for the view, as for a copy in progress.
    let rekey = std::thread::spawn({
        let (b, target) = (b.clone(), Arc::new(target));
        move || (b.rekey(&target), target)
    });
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !rekey.is_finished(),
        "the rekey returned while a view lived"
    );
    drop(view);
    let (done, _target) = rekey.join().unwrap();
    assert!(done.unwrap(), "the view ended: the rekey completes");
    let e = a.view(&ep, &key, 0, 16, Access::READ).unwrap_err();
    assert!(matches!(e, Error::InvalidKey(_)), "after the rekey: {e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_held_past_the_revoke_timeout_fails_the_rekey() {
    let revoke = Duration::from_millis(200);
    let (a, b, ep, target, _local) = mapped_and_rekeyed(revoke).await;
    let key = a.import(&ep, &b.export(&target).unwrap()).unwrap();
    let view = a.view(&ep, &key, 0, 4096, Access::READ).unwrap().unwrap();
    let e = b.rekey(&target).unwrap_err();
    assert!(matches!(e, Error::DeadlineExceeded { .. }), "{e}");
    assert!(
        a.view(&ep, &key, 0, 4096, Access::READ).is_err(),
        "the old key is dead all the same"
    );
    drop(view);
    assert!(b.rekey(&target).unwrap(), "rekeying works again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_memory_and_regions_not_yet_mapped_have_no_view() {
    let (a, b) = (bind(Duration::from_secs(2)), bind(Duration::from_secs(2)));
    let ep = a.connect(&b.address(), Deadline::default()).await.unwrap();
    let user =
        RegisteredBuffer::new(Arc::new(HostMemory::new()), b.clone(), 4096, Access::READ).unwrap();
    let key = a.import(&ep, &user.export().unwrap()).unwrap();
    assert!(a.view(&ep, &key, 0, 4096, Access::READ).unwrap().is_none());
    let shared = b.alloc_registered(4096, Access::READ).unwrap().unwrap();
    let key = a.import(&ep, &b.export(&shared).unwrap()).unwrap();
    assert!(
        a.view(&ep, &key, 0, 4096, Access::READ).unwrap().is_none(),
        "no transfer has mapped it yet"
    );
    let e = a.view(&ep, &key, 0, 4096, Access::WRITE).unwrap_err();
    assert!(matches!(e, Error::AccessDenied(_)), "{e}");
}

/// A peer stopped mid-chunk makes the owner's rekey wait up to `revoke_timeout`. `rekey`
/// is called in place on runtime workers (it rarely waits), so that wait must leave the
/// worker to the tasks queued on it: with one worker, another task still runs while the
/// rekey waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_rekey_waiting_for_a_stopped_peer_leaves_its_worker_to_other_tasks() {
    let revoke = Duration::from_millis(500);
    let (a, b, ep, target, local) = mapped_and_rekeyed(revoke).await;
    let key = a.import(&ep, &b.export(&target).unwrap()).unwrap();
    read_all(&a, &ep, &local, &key).await.unwrap();
    let stuck = stopped_peer_copy(&b, &target);
    let (poke, poked) = tokio::sync::oneshot::channel::<()>();
    let (ack, acked) = std::sync::mpsc::channel();
    tokio::spawn(async move {
        let _ = poked.await;
        let _ = ack.send(Instant::now());
    });
    let rekeying = tokio::spawn(async move {
        let r = b.rekey(&target);
        (r.is_err(), Instant::now(), target)
    });
    // This test's body runs on its own thread, not the runtime's one worker.
    std::thread::sleep(Duration::from_millis(100));
    poke.send(()).unwrap();
    let answered = acked.recv_timeout(Duration::from_secs(10)).unwrap();
    let (failed, ended, target) = rekeying.await.unwrap();
    // Withdrawn while the mapping it lies in is alive (`target` unmaps it when it drops).
    drop(stuck);
    drop(target);
    assert!(failed, "the stopped peer's copy never ended");
    assert!(
        answered < ended,
        "the other task ran only after the rekey gave up: the wait held the worker"
    );
}

/// The side channel serves at most `max_connections` at once (one more is closed unread),
/// and a message started but not finished within `frame_timeout` closes its connection,
/// freeing its place; an idle connection is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn side_channel_connections_and_stalled_messages_are_bounded() {
    use std::io::Read;
    let c = ShmCommunicator::bind(ShmConfig {
        max_connections: 2,
        frame_timeout: Duration::from_millis(300),
        ..ShmConfig::default()
    })
    .unwrap();
    let mut a = raw_client(&c);
    let _b = raw_client(&c);
    let PeerAddr::Unix(path) = c.address() else {
        panic!("unix address expected")
    };
    let mut third = UnixStream::connect(&path).unwrap();
    third
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut byte = [0u8; 1];
    assert_eq!(
        third.read(&mut byte).unwrap(),
        0,
        "over max_connections: closed unread"
    );
    // `a` starts a frame and stalls: closed after frame_timeout.
    let started = Instant::now();
    a.write_all(&[9, 0]).unwrap();
    assert_eq!(a.read(&mut byte).unwrap(), 0);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(4),
        "{took:?}"
    );
    // Its place is free again.
    std::thread::sleep(Duration::from_millis(50));
    let _c = raw_client(&c);
}
