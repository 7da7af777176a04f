//! The KV-cache API between a prompt and a decoder cluster over the TCP transport on
//! loopback: whole caches pulled and pushed, scattered blocks of a layer range pulled and
//! pushed as runs, local block copies, and layout errors that name both sides.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::engine_over;
use hmc_engine::kv::{BlocksCacheKey, Cache, CacheDesc, CacheKey, DataDist, DataType, Role};
use hmc_engine::{EngineConfig, EngineError, MemType};
use hmc_transport_tcp::TcpCommunicator;

const T: Duration = Duration::from_secs(10);
const PROMPT: u64 = 1;
const DECODER: u64 = 2;

async fn cluster(id: u64, role: Role) -> DataDist<TcpCommunicator> {
    let comm =
        TcpCommunicator::bind(&"tcp://127.0.0.1:0".parse().unwrap(), Default::default()).unwrap();
    let e = engine_over(Arc::new(comm), EngineConfig::default()).await;
    DataDist::new(e, id, role)
}

/// The key of request `req_id`'s cache in `cluster`: model 7, no prefix.
fn request_key(cluster: u64, req_id: u64) -> CacheKey {
    CacheKey {
        prompt_cluster_id: cluster,
        req_id,
        model_id: 7,
        prefix_id: 0,
    }
}

/// 2 layers (K and V each): 4 tensors of 8 blocks of 16 x 64 F16 (2 KiB per block).
fn desc(blocks: u64) -> CacheDesc {
    CacheDesc {
        placement: MemType::Host,
        num_tensors: 4,
        dtype: DataType::F16,
        shape: vec![blocks, 16, 64],
    }
}

const BLOCK: usize = 16 * 64 * 2;

fn tensor_len(c: &Cache) -> usize {
    c.desc().shape.iter().product::<u64>() as usize * 2
}

/// A copy of tensor `t`'s bytes.
fn tensor(c: &Cache, t: usize) -> Vec<u8> {
    // SAFETY: the cache's tensors are host memory owned by its DataDist until
    // deallocate_cache; the tests read them only while no transfer runs on them.
    unsafe { std::slice::from_raw_parts(c.tensor_addrs()[t] as *const u8, tensor_len(c)) }.to_vec()
}

fn fill(c: &Cache, seed: u8) {
    for t in 0..c.desc().num_tensors as usize {
        // SAFETY: as in `tensor`; no transfer runs on the cache while it is filled.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(c.tensor_addrs()[t] as *mut u8, tensor_len(c))
        };
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i as u8)
                .wrapping_mul(7)
                .wrapping_add(seed)
                .wrapping_add(t as u8 * 31);
        }
    }
}

fn block(c: &Cache, t: usize, b: usize) -> Vec<u8> {
    tensor(c, t)[b * BLOCK..(b + 1) * BLOCK].to_vec()
}

