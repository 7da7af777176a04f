//! `cargo xtask bench engine`: one-sided WRITE and READ between two processes on loopback,
//! hmc-engine over the TCP transport side by side with Mooncake Transfer Engine (its tcp
//! protocol, through its Python API, one op at a time as our sync path), in one run.
//!
//! Rows: sync single ops at each size (ops/s, GB/s, ratio to Mooncake; each cell alternates
//! the systems round by round and keeps their median rounds); async (8 in flight);
//! the engine against the same transfers through the bare `Communicator` (facade overhead);
//! and 64 scattered 128 KiB KV blocks against one contiguous 8 MiB transfer, pulled (READ)
//! and pushed (WRITE).
//!
//! Arguments: `--sizes 4096,65536,1048576,16777216 --seconds 2 --mooncake-python PATH`
//! (Mooncake is skipped with a note when the interpreter is absent). Internal: `--target`.
//! With `--conn-sweep [1,2,…,1024,max]` it runs, instead, the connection sweep
//! (`conn_sweep`): WRITE ops/s and the target's memory per connected engine from one
//! initiator engine to as many as the machine allows. Over TCP, the sync rows are also
//! set beside the floor of this machine (`tcp_floor`): a spinning ping-pong of the same
//! shapes between two processes with no runtime or protocol. `--floor-variants` prints,
//! instead of the rows, that floor under each way of driving the sockets it tried (larger
//! socket buffers, sends in pieces, blocking calls). Internal: `--tcp-floor`.
//! `--floor-client LEN` measures that floor on request for another bench (the Python one):
//! for each line `read|write BYTES SECONDS` on stdin it prints the µs per op.
//!
//! Beside each rate, the CPU it took (`hmc_bench_kit::cpu`): user and system time of every
//! process of that system over each round's timed loop (hmc: this process and its target;
//! Mooncake: its initiator and its target; the floor: this process, whose thread drives the
//! floor's client, and the floor's target), per operation and per GiB moved, the median of
//! the rounds.

#[path = "support/conn_sweep.rs"]
mod conn_sweep;
#[path = "support/mooncake.rs"]
mod mooncake;
#[path = "support/tcp_floor.rs"]
mod tcp_floor;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmc_bench_kit::cpu::{self, Process, ProcessCpu};
use hmc_core::{Access, Communicator, Deadline, Op, RemoteRegion, TransferDesc};
use hmc_engine::{Engine, EngineConfig, MemDesc, MemType, TransferOp, TransferOpDesc};
use hmc_transport_tcp::TcpCommunicator;

const T: Duration = Duration::from_secs(30);

struct Args {
    sizes: Vec<usize>,
    seconds: f64,
    mooncake_python: Option<String>,
    target: bool,
    /// `TcpConfig::busy_poll` of both engines' transports, µs (default: the library's).
    busy_poll_us: Option<u64>,
    /// `tcp` (default), `ucx` (UCX's transports from `UCX_TLS`, e.g. `posix,cma,self`) or
    /// `shm` (`hmc-transport-shm`: cross-memory attach into the target's user memory).
    transport: String,
    /// The connection sweep's steps, instead of the rows.
    conn_sweep: Option<hmc_bench_kit::sweep::SweepPlan>,
    /// Bytes of each WRITE in the sweep.
    sweep_size: usize,
    /// Instead of the rows: the TCP floor under each of its variants (`tcp_floor`).
    floor_variants: bool,
}

