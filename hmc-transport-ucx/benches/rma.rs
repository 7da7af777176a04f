//! One-sided put/get bandwidth of `UcxCommunicator` beside `ucx_perftest` (`ucp_put_bw`, `ucp_get`) on the same `UCX_TLS`, alternated in one run; prints a markdown table.
//!
//! `cargo bench -p hmc-transport-ucx --bench rma`. Environment: `HMC_BENCH_QUICK=1` moves
//! less data; `HMC_BENCH_TLS` picks rows: `tcp` or `shm` (every row of that transport) or
//! exact row names, comma-separated (`shm-ucxmem,tcp-ucxmem`); `HMC_BENCH_REPEATS` (default
//! 3, quick 1) is how many times ours and ucx_perftest are alternated per cell;
//! `HMC_BENCH_DIRECT_OFF=1` sets `UcxConfig::direct_mapped = false` and `HMC_BENCH_SPIN_US`
//! sets `UcxConfig::spin` on both sides (for A/B runs). Needs
//! `ucx_perftest` (Debian: `ucx-utils`) on `PATH`; without it the reference columns say `n/a`.
//!
//! Like for like: `ucx_perftest` allocates its buffers through UCX (`ucp_mem_map` with
//! `UCP_MEM_MAP_FLAG_ALLOCATE`, its `-m host` default), so the `-ucxmem` rows (both sides'
//! buffers from `UcxCommunicator::alloc_registered`) are the comparable ones; the other rows
//! use user memory given to `register`, which perftest never measures. The reference is
//! the better of perftest's own default window (`-O 1`: one operation outstanding) and
//! ours (`-O 8`, `UcxConfig::max_inflight_chunks`); over TCP the window decides the result.
//!
//! A second table gives the CPU each side took (`hmc_bench_kit::cpu`) per GiB moved: ours,
//! this process and the target (every thread) over the timed calls; ucx_perftest's, its
//! client and server (reaped children) over their whole run, start-up included, for the
//! run whose bandwidth was kept; the medians of the alternated runs.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmc_backend_cpu::HostMemory;
use hmc_bench_kit::cpu::{self, Process, ProcessCpu};
use std::io::{BufRead, BufReader, Read};

use hmc_core::{
    Access, Communicator, ConnBuffer, Deadline, Op, PeerAddr, RegisteredBuffer, RemoteRegion,
    TransferDesc,
};
use hmc_transport_ucx::{UcxCommunicator, UcxConfig};

const SIZES: [usize; 3] = [64 << 10, 1 << 20, 16 << 20];
/// Bytes per transfer call: a batch of descriptors of one size, each over the same range
/// (like perftest's window of operations on one buffer).
const BATCH_BYTES: usize = 16 << 20;

struct Row {
    tls: &'static str,
    op: &'static str,
    size: usize,
    ours: Vec<f64>,
    reference: Vec<f64>,
    /// CPU-seconds per GiB of each run, ours and ucx_perftest's.
    ours_cpu: Vec<Option<f64>>,
    reference_cpu: Vec<Option<f64>>,
}

/// A bandwidth in GB/s and the CPU-seconds per GiB it took.
type Measured = (f64, Option<f64>);

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

/// Runs `ucx_perftest` server and client (two processes) with `-O window`; returns the
/// client's overall bandwidth in GB/s and the CPU-seconds per GiB of both processes.
fn perftest_once(
    tls: &str,
    env: &[(&str, &str)],
    test: &str,
    size: usize,
    iters: usize,
    window: usize,
) -> Option<Measured> {
    // Both perftest processes (and the client's retries) are children reaped below.
    let meter = ProcessCpu::start(&[Process::WaitedChildren]);
    let port = free_port().to_string();
    let args = [
        "-t".to_string(),
        test.to_string(),
        "-s".to_string(),
        size.to_string(),
        "-n".to_string(),
        iters.to_string(),
        "-O".to_string(),
        window.to_string(),
        "-p".to_string(),
        port,
    ];
    let mut server = Command::new("ucx_perftest")
        .args(&args)
        .env("UCX_TLS", tls)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let mut result = None;
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        let out = Command::new("ucx_perftest")
            .arg("127.0.0.1")
            .args(&args)
            .env("UCX_TLS", tls)
            .envs(env.iter().copied())
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
    let bytes = (iters * size) as u64;
    let used = meter.used();
    result.map(|gbs| (gbs, used.and_then(|u| cpu::cpu_s_per_gib(u, bytes))))
}

