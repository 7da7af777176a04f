//! Our own overhead per operation, measured against the user-space `libibverbs.so.1` stand-in (no NIC needed): CPU time of the calling thread per posted batch (validation, splitting, chaining, `post_send` through the ops table, the wake-up), CPU of the completion thread per completion, and completions per second; prints a markdown table.
//!
//! `cargo bench -p hmc-transport-rdma --bench overhead` (or `cargo xtask bench rdma`).
//! `HMC_BENCH_QUICK=1` runs fewer batches. `HMC_RDMA_HARDWARE=1` uses the installed
//! `libibverbs.so.1` and a real NIC (`HMC_RDMA_DEVICE`) instead of the stand-in (what the
//! hardware bundle's `run.sh` does, beside `ib_write_bw`/`ib_read_bw`). A second table
//! gives bandwidth of 16 MiB batches of 64 KiB, 1 MiB and 16 MiB descriptors. The stand-in moves bytes through Unix sockets
//! and threads of its own, so the wall-clock columns say how fast the stand-in is, not a
//! NIC; the CPU columns of our threads are what regressions show in. On a NIC, compare
//! with `ib_write_bw` instead (`cargo xtask rdma-bundle` runs it beside this bench:
//! docs/guide/commands.md).

use std::sync::Arc;
use std::time::{Duration, Instant};

use hmc_backend_cpu::HostMemory;
use hmc_core::{Access, Communicator, ConnBuffer, Deadline, Op, RegisteredBuffer, TransferDesc};
use hmc_transport_rdma::{RdmaCommunicator, RdmaConfig};

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer for clock_gettime.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// CPU time of the completion threads (`hmc-rdma-cq`), from /proc (clock ticks of
/// `USER_HZ`, 100 on Linux).
fn completion_cpu() -> Duration {
    Duration::from_secs_f64(hmc_testshim::thread_cpu_ticks("hmc-rdma-cq") as f64 / 100.0)
}

struct Case {
    descs: usize,
    size: usize,
    op: Op,
}

fn main() {
    let quick = std::env::var_os("HMC_BENCH_QUICK").is_some();
    let hardware = std::env::var_os("HMC_RDMA_HARDWARE").is_some();
    let lib = (!hardware).then(|| {
        let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../target/tmp/ibverbs-standin");
        hmc_testshim::build_ibverbs_standin(&dir).expect("build the libibverbs stand-in")
    });
    let config = || RdmaConfig {
        library: lib.clone(),
        device: std::env::var("HMC_RDMA_DEVICE")
            .ok()
            .filter(|d| !d.is_empty()),
        ..RdmaConfig::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let a = Arc::new(RdmaCommunicator::new(config()).unwrap());
    let b = Arc::new(RdmaCommunicator::new(config()).unwrap());
    let mem = Arc::new(HostMemory::new());
    let cases = [
        Case {
            descs: 1,
            size: 64,
            op: Op::Write,
        },
        Case {
            descs: 16,
            size: 64,
            op: Op::Write,
        },
        Case {
            descs: 256,
            size: 64,
            op: Op::Write,
        },
        Case {
            descs: 1,
            size: 64,
            op: Op::Read,
        },
        Case {
            descs: 256,
            size: 64,
            op: Op::Read,
        },
        Case {
            descs: 1,
            size: 1 << 20,
            op: Op::Write,
        },
    ];
    println!(
        "| op | descriptors x size | batches | our CPU per batch (µs) | our CPU per WR (µs) | completion-thread CPU per completion (µs) | completions/s | wall per batch (µs) |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    rt.block_on(async {
        let ep = a.connect(&b.address(), Deadline::default()).await.unwrap();
        for c in cases {
            let total = c.descs * c.size;
            let target =
                RegisteredBuffer::new(mem.clone(), b.clone(), total, Access::READ_WRITE).unwrap();
            let local =
                RegisteredBuffer::new(mem.clone(), a.clone(), total, Access::READ_WRITE).unwrap();
            let key = a.import(&ep, &target.export().unwrap()).unwrap();
            let batch: Vec<_> = (0..c.descs)
                .map(|i| TransferDesc {
                    local: local.registration(),
                    local_offset: i * c.size,
                    remote: &key,
                    remote_offset: (i * c.size) as u64,
                    len: c.size,
                })
                .collect();
            let budget = if c.size >= 1 << 20 { 50 } else { 2000 };
            let n = if quick { budget / 10 } else { budget };
            for _ in 0..n / 10 {
                a.transfer(&ep, c.op, &batch, Deadline::default())
                    .await
                    .unwrap();
            }
            let (cpu0, cq0, done0, t0) = (
                thread_cpu(),
                completion_cpu(),
                a.stats().completions,
                Instant::now(),
            );
            for _ in 0..n {
                a.transfer(&ep, c.op, &batch, Deadline::default())
                    .await
                    .unwrap();
            }
            let wall = t0.elapsed();
            let cpu = thread_cpu() - cpu0;
            let cq = completion_cpu() - cq0;
            let completions = a.stats().completions - done0;
            let wrs = n * c.descs.max(c.size.div_ceil(1 << 20));
            println!(
                "| {:?} | {} x {} B | {n} | {:.1} | {:.2} | {:.1} | {:.0} | {:.0} |",
                c.op,
                c.descs,
                c.size,
                cpu.as_secs_f64() * 1e6 / n as f64,
                cpu.as_secs_f64() * 1e6 / wrs as f64,
                cq.as_secs_f64() * 1e6 / completions.max(1) as f64,
                completions as f64 / wall.as_secs_f64(),
                wall.as_secs_f64() * 1e6 / n as f64,
            );
        }
        println!();
        println!("| op | descriptor size | descriptors per batch | batches | GB/s |");
        println!("| --- | ---: | ---: | ---: | ---: |");
        let batch_bytes = 16usize << 20;
        let target =
            RegisteredBuffer::new(mem.clone(), b.clone(), batch_bytes, Access::READ_WRITE).unwrap();
        let local =
            RegisteredBuffer::new(mem.clone(), a.clone(), batch_bytes, Access::READ_WRITE).unwrap();
        let key = a.import(&ep, &target.export().unwrap()).unwrap();
        for op in [Op::Write, Op::Read] {
            for size in [64usize << 10, 1 << 20, 16 << 20] {
                let count = batch_bytes / size;
                let batch: Vec<_> = (0..count)
                    .map(|i| TransferDesc {
                        local: local.registration(),
                        local_offset: i * size,
                        remote: &key,
                        remote_offset: (i * size) as u64,
                        len: size,
                    })
                    .collect();
                let n = if quick { 3 } else { 20 };
                a.transfer(&ep, op, &batch, Deadline::default())
                    .await
                    .unwrap();
                let t0 = Instant::now();
                for _ in 0..n {
                    a.transfer(&ep, op, &batch, Deadline::default())
                        .await
                        .unwrap();
                }
                let gbs = (n * batch_bytes) as f64 / t0.elapsed().as_secs_f64() / 1e9;
                println!("| {op:?} | {} KiB | {count} | {n} | {gbs:.2} |", size >> 10);
            }
        }
    });
}