fn args() -> Args {
    let mut a = Args {
        sizes: vec![4096, 65536, 1 << 20, 16 << 20],
        seconds: 2.0,
        mooncake_python: None,
        target: false,
        busy_poll_us: None,
        transport: "tcp".into(),
        conn_sweep: None,
        sweep_size: 64,
        floor_variants: false,
    };
    let mut it = std::env::args().skip(1).peekable();
    while let Some(k) = it.next() {
        match k.as_str() {
            "--sizes" => {
                a.sizes = it
                    .next()
                    .expect("--sizes N,N")
                    .split(',')
                    .map(|s| s.parse().expect("a size in bytes"))
                    .collect()
            }
            "--seconds" => a.seconds = it.next().expect("--seconds S").parse().expect("seconds"),
            "--mooncake-python" => a.mooncake_python = it.next(),
            "--quick" => a.seconds = 0.5,
            "--target" => a.target = true,
            "--tcp-floor" => {
                let len = it.next().expect("--tcp-floor LEN VARIANT");
                let v = it.next().expect("--tcp-floor LEN VARIANT");
                tcp_floor::serve(len.parse().expect("bytes"), v.parse().expect("variant"));
                std::process::exit(0);
            }
            "--floor-client" => {
                tcp_floor::client(
                    it.next()
                        .expect("--floor-client LEN")
                        .parse()
                        .expect("bytes"),
                );
                std::process::exit(0);
            }
            "--floor-variants" => a.floor_variants = true,
            "--transport" => a.transport = it.next().expect("--transport tcp|ucx|shm"),
            "--conn-sweep" => {
                // The list is optional: the default steps when the next word is a flag.
                let list = match it.next_if(|v| !v.starts_with("--")) {
                    Some(v) => v,
                    None => hmc_bench_kit::sweep::DEFAULT_STEPS.to_string(),
                };
                a.conn_sweep =
                    Some(hmc_bench_kit::sweep::SweepPlan::parse(&list).expect("--conn-sweep"));
            }
            "--sweep-size" => {
                a.sweep_size = it.next().expect("--sweep-size N").parse().expect("bytes")
            }
            "--busy-poll-us" => {
                a.busy_poll_us = Some(it.next().expect("--busy-poll-us N").parse().expect("µs"))
            }
            // cargo bench passes --bench.
            _ => {}
        }
    }
    a
}

/// A TCP transport (an error rather than a panic: the connection sweep stops on it).
fn open_tcp(busy_poll_us: Option<u64>) -> Result<TcpCommunicator, String> {
    let mut config = hmc_transport_tcp::TcpConfig {
        // The connection sweep measures the machine, not the transport's default limit.
        max_accepted_connections: 1 << 20,
        ..Default::default()
    };
    if let Some(us) = busy_poll_us {
        config.busy_poll = Duration::from_micros(us);
    }
    TcpCommunicator::bind(&"tcp://127.0.0.1:0".parse().unwrap(), config)
        .map_err(|e| format!("TCP transport: {e}"))
}

fn open_ucx() -> Result<hmc_transport_ucx::UcxCommunicator, String> {
    hmc_transport_ucx::UcxCommunicator::new(hmc_transport_ucx::UcxConfig {
        bind: ([127, 0, 0, 1], 0).into(),
        ..hmc_transport_ucx::UcxConfig::from_env()
    })
    .map_err(|e| format!("UCX (install libucx0, or run with --transport tcp): {e}"))
}

fn open_shm() -> Result<hmc_transport_shm::ShmCommunicator, String> {
    hmc_transport_shm::ShmCommunicator::bind(Default::default())
        .map_err(|e| format!("the same-host transport: {e}"))
}

/// Bytes each side registers: room for the largest op, and for the KV rows (two 8 MiB
/// areas).
fn buffer_len(sizes: &[usize]) -> usize {
    sizes.iter().copied().max().unwrap_or(0).max(16 << 20)
}

