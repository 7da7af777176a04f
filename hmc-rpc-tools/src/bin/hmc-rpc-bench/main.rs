//! `hmc-rpc-bench`: echo throughput and latency over a matrix of payload size x clients x
//! pipeline depth, every response verified, side by side with a raw TCP ping-pong baseline
//! and the tonic (gRPC) peer; prints a markdown table with ratios and writes CSV. With
//! `--data-planes tcp,ucx` it adds HMC_BUFFER rows (a server started with `--data-plane`)
//! beside the TCP_STREAM path and, for UCX, `ucx_perftest -t tag_bw` on the same `UCX_TLS`
//! (with perftest's default endpoints and with peer error handling, `-e`, as ours). With
//! `--conn-sweep` it measures, instead, RPC/s and the server's memory per idle connection
//! from one connection to as many as the machine allows (`sweep`). With `--vs-iperf3 N` it
//! runs N alternated rounds of the echo cells of hmc-rpc and tonic and of iperf3 moving
//! bytes both ways, and prints medians (`vs_iperf3`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use clap::Parser;
use hmc_core::PeerAddr;
use hmc_rpc_tools::plane::DataPlaneChoice;

mod baselines;
mod data_planes;
mod hmc;
mod measure;
mod raw_sweep;
mod sweep;
mod vs_iperf3;

use baselines::{
    PIPELINE_DEPTH, Proc, RAW_BATCH_MAX, bench_raw_tcp, bench_raw_tcp_processes, bench_tonic,
    free_port, raw_echo_server, start_server, wait_port,
};
use data_planes::{TagBw, bench_data_planes};
use hmc::{bench_direct, bench_hmc};
use measure::{
    C2cMarks, Cell, CpuProbe, cpu_s_per_gib, fmt_c2c, fmt_size, idle_conn_kib,
    oversubscription_note,
};