/// The better of perftest's default window (1) and ours.
fn perftest(
    tls: &str,
    env: &[(&str, &str)],
    test: &str,
    size: usize,
    iters: usize,
) -> Option<Measured> {
    [1, WINDOW]
        .into_iter()
        .filter_map(|w| perftest_once(tls, env, test, size, iters, w))
        .reduce(|a, b| if b.0 > a.0 { b } else { a })
}

/// Operations in flight per transfer on our side (`UcxConfig::max_inflight_chunks` default).
const WINDOW: usize = 8;

/// Median, min and max of some runs.
fn summary(v: &[f64]) -> Option<(f64, f64, f64)> {
    if v.is_empty() {
        return None;
    }
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    Some((v[v.len() / 2], v[0], v[v.len() - 1]))
}

fn fmt_runs(s: Option<(f64, f64, f64)>) -> String {
    match s {
        Some((m, lo, hi)) if lo != hi => format!("{m:.2} ({lo:.2}–{hi:.2})"),
        Some((m, ..)) => format!("{m:.2}"),
        None => "n/a".into(),
    }
}

async fn ours(
    a: &Arc<UcxCommunicator>,
    ep: &hmc_transport_ucx::UcxEndpoint,
    key: &hmc_transport_ucx::UcxRemoteKey,
    local: &hmc_transport_ucx::UcxRegistration,
    op: Op,
    size: usize,
    (total, peer): (usize, u32),
) -> Measured {
    let per_call = (BATCH_BYTES / size).max(1);
    let batch: Vec<TransferDesc<'_, UcxCommunicator>> = (0..per_call)
        // Like ucp_put_bw / ucp_get: the same local buffer and remote address every time.
        .map(|_| TransferDesc {
            local,
            local_offset: 0,
            remote: key,
            remote_offset: 0,
            len: size,
        })
        .collect();
    let calls = (total / (size * per_call)).max(2);
    for _ in 0..2 {
        a.transfer(ep, op, &batch, Deadline::default())
            .await
            .expect("warm-up");
    }
    let meter = ProcessCpu::with_peer(peer);
    let start = Instant::now();
    for _ in 0..calls {
        a.transfer(ep, op, &batch, Deadline::default())
            .await
            .expect("transfer");
    }
    let bytes = calls * per_call * size;
    let gbs = bytes as f64 / start.elapsed().as_secs_f64() / 1e9;
    let used = meter.used();
    (gbs, used.and_then(|u| cpu::cpu_s_per_gib(u, bytes as u64)))
}

/// The median of the runs' CPU figures (`None` unless every run has one).
fn median_cpu(v: &[Option<f64>]) -> Option<f64> {
    let all: Option<Vec<f64>> = v.iter().copied().collect();
    summary(&all?).map(|(m, ..)| m)
}

const CHILD_ENV: &str = "HMC_BENCH_CHILD_TLS";

/// The target process (like ucx_perftest's server): serves a region until stdin closes.
fn config(tls: &str, wakeup: bool) -> UcxConfig {
    let spin = std::env::var("HMC_BENCH_SPIN_US")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_micros);
    let defaults = UcxConfig::from_env();
    UcxConfig {
        direct_mapped: std::env::var_os("HMC_BENCH_DIRECT_OFF").is_none(),
        spin: spin.unwrap_or(defaults.spin),
        wakeup,
        park_max: if wakeup {
            Duration::from_millis(100)
        } else {
            Duration::from_millis(1)
        },
        ..UcxConfig::with_tls(tls)
    }
}