/// The target process: an engine with one registered buffer; prints its name, the
/// buffer's address, and the buffer's exported region (for the bare-communicator rows).
async fn target<C: Communicator>(len: usize, comm: C) {
    let comm = Arc::new(comm);
    let mut config = EngineConfig::default();
    // The connection sweep measures the machine, not the engine's default limit.
    config.rpc.max_connections = 1 << 20;
    let engine = Engine::initialize(comm.clone(), "127.0.0.1", config)
        .await
        .unwrap();
    let buf = vec![1u8; len];
    // SAFETY: `buf` lives until the process exits.
    unsafe {
        engine
            .register_mem(
                MemDesc {
                    addr: buf.as_ptr() as u64,
                    len,
                },
                MemType::Host,
                hmc_engine::Access::READ_WRITE,
            )
            .unwrap();
    }
    // A second registration of the same memory for the bare rows (the engine's own key
    // stays internal).
    let region = hmc_core::Region {
        device: hmc_core::Device::HOST,
        addr: buf.as_ptr() as u64,
        len,
    };
    // SAFETY: as above.
    let bare = unsafe { comm.register(region, Access::READ_WRITE).unwrap() };
    let hex: String = comm
        .export(&bare)
        .unwrap()
        .encode()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    println!(
        "READY {} {} {} {hex}",
        engine.name(),
        buf.as_ptr() as u64,
        comm.address()
    );
    std::io::stdout().flush().unwrap();
    // Serve until the parent closes our stdin.
    tokio::task::spawn_blocking(|| {
        let mut s = String::new();
        let _ = std::io::stdin().read_line(&mut s);
    })
    .await
    .unwrap();
    drop(bare);
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Runs `op` until `secs` passed (at least 3 times); returns (ops, seconds).
async fn timed<F, Fut>(secs: f64, mut op: F) -> (u64, f64)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    op().await; // warm-up
    let start = Instant::now();
    let mut n = 0;
    while n < 3 || start.elapsed().as_secs_f64() < secs {
        op().await;
        n += 1;
    }
    (n, start.elapsed().as_secs_f64())
}

/// Rounds per sync cell, alternated between the systems (see `run`).
const ROUNDS: usize = 3;

/// Pairs of rounds (engine, then the bare communicator) per facade-overhead cell.
const FACADE_PAIRS: usize = 9;

/// The median of `v` (its upper middle for an even count).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The round of median time per op among `(ops, seconds)` rounds.
fn median_round(mut r: Vec<(u64, f64)>) -> (u64, f64) {
    r.sort_by(|a, b| (a.1 / a.0 as f64).total_cmp(&(b.1 / b.0 as f64)));
    r[r.len() / 2]
}

struct Row {
    what: String,
    op: &'static str,
    size: usize,
    ops: u64,
    secs: f64,
    /// CPU-microseconds per op of every process of the system (the median of the rounds).
    cpu_us: Option<f64>,
}

/// CPU-microseconds per op that the processes of `cpu` used over `ops` ops since it
/// started (`None` where one could not be read).
fn cpu_per_op(cpu: &ProcessCpu, ops: u64) -> Option<f64> {
    cpu.used().and_then(|u| cpu::cpu_us_per_op(u, ops))
}

/// The median of the rounds' figures, where every round has one.
fn median_cpu(v: Vec<Option<f64>>) -> Option<f64> {
    let all: Option<Vec<f64>> = v.into_iter().collect();
    all.filter(|v| !v.is_empty()).map(median)
}

/// CPU-seconds per GiB from CPU-microseconds per op of `size` bytes.
fn per_gib(cpu_us: Option<f64>, size: usize) -> Option<f64> {
    cpu_us.and_then(|us| cpu::s_per_gib_from_us_per_op(us, size as u64))
}

