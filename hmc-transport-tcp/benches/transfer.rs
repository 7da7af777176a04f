//! `cargo bench -p hmc-transport-tcp --bench transfer [-- --quick]`: one-sided WRITE and READ from 4 KiB to 64 MiB against a target in another process, beside iperf3 on loopback in the same run.
//!
//! The target is `hmc-tcp-peer serve` (a real second process, as iperf3's server is);
//! this process connects over the control plane, imports the target's buffer, and times
//! back-to-back single-descriptor transfers of each size on one endpoint. Bandwidth is
//! bytes moved over wall time. The machines are noisy, so the whole sweep runs `ROUNDS`
//! times and each cell keeps its best round; iperf3 runs before and after the sweep and
//! keeps its best too, so both sides get the same treatment. The last lines compare the
//! 1 MiB-and-up rows with that iperf3 figure.
//!
//! Beside each rate, the CPU it took (`hmc_bench_kit::cpu`): user and system time of both
//! processes (this one and the target, every thread) over the kept round's timed loop, per
//! GiB moved and per operation; iperf3's the same for its client and server (reaped
//! children) over the bytes its server received.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmc_backend_cpu::HostMemory;
use hmc_bench_kit::cpu::{self, ProcessCpu};
use hmc_bench_kit::iperf3::{self, Direction, Iperf};
use hmc_core::{
    Access, Communicator, ConnBuffer, Deadline, Op, PeerAddr, RegisteredBuffer, RemoteRegion,
    TransferDesc,
};
use hmc_transport_tcp::{ControlPlane, ControlPlaneConfig, TcpCommunicator, TcpConfig};

const PEER: &str = env!("CARGO_BIN_EXE_hmc-tcp-peer");
const MAX: usize = 64 << 20;
const SIZES: [usize; 7] = [
    4 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
    4 << 20,
    16 << 20,
    64 << 20,
];
/// Sweeps over all sizes; each cell keeps its best.
const ROUNDS: usize = 3;
/// The share of iperf3's bandwidth the 1 MiB-and-up rows must reach.
const TARGET_SHARE: f64 = 0.70;