fn child(tls: &str) {
    let wakeup = std::env::var_os("HMC_BENCH_CHILD_NO_WAKEUP").is_none();
    let c = Arc::new(UcxCommunicator::new(config(tls, wakeup)).expect("UCX"));
    let user = RegisteredBuffer::new(
        Arc::new(HostMemory::new()),
        c.clone(),
        BATCH_BYTES,
        Access::READ_WRITE,
    )
    .expect("register");
    let ucx = c
        .alloc_registered(BATCH_BYTES, Access::READ_WRITE)
        .expect("alloc_registered");
    let desc = if std::env::var_os("HMC_BENCH_CHILD_UCXMEM").is_some() {
        c.export(&ucx).unwrap()
    } else {
        user.export().unwrap()
    };
    let hex: String = desc.encode().iter().map(|b| format!("{b:02x}")).collect();
    println!("READY {} {hex}", c.address());
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
}

/// Starts a target process; returns it with its address and region.
fn spawn_target(
    tls: &str,
    env: &[(&str, &str)],
    wakeup: bool,
    ucxmem: bool,
) -> (std::process::Child, PeerAddr, RemoteRegion) {
    let mut cmd = Command::new(std::env::current_exe().expect("bench binary"));
    cmd.envs(env.iter().copied());
    if ucxmem {
        cmd.env("HMC_BENCH_CHILD_UCXMEM", "1");
    }
    if !wakeup {
        cmd.env("HMC_BENCH_CHILD_NO_WAKEUP", "1");
    }
    let mut proc = cmd
        .env(CHILD_ENV, tls)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn target");
    let mut lines = BufReader::new(proc.stdout.take().expect("stdout")).lines();
    let line = loop {
        let l = lines.next().expect("target output").expect("read target");
        if let Some(at) = l.find("READY ") {
            break l[at + 6..].to_string();
        }
    };
    let (addr, hex) = line.split_once(' ').expect("addr and descriptor");
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect();
    (
        proc,
        addr.parse().expect("address"),
        RemoteRegion::decode(&bytes).expect("descriptor"),
    )
}