async fn linked() -> (DataDist<TcpCommunicator>, DataDist<TcpCommunicator>) {
    let p = cluster(PROMPT, Role::Prompt).await;
    let d = cluster(DECODER, Role::Decoder).await;
    let r = d
        .link_clusters(&[(PROMPT, p.engine().name().to_string())], T)
        .await;
    assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
    let r = p
        .link_clusters(&[(DECODER, d.engine().name().to_string())], T)
        .await;
    assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
    (p, d)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decoder_pulls_a_requests_whole_cache_and_a_prompt_pushes_one() {
    let (p, d) = linked().await;
    let key = request_key(PROMPT, 42);
    let src = p.allocate_cache(desc(8), &[key], None).await.unwrap();
    fill(&src, 3);
    let dst = d.allocate_cache(desc(8), &[], None).await.unwrap();
    d.pull_kv_cache(&key, &dst, T).await.unwrap();
    for t in 0..4 {
        assert_eq!(tensor(&dst, t), tensor(&src, t), "tensor {t}");
    }
    // Push: the decoder publishes its destination under a key of its own cluster.
    let dkey = request_key(DECODER, 43);
    let dst2 = d.allocate_cache(desc(8), &[dkey], None).await.unwrap();
    fill(&src, 9);
    p.push_kv_cache(&src, DECODER, &dkey, T).await.unwrap();
    assert_eq!(tensor(&dst2, 3), tensor(&src, 3));
    // An unknown key names the key and the engine.
    let missing = CacheKey { req_id: 99, ..key };
    let e = d.pull_kv_cache(&missing, &dst, T).await.unwrap_err();
    assert!(matches!(e, EngineError::UnknownKey { .. }), "{e}");
    assert!(e.to_string().contains("kv/cache/99/7/0"), "{e}");
    p.deallocate_cache(src).await.unwrap();
    // Gone once deallocated.
    assert!(d.pull_kv_cache(&key, &dst, T).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scattered_blocks_of_a_layer_range_move_as_runs() {
    let (p, d) = linked().await;
    let bkey = BlocksCacheKey {
        prompt_cluster_id: PROMPT,
        model_id: 7,
    };
    let src = p.allocate_cache(desc(8), &[], Some(bkey)).await.unwrap();
    fill(&src, 5);
    // The decoder's paged cache has more blocks; only the block shape must match.
    let dst = d.allocate_cache(desc(16), &[], None).await.unwrap();
    let (sb, db) = ([0, 1, 2, 5, 6], [10, 11, 12, 3, 4]);
    // Layer 1 only: tensors 2 and 3.
    d.pull_kv_blocks(&bkey, &dst, &sb, &db, Some(1..2), 2, T)
        .await
        .unwrap();
    for t in 0..4 {
        for (s, dd) in sb.iter().zip(&db) {
            let got = block(&dst, t, *dd as usize);
            if t >= 2 {
                assert_eq!(
                    got,
                    block(&src, t, *s as usize),
                    "tensor {t} block {s} -> {dd}"
                );
            } else {
                assert!(got.iter().all(|&x| x == 0), "layer 0 untouched");
            }
        }
    }
    // Push blocks back the other way, all layers.
    let dkey = BlocksCacheKey {
        prompt_cluster_id: DECODER,
        model_id: 7,
    };
    let dst2 = d.allocate_cache(desc(16), &[], Some(dkey)).await.unwrap();
    p.push_kv_blocks(&src, DECODER, &dkey, &[7], &[15], None, 2, T)
        .await
        .unwrap();
    assert_eq!(block(&dst2, 0, 15), block(&src, 0, 7));
    // Out-of-range ids and mismatched layouts are refused before any byte moves.
    let e = d
        .pull_kv_blocks(&bkey, &dst, &[8], &[0], None, 2, T)
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("source block id 8 is out of range: the remote cache has 8 blocks"),
        "{e}"
    );
    let e = d
        .pull_kv_blocks(&bkey, &dst, &[0, 1], &[0], None, 2, T)
        .await
        .unwrap_err();
    assert!(matches!(e, EngineError::Layout(_)), "{e}");
    let wrong = d
        .allocate_cache(
            CacheDesc {
                dtype: DataType::Bf16,
                shape: vec![8, 32, 32],
                ..desc(8)
            },
            &[],
            None,
        )
        .await
        .unwrap();
    let e = d
        .pull_kv_blocks(&bkey, &wrong, &[0], &[0], None, 2, T)
        .await
        .unwrap_err();
    let s = e.to_string();
    assert!(s.contains("dtype local Bf16, remote F16"), "{s}");
    assert!(
        s.contains("block shape local [32, 32], remote [16, 64]"),
        "{s}"
    );
    let e = d
        .pull_kv_blocks(&bkey, &dst, &[0], &[0], Some(1..3), 2, T)
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("do not fit a cache of 4 tensors"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_block_copies() {
    let d = cluster(DECODER, Role::Decoder).await;
    let c = d.allocate_cache(desc(8), &[], None).await.unwrap();
    fill(&c, 1);
    let before: Vec<Vec<u8>> = (0..4).map(|t| block(&c, t, 2)).collect();
    d.copy_kv_blocks(&c, &[2, 3], &[6, 7]).unwrap();
    for (t, b) in before.iter().enumerate() {
        assert_eq!(&block(&c, t, 6), b);
        assert_eq!(block(&c, t, 7), block(&c, t, 3));
    }
    assert!(d.copy_kv_blocks(&c, &[9], &[0]).is_err());
    d.deallocate_cache(c).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_must_name_this_cluster_and_links_must_exist() {
    let d = cluster(DECODER, Role::Decoder).await;
    let foreign = CacheKey {
        prompt_cluster_id: PROMPT,
        req_id: 1,
        model_id: 1,
        prefix_id: 0,
    };
    assert!(d.allocate_cache(desc(8), &[foreign], None).await.is_err());
    let c = d.allocate_cache(desc(8), &[], None).await.unwrap();
    let e = d.pull_kv_cache(&foreign, &c, T).await.unwrap_err();
    assert!(e.to_string().contains("link_clusters"), "{e}");
    let r = d.unlink_clusters(&[PROMPT]).await;
    assert!(r[0].is_err());
}

/// A `DataDist` dropped without `deallocate_cache` leaves its caches registered with the
/// engine, which lives on in its clones: peers still read them, so their memory is kept,
/// not freed and reused under them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_datadist_keeps_the_memory_peers_still_reach() {
    let (p, d) = linked().await;
    let key = request_key(PROMPT, 5);
    let src = p.allocate_cache(desc(64), &[key], None).await.unwrap();
    fill(&src, 11);
    let want: Vec<Vec<u8>> = (0..4).map(|t| tensor(&src, t)).collect();
    let prompt_engine = p.engine().clone();
    // The decoder resolves the cache's addresses before the prompt's DataDist goes.
    let dst = d.allocate_cache(desc(64), &[], None).await.unwrap();
    d.pull_kv_cache(&key, &dst, T).await.unwrap();
    drop(p);
    // Were the tensors freed, these same-size allocations would take their place.
    let churn: Vec<Vec<u8>> = (0..64).map(|_| vec![0xEE; tensor_len(&src)]).collect();
    fill(&dst, 0);
    // The engine still serves the published cache: a READ by its addresses.
    let descs: Vec<hmc_engine::TransferOpDesc> = (0..4)
        .map(|t| hmc_engine::TransferOpDesc {
            local_addr: dst.tensor_addrs()[t],
            remote_addr: src.tensor_addrs()[t],
            len: tensor_len(&src),
        })
        .collect();
    d.engine()
        .transfer(
            prompt_engine.name(),
            hmc_engine::TransferOp::Read,
            &descs,
            T,
        )
        .await
        .unwrap();
    for (t, want) in want.iter().enumerate() {
        assert!(
            &tensor(&dst, t) == want,
            "tensor {t} changed after the drop"
        );
    }
    drop(churn);
}
