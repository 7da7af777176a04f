//! The ordering of a notification attached to a transfer, on every transport the engine
//! opens, with both engines in this process (the RDMA stand-in's NIC and the example C
//! plugin's memory are per process): the target finds the WRITE's bytes in place when the
//! notification arrives, and a failed WRITE gives the target a failure notice and never a
//! success. (`prepared.rs` checks the same from another process over tcp, shm, auto and
//! ucx.)

#[path = "../../hmc-plugin/tests/common/mod.rs"]
mod plugins;

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{engine_from, engine_on, engine_over, register_rw};
use hmc_core::AnyCommunicator;
use hmc_engine::{
    BlockDesc, Engine, EngineConfig, EngineError, Notify, PreparedList, TransferOp, TransferStatus,
};
use rstest::rstest;

const T: Duration = Duration::from_secs(20);
const BLOCK: usize = 8192;
const BLOCKS: usize = 32;

async fn engine(name: &str) -> Engine<AnyCommunicator> {
    match name {
        "rdma-standin" => {
            engine_over(
                Arc::new(common::standin::rdma_standin()),
                EngineConfig::default(),
            )
            .await
        }
        "plugin" => {
            let lib = plugins::build_c_plugin("loopmem", &[]);
            let lib = lib.display().to_string();
            engine_from(&[("transport", "loopmem"), ("plugin_path", lib.as_str())]).await
        }
        t => engine_on(t, &[]).await,
    }
}

fn blocks(m: &[u8]) -> Vec<BlockDesc> {
    vec![BlockDesc::strided(
        m.as_ptr() as u64,
        BLOCK,
        BLOCK as u64,
        BLOCKS as u64,
    )]
}

/// `src` registered at `init` and `dst` at `target`, the target added from its metadata
/// blob, and both as prepared lists of blocks: (the target's name, `src`'s list, `dst`'s).
async fn prepared_pair(
    init: &Engine<AnyCommunicator>,
    target: &Engine<AnyCommunicator>,
    src: &[u8],
    dst: &[u8],
) -> (
    String,
    PreparedList<AnyCommunicator>,
    PreparedList<AnyCommunicator>,
) {
    register_rw(init, src);
    register_rw(target, dst);
    let peer = init
        .add_remote(&target.local_metadata().unwrap(), T)
        .await
        .unwrap();
    let local = init.prepare_local(&blocks(src)).unwrap();
    let remote = init.prepare_remote(&peer, &blocks(dst), T).await.unwrap();
    (peer, local, remote)
}

/// The next notification of `e` named `name`, waiting up to `T`; `on_arrival` runs on it
/// at once (before anything else of the test happens).
async fn next_notify<R>(
    e: &Engine<AnyCommunicator>,
    name: &str,
    on_arrival: impl Fn(&Notify) -> R,
) -> (Notify, R) {
    let start = Instant::now();
    loop {
        if let Some(n) = e.get_notifies().into_iter().find(|n| n.name == name) {
            let r = on_arrival(&n);
            return (n, r);
        }
        assert!(start.elapsed() < T, "no notification `{name}`");
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
}

#[rstest]
#[case::tcp("tcp")]
#[case::shm("shm")]
#[case::auto("auto")]
#[case::ucx("ucx")]
#[case::rdma_standin("rdma-standin")]
#[case::plugin("plugin")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_follows_its_bytes_and_a_failure_sends_a_notice(#[case] name: &str) {
    let (init, target) = (engine(name).await, engine(name).await);
    let src: Vec<u8> = (0..BLOCK * BLOCKS).map(|i| (i * 13 % 251) as u8).collect();
    let dst = vec![0u8; BLOCK * BLOCKS];
    let other = vec![0u8; BLOCK * BLOCKS];
    let other_handle = register_rw(&target, &other);
    let (peer, local, remote) = prepared_pair(&init, &target, &src, &dst).await;
    let remote_other = init
        .prepare_remote(&peer, &blocks(&other), T)
        .await
        .unwrap();

    // Scattered blocks (no two adjacent on both sides): one run each.
    let ours: Vec<u64> = (0..BLOCKS as u64).step_by(2).collect();
    let theirs: Vec<u64> = ours.iter().map(|i| (i * 5 + 3) % BLOCKS as u64).collect();
    let x = init
        .make_transfer(
            TransferOp::Write,
            &local,
            &ours,
            &remote,
            &theirs,
            Some(("written".into(), b"w".to_vec())),
        )
        .unwrap();
    x.post().unwrap();
    let in_place = |_: &Notify| {
        ours.iter().zip(&theirs).all(|(o, t)| {
            let (o, t) = (*o as usize * BLOCK, *t as usize * BLOCK);
            dst[t..t + BLOCK] == src[o..o + BLOCK]
        })
    };
    let (n, ok) = next_notify(&target, "written", in_place).await;
    assert!(
        ok,
        "{name}: the bytes were not in place when the notification arrived"
    );
    assert_eq!((n.msg.as_slice(), &n.failed), (&b"w"[..], &None));
    assert!(matches!(
        tokio::time::timeout(T, x.wait()).await.unwrap().unwrap(),
        TransferStatus::Completed
    ));

    // The region under the list goes: the WRITE fails and the target gets a notice.
    target.deregister_mem(other_handle).await.unwrap();
    let y = init
        .make_transfer(
            TransferOp::Write,
            &local,
            &ours,
            &remote_other,
            &theirs,
            Some(("doomed".into(), b"d".to_vec())),
        )
        .unwrap();
    y.post().unwrap();
    match tokio::time::timeout(T, y.wait()).await.unwrap().unwrap() {
        TransferStatus::Failed(e) => assert!(
            matches!(*e, EngineError::ListInvalid(_) | EngineError::Transport(_)),
            "{name}: {e}"
        ),
        other => panic!("{name}: {other:?}"),
    }
    let (n, _) = next_notify(&target, "doomed", |_| ()).await;
    assert!(
        n.failed.is_some(),
        "{name}: a failed WRITE's notification is a notice"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        target.get_notifies().iter().all(|n| n.name != "doomed"),
        "{name}: one notice, and no success after it"
    );
    init.finalize().await;
    target.finalize().await;
}

