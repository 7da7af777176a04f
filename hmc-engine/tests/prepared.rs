//! Prepared lists, posted transfers, notifications on completion and metadata blobs,
//! between this process and a `kv_peer` process, checked by checksums on both sides.

mod common;

use std::time::{Duration, Instant};

use common::kv_peer::{KvPeer, pattern};
use common::{T, checksum, engine_on, register_rw};
use hmc_core::{AnyCommunicator, Communicator};
use hmc_engine::TransferStatus;
use hmc_engine::{BlockDesc, Engine, EngineError, PreparedList, PreparedTransfer, TransferOp};
use rstest::rstest;

/// This side's copy of a peer's layout: `layers` zeroed regions, registered.
struct Cache {
    mem: Vec<Vec<u8>>,
    block: u64,
}

impl Cache {
    fn new(e: &Engine<AnyCommunicator>, layers: u64, blocks: u64, block: u64) -> Cache {
        let mem: Vec<Vec<u8>> = (0..layers)
            .map(|_| vec![0u8; (blocks * block) as usize])
            .collect();
        // The test keeps `mem` until the engine is finalized and dropped.
        for m in &mem {
            register_rw(e, m);
        }
        Cache { mem, block }
    }

    /// One entry per block, layer-major (entry `l * blocks + b`).
    fn entries(&self) -> Vec<BlockDesc> {
        self.mem
            .iter()
            .flat_map(|m| {
                (0..m.len() as u64 / self.block).map(move |b| {
                    BlockDesc::block(m.as_ptr() as u64 + b * self.block, self.block as usize)
                })
            })
            .collect()
    }

    fn block_sum(&self, entry: u64) -> u64 {
        let per = self.mem[0].len() as u64 / self.block;
        let (l, b) = ((entry / per) as usize, (entry % per) as usize);
        let at = b * self.block as usize;
        checksum(&self.mem[l][at..at + self.block as usize])
    }
}

/// The peer's blocks as entries, layer-major.
fn peer_entries(p: &KvPeer) -> Vec<BlockDesc> {
    p.addrs
        .iter()
        .flat_map(|&a| {
            (0..p.blocks).map(move |b| BlockDesc::block(a + b * p.block, p.block as usize))
        })
        .collect()
}

/// `n` distinct pseudo-random indices below `max`.
fn pick(n: usize, max: u64, seed: u64) -> Vec<u64> {
    let mut x = seed | 1;
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if seen.insert(x % max) {
            out.push(x % max);
        }
    }
    out
}

fn expected_block(seed: u64, blocks: u64, block: u64, entry: u64) -> u64 {
    let (l, b) = (entry / blocks, entry % blocks);
    let bytes: Vec<u8> = (0..block)
        .map(|o| pattern(seed, l, b * block + o))
        .collect();
    checksum(&bytes)
}

async fn ended(x: &PreparedTransfer<AnyCommunicator>) -> TransferStatus {
    tokio::time::timeout(Duration::from_secs(60), x.wait())
        .await
        .expect("every posted transfer ends")
        .expect("posted")
}

