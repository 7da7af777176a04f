//! Same-host one-sided transfers between two processes: `ShmCommunicator` (cross-memory
//! attach into user memory, and copies into the target's shared memory from
//! `alloc_registered`) beside a plain
//! single-thread `memcpy` of the same sizes and beside our UCX transport on UCX's shared
//! memory (`UCX_TLS=posix,cma,self`), with user memory given to `register` and with memory
//! UCX allocates itself (what `ucx_perftest` measures), in one run; prints a markdown table.
//!
//! `cargo bench -p hmc-transport-shm --bench shm [-- --quick]` (`cargo xtask bench shm`).
//! One operation in flight (a synchronous loop), as an inference worker moving one block at
//! a time does. This binary runs itself as the peer process (`HMC_SHM_BENCH_PEER=1`).
//!
//! A second table gives the CPU each cell took (`hmc_bench_kit::cpu`): user and system
//! time of both processes (this one and the peer, every thread) over the timed loop, per
//! GiB moved and per operation; memcpy's is this process's alone.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmc_backend_cpu::HostMemory;
use hmc_bench_kit::cpu::{self, ProcessCpu};
use hmc_core::{
    Access, AnyCommunicator, Communicator, ConnBuffer, Deadline, Op, PeerAddr, RegisteredBuffer,
    RemoteRegion, TransferDesc,
};
use hmc_transport_shm::{ShmCommunicator, ShmConfig};
use hmc_transport_ucx::{UcxCommunicator, UcxConfig};

const SIZES: [usize; 4] = [4 << 10, 64 << 10, 1 << 20, 16 << 20];
const BUF: usize = 16 << 20;
const UCX_TLS: &str = "posix,cma,self";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn ucx() -> Option<UcxCommunicator> {
    let config = UcxConfig {
        bind: "127.0.0.1:0".parse().expect("addr"),
        ..UcxConfig::from_env()
    };
    UcxCommunicator::new(config)
        .map_err(|e| eprintln!("shm bench: UCX columns skipped: {e}"))
        .ok()
}