#[derive(Parser, Debug)]
#[command(about = "HMC RPC echo benchmark beside raw TCP and tonic")]
struct Args {
    /// Payload sizes in bytes, comma-separated.
    #[arg(long, default_value = "64,4096,1048576", value_delimiter = ',')]
    sizes: Vec<usize>,
    /// Client connections, comma-separated.
    #[arg(long, default_value = "1,8", value_delimiter = ',')]
    clients: Vec<usize>,
    /// Calls in flight per client (pipeline depth), comma-separated.
    #[arg(long, default_value = "1,8", value_delimiter = ',')]
    depths: Vec<usize>,
    /// Seconds per cell.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// The hmc-rpc-server binary (default: next to this one).
    #[arg(long)]
    server_bin: Option<PathBuf>,
    /// Server worker threads.
    #[arg(long, default_value_t = 2)]
    server_workers: usize,
    /// The tonic-echo peer binary (default: $HMC_TONIC_ECHO, else
    /// tgt/tonic/release/tonic-echo); skipped with a note when absent.
    #[arg(long)]
    tonic_bin: Option<PathBuf>,
    /// Skip the tonic peer.
    #[arg(long)]
    no_tonic: bool,
    /// CRC32C on hmc-rpc's DATA chunks (both directions). Off by default, as in the
    /// library (`ConnConfig::stream_crc`): TCP's checksum covers them, as with gRPC.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    stream_crc: bool,
    /// Worker threads of the hmc-rpc client runtime (0: a current-thread runtime). By
    /// default tokio's default multi-thread runtime (one worker per CPU), which is what
    /// `#[tokio::main]` gives a user and what the tonic peer's client uses.
    #[arg(long)]
    client_threads: Option<usize>,
    /// Where to write the CSV.
    #[arg(long, default_value = "target/hmc-rpc-bench.csv")]
    csv: PathBuf,
    /// Data planes for HMC_BUFFER rows, comma-separated (`tcp`, `ucx`, or a transport
    /// plugin's name on `HMC_PLUGIN_PATH`); none by default.
    #[arg(long, value_delimiter = ',', value_parser = DataPlaneChoice::parse)]
    data_planes: Vec<DataPlaneChoice>,
    /// Payload sizes of the HMC_BUFFER rows.
    #[arg(long, default_value = "1048576", value_delimiter = ',')]
    dp_sizes: Vec<usize>,
    /// Payloads from this many bytes go HMC_BUFFER (server and client).
    /// (`--ucx-threshold` is the former name, still accepted.)
    #[arg(long, alias = "ucx-threshold", default_value_t = 64 * 1024)]
    data_plane_threshold: usize,
    /// Runs of `ucx_perftest -t tag_bw` per payload size, each without and with `-e` (peer
    /// error handling, as `UcxCommunicator`'s endpoints); the table shows medians and
    /// ranges (tag_bw busy-polls on both sides, so other load on the cores moves it).
    #[arg(long, default_value_t = 3)]
    tag_bw_runs: usize,
    /// The ucx_perftest binary for the tag_bw reference (skipped with a note when absent).
    #[arg(long, default_value = "ucx_perftest")]
    ucx_perftest: PathBuf,
    /// HMC_BUFFER rows: each request body is built in place in a pooled registered buffer
    /// (`ClientDataPlane::request_buffer_for` the connection's server), as a data-plane user
    /// would, instead of in a `Vec` the data plane then copies into one. `false`: built like
    /// the TCP_STREAM rows.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    dp_request_buffers: bool,
    /// Idle connections opened to each server (hmc-rpc and tonic) to measure the memory
    /// an idle connection costs (RSS growth per connection); 0 skips it.
    #[arg(long, default_value_t = 500)]
    idle_conns: usize,
    /// The connection sweep instead of the echo matrix: RPC/s and the server's memory per
    /// idle connection at each connection count (`max` last: keep doubling until connects
    /// fail, after raising RLIMIT_NOFILE to its hard limit). Without a list:
    /// 1,2,4,…,1024,max.
    #[arg(long, num_args = 0..=1, default_missing_value = hmc_rpc_tools::sweep::DEFAULT_STEPS,
          value_parser = hmc_rpc_tools::sweep::SweepPlan::parse, value_name = "N,N,…[,max]")]
    conn_sweep: Option<hmc_rpc_tools::sweep::SweepPlan>,
    /// Calls in flight per connection in the sweep.
    #[arg(long, default_value_t = 1)]
    sweep_depth: usize,
    /// Payload of the sweep's echo calls, bytes.
    #[arg(long, default_value_t = 64)]
    sweep_size: usize,
    /// With `--conn-sweep`: after each step, the same connections with a raw tokio TCP echo
    /// (the machine's own curve: how much of the growth of CPU per call with the
    /// connection count any tokio RPC stack here pays; see `raw_sweep`).
    #[arg(long)]
    sweep_raw: bool,
    /// Instead of the echo matrix: this many alternated rounds of the `--sizes` x
    /// `--clients` x `--depths` echo cells of hmc-rpc and tonic and of iperf3 moving bytes
    /// both ways on loopback (`iperf3 --bidir`), with the median and range of each system's
    /// MB/s moved, CPU-s/GiB and hmc-rpc's share of iperf3's rate.
    #[arg(long, value_name = "ROUNDS")]
    vs_iperf3: Option<usize>,
    /// Internal: serve the sweep's raw tokio echo baseline (messages of this many bytes,
    /// `--server-workers` runtime threads), printing the port on stdout.
    #[arg(long, hide = true)]
    raw_tokio_echo_server: Option<usize>,
    /// Internal: serve the two-process raw TCP baseline (echo messages of this many bytes on
    /// one connection), printing the port on stdout.
    #[arg(long, hide = true)]
    raw_echo_server: Option<usize>,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if let Some(size) = args.raw_tokio_echo_server {
        return match raw_sweep::raw_tokio_echo_server(size, args.server_workers) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: raw tokio echo server: {e}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    if let Some(size) = args.raw_echo_server {
        return match raw_echo_server(size) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: raw echo server: {e}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    hmc_rpc_tools::tuning::tune_allocator();
    let rt = match args.client_threads {
        Some(0) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        Some(n) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
        None => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
    }
    .expect("tokio runtime");
    match rt.block_on(run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let server_bin = args
        .server_bin
        .clone()
        .unwrap_or_else(|| me.with_file_name("hmc-rpc-server"));
    if let Some(plan) = &args.conn_sweep {
        return sweep::run_sweep(&args, plan, &server_bin).await;
    }
    // Both servers are killed when `run` returns.
    let (server, port) = start_server(&server_bin, &args, "1024", &[])?;
    let server_pid = server.0.id();
    let addr = PeerAddr::Tcp(SocketAddr::from(([127, 0, 0, 1], port)));
    let tonic = Tonic::start(&args)?;
    if let Some(rounds) = args.vs_iperf3 {
        return vs_iperf3::run(&args, rounds.max(1), &addr, server_pid, &tonic).await;
    }
    // Before any load, so that the figures are the connections' own.
    let idle = (args.idle_conns > 0).then(|| {
        eprintln!("idle connections: {} to each server", args.idle_conns);
        (
            idle_conn_kib(server_pid, port, args.idle_conns),
            tonic
                .pid
                .and_then(|pid| idle_conn_kib(pid, tonic.port, args.idle_conns)),
        )
    });
    let m = measure(&args, &addr, server_pid, &tonic).await?;
    let dp_rows = bench_data_planes(&args, &server_bin, &m.cells).await?;
    print_echo_table(&args, &m);
    if let Some(note) = oversubscription_note(args.client_threads, args.server_workers) {
        println!("\n{note}");
    }
    if let Some(idle) = idle {
        print_idle(&args, idle);
    }
    print_raw_table(&m);
    print_pipelining(&args, &m);
    print_data_planes(&dp_rows);
    write_csv(&args, &m, &dp_rows)
}

/// The tonic peer, when one runs beside hmc-rpc (killed on drop).
struct Tonic {
    bin: Option<PathBuf>,
    port: u16,
    pid: Option<u32>,
    _proc: Option<Proc>,
}

impl Tonic {
    /// Starts `--tonic-bin` (or `$HMC_TONIC_ECHO`) unless `--no-tonic`, or says it is
    /// missing and runs without it.
    fn start(args: &Args) -> Result<Tonic, String> {
        let tonic_bin = if args.no_tonic {
            None
        } else {
            let p = args
                .tonic_bin
                .clone()
                .or_else(|| std::env::var_os("HMC_TONIC_ECHO").map(PathBuf::from))
                .unwrap_or_else(|| PathBuf::from("tgt/tonic/release/tonic-echo"));
            if p.exists() {
                Some(p)
            } else {
                eprintln!(
                    "note: tonic peer not found at {} (build /work/shared/peers/tonic-echo, or pass --tonic-bin); skipping it",
                    p.display()
                );
                None
            }
        };
        let tonic_port = free_port();
        let _tonic = match &tonic_bin {
            Some(b) => {
                let c = Command::new(b)
                    .env("GLIBC_TUNABLES", hmc_rpc_tools::tuning::GLIBC_TUNABLES)
                    .args(["server", &tonic_port.to_string()])
                    .stdout(Stdio::null())
                    .spawn()
                    .map_err(|e| e.to_string())?;
                wait_port(tonic_port);
                Some(Proc(c))
            }
            None => None,
        };
        let pid = _tonic.as_ref().map(|p| p.0.id());
        Ok(Tonic {
            bin: tonic_bin,
            port: tonic_port,
            pid,
            _proc: _tonic,
        })
    }
}

/// Every cell's figures: hmc-rpc (and tonic) per size, clients and depth, and the
/// baselines beside them.
struct Measured {
    cells: Vec<(Cell, Option<Cell>)>,
    raw: Vec<Cell>,
    raw_deep: Vec<Cell>,
    raw_proc: Vec<Cell>,
    direct: Vec<Cell>,
}

/// Runs the cells in order, a cache-line round trip measured between each pair.
async fn measure(
    args: &Args,
    addr: &PeerAddr,
    server_pid: u32,
    tonic: &Tonic,
) -> Result<Measured, String> {
    let run = Cells {
        args,
        addr,
        server_pid,
        tonic,
    };
    let mut m = Measured {
        cells: Vec::new(),
        raw: Vec::new(),
        raw_deep: Vec::new(),
        raw_proc: Vec::new(),
        direct: Vec::new(),
    };
    let total = args.sizes.len() * (1 + args.clients.len() * args.depths.len());
    let mut step = 0;
    for &size in &args.sizes {
        step += 1;
        eprintln!("[{step}/{total}] raw TCP ping-pong, {}", fmt_size(size));
        let mut c2c = C2cMarks::start();
        run.baselines(size, &mut c2c, &mut m).await?;
        for &clients in &args.clients {
            for &depth in &args.depths {
                step += 1;
                eprintln!(
                    "[{step}/{total}] {} x {clients} client(s) x {depth} in flight: hmc-rpc{}",
                    fmt_size(size),
                    if tonic.bin.is_some() { ", tonic" } else { "" }
                );
                m.cells
                    .push(run.echo(size, clients, depth, &mut c2c).await?);
            }
        }
    }
    Ok(m)
}

/// What every cell of [`measure()`] runs against.
struct Cells<'a> {
    args: &'a Args,
    addr: &'a PeerAddr,
    server_pid: u32,
    tonic: &'a Tonic,
}

impl Cells<'_> {
    /// The baselines of one `size`: raw TCP ping-pong in one process and between two,
    /// the direct (blocking) client with one client and depth 1, and raw TCP as deep as
    /// the pipelining figure where that fits.
    async fn baselines(
        &self,
        size: usize,
        c2c: &mut C2cMarks,
        m: &mut Measured,
    ) -> Result<(), String> {
        let args = self.args;
        let secs = args.seconds.min(2.0);
        let mut r = bench_raw_tcp(size, 1, secs).map_err(|e| e.to_string())?;
        r.c2c_ns = c2c.next();
        m.raw.push(r);
        let mut r = bench_raw_tcp_processes(size, secs)?;
        r.c2c_ns = c2c.next();
        m.raw_proc.push(r);
        if args.clients.contains(&1) && args.depths.contains(&1) {
            let a = self.addr.clone();
            let mut r = tokio::task::spawn_blocking(move || bench_direct(&a, size, secs))
                .await
                .map_err(|e| e.to_string())??;
            r.c2c_ns = c2c.next();
            m.direct.push(r);
        }
        // Raw blocking TCP with as many messages in flight as the pipelining figure's deep
        // side, beside it.
        if args.depths.contains(&PIPELINE_DEPTH)
            && args.clients.contains(&1)
            && size * PIPELINE_DEPTH <= RAW_BATCH_MAX
        {
            let mut r = bench_raw_tcp(size, PIPELINE_DEPTH, secs).map_err(|e| e.to_string())?;
            r.c2c_ns = c2c.next();
            m.raw_deep.push(r);
        }
        Ok(())
    }

    /// One echo cell: hmc-rpc, then tonic where it runs (its failure is reported and
    /// leaves its side empty).
    async fn echo(
        &self,
        size: usize,
        clients: usize,
        depth: usize,
        c2c: &mut C2cMarks,
    ) -> Result<(Cell, Option<Cell>), String> {
        let args = self.args;
        let cpu = CpuProbe::start(self.server_pid, false);
        let mut h = bench_hmc(
            self.addr,
            size,
            clients,
            depth,
            args.seconds,
            args.stream_crc,
        )
        .await?;
        h.cpu_us_per_call = cpu.per_call(h.calls);
        h.c2c_ns = c2c.next();
        let cpu = CpuProbe::start(self.tonic.pid.unwrap_or(0), true);
        let t = match &self.tonic.bin {
            Some(b) => match bench_tonic(b, self.tonic.port, size, clients, depth, args.seconds) {
                Ok(mut t) => {
                    t.cpu_us_per_call = cpu.per_call(t.calls);
                    t.c2c_ns = c2c.next();
                    Some(t)
                }
                Err(e) => {
                    eprintln!("  tonic: {e}");
                    None
                }
            },
            None => None,
        };
        eprintln!(
            "  hmc-rpc {:.0} RPC/s {:.1} MB/s p50 {:.0} us{}",
            h.rps,
            h.mbps,
            h.p50,
            t.as_ref()
                .map(|t| format!(
                    " | tonic {:.0} RPC/s {:.1} MB/s p50 {:.0} us",
                    t.rps, t.mbps, t.p50
                ))
                .unwrap_or_default()
        );
        Ok((h, t))
    }
}

