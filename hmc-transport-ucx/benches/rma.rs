//! One-sided put/get bandwidth of `UcxCommunicator` beside `ucx_perftest` (`ucp_put_bw`, `ucp_get`) on the same `UCX_TLS`, in one run; prints a markdown table.
//!
//! `cargo bench -p hmc-transport-ucx --bench rma`. Environment: `HMC_BENCH_QUICK=1` moves
//! less data; `HMC_BENCH_TLS=tcp` (or `shm`) runs one transport only. Needs `ucx_perftest`
//! (Debian: `ucx-utils`) on `PATH`; without it the reference columns say `n/a`.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmc_backend_cpu::HostMemory;
use hmc_core::{Access, Communicator, ConnBuffer, Deadline, Op, RegisteredBuffer, TransferDesc};
use hmc_transport_ucx::{UcxCommunicator, UcxConfig};

const SIZES: [usize; 3] = [64 << 10, 1 << 20, 16 << 20];
/// Bytes per transfer call: a batch of descriptors of one size (like perftest's window).
const BATCH_BYTES: usize = 16 << 20;

struct Row {
    tls: &'static str,
    op: &'static str,
    size: usize,
    ours: f64,
    reference: Option<f64>,
}

fn human(size: usize) -> String {
    if size >= 1 << 20 {
        format!("{} MiB", size >> 20)
    } else {
        format!("{} KiB", size >> 10)
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(13_337)
}

/// Runs `ucx_perftest` server and client; returns the client's overall bandwidth in GB/s.
fn perftest(tls: &str, test: &str, size: usize, iters: usize) -> Option<f64> {
    let port = free_port().to_string();
    let args = [
        "-t",
        test,
        "-s",
        &size.to_string(),
        "-n",
        &iters.to_string(),
        "-p",
        &port,
    ];
    let mut server = Command::new("ucx_perftest")
        .args(args)
        .env("UCX_TLS", tls)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let mut result = None;
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        let out = Command::new("ucx_perftest")
            .arg("127.0.0.1")
            .args(args)
            .env("UCX_TLS", tls)
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        if let Some(line) = text.lines().find(|l| l.starts_with("Final:")) {
            let nums: Vec<f64> = line
                .split_whitespace()
                .skip(1)
                .filter_map(|t| t.parse().ok())
                .collect();
            // iterations, p50, avg, overall overhead, avg MB/s, overall MB/s, ...
            result = nums.get(5).map(|mbs| mbs * 1_048_576.0 / 1e9);
            break;
        }
    }
    let _ = server.kill();
    let _ = server.wait();
    result
}

async fn ours(
    a: &Arc<UcxCommunicator>,
    ep: &hmc_transport_ucx::UcxEndpoint,
    key: &hmc_transport_ucx::UcxRemoteKey,
    local: &RegisteredBuffer<HostMemory, UcxCommunicator>,
    op: Op,
    size: usize,
    total: usize,
) -> f64 {
    let per_call = (BATCH_BYTES / size).max(1);
    let batch: Vec<TransferDesc<'_, UcxCommunicator>> = (0..per_call)
        .map(|i| TransferDesc {
            local: local.registration(),
            local_offset: i * size,
            remote: key,
            remote_offset: (i * size) as u64,
            len: size,
        })
        .collect();
    let calls = (total / (size * per_call)).max(2);
    for _ in 0..2 {
        a.transfer(ep, op, &batch, Deadline::default())
            .await
            .expect("warm-up");
    }
    let start = Instant::now();
    for _ in 0..calls {
        a.transfer(ep, op, &batch, Deadline::default())
            .await
            .expect("transfer");
    }
    (calls * per_call * size) as f64 / start.elapsed().as_secs_f64() / 1e9
}

fn main() {
    let quick = std::env::var_os("HMC_BENCH_QUICK").is_some();
    let only = std::env::var("HMC_BENCH_TLS").ok();
    let transports: Vec<(&'static str, &'static str, usize)> = [
        ("tcp", "tcp", if quick { 64 << 20 } else { 512 << 20 }),
        (
            "shm",
            "posix,cma,self",
            if quick { 256 << 20 } else { 4 << 30 },
        ),
    ]
    .into_iter()
    .filter(|(name, _, _)| only.as_deref().is_none_or(|o| o == *name))
    .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio");
    let memory = Arc::new(HostMemory::new());
    let mut rows = Vec::new();
    for (name, tls, total) in transports {
        let a = Arc::new(UcxCommunicator::new(UcxConfig::with_tls(tls)).expect("UCX"));
        let b = Arc::new(UcxCommunicator::new(UcxConfig::with_tls(tls)).expect("UCX"));
        let target =
            RegisteredBuffer::new(memory.clone(), b.clone(), BATCH_BYTES, Access::READ_WRITE)
                .expect("target");
        let local =
            RegisteredBuffer::new(memory.clone(), a.clone(), BATCH_BYTES, Access::READ_WRITE)
                .expect("local");
        rt.block_on(async {
            let ep = a
                .connect(&b.address(), Deadline::default())
                .await
                .expect("connect");
            let key = a.import(&ep, &target.export()).expect("import");
            for (op, opname, test) in [
                (Op::Write, "put", "ucp_put_bw"),
                (Op::Read, "get", "ucp_get"),
            ] {
                for size in SIZES {
                    let g = ours(&a, &ep, &key, &local, op, size, total).await;
                    let reference = perftest(tls, test, size, (total / size).max(8));
                    eprintln!(
                        "{name} {opname} {}: {g:.2} GB/s vs {reference:?}",
                        human(size)
                    );
                    rows.push(Row {
                        tls: name,
                        op: opname,
                        size,
                        ours: g,
                        reference,
                    });
                }
            }
        });
    }
    println!("| UCX_TLS | op | size | hmc GB/s | ucx_perftest GB/s | ratio |");
    println!("| --- | --- | --- | ---: | ---: | ---: |");
    for r in rows {
        let (reference, ratio) = match r.reference {
            Some(x) => (format!("{x:.2}"), format!("{:.0}%", 100.0 * r.ours / x)),
            None => ("n/a".into(), "n/a".into()),
        };
        println!(
            "| {} | {} | {} | {:.2} | {} | {} |",
            r.tls,
            r.op,
            human(r.size),
            r.ours,
            reference,
            ratio
        );
    }
}
