//! `--vs-iperf3 ROUNDS`: the large-payload echo of hmc-rpc and tonic beside iperf3 moving
//! bytes both ways on loopback (`--bidir`, one stream each way: the bytes an echo moves),
//! in alternated rounds of one run, with the median and range of each figure: the bytes
//! moved per second, hmc-rpc's rate as a share of iperf3's, and the CPU time of every
//! process of each system per GiB moved (issue 60).
//!
//! Each round measures every clients x in-flight cell of hmc-rpc and of tonic and one
//! iperf3 run; odd rounds go hmc-rpc, tonic, iperf3 and even rounds the reverse, so that a
//! drift of the shared machine's load over the run falls on all three alike. The ratios are
//! the medians of the per-round ratios, not ratios of medians.

use hmc_bench_kit::iperf3::{self, Direction, Iperf};
use hmc_bench_kit::rounds::{Spread, cell};
use hmc_core::PeerAddr;

use crate::baselines::bench_tonic;
use crate::hmc::bench_hmc;
use crate::measure::{Cell, CpuProbe, cpu_s_per_gib, fmt_size};
use crate::{Args, Tonic};

/// The share of iperf3's rate that hmc-rpc's echo is to reach (issue 60, part 3).
const TARGET_SHARE_OF_IPERF3: f64 = 0.80;

/// One round's figures of one cell (one size, clients and depth).
struct Round {
    size: usize,
    clients: usize,
    depth: usize,
    hmc: Cell,
    tonic: Option<Cell>,
    iperf: Option<Iperf>,
}

/// MB/s moved (request and response) by an echo cell.
fn moved(c: &Cell) -> f64 {
    2.0 * c.mbps
}

/// Runs `rounds` alternated rounds and prints the per-round table and the medians.
pub(crate) async fn run(
    args: &Args,
    rounds: usize,
    addr: &PeerAddr,
    server_pid: u32,
    tonic: &Tonic,
) -> Result<(), String> {
    let iperf_secs = args.seconds.round().max(1.0) as u32;
    let mut all: Vec<(usize, Round)> = Vec::new();
    for r in 1..=rounds {
        let forward = r % 2 == 1;
        eprintln!(
            "[round {r}/{rounds}] {}",
            if forward {
                "hmc-rpc, tonic, iperf3"
            } else {
                "iperf3, tonic, hmc-rpc"
            }
        );
        let mut iperf = None;
        if !forward {
            iperf = Some(iperf3_round(iperf_secs));
        }
        let cells = cells_of(args);
        let mut hmc = Vec::new();
        let mut ton = Vec::new();
        // Forward rounds run hmc-rpc's cells, then tonic's; the others the reverse.
        for pass in 0..2 {
            let hmc_now = (pass == 0) == forward;
            for &(size, clients, depth) in &cells {
                if hmc_now {
                    let cpu = CpuProbe::start(server_pid, false);
                    let mut h =
                        bench_hmc(addr, size, clients, depth, args.seconds, args.stream_crc)
                            .await?;
                    h.cpu_us_per_call = cpu.per_call(h.calls);
                    eprintln!(
                        "  hmc-rpc {} x {clients} x {depth}: {:.0} MB/s moved",
                        fmt_size(size),
                        moved(&h)
                    );
                    hmc.push(h);
                } else {
                    ton.push(tonic_cell(args, tonic, size, clients, depth));
                }
            }
        }
        if forward {
            iperf = Some(iperf3_round(iperf_secs));
        }
        let iperf = iperf.flatten();
        for (i, h) in hmc.into_iter().enumerate() {
            all.push((
                r,
                Round {
                    size: h.size,
                    clients: h.clients,
                    depth: h.depth,
                    hmc: h,
                    tonic: ton.get_mut(i).and_then(Option::take),
                    iperf,
                },
            ));
        }
    }
    print_rounds(args, rounds, &all);
    Ok(())
}

/// The (size, clients, depth) cells of the run, in the echo matrix's order.
fn cells_of(args: &Args) -> Vec<(usize, usize, usize)> {
    let mut v = Vec::new();
    for &size in &args.sizes {
        for &clients in &args.clients {
            for &depth in &args.depths {
                v.push((size, clients, depth));
            }
        }
    }
    v
}

fn tonic_cell(
    args: &Args,
    tonic: &Tonic,
    size: usize,
    clients: usize,
    depth: usize,
) -> Option<Cell> {
    let (bin, pid) = (tonic.bin.as_ref()?, tonic.pid?);
    let cpu = CpuProbe::start(pid, true);
    match bench_tonic(bin, tonic.port, size, clients, depth, args.seconds) {
        Ok(mut t) => {
            t.cpu_us_per_call = cpu.per_call(t.calls);
            eprintln!(
                "  tonic {} x {clients} x {depth}: {:.0} MB/s moved",
                fmt_size(size),
                moved(&t)
            );
            Some(t)
        }
        Err(e) => {
            eprintln!("  tonic: {e}");
            None
        }
    }
}