/// The main table: hmc-rpc against tonic, cell by cell.
fn print_echo_table(args: &Args, m: &Measured) {
    println!(
        "## hmc-rpc echo vs tonic (same run, {} s per cell; hmc-rpc: stream CRC {}, client runtime {}, server workers {}; tonic: tokio default runtime)\n",
        args.seconds,
        if args.stream_crc { "on" } else { "off" },
        match args.client_threads {
            Some(0) => "current-thread".to_string(),
            Some(n) => format!("{n} threads"),
            None => format!(
                "tokio default ({} threads)",
                std::thread::available_parallelism().map_or(1, |n| n.get())
            ),
        },
        args.server_workers
    );
    println!(
        "| payload | clients | in flight | hmc RPC/s | hmc MB/s | hmc p50 us | hmc p99 us | hmc p999 us | tonic RPC/s | tonic MB/s | tonic p50 us | RPC/s ratio | hmc CPU us/call | tonic CPU us/call | hmc CPU-s/GiB | tonic CPU-s/GiB | host c2c ns |"
    );
    println!(
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    let cpu = |c: Option<&Cell>| {
        c.and_then(|c| c.cpu_us_per_call)
            .map_or("-".to_string(), |v| format!("{v:.1}"))
    };
    let gib = |c: Option<&Cell>| hmc_bench_kit::cpu::cell(c.and_then(cpu_s_per_gib), 3);
    for (h, t) in &m.cells {
        let (tr, tm, tp, ratio) = match t {
            Some(t) => (
                format!("{:.0}", t.rps),
                format!("{:.1}", t.mbps),
                format!("{:.0}", t.p50),
                format!("{:.2}x", h.rps / t.rps),
            ),
            None => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        println!(
            "| {} | {} | {} | {:.0} | {:.1} | {:.0} | {:.0} | {:.0} | {tr} | {tm} | {tp} | {ratio} | {} | {} | {} | {} | {} |",
            fmt_size(h.size),
            h.clients,
            h.depth,
            h.rps,
            h.mbps,
            h.p50,
            h.p99,
            h.p999,
            cpu(Some(h)),
            cpu(t.as_ref()),
            gib(Some(h)),
            gib(t.as_ref()),
            fmt_c2c(h)
        );
    }
    println!(
        "\nCPU us/call and CPU-s/GiB: user and system CPU time of the client and the server \
         processes (every thread; tonic's client a reaped child), over the cell, per call and \
         per GiB of payload moved (request and response)."
    );
    println!(
        "\nhost c2c ns: a cache line's round trip between the first two CPUs, just before/after \
         the cell. Tens of ns: the cores share a cache; several times that: the host runs them \
         apart (on the project's VMs about 60 against 330 ns), which slows every figure that \
         crosses cores; the host changes it within seconds."
    );
}

/// Server memory per idle connection, hmc-rpc's and tonic's.
fn print_idle(args: &Args, (hmc, tonic): (Option<f64>, Option<f64>)) {
    let kib = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
    println!(
        "\n## idle connections ({} that send nothing; server RSS growth per connection)\n",
        args.idle_conns
    );
    println!("| hmc-rpc KiB/conn | tonic KiB/conn |\n| --- | --- |");
    println!("| {} | {} |", kib(hmc), kib(tonic));
}

/// One call at a time against raw TCP ping-pong, in this process and another.
fn print_raw_table(m: &Measured) {
    println!(
        "\n## raw TCP ping-pong baseline (1 connection, 1 in flight, blocking; echo in a thread of this process, and in another process as hmc-rpc's server is)\n"
    );
    println!(
        "| payload | round trips/s | MB/s | p50 us | p99 us | hmc-rpc 1x1 p50 us | p50 ratio | two processes: p50 us | p50 ratio | DirectClient p50 us | p50 ratio | raw CPU us/call | two processes: CPU us/call | hmc-rpc 1x1 CPU us/call | host c2c ns |"
    );
    println!(
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for r in &m.raw {
        let h = m
            .cells
            .iter()
            .find(|(h, _)| h.size == r.size && h.clients == 1 && h.depth == 1)
            .map(|(h, _)| h.p50);
        let p = m.raw_proc.iter().find(|p| p.size == r.size).map(|p| p.p50);
        let d = m.direct.iter().find(|d| d.size == r.size).map(|d| d.p50);
        let one = |c: Option<&Cell>| hmc_bench_kit::cpu::cell(c.and_then(|c| c.cpu_us_per_call), 1);
        let h1 = m
            .cells
            .iter()
            .find(|(h, _)| h.size == r.size && h.clients == 1 && h.depth == 1)
            .map(|(h, _)| h);
        println!(
            "| {} | {:.0} | {:.1} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            fmt_size(r.size),
            r.rps,
            r.mbps,
            r.p50,
            r.p99,
            h.map_or("-".into(), |h| format!("{h:.0}")),
            h.map_or("-".into(), |h| format!("{:.2}x", h / r.p50.max(1.0))),
            p.map_or("-".into(), |p| format!("{p:.0}")),
            h.zip(p)
                .map_or("-".into(), |(h, p)| format!("{:.2}x", h / p.max(1.0))),
            d.map_or("-".into(), |d| format!("{d:.0}")),
            d.map_or("-".into(), |d| format!("{:.2}x", d / r.p50.max(1.0))),
            one(Some(r)),
            one(m.raw_proc.iter().find(|p| p.size == r.size)),
            one(h1),
            fmt_c2c(r)
        );
    }
}

/// Depth 8 against depth 1 on one connection, beside raw TCP with as many in flight.
fn print_pipelining(args: &Args, m: &Measured) {
    println!("\n## pipelining on one connection (1 client)\n");
    println!(
        "| payload | depth 1 RPC/s | depth 8 RPC/s | ratio | raw TCP depth 1 msg/s | raw TCP depth 8 msg/s | raw ratio | hmc depth 8 / raw depth 8 |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for &size in &args.sizes {
        let find = |d: usize| {
            m.cells
                .iter()
                .find(|(h, _)| h.size == size && h.clients == 1 && h.depth == d)
                .map(|(h, _)| h.rps)
        };
        let raw1 = m.raw.iter().find(|r| r.size == size).map(|r| r.rps);
        let raw8 = m
            .raw_deep
            .iter()
            .find(|r| r.size == size && r.depth == PIPELINE_DEPTH)
            .map(|r| r.rps);
        let num = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.0}"));
        let ratio = |a: Option<f64>, b: Option<f64>| {
            a.zip(b)
                .map_or("-".into(), |(a, b)| format!("{:.2}x", b / a.max(1e-9)))
        };
        if let (Some(a), Some(b)) = (find(1), find(PIPELINE_DEPTH)) {
            println!(
                "| {} | {a:.0} | {b:.0} | {:.2}x | {} | {} | {} | {} |",
                fmt_size(size),
                b / a,
                num(raw1),
                num(raw8),
                ratio(raw1, raw8),
                ratio(raw8, Some(b)),
            );
        }
    }
}

/// HMC_BUFFER rows against TCP_STREAM and tag_bw.
fn print_data_planes(dp_rows: &[data_planes::DpRow]) {
    if !dp_rows.is_empty() {
        println!(
            "\n## HMC_BUFFER echo vs TCP_STREAM and ucx_perftest tag_bw (bytes moved = request + response; UCX_TLS={})\n",
            std::env::var("UCX_TLS").unwrap_or_else(|_| "(UCX default)".into())
        );
        println!(
            "| data plane | payload | clients | in flight | RPC/s | p50 us | bytes moved MB/s | TCP_STREAM MB/s | vs TCP_STREAM | tag_bw MB/s median (range) | vs tag_bw median | tag_bw -e MB/s median (range) | vs tag_bw -e median | CPU us/call (TCP_STREAM) | CPU-s/GiB | TCP_STREAM CPU-s/GiB | tag_bw CPU-s/GiB | host c2c ns |"
        );
        println!(
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
        );
        for r in dp_rows {
            let moved = 2.0 * r.buffer.mbps;
            let (stream, vs_stream) = match &r.stream {
                Some(s) => (
                    format!("{:.1}", 2.0 * s.mbps),
                    format!("{:.2}x", r.buffer.mbps / s.mbps.max(1e-9)),
                ),
                None => ("-".into(), "-".into()),
            };
            let vs = |t: &TagBw| {
                let (b, lo, hi) = *t;
                (
                    format!("{:.1} ({:.0}–{:.0})", b / 1e6, lo / 1e6, hi / 1e6),
                    format!("{:.0}%", 100.0 * moved * 1e6 / b),
                )
            };
            let none = || ("-".to_string(), "-".to_string());
            let ((tag, vs_tag), (tag_e, vs_tag_e)) = match &r.tag_bw {
                Some((plain, peer)) => (vs(plain), peer.as_ref().map_or_else(none, vs)),
                None => (none(), none()),
            };
            let cpu = |c: Option<&Cell>| {
                c.and_then(|c| c.cpu_us_per_call)
                    .map_or("-".into(), |v| format!("{v:.0}"))
            };
            let gib = |c: Option<&Cell>| hmc_bench_kit::cpu::cell(c.and_then(cpu_s_per_gib), 3);
            println!(
                "| {:?} | {} | {} | {} | {:.0} | {:.0} | {moved:.1} | {stream} | {vs_stream} | {tag} | {vs_tag} | {tag_e} | {vs_tag_e} | {} ({}) | {} | {} | {} | {} |",
                r.plane,
                fmt_size(r.buffer.size),
                r.buffer.clients,
                r.buffer.depth,
                r.buffer.rps,
                r.buffer.p50,
                cpu(Some(&r.buffer)),
                cpu(r.stream.as_ref()),
                gib(Some(&r.buffer)),
                gib(r.stream.as_ref()),
                hmc_bench_kit::cpu::cell(r.tag_bw_cpu, 3),
                fmt_c2c(&r.buffer)
            );
        }
    }
}

/// Every cell as one CSV line (`--csv`).
fn write_csv(args: &Args, m: &Measured, dp_rows: &[data_planes::DpRow]) -> Result<(), String> {
    if let Some(dir) = args.csv.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let mut csv = String::from(
        "system,payload_bytes,clients,in_flight,calls,rps,mbps,p50_us,p99_us,p999_us,cpu_us_per_call,c2c_before_ns,c2c_after_ns\n",
    );
    for c in m
        .cells
        .iter()
        .flat_map(|(h, t)| std::iter::once(h).chain(t.iter()))
        .chain(m.raw.iter())
        .chain(m.raw_deep.iter())
        .chain(m.raw_proc.iter())
        .chain(m.direct.iter())
        .chain(dp_rows.iter().map(|r| &r.buffer))
    {
        csv.push_str(&format!(
            "{},{},{},{},{},{:.1},{:.3},{:.1},{:.1},{:.1},{},{}\n",
            c.system,
            c.size,
            c.clients,
            c.depth,
            c.calls,
            c.rps,
            c.mbps,
            c.p50,
            c.p99,
            c.p999,
            c.cpu_us_per_call
                .map_or(String::new(), |v| format!("{v:.1}")),
            c.c2c_ns
                .map_or(",".to_string(), |(b, a)| format!("{b:.0},{a:.0}"))
        ));
    }
    std::fs::write(&args.csv, csv).map_err(|e| format!("writing {}: {e}", args.csv.display()))?;
    eprintln!("CSV written to {}", args.csv.display());
    Ok(())
}