/// Every post of one prepared transfer delivers its notification exactly once, beside
/// standalone notifications: each post is a new send (its own id), so none is taken for a
/// duplicate of an earlier one and none arrives twice.
#[rstest]
#[case::tcp("tcp")]
#[case::shm("shm")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_post_delivers_its_notification_once(#[case] name: &str) {
    let (init, target) = (engine(name).await, engine(name).await);
    let (src, dst) = (vec![3u8; BLOCK * BLOCKS], vec![0u8; BLOCK * BLOCKS]);
    let (peer, x) = whole_write(&init, &target, &src, &dst, "posted").await;
    for round in 0..20 {
        x.post().unwrap();
        assert!(
            matches!(
                tokio::time::timeout(T, x.wait()).await.unwrap().unwrap(),
                TransferStatus::Completed
            ),
            "{name}: round {round}"
        );
        init.send_notify(&peer, "alone", b"a", T).await.unwrap();
        let got: Vec<String> = target.get_notifies().into_iter().map(|n| n.name).collect();
        assert_eq!(got, ["posted", "alone"], "{name}: round {round}");
    }
    x.release().await;
    init.finalize().await;
    target.finalize().await;
}

/// A WRITE of every block of `src` at `init` to the same block of `dst` at `target`,
/// notified as `notify`: (the target's name, the transfer).
async fn whole_write(
    init: &Engine<AnyCommunicator>,
    target: &Engine<AnyCommunicator>,
    src: &[u8],
    dst: &[u8],
    notify: &str,
) -> (String, hmc_engine::PreparedTransfer<AnyCommunicator>) {
    let (peer, local, remote) = prepared_pair(init, target, src, dst).await;
    let idx: Vec<u64> = (0..BLOCKS as u64).collect();
    let x = init
        .make_transfer(
            TransferOp::Write,
            &local,
            &idx,
            &remote,
            &idx,
            Some((notify.into(), b"1".to_vec())),
        )
        .unwrap();
    (peer, x)
}

/// What one post of a transfer with a notification ended as, and how long it took.
async fn post_once(x: &hmc_engine::PreparedTransfer<AnyCommunicator>) -> (bool, Duration) {
    let start = Instant::now();
    x.post().unwrap();
    let st = tokio::time::timeout(T, x.wait()).await.unwrap().unwrap();
    (matches!(st, TransferStatus::Completed), start.elapsed())
}

/// Notifications lost, late or doubled on the way (the engine's `faults` option, at the
/// sender or at the receiver), each fault on the first post only: a post whose
/// notification was lost or came too late ends in error within its no-progress timeout
/// plus a slack, and the target's program sees exactly one notification for it, the
/// failure notice, even once the late copy has landed; a doubled one is seen once; the
/// next post completes and is seen once.
#[rstest]
#[case::dropped_at_the_sender("tcp", "notify.drop=first:1", "", false)]
#[case::late_past_the_deadline("tcp", "notify.delay=1500ms@first:1", "", false)]
#[case::late_within_the_deadline("tcp", "notify.delay=100ms@first:1", "", true)]
#[case::doubled_at_the_sender("tcp", "notify.dup=first:1", "", true)]
#[case::dropped_at_the_receiver("tcp", "", "notify.at=receiver;notify.drop=first:1", false)]
#[case::doubled_at_the_receiver("tcp", "", "notify.at=receiver;notify.dup=first:1", true)]
#[case::shm_dropped("shm", "notify.drop=first:1", "", false)]
#[case::shm_doubled("shm", "notify.dup=first:1", "", true)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_faulty_notification_is_seen_once_or_the_post_fails(
    #[case] name: &str,
    #[case] initiator_faults: &str,
    #[case] target_faults: &str,
    #[case] first_completes: bool,
) {
    fn options(faults: &str) -> Vec<(&str, &str)> {
        let mut o = vec![("no_progress_timeout_ms", "500")];
        if !faults.is_empty() {
            o.push(("faults", faults));
        }
        o
    }
    let (fi, ft) = (initiator_faults, target_faults);
    let init = engine_on(name, &options(fi)).await;
    let target = engine_on(name, &options(ft)).await;
    let (src, dst) = (vec![5u8; BLOCK * BLOCKS], vec![0u8; BLOCK * BLOCKS]);
    let (_, x) = whole_write(&init, &target, &src, &dst, "kv").await;
    let (ok, took) = post_once(&x).await;
    assert_eq!(ok, first_completes, "{name} {fi} {ft}: first post");
    assert!(took < Duration::from_millis(500 + 1500), "{name}: {took:?}");
    // Long enough for a late copy (1.5 s after the send) and a failure notice to land.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let seen = target.get_notifies();
    assert_eq!(seen.len(), 1, "{name} {fi} {ft}: {seen:?}");
    assert_eq!(seen[0].failed.is_none(), first_completes, "{seen:?}");
    let (ok, _) = post_once(&x).await;
    assert!(ok, "{name} {fi} {ft}: the post after the fault");
    let seen = target.get_notifies();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen[0].failed.is_none());
    x.release().await;
    init.finalize().await;
    target.finalize().await;
}