/// READs random blocks of the peer into random blocks here and WRITEs others back with a
/// notification; the peer checks the written blocks when the notification arrives (so the
/// bytes were visible first), and both sides' checksums agree. Posted twice (a transfer is
/// re-posted after it ended), with telemetry. The peer's regions are its heap's, or
/// (`alloc`) the engine's own (`Engine::alloc_mem`), which under `shm` and `auto` must be
/// shared memory (a memfd mapping) and elsewhere is not.
#[rstest]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_lists_move_random_blocks_both_ways(
    #[values("tcp", "shm", "auto", "ucx")] transport: &str,
    #[values(false, true)] alloc: bool,
) {
    let (layers, blocks, block) = (4, 64, 4096);
    let alloc_flag: &[&str] = if alloc { &["--alloc", "1"] } else { &[] };
    let mut peer = KvPeer::spawn(
        transport,
        layers,
        blocks,
        block,
        &[&["--seed", "3"], alloc_flag].concat(),
    );
    let shared = matches!(transport, "shm" | "auto") && alloc;
    assert_eq!(
        peer.cmd("memfd"),
        format!("MEMFD {}", if shared { layers } else { 0 }),
        "where the peer's regions live"
    );
    let e = engine_on(transport, &[]).await;
    let mut cache = Cache::new(&e, layers, blocks, block);
    let name = e.add_remote(&peer.blob, T).await.unwrap();
    assert_eq!(name, peer.name);
    assert!(e.check_remote(&name));
    let local = e.prepare_local(&cache.entries()).unwrap();
    let remote = e
        .prepare_remote(&name, &peer_entries(&peer), T)
        .await
        .unwrap();
    assert_eq!(
        (local.len(), remote.len()),
        (layers * blocks, layers * blocks)
    );
    // Block-by-block entries of one region fold into one segment per layer.
    assert_eq!((local.segments(), remote.segments()), (4, 4));

    let n = 64;
    let theirs = pick(n, layers * blocks, 11);
    let ours = pick(n, layers * blocks, 29);
    let read = e
        .make_transfer(TransferOp::Read, &local, &ours, &remote, &theirs, None)
        .unwrap();
    for _ in 0..2 {
        read.post().unwrap();
        assert!(matches!(ended(&read).await, TransferStatus::Completed));
    }
    for (o, t) in ours.iter().zip(&theirs) {
        assert_eq!(
            cache.block_sum(*o),
            expected_block(3, blocks, block, *t),
            "block {t}"
        );
    }
    let tm = read.telemetry().unwrap();
    assert!(tm.ok);
    assert_eq!((tm.bytes, tm.requested_descs), (n as u64 * block, n as u64));
    assert_eq!(
        tm.staged_at_peer_bytes, 0,
        "host memory moves on the direct path"
    );
    assert!(tm.descs >= 1 && tm.descs <= n as u64);
    assert!(tm.duration > Duration::ZERO && tm.duration < T);
    assert_eq!(tm.transport, e.communicator().transport());

    // WRITE other blocks, with a notification that lists what the peer must see.
    for m in cache.mem.iter_mut() {
        m.iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = (i * 7 + 1) as u8);
    }
    let src = pick(n, layers * blocks, 41);
    let dst = pick(n, layers * blocks, 53);
    let msg: Vec<String> = src
        .iter()
        .zip(&dst)
        .map(|(s, d)| format!("{}:{}:{}", d / blocks, d % blocks, cache.block_sum(*s)))
        .collect();
    let write = e
        .make_transfer(
            TransferOp::Write,
            &local,
            &src,
            &remote,
            &dst,
            Some(("kv-done".into(), msg.join(",").into_bytes())),
        )
        .unwrap();
    write.post().unwrap();
    // The peer waits for the notification and checks the blocks at once.
    let verified = peer.cmd("verify");
    assert!(matches!(ended(&write).await, TransferStatus::Completed));
    assert_eq!(verified, "VERIFIED kv-done ok false");
    let sums = peer.sums();
    for (s, d) in src.iter().zip(&dst) {
        assert_eq!(sums[*d as usize], cache.block_sum(*s));
    }
    e.finalize().await;
}