struct Reaper(Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One kept measurement: GB/s, and the CPU of both processes per GiB and per op.
#[derive(Clone, Copy, Default)]
struct Rate {
    gbs: f64,
    cpu_s_per_gib: Option<f64>,
    cpu_us_per_op: Option<f64>,
}

/// Times back-to-back transfers of `len` bytes; GB/s and the CPU of this process and the
/// target `peer` over the timed loop.
#[allow(clippy::too_many_arguments)]
async fn measure(
    comm: &TcpCommunicator,
    ep: &<TcpCommunicator as Communicator>::Endpoint,
    key: &<TcpCommunicator as Communicator>::RemoteKey,
    local: &RegisteredBuffer<HostMemory, TcpCommunicator>,
    op: Op,
    len: usize,
    budget: Duration,
    peer: u32,
) -> Rate {
    let d = [TransferDesc::<TcpCommunicator> {
        local: local.registration(),
        local_offset: 0,
        remote: key,
        remote_offset: 0,
        len,
    }];
    let deadline = || Deadline::after(Duration::from_secs(60));
    // Warm-up: connection and page faults out of the way.
    comm.transfer(ep, op, &d, deadline())
        .await
        .expect("warm-up");
    let cpu = ProcessCpu::with_peer(peer);
    let start = Instant::now();
    let mut n = 0u64;
    while n < 3 || start.elapsed() < budget {
        comm.transfer(ep, op, &d, deadline())
            .await
            .expect("transfer");
        n += 1;
    }
    let gbs = (n as f64 * len as f64) / start.elapsed().as_secs_f64() / 1e9;
    let used = cpu.used();
    Rate {
        gbs,
        cpu_s_per_gib: used.and_then(|u| cpu::cpu_s_per_gib(u, n * len as u64)),
        cpu_us_per_op: used.and_then(|u| cpu::cpu_us_per_op(u, n)),
    }
}

/// The better of two rates, with its own CPU figures.
fn best(a: Rate, b: Rate) -> Rate {
    if b.gbs > a.gbs { b } else { a }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this binary without
    // it, and then it only checks that every size moves both ways, quickly and without
    // figures.
    let smoke = !args.iter().any(|a| a == "--bench");
    let quick = args.iter().any(|a| a == "--quick");
    let budget = match (smoke, quick) {
        (true, _) => Duration::ZERO,
        (false, true) => Duration::from_millis(200),
        (false, false) => Duration::from_secs(1),
    };
    let iperf_secs = if quick { 1 } else { 3 };
    let rounds = if smoke || quick { 1 } else { ROUNDS };
    let iperf_before = if smoke {
        Err("not run in a smoke run".to_string())
    } else {
        iperf3::run(iperf_secs, Direction::One)
    };

    let mut server = Command::new(PEER)
        .args([
            "serve",
            "--listen",
            "tcp://127.0.0.1:0",
            "--len",
            &MAX.to_string(),
            "--exit-after",
            "0",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start hmc-tcp-peer serve");
    let mut out = BufReader::new(server.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).expect("server's first line");
    // Keep reading, so the server never writes into a closed pipe.
    std::thread::spawn(move || out.lines().map_while(Result::ok).for_each(drop));
    let peer_pid = server.id();
    let _server = Reaper(server);
    let control_addr: PeerAddr = first
        .split("control plane at ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line from the server: {first:?}"));

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Spawned, so the transfers run on a runtime worker that drives the I/O itself, as in
    // a server; `block_on`'s own thread would add a cross-thread wakeup per readiness event.
    let run = rt.spawn(async move {
        let soon = || Deadline::after(Duration::from_secs(20));
        let control = ControlPlane::bind(1, &[], ControlPlaneConfig::default())
            .await
            .unwrap();
        control.connect(0, &control_addr, soon()).await.unwrap();
        let data: PeerAddr = control.recv(0, soon()).await.unwrap();
        let region: RemoteRegion = control.recv(0, soon()).await.unwrap();
        let any = "tcp://127.0.0.1:0".parse().unwrap();
        let comm = Arc::new(TcpCommunicator::bind(&any, TcpConfig::default()).unwrap());
        let ep = comm.connect(&data, soon()).await.unwrap();
        let key = comm.import(&ep, &region).unwrap();
        let local = RegisteredBuffer::new(
            Arc::new(HostMemory::new()),
            comm.clone(),
            MAX,
            Access::READ_WRITE,
        )
        .unwrap();
        let mut rows: Vec<(usize, Rate, Rate)> = SIZES
            .iter()
            .map(|&len| (len, Rate::default(), Rate::default()))
            .collect();
        let p = peer_pid;
        for _ in 0..rounds {
            for (len, w, r) in rows.iter_mut() {
                let l = *len;
                *w = best(
                    *w,
                    measure(&comm, &ep, &key, &local, Op::Write, l, budget, p).await,
                );
                *r = best(
                    *r,
                    measure(&comm, &ep, &key, &local, Op::Read, l, budget, p).await,
                );
            }
        }
        rows
    });
    let rows = rt.block_on(run).expect("benchmark task");
    drop(rt);
    if smoke {
        println!(
            "smoke run: every size from 4 KiB to 64 MiB moved both ways; `cargo bench` gives figures"
        );
        return;
    }
    let iperf = match (iperf_before, iperf3::run(iperf_secs, Direction::One)) {
        (Ok(a), Ok(b)) => Ok(if b.gbs > a.gbs { b } else { a }),
        (Ok(a), Err(_)) | (Err(_), Ok(a)) => Ok(a),
        (Err(e), Err(_)) => Err(e),
    };
    match &iperf {
        Ok(g) => {
            println!(
                "iperf3 loopback, one stream, best of two runs: {:.2} GB/s",
                g.gbs
            );
            println!(
                "iperf3 CPU, client and server, that run: {} CPU-s/GiB",
                cpu::cell(g.cpu_s_per_gib, 3)
            );
        }
        Err(e) => println!("iperf3: {e}"),
    }
    println!("hmc TCP one-sided transfers, best of {rounds} round(s), target in another process:");

    println!(
        "\n| size | WRITE GB/s | READ GB/s | WRITE / iperf3 | READ / iperf3 | WRITE CPU-s/GiB | READ CPU-s/GiB | iperf3 CPU-s/GiB | WRITE CPU us/op | READ CPU us/op |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let share = |g: f64| match &iperf {
        Ok(i) => format!("{:.0}%", 100.0 * g / i.gbs),
        Err(_) => "n/a".into(),
    };
    let iperf_cpu = cpu::cell(iperf.as_ref().ok().and_then(|i| i.cpu_s_per_gib), 3);
    for (len, w, r) in &rows {
        let size = if *len >= 1 << 20 {
            format!("{} MiB", len >> 20)
        } else {
            format!("{} KiB", len >> 10)
        };
        println!(
            "| {size} | {:.2} | {:.2} | {} | {} | {} | {} | {iperf_cpu} | {} | {} |",
            w.gbs,
            r.gbs,
            share(w.gbs),
            share(r.gbs),
            cpu::cell(w.cpu_s_per_gib, 3),
            cpu::cell(r.cpu_s_per_gib, 3),
            cpu::cell(w.cpu_us_per_op, 1),
            cpu::cell(r.cpu_us_per_op, 1),
        );
    }
    println!(
        "\n{} iperf3: its client and server over its best run.",
        cpu::CPU_NOTE
    );
    if let Ok(Iperf { gbs: i, .. }) = iperf {
        let worst = rows
            .iter()
            .filter(|(len, _, _)| *len >= 1 << 20)
            .flat_map(|(_, w, r)| [w.gbs, r.gbs])
            .fold(f64::INFINITY, f64::min);
        let verdict = if worst >= TARGET_SHARE * i {
            "meets"
        } else {
            "MISSES"
        };
        println!(
            "\nslowest row at 1 MiB and above: {worst:.2} GB/s = {:.0}% of iperf3 ({i:.2} GB/s); {verdict} the {:.0}% target",
            100.0 * worst / i,
            100.0 * TARGET_SHARE
        );
    }
}