fn main() {
    if let Ok(tls) = std::env::var(CHILD_ENV) {
        child(&tls);
        return;
    }
    let quick = std::env::var_os("HMC_BENCH_QUICK").is_some();
    let only = std::env::var("HMC_BENCH_TLS").ok();
    // Bytes per measurement: TCP and emulated shared-memory RMA (user memory) move about
    // 2 GB/s here, mapped shared memory 15-55 GB/s.
    let (tcp_bytes, shm_bytes) = if quick {
        (64 << 20, 256 << 20)
    } else {
        (512 << 20, 4 << 30)
    };
    let repeats: usize = std::env::var("HMC_BENCH_REPEATS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 1 } else { 3 })
        .max(1);
    // UCX 1.13 over tcp sends RMA in UCX_TCP_TX_SEG_SIZE pieces (8 KiB by default); one
    // put of 1 MiB or more then stalls for tens to hundreds of ms (ucx_perftest: 25-80 MB/s
    // at 16 MiB), 64 KiB segments do not. UCX_ variables in this process's environment
    // reach all three processes: this one, the target and perftest.
    // perftest runs with the UCX_TCP_TX_SEG_SIZE our communicators apply by default
    // (unless the environment sets one for all three processes).
    const SEG: &[(&str, &str)] = &[("UCX_TCP_TX_SEG_SIZE", hmc_transport_ucx::TCP_TX_SEG_SIZE)];
    let seg: &'static [(&'static str, &'static str)] =
        if std::env::var_os("UCX_TCP_TX_SEG_SIZE").is_some() {
            &[]
        } else {
            SEG
        };
    type Transport = (
        &'static str,
        &'static str,
        bool,
        bool,
        usize,
        &'static [(&'static str, &'static str)],
    );
    let transports: Vec<Transport> = [
        ("tcp", "tcp", true, false, tcp_bytes, seg),
        ("tcp-ucxmem", "tcp", true, true, tcp_bytes, seg),
        ("shm", "posix,cma,self", true, false, tcp_bytes, &[][..]),
        (
            "shm-ucxmem",
            "posix,cma,self",
            true,
            true,
            shm_bytes,
            &[][..],
        ),
        (
            "shm-nowakeup",
            "posix,cma,self",
            false,
            false,
            tcp_bytes,
            &[][..],
        ),
    ]
    .into_iter()
    .filter(|(name, ..)| {
        only.as_deref().is_none_or(|o| {
            o.split(',')
                .any(|o| *name == o || (!o.contains('-') && name.starts_with(o)))
        })
    })
    .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio");
    let memory = Arc::new(HostMemory::new());
    let mut rows = Vec::new();
    for (name, tls, wakeup, ucxmem, total, env) in transports {
        // Two processes, like ucx_perftest's client and server.
        let a = Arc::new(UcxCommunicator::new(config(tls, wakeup)).expect("UCX"));
        let (mut target_proc, target_addr, target) = spawn_target(tls, env, wakeup, ucxmem);
        let peer = target_proc.id();
        let user_local =
            RegisteredBuffer::new(memory.clone(), a.clone(), BATCH_BYTES, Access::READ_WRITE)
                .expect("local");
        let ucx_local = a
            .alloc_registered(BATCH_BYTES, Access::READ_WRITE)
            .expect("alloc_registered");
        let local = if ucxmem {
            &ucx_local
        } else {
            user_local.registration()
        };
        rt.block_on(async {
            let ep = a
                .connect(&target_addr, Deadline::default())
                .await
                .expect("connect");
            let key = a.import(&ep, &target).expect("import");
            for (op, opname, test) in [
                (Op::Write, "put", "ucp_put_bw"),
                (Op::Read, "get", "ucp_get"),
            ] {
                for size in SIZES {
                    let mut row = Row {
                        tls: name,
                        op: opname,
                        size,
                        ours: Vec::new(),
                        reference: Vec::new(),
                        ours_cpu: Vec::new(),
                        reference_cpu: Vec::new(),
                    };
                    // Alternate, so both sides see the same background load.
                    for _ in 0..repeats {
                        let (g, c) = ours(&a, &ep, &key, local, op, size, (total, peer)).await;
                        row.ours.push(g);
                        row.ours_cpu.push(c);
                        let iters = (total / size).max(32);
                        if let Some((g, c)) = perftest(tls, env, test, size, iters) {
                            row.reference.push(g);
                            row.reference_cpu.push(c);
                        }
                    }
                    eprintln!(
                        "{name} {opname} {}: {:?} GB/s vs {:?}",
                        human(size),
                        row.ours,
                        row.reference
                    );
                    rows.push(row);
                }
            }
        });
        drop(target_proc.stdin.take());
        let _ = target_proc.wait();
    }
    println!(
        "shm = posix,cma,self; -ucxmem: both buffers from UcxCommunicator::alloc_registered (like ucx_perftest's); -nowakeup: UcxConfig::wakeup = false; median (min–max) of {repeats} alternated run(s); ucx_perftest: better of -O 1 and -O {WINDOW}"
    );
    println!("| row | op | size | hmc GB/s | ucx_perftest GB/s | ratio of medians |");
    println!("| --- | --- | --- | ---: | ---: | ---: |");
    for r in &rows {
        let (ours, reference) = (summary(&r.ours), summary(&r.reference));
        let ratio = match (ours, reference) {
            (Some((o, ..)), Some((x, ..))) => format!("{:.0}%", 100.0 * o / x),
            _ => "n/a".into(),
        };
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            r.tls,
            r.op,
            human(r.size),
            fmt_runs(ours),
            fmt_runs(reference),
            ratio
        );
    }
    println!("\n### CPU per GiB moved, the same cells\n");
    println!("| row | op | size | hmc GB/s | hmc CPU-s/GiB | ucx_perftest CPU-s/GiB |");
    println!("| --- | --- | --- | ---: | ---: | ---: |");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            r.tls,
            r.op,
            human(r.size),
            fmt_runs(summary(&r.ours)),
            cpu::cell(median_cpu(&r.ours_cpu), 3),
            cpu::cell(median_cpu(&r.reference_cpu), 3),
        );
    }
    println!(
        "\n{} ucx_perftest: its client and server over their whole run, start-up included.",
        cpu::CPU_NOTE
    );
}
