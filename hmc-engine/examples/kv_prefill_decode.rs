//! Prefill/decode disaggregation with the KV-cache API, in two processes: the prompt
//! cluster "prefills" a request into blocks of its paged KV cache and publishes the cache;
//! the decoder cluster links to it, pulls the request's (scattered) blocks into free blocks
//! of its own cache, and checks every block's checksum against what the prompt side wrote.
//!
//! `cargo run -p hmc-engine --example kv_prefill_decode` runs both processes.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmc_engine::kv::{BlocksCacheKey, Cache, CacheDesc, DataDist, DataType, Role};
use hmc_engine::{Engine, EngineConfig, MemType};
use hmc_transport_tcp::TcpCommunicator;

const T: Duration = Duration::from_secs(30);
const PROMPT: u64 = 1;
const DECODER: u64 = 2;
const MODEL: u64 = 7;
const LAYERS: u32 = 4;
/// 16 tokens x 1024 F16 values per block and tensor: 32 KiB.
const BLOCK: usize = 16 * 1024 * 2;

fn desc(blocks: u64) -> CacheDesc {
    CacheDesc {
        placement: MemType::Host,
        num_tensors: 2 * LAYERS,
        dtype: DataType::F16,
        shape: vec![blocks, 16, 1024],
    }
}

/// The byte the prompt side writes at `i` of block `b` of tensor `t` for request `req`.
fn prefill_byte(req: u64, t: usize, b: u64, i: usize) -> u8 {
    (i as u8)
        .wrapping_mul(31)
        .wrapping_add(t as u8 * 7)
        .wrapping_add(b as u8 * 3)
        .wrapping_add(req as u8)
}

fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Block `b` of tensor `t` of a host cache.
fn block(c: &Cache, t: usize, b: u64) -> &'static mut [u8] {
    // SAFETY: the cache is host memory owned by its DataDist until deallocate_cache, and
    // each side touches a block only while no transfer runs on it.
    unsafe {
        std::slice::from_raw_parts_mut((c.tensor_addrs()[t] + b * BLOCK as u64) as *mut u8, BLOCK)
    }
}

async fn cluster(id: u64, role: Role) -> DataDist<TcpCommunicator> {
    let comm = TcpCommunicator::bind(&"tcp://127.0.0.1:0".parse().unwrap(), Default::default())
        .expect("TCP transport");
    let e = Engine::initialize(Arc::new(comm), "127.0.0.1", EngineConfig::default())
        .await
        .expect("engine");
    DataDist::new(e, id, role)
}

async fn prompt(req: u64, blocks: &[u64]) {
    let dd = cluster(PROMPT, Role::Prompt).await;
    let key = BlocksCacheKey {
        prompt_cluster_id: PROMPT,
        model_id: MODEL,
    };
    let cache = dd.allocate_cache(desc(64), &[], Some(key)).await.unwrap();
    for t in 0..(2 * LAYERS) as usize {
        for &b in blocks {
            for (i, x) in block(&cache, t, b).iter_mut().enumerate() {
                *x = prefill_byte(req, t, b, i);
            }
        }
    }
    println!("READY {}", dd.engine().name());
    std::io::stdout().flush().unwrap();
    tokio::task::spawn_blocking(|| {
        let mut s = String::new();
        let _ = std::io::stdin().read_line(&mut s);
    })
    .await
    .unwrap();
    dd.deallocate_cache(cache).await.unwrap();
}

async fn decoder() {
    let req = 42;
    // The request's blocks at the prompt side (scattered), and the free blocks the decoder
    // gives it (partly consecutive, so some runs merge).
    let src: Vec<u64> = vec![3, 4, 5, 9, 10, 20, 33, 34, 35, 36, 50, 63];
    let dst: Vec<u64> = vec![0, 1, 2, 3, 4, 40, 41, 42, 43, 44, 100, 127];
    let me = std::env::current_exe().unwrap();
    let list: Vec<String> = src.iter().map(u64::to_string).collect();
    let mut child = Command::new(me)
        .args([
            "--role",
            "prompt",
            "--req",
            &req.to_string(),
            "--blocks",
            &list.join(","),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let name = line
        .strip_prefix("READY ")
        .expect("READY")
        .trim()
        .to_string();

    let dd = cluster(DECODER, Role::Decoder).await;
    let linked = dd.link_clusters(&[(PROMPT, name)], T).await;
    linked.into_iter().for_each(|r| r.unwrap());
    let cache = dd.allocate_cache(desc(128), &[], None).await.unwrap();
    let key = BlocksCacheKey {
        prompt_cluster_id: PROMPT,
        model_id: MODEL,
    };
    let t0 = Instant::now();
    dd.pull_kv_blocks(&key, &cache, &src, &dst, None, 2, T)
        .await
        .unwrap();
    let took = t0.elapsed();
    let bytes = src.len() * BLOCK * (2 * LAYERS) as usize;
    let mut checked = 0;
    for t in 0..(2 * LAYERS) as usize {
        for (&s, &d) in src.iter().zip(&dst) {
            let want: Vec<u8> = (0..BLOCK).map(|i| prefill_byte(req, t, s, i)).collect();
            assert_eq!(
                checksum(block(&cache, t, d)),
                checksum(&want),
                "tensor {t}: prompt block {s} -> decoder block {d}"
            );
            checked += 1;
        }
    }
    println!(
        "decoder: pulled {} blocks x {} tensors ({bytes} bytes) from the prompt cluster in {took:?} ({:.2} GB/s); {checked} block checksums match",
        src.len(),
        2 * LAYERS,
        bytes as f64 / took.as_secs_f64() / 1e9
    );
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success(), "the prompt process failed");
    dd.deallocate_cache(cache).await.unwrap();
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |k: &str| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    match arg("--role").as_deref() {
        Some("prompt") => {
            let req = arg("--req").unwrap().parse().unwrap();
            let blocks: Vec<u64> = arg("--blocks")
                .unwrap()
                .split(',')
                .map(|b| b.parse().unwrap())
                .collect();
            prompt(req, &blocks).await
        }
        _ => decoder().await,
    }
}
