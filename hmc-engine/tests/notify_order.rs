//! The ordering of a notification attached to a transfer, on every transport the engine
//! opens, with both engines in this process (the RDMA stand-in's NIC and the example C
//! plugin's memory are per process): the target finds the WRITE's bytes in place when the
//! notification arrives, and a failed WRITE gives the target a failure notice and never a
//! success. (`prepared.rs` checks the same from another process over tcp, shm, auto and
//! ucx.)

#[path = "../../hmc-plugin/tests/common/mod.rs"]
mod plugins;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmc_core::AnyCommunicator;
use hmc_engine::{
    Access, BlockDesc, Engine, EngineConfig, EngineError, MemDesc, MemType, Notify, PreparedList,
    TransferOp, TransferStatus,
};
use rstest::rstest;

const T: Duration = Duration::from_secs(20);
const BLOCK: usize = 8192;
const BLOCKS: usize = 32;

async fn engine(name: &str) -> Engine<AnyCommunicator> {
    match name {
        "rdma-standin" => {
            // The user-space libibverbs stand-in (not a NIC).
            let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../target/tmp/ibverbs-standin");
            let lib = hmc_testshim::build_ibverbs_standin(&dir).expect("build the stand-in");
            let c = hmc_transport_rdma::RdmaCommunicator::new(hmc_transport_rdma::RdmaConfig {
                library: Some(lib),
                ..Default::default()
            })
            .unwrap();
            Engine::initialize(
                Arc::new(AnyCommunicator::new(c)),
                "127.0.0.1",
                EngineConfig::default(),
            )
            .await
            .unwrap()
        }
        "plugin" => {
            let lib = plugins::build_c_plugin("loopmem", &[]);
            let o: HashMap<String, String> = [
                ("transport".to_string(), "loopmem".to_string()),
                ("plugin_path".to_string(), lib.display().to_string()),
            ]
            .into();
            Engine::initialize_with("127.0.0.1", EngineConfig::from_options(&o).unwrap())
                .await
                .unwrap()
        }
        t => {
            let o: HashMap<String, String> = [("transport".to_string(), t.to_string())].into();
            Engine::initialize_with("127.0.0.1", EngineConfig::from_options(&o).unwrap())
                .await
                .unwrap()
        }
    }
}

fn register(e: &Engine<AnyCommunicator>, m: &[u8]) -> hmc_engine::MemHandle {
    // SAFETY: every test keeps its buffers until its engines are finalized.
    unsafe {
        e.register_mem(
            MemDesc {
                addr: m.as_ptr() as u64,
                len: m.len(),
            },
            MemType::Host,
            Access::READ_WRITE,
        )
    }
    .unwrap()
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
    register(init, src);
    register(target, dst);
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
    let other_handle = register(&target, &other);
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
    let src = vec![3u8; BLOCK * BLOCKS];
    let dst = vec![0u8; BLOCK * BLOCKS];
    let (peer, local, remote) = prepared_pair(&init, &target, &src, &dst).await;
    let idx: Vec<u64> = (0..BLOCKS as u64).collect();
    let x = init
        .make_transfer(
            TransferOp::Write,
            &local,
            &idx,
            &remote,
            &idx,
            Some(("posted".into(), b"p".to_vec())),
        )
        .unwrap();
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