/// Strided entries describe a block table in one entry per layer, in constant memory;
/// pairs adjacent on both sides merge into one run, others do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strided_entries_and_merged_runs() {
    let (layers, blocks, block) = (2, 256, 1024);
    let peer = KvPeer::spawn("tcp", layers, blocks, block, &["--seed", "5"]);
    let e = engine_on("tcp", &[]).await;
    let cache = Cache::new(&e, layers, blocks, block);
    e.add_remote(&peer.blob, T).await.unwrap();
    let strided = |base: u64| BlockDesc::strided(base, block as usize, block, blocks);
    let local = e
        .prepare_local(
            &cache
                .mem
                .iter()
                .map(|m| strided(m.as_ptr() as u64))
                .collect::<Vec<_>>(),
        )
        .unwrap();
    let remote = e
        .prepare_remote(
            &peer.name,
            &peer.addrs.iter().map(|&a| strided(a)).collect::<Vec<_>>(),
            T,
        )
        .await
        .unwrap();
    assert_eq!((local.len(), local.segments()), (512, 2));
    assert!(
        remote.heap_bytes() < 256,
        "{} bytes for 512 blocks",
        remote.heap_bytes()
    );

    let seq: Vec<u64> = (10..42).collect();
    let merged = e
        .make_transfer(TransferOp::Read, &local, &seq, &remote, &seq, None)
        .unwrap();
    assert_eq!(
        merged.runs(),
        1,
        "32 blocks contiguous on both sides are one run"
    );
    let rev: Vec<u64> = seq.iter().rev().copied().collect();
    let scattered = e
        .make_transfer(TransferOp::Read, &local, &seq, &remote, &rev, None)
        .unwrap();
    assert_eq!(scattered.runs(), 32);
    // Across a region boundary (entry 255 and 256) nothing merges.
    let edge = [255u64, 256];
    let across = e
        .make_transfer(TransferOp::Read, &local, &edge, &remote, &edge, None)
        .unwrap();
    assert_eq!(across.runs(), 2);
    for x in [&merged, &scattered, &across] {
        x.post().unwrap();
        assert!(matches!(ended(x).await, TransferStatus::Completed));
    }
    for (o, t) in seq.iter().zip(&rev) {
        assert_eq!(cache.block_sum(*o), expected_block(5, blocks, block, *t));
    }
    for i in edge {
        assert_eq!(cache.block_sum(i), expected_block(5, blocks, block, i));
    }
    // Indices outside a list, unequal index arrays and entries of unequal lengths are
    // refused when the transfer is made.
    let e1 = e
        .make_transfer(TransferOp::Read, &local, &[512], &remote, &[0], None)
        .unwrap_err();
    assert!(
        e1.to_string().contains("outside the local list of 512"),
        "{e1}"
    );
    let e2 = e
        .make_transfer(TransferOp::Read, &local, &[1, 2], &remote, &[0], None)
        .unwrap_err();
    assert!(
        e2.to_string().contains("2 local indices and 1 remote"),
        "{e2}"
    );
    let half = e
        .prepare_local(&[BlockDesc::block(cache.mem[0].as_ptr() as u64, 512)])
        .unwrap();
    let e3 = e
        .make_transfer(TransferOp::Read, &half, &[0], &remote, &[0], None)
        .unwrap_err();
    assert!(e3.to_string().contains("of one length"), "{e3}");
    // An entry outside every region is refused at preparation.
    let e4 = e
        .prepare_remote(
            &peer.name,
            &[BlockDesc::block(peer.addrs[0] + blocks * block, 8)],
            T,
        )
        .await
        .err()
        .unwrap();
    assert!(
        matches!(
            e4,
            EngineError::NotRegistered { .. } | EngineError::Straddles { .. }
        ),
        "{e4}"
    );
    e.finalize().await;
}

/// The peer deregisters a layer under a prepared remote list: a transfer of it fails
/// with `ListInvalid` naming the region, and the peer gets a failure notice for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_is_invalid_after_the_peer_deregisters_under_it() {
    let (layers, blocks, block) = (2, 16, 4096);
    let mut peer = KvPeer::spawn("tcp", layers, blocks, block, &[]);
    let e = engine_on("tcp", &[]).await;
    let cache = Cache::new(&e, layers, blocks, block);
    e.add_remote(&peer.blob, T).await.unwrap();
    let local = e.prepare_local(&cache.entries()).unwrap();
    let remote = e
        .prepare_remote(&peer.name, &peer_entries(&peer), T)
        .await
        .unwrap();
    let idx: Vec<u64> = (16..20).collect();
    let x = e
        .make_transfer(
            TransferOp::Write,
            &local,
            &idx,
            &remote,
            &idx,
            Some(("layer1".into(), b"x".to_vec())),
        )
        .unwrap();
    assert_eq!(peer.cmd("dereg 1"), "OK");
    x.post().unwrap();
    match ended(&x).await {
        TransferStatus::Failed(err) => {
            assert!(matches!(*err, EngineError::ListInvalid(_)), "{err}");
            let addr = format!("{:#x}", peer.addrs[1]);
            assert!(err.to_string().contains(&addr), "{err}");
        }
        other => panic!("{other:?}"),
    }
    // The failure notice is sent in the background.
    let start = Instant::now();
    loop {
        let n = peer.cmd("notifs");
        if n != "NOTIFS 0 " && n != "NOTIFS 0" {
            assert_eq!(n, "NOTIFS 1 layer1:true");
            break;
        }
        assert!(start.elapsed() < T, "no failure notice");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    e.finalize().await;
}

