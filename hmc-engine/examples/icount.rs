//! A fixed-count workload for counting instructions, where this machine's rates spread too
//! widely to resolve a few percent ("no cell more than N% slower"): two engines in this
//! process over TCP loopback with busy-polling off, so that no spin loop counts.
//!
//! `icount N WHICH`, WHICH one of `small` (N sync 4 KiB WRITE+READ pairs), `large` (N/10
//! pairs of 1 MiB), `kv` (N/4 prepared posts of 64 scattered 16 KiB blocks with a
//! notification, each taken at the target), `all`, or `none` (setup only, to subtract).
//! Run each binary under `valgrind --tool=callgrind`, alternated with the other, and
//! divide the difference from `none` by the count (docs/log/2026-12-07-kv-at-the-limits.md).

use std::sync::Arc;
use std::time::Duration;

use hmc_engine::{
    Access, BlockDesc, Engine, EngineConfig, MemDesc, MemType, TransferOp, TransferOpDesc,
};
use hmc_transport_tcp::{TcpCommunicator, TcpConfig};

const T: Duration = Duration::from_secs(30);

async fn engine() -> Engine<TcpCommunicator> {
    let cfg = TcpConfig {
        busy_poll: Duration::ZERO,
        ..Default::default()
    };
    let comm = TcpCommunicator::bind(&"tcp://127.0.0.1:0".parse().unwrap(), cfg).unwrap();
    Engine::initialize(Arc::new(comm), "127.0.0.1", EngineConfig::default())
        .await
        .unwrap()
}

fn reg(e: &Engine<TcpCommunicator>, m: &[u8]) {
    // SAFETY: every buffer registered here lives until `main` returns, after both engines
    // were finalized.
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
    .unwrap();
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().unwrap())
        .unwrap_or(2000);
    let which = std::env::args().nth(2).unwrap_or_else(|| "all".into());
    let (a, b) = (engine().await, engine().await);
    let (src, dst) = (vec![7u8; 16 << 20], vec![0u8; 16 << 20]);
    reg(&a, &src);
    reg(&b, &dst);
    a.connect(b.name(), T).await.unwrap();
    let d = |len: usize| {
        [TransferOpDesc {
            local_addr: src.as_ptr() as u64,
            remote_addr: dst.as_ptr() as u64,
            len,
        }]
    };
    if which == "all" || which == "small" {
        for _ in 0..n {
            a.transfer(b.name(), TransferOp::Write, &d(4096), T)
                .await
                .unwrap();
            a.transfer(b.name(), TransferOp::Read, &d(4096), T)
                .await
                .unwrap();
        }
    }
    if which == "all" || which == "large" {
        for _ in 0..n / 10 {
            a.transfer(b.name(), TransferOp::Write, &d(1 << 20), T)
                .await
                .unwrap();
            a.transfer(b.name(), TransferOp::Read, &d(1 << 20), T)
                .await
                .unwrap();
        }
    }
    if which == "all" || which == "kv" {
        let blob = b.local_metadata().unwrap();
        let peer = match a.add_remote(&blob, T).await {
            Ok(p) => p,
            Err(_) => b.name().to_string(),
        };
        let block = 16usize << 10;
        let table = |base: u64| {
            vec![BlockDesc {
                addr: base,
                len: block,
                stride: block as u64,
                count: 1024,
            }]
        };
        let local = a.prepare_local(&table(src.as_ptr() as u64)).unwrap();
        let remote = a
            .prepare_remote(&peer, &table(dst.as_ptr() as u64), T)
            .await
            .unwrap();
        let idx: Vec<u64> = (0..64u64).map(|i| (i * 13) % 1024).collect();
        for i in 0..n / 4 {
            let op = if i % 2 == 0 {
                TransferOp::Write
            } else {
                TransferOp::Read
            };
            let x = a
                .make_transfer(
                    op,
                    &local,
                    &idx,
                    &remote,
                    &idx,
                    Some(("kv".into(), b"req".to_vec())),
                )
                .unwrap();
            x.post().unwrap();
            x.wait().await;
            let mut got = 0;
            while got == 0 {
                got = b.get_notifies().len();
                if got == 0 {
                    tokio::time::sleep(Duration::from_micros(50)).await;
                }
            }
        }
    }
    a.finalize().await;
    b.finalize().await;
}