fn iperf3_round(secs: u32) -> Option<Iperf> {
    match iperf3::run(secs, Direction::Both) {
        Ok(i) => {
            eprintln!("  iperf3 --bidir: {:.0} MB/s moved", i.gbs * 1e3);
            Some(i)
        }
        Err(e) => {
            eprintln!("  iperf3: {e}");
            None
        }
    }
}

/// The per-round table, then one row of medians per cell.
fn print_rounds(args: &Args, rounds: usize, all: &[(usize, Round)]) {
    let f = |v: Option<f64>, d: usize| hmc_bench_kit::cpu::cell(v, d);
    println!(
        "\n## echo vs iperf3 --bidir, each round ({} s per cell; iperf3: one stream each way on loopback; MB/s moved = request + response)\n",
        args.seconds
    );
    println!(
        "| round | payload | clients | in flight | hmc MB/s moved | tonic MB/s moved | iperf3 MB/s moved | hmc / iperf3 | hmc / tonic | hmc CPU-s/GiB | tonic CPU-s/GiB | iperf3 CPU-s/GiB |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for (r, x) in all {
        let fig = Figures::of(x);
        println!(
            "| {r} | {} | {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} |",
            fmt_size(x.size),
            x.clients,
            x.depth,
            fig.hmc,
            f(fig.tonic, 0),
            f(fig.iperf, 0),
            f(fig.of_iperf, 2),
            f(fig.of_tonic, 2),
            f(fig.hmc_cpu, 3),
            f(fig.tonic_cpu, 3),
            f(fig.iperf_cpu, 3),
        );
    }
    println!("\n## echo vs iperf3 --bidir, medians of {rounds} alternated rounds (min–max)\n");
    println!(
        "| payload | clients | in flight | hmc MB/s moved | tonic MB/s moved | iperf3 MB/s moved | hmc / iperf3 (target ≥ {:.0}%) | hmc / tonic | hmc CPU-s/GiB | tonic CPU-s/GiB | iperf3 CPU-s/GiB | hmc CPU / iperf3 CPU |",
        100.0 * TARGET_SHARE_OF_IPERF3
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for (size, clients, depth) in cells_of(args) {
        let figs: Vec<Figures> = all
            .iter()
            .map(|(_, x)| x)
            .filter(|x| (x.size, x.clients, x.depth) == (size, clients, depth))
            .map(Figures::of)
            .collect();
        let s = |pick: fn(&Figures) -> Option<f64>| Spread::of(figs.iter().filter_map(pick));
        println!(
            "| {} | {clients} | {depth} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            fmt_size(size),
            cell(s(|f| Some(f.hmc)), 0),
            cell(s(|f| f.tonic), 0),
            cell(s(|f| f.iperf), 0),
            cell(s(|f| f.of_iperf), 2),
            cell(s(|f| f.of_tonic), 2),
            cell(s(|f| f.hmc_cpu), 3),
            cell(s(|f| f.tonic_cpu), 3),
            cell(s(|f| f.iperf_cpu), 3),
            cell(s(|f| f.hmc_cpu.zip(f.iperf_cpu).map(|(h, i)| h / i)), 2),
        );
    }
    println!(
        "\nCPU-s/GiB: user and system CPU time of each system's client and server processes \
         (every thread; tonic's client and iperf3's two processes reaped children), per GiB \
         moved (request and response; iperf3: bytes received both ways). Ratios are medians \
         of the per-round ratios."
    );
}

/// One round's figures of a cell, as the tables print them.
struct Figures {
    hmc: f64,
    tonic: Option<f64>,
    iperf: Option<f64>,
    of_iperf: Option<f64>,
    of_tonic: Option<f64>,
    hmc_cpu: Option<f64>,
    tonic_cpu: Option<f64>,
    iperf_cpu: Option<f64>,
}

impl Figures {
    fn of(x: &Round) -> Figures {
        let hmc = moved(&x.hmc);
        let tonic = x.tonic.as_ref().map(moved);
        let iperf = x.iperf.map(|i| i.gbs * 1e3);
        Figures {
            hmc,
            tonic,
            iperf,
            of_iperf: iperf.map(|i| hmc / i.max(f64::MIN_POSITIVE)),
            of_tonic: tonic.map(|t| hmc / t.max(f64::MIN_POSITIVE)),
            hmc_cpu: cpu_s_per_gib(&x.hmc),
            tonic_cpu: x.tonic.as_ref().and_then(cpu_s_per_gib),
            iperf_cpu: x.iperf.and_then(|i| i.cpu_s_per_gib),
        }
    }
}