/// A peer that restarted at the same address: a list prepared for the old one fails with
/// `PeerGone`, its old blob is refused as stale, and its new blob works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_peer_refuses_old_lists_and_blobs() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port().to_string()
    };
    let (layers, blocks, block) = (1, 8, 4096);
    let old = KvPeer::spawn("tcp", layers, blocks, block, &["--port", &port]);
    let e = engine_on("tcp", &[]).await;
    let cache = Cache::new(&e, layers, blocks, block);
    let name = e.add_remote(&old.blob, T).await.unwrap();
    let local = e.prepare_local(&cache.entries()).unwrap();
    let remote = e
        .prepare_remote(&name, &peer_entries(&old), T)
        .await
        .unwrap();
    let idx: Vec<u64> = (0..8).collect();
    let x = e
        .make_transfer(TransferOp::Read, &local, &idx, &remote, &idx, None)
        .unwrap();
    let stale = old.blob.clone();
    drop(old);
    let new = KvPeer::spawn("tcp", layers, blocks, block, &["--port", &port]);
    x.post().unwrap();
    match ended(&x).await {
        TransferStatus::Failed(err) => {
            assert!(matches!(*err, EngineError::PeerGone { .. }), "{err}")
        }
        other => panic!("{other:?}"),
    }
    let _ = e.remove_remote(&name).await;
    let err = e.add_remote(&stale, T).await.unwrap_err();
    assert!(err.to_string().contains("stale"), "{err}");
    assert!(!e.check_remote(&name));
    assert_eq!(e.add_remote(&new.blob, T).await.unwrap(), name);
    e.finalize().await;
}

/// A target stopped (SIGSTOP) under a WRITE: the initiator's post ends after the
/// no-progress timeout, and once the target resumes no byte of that WRITE lands there,
/// neither of a small one (wholly in the socket buffers) nor of a large one. A READ from
/// the stopped target ends the same way, and nothing lands here after.
#[rstest]
#[case::one_block(1, 4096)]
#[case::large(256, 65536)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_target_gets_no_late_bytes(#[case] blocks: u64, #[case] block: u64) {
    let mut peer = KvPeer::spawn("tcp", 1, blocks, block, &[]);
    let e = engine_on("tcp", &[("no_progress_timeout_ms", "1000")]).await;
    let mut cache = Cache::new(&e, 1, blocks, block);
    cache.mem[0].iter_mut().for_each(|b| *b = 0xEE);
    e.add_remote(&peer.blob, T).await.unwrap();
    let before = peer.sums();
    let local = e.prepare_local(&cache.entries()).unwrap();
    let remote = e
        .prepare_remote(&peer.name, &peer_entries(&peer), T)
        .await
        .unwrap();
    let idx: Vec<u64> = (0..blocks).collect();
    let write = e
        .make_transfer(TransferOp::Write, &local, &idx, &remote, &idx, None)
        .unwrap();
    let read = e
        .make_transfer(TransferOp::Read, &local, &idx, &remote, &idx, None)
        .unwrap();
    peer.stop();
    let start = Instant::now();
    write.post().unwrap();
    let st = ended(&write).await;
    assert!(matches!(st, TransferStatus::TimedOut), "{st:?}");
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "{took:?}"
    );
    read.post().unwrap();
    assert!(matches!(ended(&read).await, TransferStatus::TimedOut));
    cache.mem[0].iter_mut().for_each(|b| *b = 0x11);
    peer.signal(libc::SIGCONT);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        peer.sums(),
        before,
        "bytes of the abandoned WRITE landed at the target"
    );
    assert!(
        cache.mem[0].iter().all(|&b| b == 0x11),
        "bytes of the abandoned READ landed here"
    );
    // The connection is usable again: the same transfer posted once more completes.
    write.post().unwrap();
    assert!(matches!(ended(&write).await, TransferStatus::Completed));
    assert_eq!(peer.sums()[0], cache.block_sum(0));
    e.finalize().await;
}