/// The peer: prints `<row> <address> <descriptor>` lines, then `READY`, and keeps its
/// registrations until its standard input closes.
fn peer() {
    let rt = runtime();
    let _guard = rt.enter();
    let mem = Arc::new(HostMemory::new());
    // Registrations, kept alive until the parent is done.
    let mut keep: Vec<Box<dyn std::any::Any>> = Vec::new();
    let shm = Arc::new(ShmCommunicator::bind(ShmConfig::default()).expect("bind shm"));
    let b = RegisteredBuffer::new(mem.clone(), shm.clone(), BUF, Access::READ_WRITE).expect("reg");
    println!(
        "shm {} {}",
        shm.address(),
        hex(&b.export().expect("export").encode())
    );
    keep.push(Box::new(b));
    if let Ok(Some(r)) = shm.alloc_registered(BUF, Access::READ_WRITE) {
        println!(
            "shm-mapped {} {}",
            shm.address(),
            hex(&shm.export(&r).expect("export").encode())
        );
        keep.push(Box::new(r));
    }
    if let Some(u) = ucx().map(Arc::new) {
        let b = RegisteredBuffer::new(mem, u.clone(), BUF, Access::READ_WRITE).expect("reg");
        println!(
            "ucx-user {} {}",
            u.address(),
            hex(&b.export().expect("export").encode())
        );
        keep.push(Box::new(b));
        if let Ok(Some(r)) = Communicator::alloc_registered(&*u, BUF, Access::READ_WRITE) {
            println!(
                "ucx-ucxmem {} {}",
                u.address(),
                hex(&u.export(&r).expect("export").encode())
            );
            keep.push(Box::new(r));
        }
    }
    println!("READY");
    std::io::stdout().flush().expect("flush");
    let mut line = String::new();
    while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {
        line.clear();
    }
    drop(keep);
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Synchronous `op`s of `size` bytes for about `secs`: operations per second, the median
/// latency in microseconds and the CPU-microseconds per op of this process and `peer`.
#[allow(clippy::too_many_arguments)]
async fn sync_loop<C: Communicator>(
    comm: &C,
    ep: &C::Endpoint,
    local: &C::Registration,
    key: &C::RemoteKey,
    op: Op,
    size: usize,
    secs: f64,
    peer: u32,
) -> (f64, f64, Option<f64>) {
    let d = [TransferDesc {
        local,
        local_offset: 0,
        remote: key,
        remote_offset: 0,
        len: size,
    }];
    let deadline = || Deadline::after(Duration::from_secs(10));
    for _ in 0..3 {
        comm.transfer(ep, op, &d, deadline())
            .await
            .expect("warm-up transfer");
    }
    let mut lat = Vec::new();
    let cpu = ProcessCpu::with_peer(peer);
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < secs {
        let t = Instant::now();
        comm.transfer(ep, op, &d, deadline())
            .await
            .expect("transfer");
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let ops = lat.len() as f64 / start.elapsed().as_secs_f64();
    let cpu_us = cpu
        .used()
        .and_then(|u| cpu::cpu_us_per_op(u, lat.len() as u64));
    lat.sort_by(f64::total_cmp);
    (ops, lat[lat.len() / 2], cpu_us)
}

/// Single-thread `memcpy` of `size` bytes between two distinct buffers, for `secs`: copies
/// per second and this process's CPU-microseconds per copy.
fn memcpy_loop(size: usize, secs: f64) -> (f64, Option<f64>) {
    let src = vec![7u8; BUF];
    let mut dst = vec![0u8; BUF];
    let cpu = ProcessCpu::this_process();
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        for _ in 0..16 {
            dst[..size].copy_from_slice(std::hint::black_box(&src[..size]));
            std::hint::black_box(&mut dst);
        }
        n += 16;
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    (rate, cpu.used().and_then(|u| cpu::cpu_us_per_op(u, n)))
}

struct Cell {
    row: String,
    op: Op,
    size: usize,
    ops: f64,
    p50_us: f64,
    /// CPU-microseconds per op of both processes.
    cpu_us: Option<f64>,
}

/// CPU-seconds per GiB from CPU-microseconds per op of `size` bytes.
fn per_gib(cpu_us: Option<f64>, size: usize) -> Option<f64> {
    cpu_us.and_then(|us| cpu::s_per_gib_from_us_per_op(us, size as u64))
}

fn gbs(ops: f64, size: usize) -> f64 {
    ops * size as f64 / 1e9
}

fn human(size: usize) -> String {
    if size >= 1 << 20 {
        format!("{} MiB", size >> 20)
    } else {
        format!("{} KiB", size >> 10)
    }
}

async fn measure<C: Communicator>(
    comm: &C,
    peer: &PeerAddr,
    desc: &RemoteRegion,
    local: &C::Registration,
    row: &str,
    (secs, peer_pid): (f64, u32),
    out: &mut Vec<Cell>,
) {
    let ep = comm
        .connect(peer, Deadline::after(Duration::from_secs(10)))
        .await
        .expect("connect");
    let key = comm.import(&ep, desc).expect("import");
    for op in [Op::Write, Op::Read] {
        for size in SIZES {
            let (ops, p50_us, cpu_us) =
                sync_loop(comm, &ep, local, &key, op, size, secs, peer_pid).await;
            out.push(Cell {
                row: row.into(),
                op,
                size,
                ops,
                p50_us,
                cpu_us,
            });
        }
    }
}

fn main() {
    if std::env::var_os("HMC_SHM_BENCH_PEER").is_some() {
        return peer();
    }
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let quick = std::env::args().any(|a| a == "--quick");
    let secs = if quick { 0.3 } else { 1.0 };
    // Both processes run UCX on its shared-memory transports.
    // SAFETY: set before any thread of this process starts.
    unsafe { std::env::set_var("UCX_TLS", UCX_TLS) };
    let mut child = Command::new(std::env::current_exe().expect("exe"))
        .env("HMC_SHM_BENCH_PEER", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the peer");
    let mut targets = Vec::new();
    for line in BufReader::new(child.stdout.take().expect("stdout")).lines() {
        let line = line.expect("peer output");
        if line == "READY" {
            break;
        }
        let mut it = line.split(' ');
        let (row, addr, desc) = (it.next(), it.next(), it.next());
        let (Some(row), Some(addr), Some(desc)) = (row, addr, desc) else {
            continue;
        };
        let addr: PeerAddr = addr.parse().expect("peer address");
        let desc = RemoteRegion::decode(&unhex(desc)).expect("descriptor");
        targets.push((row.to_string(), addr, desc));
    }
    let rt = runtime();
    let mut cells = Vec::new();
    let run = (secs, child.id());
    rt.block_on(async {
        let mem = Arc::new(HostMemory::new());
        let shm = Arc::new(ShmCommunicator::bind(ShmConfig::default()).expect("bind shm"));
        let ucx = ucx().map(|u| Arc::new(AnyCommunicator::new(u)));
        for (row, addr, desc) in &targets {
            match row.as_str() {
                "shm" | "shm-mapped" => {
                    let b =
                        RegisteredBuffer::new(mem.clone(), shm.clone(), BUF, Access::READ_WRITE)
                            .expect("reg");
                    measure(&*shm, addr, desc, b.registration(), row, run, &mut cells).await;
                }
                "ucx-user" | "ucx-ucxmem" => {
                    let Some(u) = &ucx else { continue };
                    if row == "ucx-user" {
                        let b =
                            RegisteredBuffer::new(mem.clone(), u.clone(), BUF, Access::READ_WRITE)
                                .expect("reg");
                        measure(&**u, addr, desc, b.registration(), row, run, &mut cells).await;
                    } else if let Ok(Some(r)) = u.alloc_registered(BUF, Access::READ_WRITE) {
                        measure(&**u, addr, desc, &r, row, run, &mut cells).await;
                    }
                }
                _ => {}
            }
        }
    });
    drop(child.stdin.take());
    let _ = child.wait();
    report(&cells, secs);
}

fn report(cells: &[Cell], secs: f64) {
    let find = |row: &str, op: Op, size: usize| {
        cells
            .iter()
            .find(|c| c.row == row && c.op == op && c.size == size)
    };
    println!("\n### Same-host one-sided transfers, two processes, one operation in flight\n");
    println!(
        "| op | size | shm ops/s | shm GB/s | shm p50 µs | memcpy GB/s | shm / memcpy | shared mem ops/s | shared mem GB/s | shared / memcpy | UCX user mem GB/s | shm / UCX user | UCX own mem GB/s | shm / UCX own |"
    );
    println!(
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    let mut cpu_rows = Vec::new();
    for op in [Op::Write, Op::Read] {
        for size in SIZES {
            let Some(s) = find("shm", op, size) else {
                continue;
            };
            let (copies, copy_cpu) = memcpy_loop(size, secs);
            let copy = gbs(copies, size);
            let of = |row: &str| find(row, op, size).and_then(|c| c.cpu_us);
            cpu_rows.push(format!(
                "| {op:?} | {} | {:.2} | {} | {} | {} | {} | {} | {} | {} |",
                human(size),
                gbs(s.ops, size),
                cpu::cell(per_gib(s.cpu_us, size), 3),
                cpu::cell(s.cpu_us, 1),
                cpu::cell(per_gib(of("shm-mapped"), size), 3),
                cpu::cell(per_gib(copy_cpu, size), 3),
                cpu::cell(copy_cpu, 2),
                cpu::cell(per_gib(of("ucx-user"), size), 3),
                cpu::cell(per_gib(of("ucx-ucxmem"), size), 3),
            ));
            let ratio = |row: &str| match find(row, op, size) {
                Some(c) => (
                    format!("{:.2}", gbs(c.ops, size)),
                    format!("{:.1}x", s.ops / c.ops),
                ),
                None => ("n/a".into(), "n/a".into()),
            };
            let (uu, ru) = ratio("ucx-user");
            let (uo, ro) = ratio("ucx-ucxmem");
            let mapped = match find("shm-mapped", op, size) {
                Some(m) => format!(
                    "{:.0} | {:.2} | {:.0}%",
                    m.ops,
                    gbs(m.ops, size),
                    100.0 * gbs(m.ops, size) / copy
                ),
                None => "n/a | n/a | n/a".into(),
            };
            println!(
                "| {op:?} | {} | {:.0} | {:.2} | {:.1} | {copy:.2} | {:.0}% | {mapped} | {uu} | {ru} | {uo} | {ro} |",
                human(size),
                s.ops,
                gbs(s.ops, size),
                s.p50_us,
                100.0 * gbs(s.ops, size) / copy,
            );
        }
    }
    println!(
        "\nTargets (issue 18): 4 KiB >= 300k sync ops/s; 64 KiB and 1 MiB >= 80% of memcpy; >= 5x UCX with user memory from 64 KiB."
    );
    println!("\n### CPU per GiB moved, the same cells\n");
    println!(
        "| op | size | shm GB/s | shm CPU-s/GiB | shm CPU us/op | shared mem CPU-s/GiB | memcpy CPU-s/GiB | memcpy CPU us/op | UCX user mem CPU-s/GiB | UCX own mem CPU-s/GiB |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for r in &cpu_rows {
        println!("{r}");
    }
    println!(
        "\n{} Transfers: this process and the peer; memcpy: this process alone.",
        cpu::CPU_NOTE
    );
}