impl Row {
    /// The CPU cells: CPU-s/GiB and CPU us/op.
    fn cpu_cells(&self) -> (String, String) {
        (
            cpu::cell(per_gib(self.cpu_us, self.size), 3),
            cpu::cell(self.cpu_us, 1),
        )
    }
    fn ops_s(&self) -> f64 {
        self.ops as f64 / self.secs
    }
    fn gbs(&self) -> f64 {
        self.ops as f64 * self.size as f64 / self.secs / 1e9
    }
    fn us(&self) -> f64 {
        self.secs * 1e6 / self.ops as f64
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let a = args();
    let len = buffer_len(&a.sizes);
    let poll = a.busy_poll_us;
    match (a.target, a.transport.as_str()) {
        (true, "ucx") => target(len, open_ucx().unwrap()).await,
        (true, "shm") => target(len, open_shm().unwrap()).await,
        (true, _) => target(len, open_tcp(poll).unwrap()).await,
        (false, "ucx") => run(a, open_ucx).await,
        (false, "shm") => run(a, open_shm).await,
        (false, _) => run(a, move || open_tcp(poll)).await,
    }
}

/// The target process (this bench with `--target`), and what it printed once ready: its
/// engine's name, its buffer's address, its data-plane address and the buffer's region.
struct TargetProc {
    child: std::process::Child,
    name: String,
    remote_buf: u64,
    dp: hmc_core::PeerAddr,
    region: RemoteRegion,
}

fn spawn_target(a: &Args) -> TargetProc {
    let me = std::env::current_exe().unwrap();
    let poll_args: Vec<String> = a
        .busy_poll_us
        .map(|us| vec!["--busy-poll-us".to_string(), us.to_string()])
        .unwrap_or_default();
    let mut child = Command::new(me)
        .arg("--target")
        .args(["--transport", &a.transport])
        .args(&poll_args)
        .args([
            "--sizes",
            &a.sizes
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(","),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(f.first(), Some(&"READY"), "target said `{line}`");
    TargetProc {
        name: f[1].to_string(),
        remote_buf: f[2].parse::<u64>().unwrap(),
        dp: f[3].parse().unwrap(),
        region: RemoteRegion::decode(&unhex(f[4])).unwrap(),
        child,
    }
}

async fn run<C: Communicator>(a: Args, open: impl Fn() -> Result<C, String>) {
    if let Some(plan) = &a.conn_sweep {
        return conn_sweep::run(&a, plan, open).await;
    }
    if a.floor_variants {
        return tcp_floor::variants(&a.sizes, a.seconds);
    }
    let len = buffer_len(&a.sizes);
    let TargetProc {
        mut child,
        name,
        remote_buf,
        dp,
        region,
    } = spawn_target(&a);
    let target_pid = child.id();

    let comm = Arc::new(open().unwrap());
    let engine = Engine::initialize(comm.clone(), "127.0.0.1", EngineConfig::default())
        .await
        .unwrap();
    let local = vec![2u8; len];
    let local_addr = local.as_ptr() as u64;
    // SAFETY: `local` outlives the engine's use of it (the process ends after the rows).
    unsafe {
        engine
            .register_mem(
                MemDesc {
                    addr: local_addr,
                    len,
                },
                MemType::Host,
                hmc_engine::Access::READ_WRITE,
            )
            .unwrap();
    }
    engine.connect(&name, T).await.unwrap();

    // The sync rows: each cell alternates hmc-engine, Mooncake and (over TCP) the floor,
    // ROUNDS rounds of a third of `--seconds` each, and keeps each system's median round.
    let mut mc = match &a.mooncake_python {
        None => {
            eprintln!("note: no --mooncake-python; the Mooncake column is empty");
            None
        }
        Some(py) => mooncake::Mooncake::start(py, &a.sizes, len)
            .map_err(|e| eprintln!("note: Mooncake skipped: {e}"))
            .ok(),
    };
    let mut floor_proc =
        (a.transport == "tcp").then(|| tcp_floor::Floor::start(len, tcp_floor::Variant::default()));
    let (mut rows, mut mc_rows, mut floor) = (Vec::new(), Vec::new(), Vec::new());
    let round = a.seconds / ROUNDS as f64;
    for (op, top) in [("WRITE", TransferOp::Write), ("READ", TransferOp::Read)] {
        for &size in &a.sizes {
            eprintln!("{op} {size} B: hmc-engine, Mooncake, TCP floor; {ROUNDS} rounds");
            let d = [TransferOpDesc {
                local_addr,
                remote_addr: remote_buf,
                len: size,
            }];
            let (mut h, mut m, mut f) = (Vec::new(), Vec::new(), Vec::new());
            let (mut hc, mut mcc, mut fc) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..ROUNDS {
                let (e, n) = (&engine, &name);
                let c = ProcessCpu::with_peer(target_pid);
                let r = timed(round, || async move {
                    e.transfer(n, top, &d, T).await.unwrap();
                })
                .await;
                // `timed` runs one op of warm-up before its loop.
                hc.push(cpu_per_op(&c, r.0 + 1));
                h.push(r);
                if let Some(p) = mc.as_mut() {
                    let pids = p.pids().map(Process::Pid);
                    let c = ProcessCpu::start(&pids);
                    match p.step(op == "WRITE", size, round) {
                        Ok(r) => {
                            mcc.push(cpu_per_op(&c, r.0 + 1));
                            m.push(r);
                        }
                        Err(e) => {
                            eprintln!("note: Mooncake dropped: {e}");
                            mc = None;
                        }
                    }
                }
                if let Some(fp) = floor_proc.as_mut() {
                    let c = ProcessCpu::with_peer(fp.pid());
                    let (ops, secs) = fp.timed(op == "READ", size, round);
                    fc.push(cpu_per_op(&c, ops + 1));
                    f.push(secs * 1e6 / ops.max(1) as f64);
                }
            }
            let row = |what: &str, (ops, secs), cpu_us| Row {
                what: what.into(),
                op,
                size,
                ops,
                secs,
                cpu_us,
            };
            rows.push(row("hmc-engine", median_round(h), median_cpu(hc)));
            if m.len() == ROUNDS {
                mc_rows.push(row("mooncake", median_round(m), median_cpu(mcc)));
            }
            if !f.is_empty() {
                floor.push((op, size, median(f), median_cpu(fc)));
            }
        }
    }
    drop(mc);
    drop(floor_proc);

    // The same transfers through the bare communicator: its own endpoint and key.
    let bare_comm = open().unwrap();
    let ep = bare_comm.connect(&dp, Deadline::after(T)).await.unwrap();
    let key = bare_comm.import(&ep, &region).unwrap();
    let lreg = {
        let r = hmc_core::Region {
            device: hmc_core::Device::HOST,
            addr: local_addr,
            len,
        };
        // SAFETY: as for the engine's registration.
        unsafe { bare_comm.register(r, Access::READ_WRITE).unwrap() }
    };
    // Facade overhead: engine and bare WRITEs alternated, three rounds each; medians.
    let mut overhead = Vec::new();
    for &size in &a.sizes {
        eprintln!("engine vs bare Communicator WRITE {size} B");
        let b = [TransferDesc::<C> {
            local: &lreg,
            local_offset: 0,
            remote: &key,
            remote_offset: 0,
            len: size,
        }];
        let d = [TransferOpDesc {
            local_addr,
            remote_addr: remote_buf,
            len: size,
        }];
        let (mut eng, mut raw) = (Vec::new(), Vec::new());
        for _ in 0..FACADE_PAIRS {
            let (e, n) = (&engine, &name);
            let (ops, secs) = timed(a.seconds / FACADE_PAIRS as f64, || async move {
                e.transfer(n, TransferOp::Write, &d, T).await.unwrap();
            })
            .await;
            eng.push(secs * 1e6 / ops as f64);
            let (c, ep, b) = (&bare_comm, &ep, &b);
            let (ops, secs) = timed(a.seconds / FACADE_PAIRS as f64, || async move {
                c.transfer(ep, Op::Write, b, Deadline::after(T))
                    .await
                    .unwrap();
            })
            .await;
            raw.push(secs * 1e6 / ops as f64);
        }
        // The overhead is the median of the pairs' differences: neighbouring rounds share
        // the host's placement of the vCPUs, which moves the op by more than the facade.
        let diffs = eng.iter().zip(&raw).map(|(e, r)| e - r).collect();
        overhead.push((size, median(eng), median(raw), median(diffs)));
    }

    // Async: 8 requests in flight.
    let mut asyncs = Vec::new();
    for &size in a.sizes.iter().filter(|&&s| s <= 1 << 20) {
        eprintln!("hmc-engine async x8 WRITE {size} B");
        let e = &engine;
        let n = &name;
        let c = ProcessCpu::with_peer(target_pid);
        let (ops, secs) = timed(a.seconds, || async move {
            let reqs: Vec<_> = (0..8u64)
                .map(|i| {
                    e.transfer_async(
                        n,
                        TransferOp::Write,
                        vec![TransferOpDesc {
                            local_addr: local_addr + i * size as u64,
                            remote_addr: remote_buf + i * size as u64,
                            len: size,
                        }],
                        T,
                    )
                    .unwrap()
                })
                .collect();
            for r in reqs {
                assert!(matches!(
                    r.wait().await,
                    hmc_engine::TransferStatus::Completed
                ));
            }
        })
        .await;
        asyncs.push(Row {
            what: "async x8".into(),
            op: "WRITE",
            size,
            ops: ops * 8,
            secs,
            // The warm-up's 8 ops included.
            cpu_us: cpu_per_op(&c, (ops + 1) * 8),
        });
    }

    // KV: 64 scattered 128 KiB blocks (every other block, in reverse order at the
    // target) against one contiguous 8 MiB transfer.
    let block = 128usize << 10;
    let scattered: Vec<TransferOpDesc> = (0..64u64)
        .map(|i| TransferOpDesc {
            local_addr: local_addr + i * 2 * block as u64 % (16 << 20),
            remote_addr: remote_buf + (63 - i) * 2 * block as u64 % (16 << 20),
            len: block,
        })
        .collect();
    let contiguous = [TransferOpDesc {
        local_addr,
        remote_addr: remote_buf,
        len: 8 << 20,
    }];
    // READ (a decoder pulling) and WRITE (a prefill node pushing), the two shapes
    // alternated round by round (medians of 3).
    let mut kv = Vec::new();
    for (op, op_name) in [(TransferOp::Read, "READ"), (TransferOp::Write, "WRITE")] {
        let shapes = [
            ("64 x 128 KiB scattered", &scattered[..]),
            ("8 MiB contiguous", &contiguous[..]),
        ];
        let mut rounds: [Vec<(u64, f64)>; 2] = Default::default();
        let mut cpus: [Vec<Option<f64>>; 2] = Default::default();
        for _ in 0..3 {
            for (((what, descs), r), cr) in shapes.iter().zip(&mut rounds).zip(&mut cpus) {
                eprintln!("KV {op_name} {what}");
                let (e, n) = (&engine, &name);
                let c = ProcessCpu::with_peer(target_pid);
                let t = timed(a.seconds / 3.0, || async move {
                    e.transfer(n, op, descs, T).await.unwrap();
                })
                .await;
                cr.push(cpu_per_op(&c, t.0 + 1));
                r.push(t);
            }
        }
        for (((what, _), r), cr) in shapes.iter().zip(rounds).zip(cpus) {
            let (ops, secs) = median_round(r);
            kv.push(Row {
                what: (*what).into(),
                op: op_name,
                size: 8 << 20,
                ops,
                secs,
                cpu_us: median_cpu(cr),
            });
        }
    }
    drop(child.stdin.take());
    let _ = child.wait();

    let mc = mc_rows;

    println!(
        "## hmc-engine ({} transport{}) vs Mooncake Transfer Engine (tcp), sync single ops, two processes on loopback (alternated rounds, medians of 3)\n",
        a.transport,
        std::env::var("UCX_TLS")
            .ok()
            .filter(|_| a.transport == "ucx")
            .map(|t| format!(", UCX_TLS={t}"))
            .unwrap_or_default()
    );
    println!(
        "| op | size | hmc ops/s | hmc GB/s | hmc us/op | Mooncake ops/s | Mooncake GB/s | ops ratio | hmc CPU-s/GiB | Mooncake CPU-s/GiB | hmc CPU us/op | Mooncake CPU us/op |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for r in &rows {
        let m = mc.iter().find(|m| m.op == r.op && m.size == r.size);
        let (hg, ho) = r.cpu_cells();
        let (mg, mo) = m.map_or(("-".into(), "-".into()), Row::cpu_cells);
        println!(
            "| {} | {} | {:.0} | {:.2} | {:.1} | {} | {} | {} | {hg} | {mg} | {ho} | {mo} |",
            r.op,
            r.size,
            r.ops_s(),
            r.gbs(),
            r.us(),
            m.map_or("-".into(), |m| format!("{:.0}", m.ops_s())),
            m.map_or("-".into(), |m| format!("{:.2}", m.gbs())),
            m.map_or("-".into(), |m| format!("{:.2}x", r.ops_s() / m.ops_s())),
        );
    }
    println!(
        "\n{} hmc: this process and its target; Mooncake: its initiator and its target.",
        cpu::CPU_NOTE
    );
    if !floor.is_empty() {
        println!(
            "\n## the same sync ops vs this machine's TCP floor (two processes spinning on one connection, no runtime, no protocol)\n"
        );
        println!(
            "| op | size | floor us/op | hmc us/op | hmc / floor | Mooncake us/op | Mooncake / floor | floor CPU-s/GiB | hmc CPU-s/GiB | Mooncake CPU-s/GiB | floor CPU us/op | hmc CPU / floor CPU |"
        );
        println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
        for &(op, size, f, fc) in &floor {
            let Some(r) = rows.iter().find(|r| r.op == op && r.size == size) else {
                continue;
            };
            let m = mc.iter().find(|m| m.op == op && m.size == size);
            println!(
                "| {op} | {size} | {f:.1} | {:.1} | {:.2}x | {} | {} | {} | {} | {} | {} | {} |",
                r.us(),
                r.us() / f,
                m.map_or("-".into(), |m| format!("{:.1}", m.us())),
                m.map_or("-".into(), |m| format!("{:.2}x", m.us() / f)),
                cpu::cell(per_gib(fc, size), 3),
                r.cpu_cells().0,
                m.map_or("-".into(), |m| m.cpu_cells().0),
                cpu::cell(fc, 1),
                match (r.cpu_us, fc) {
                    (Some(h), Some(f)) if f > 0.0 => format!("{:.2}x", h / f),
                    _ => "-".into(),
                },
            );
        }
        println!(
            "\nThe floor's CPU: this process (whose thread drives the floor's client) and the floor's target."
        );
    }
    println!(
        "\n## facade overhead: engine vs the bare Communicator (WRITE; {FACADE_PAIRS} alternated pairs of rounds; medians, the overhead the median of the pairs' differences)\n"
    );
    println!("| size | engine us/op | bare us/op | overhead us | overhead % |");
    println!("| --- | --- | --- | --- | --- |");
    for (size, e, b, d) in &overhead {
        println!(
            "| {size} | {e:.1} | {b:.1} | {d:.1} | {:.1}% |",
            d / b * 100.0
        );
    }
    println!("\n## async, 8 in flight (WRITE)\n");
    println!("| size | ops/s | GB/s | CPU-s/GiB | CPU us/op |");
    println!("| --- | --- | --- | --- | --- |");
    for r in &asyncs {
        let (g, o) = r.cpu_cells();
        println!(
            "| {} | {:.0} | {:.2} | {g} | {o} |",
            r.size,
            r.ops_s(),
            r.gbs()
        );
    }
    println!(
        "\n## KV blocks: 64 scattered 128 KiB blocks vs one 8 MiB transfer (alternated rounds, medians of 3)\n"
    );
    println!("| op | transfer | GB/s | share of contiguous | CPU-s/GiB |");
    println!("| --- | --- | --- | --- | --- |");
    for pair in kv.chunks(2) {
        let contiguous = pair.last().map(|r| r.gbs()).unwrap_or(1.0);
        for r in pair {
            println!(
                "| {} | {} | {:.2} | {:.0}% | {} |",
                r.op,
                r.what,
                r.gbs(),
                r.gbs() / contiguous * 100.0,
                r.cpu_cells().0
            );
        }
    }
}