/// `release` cancels a post in flight and waits for it: after it returns nothing lands in
/// local memory, and the transfer cannot be posted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_cancels_a_transfer_in_flight() {
    let (blocks, block) = (1024, 65536);
    let peer = KvPeer::spawn("tcp", 1, blocks, block, &[]);
    let e = engine_on("tcp", &[]).await;
    let mut cache = Cache::new(&e, 1, blocks, block);
    e.add_remote(&peer.blob, T).await.unwrap();
    let local = e.prepare_local(&cache.entries()).unwrap();
    let remote = e
        .prepare_remote(&peer.name, &peer_entries(&peer), T)
        .await
        .unwrap();
    let idx: Vec<u64> = (0..blocks).rev().collect();
    let x = e
        .make_transfer(TransferOp::Read, &local, &idx, &remote, &idx, None)
        .unwrap();
    x.post().unwrap();
    x.release().await;
    let st = x.status().unwrap();
    assert!(st.is_done(), "{st:?}");
    cache.mem[0].iter_mut().for_each(|b| *b = 0x5A);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(cache.mem[0].iter().all(|&b| b == 0x5A));
    let again = x.post().unwrap_err();
    assert!(again.to_string().contains("released"), "{again}");
    e.finalize().await;
}

/// A long-context request: 1.3M descriptors (vLLM at 128k tokens) over two prepared
/// lists, in one transfer, within the default limits; every block checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_of_1_3_million_descriptors() {
    let (blocks, block) = (1_300_000, 16);
    let peer = KvPeer::spawn("tcp", 1, blocks, block, &["--seed", "9"]);
    let e = engine_on("tcp", &[]).await;
    let cache = Cache::new(&e, 1, blocks, block);
    e.add_remote(&peer.blob, T).await.unwrap();
    let local: PreparedList<_> = e.prepare_local(&cache.entries()).unwrap();
    let remote = e
        .prepare_remote(
            &peer.name,
            &[BlockDesc::strided(peer.addrs[0], 16, 16, blocks)],
            T,
        )
        .await
        .unwrap();
    assert_eq!((local.segments(), remote.segments()), (1, 1));
    // A random permutation of the peer's blocks into ours, in order.
    let mut theirs: Vec<u64> = (0..blocks).collect();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for i in (1..theirs.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        theirs.swap(i, (x % (i as u64 + 1)) as usize);
    }
    let ours: Vec<u64> = (0..blocks).collect();
    let t = e
        .make_transfer(TransferOp::Read, &local, &ours, &remote, &theirs, None)
        .unwrap();
    t.post().unwrap();
    let st = ended(&t).await;
    assert!(matches!(st, TransferStatus::Completed), "{st:?}");
    assert_eq!(t.telemetry().unwrap().requested_descs, blocks);
    for (o, th) in ours.iter().zip(&theirs) {
        let at = (o * block) as usize;
        let want: Vec<u8> = (0..block).map(|i| pattern(9, 0, th * block + i)).collect();
        assert_eq!(
            &cache.mem[0][at..at + block as usize],
            &want[..],
            "block {o}"
        );
    }
    e.finalize().await;
}

/// Blobs: over the size limit, without the MAC a secret asks for, with another secret's
/// MAC: refused, each saying why; a partial blob adds regions to a peer added before and
/// is refused for one that was not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_blobs_are_bounded_authenticated_and_partial() {
    let a = engine_on("tcp", &[]).await;
    let b = engine_on("tcp", &[]).await;
    let first = vec![1u8; 4096];
    let later = vec![2u8; 4096];
    // The buffers outlive both engines (dropped at the end of the test).
    register_rw(&b, &first);
    let small = engine_on("tcp", &[("max_metadata_blob_len", "16")]).await;
    let err = small
        .add_remote(&b.local_metadata().unwrap(), T)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("max_metadata_blob_len"), "{err}");
    let secret = engine_on(
        "tcp",
        &[("auth_secret", "0123456789abcdef0123456789abcdef")],
    )
    .await;
    let err = secret
        .add_remote(&b.local_metadata().unwrap(), T)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("carries no MAC"), "{err}");
    let other = engine_on(
        "tcp",
        &[("auth_secret", "fedcba9876543210fedcba9876543210")],
    )
    .await;
    let err = secret
        .add_remote(&other.local_metadata().unwrap(), T)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("does not match"), "{err}");
    let err = a
        .add_remote(&secret.local_metadata().unwrap(), T)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("same secret"), "{err}");
    let err = a.add_remote(b"not a blob", T).await.unwrap_err();
    assert!(err.to_string().contains("not a metadata blob"), "{err}");
    // A blob that is not usable is its own kind (NIXL's "mismatch"), not a failed peer.
    assert!(matches!(err, EngineError::BadMetadata(_)), "{err:?}");
    let whole = other.local_metadata().unwrap();
    let err = other
        .add_remote(&whole[..whole.len() / 2], T)
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::BadMetadata(_)), "{err:?}");

    let h = register_rw(&b, &later);
    let partial = b.partial_metadata(&[h]).unwrap();
    // A partial blob adds a peer not added yet (it carries the addresses), and adds its
    // regions to one that is.
    let name = a.add_remote(&partial, T).await.unwrap();
    assert!(a.check_remote(&name));
    let err = a
        .add_remote(&b.local_metadata().unwrap(), T)
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::AlreadyConnected(_)), "{err}");
    assert_eq!(a.add_remote(&partial, T).await.unwrap(), name);
    let here = vec![0u8; 4096];
    register_rw(&a, &here);
    let l = a
        .prepare_local(&[BlockDesc::block(here.as_ptr() as u64, 4096)])
        .unwrap();
    let r = a
        .prepare_remote(&name, &[BlockDesc::block(later.as_ptr() as u64, 4096)], T)
        .await
        .unwrap();
    let x = a
        .make_transfer(TransferOp::Read, &l, &[0], &r, &[0], None)
        .unwrap();
    x.post().unwrap();
    assert!(matches!(ended(&x).await, TransferStatus::Completed));
    assert_eq!(here, later);
    for e in [a, b, small, secret, other] {
        e.finalize().await;
    }
}

/// A local list does not keep memory registered: deregistering under it returns at once,
/// and a transfer made of it then fails with `ListInvalid`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deregistering_under_a_local_list_does_not_wait_for_it() {
    let a = engine_on("tcp", &[]).await;
    let b = engine_on("tcp", &[]).await;
    let (src, dst) = (vec![1u8; 8192], vec![0u8; 8192]);
    // Both buffers outlive the engines (dropped at the end of the test).
    let (ha, _hb) = (register_rw(&a, &dst), register_rw(&b, &src));
    let name = a.add_remote(&b.local_metadata().unwrap(), T).await.unwrap();
    let l = a
        .prepare_local(&[BlockDesc::strided(dst.as_ptr() as u64, 4096, 4096, 2)])
        .unwrap();
    let r = a
        .prepare_remote(
            &name,
            &[BlockDesc::strided(src.as_ptr() as u64, 4096, 4096, 2)],
            T,
        )
        .await
        .unwrap();
    let x = a
        .make_transfer(TransferOp::Read, &l, &[0, 1], &r, &[1, 0], None)
        .unwrap();
    x.post().unwrap();
    assert!(matches!(ended(&x).await, TransferStatus::Completed));
    assert_eq!(dst, src);
    tokio::time::timeout(Duration::from_secs(5), a.deregister_mem(ha))
        .await
        .expect("deregistering does not wait for the list")
        .unwrap();
    x.post().unwrap();
    match ended(&x).await {
        TransferStatus::Failed(e) => assert!(matches!(*e, EngineError::ListInvalid(_)), "{e}"),
        other => panic!("{other:?}"),
    }
    a.finalize().await;
    b.finalize().await;
}
