//! `hmc-rpc-bench`: echo throughput and latency over a matrix of payload size x clients x
//! pipeline depth, every response verified, side by side with a raw TCP ping-pong baseline
//! and the tonic (gRPC) peer; prints a markdown table with ratios and writes CSV. With
//! `--data-planes tcp,ucx` it adds HMC_BUFFER rows (a server started with `--data-plane`)
//! beside the TCP_STREAM path and, for UCX, `ucx_perftest -t tag_bw` on the same `UCX_TLS`
//! (with perftest's default endpoints and with peer error handling, `-e`, as ours).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use hmc_core::{Communicator, PeerAddr};
use hmc_rpc_tools::plane::{DataPlaneKind, open_data_plane};
use hmc_rpc::{
    Client, ClientConfig, ClientDataPlane, DataPlaneConfig, DirectClient, NoDataPlane, demo,
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
    /// Data planes for HMC_BUFFER rows, comma-separated (`tcp`, `ucx`); none by default.
    #[arg(long, value_delimiter = ',')]
    data_planes: Vec<DataPlaneKind>,
    /// Payload sizes of the HMC_BUFFER rows.
    #[arg(long, default_value = "1048576", value_delimiter = ',')]
    dp_sizes: Vec<usize>,
    /// Payloads from this many bytes go HMC_BUFFER (server and client).
    #[arg(long, default_value_t = 64 * 1024)]
    ucx_threshold: usize,
    /// Runs of `ucx_perftest -t tag_bw` per payload size, each without and with `-e` (peer
    /// error handling, as `UcxCommunicator`'s endpoints); the table shows medians and
    /// ranges (tag_bw busy-polls on both sides, so other load on the cores moves it).
    #[arg(long, default_value_t = 3)]
    tag_bw_runs: usize,
    /// The ucx_perftest binary for the tag_bw reference (skipped with a note when absent).
    #[arg(long, default_value = "ucx_perftest")]
    ucx_perftest: PathBuf,
    /// HMC_BUFFER rows: each request body is built in place in a pooled registered buffer
    /// (`ClientDataPlane::request_buffer`), as a data-plane user would, instead of in a
    /// `Vec` the data plane then copies into one. `false`: built like the TCP_STREAM rows.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    dp_request_buffers: bool,
    /// Idle connections opened to each server (hmc-rpc and tonic) to measure the memory
    /// an idle connection costs (RSS growth per connection); 0 skips it.
    #[arg(long, default_value_t = 500)]
    idle_conns: usize,
    /// Internal: serve the two-process raw TCP baseline (echo messages of this many bytes on
    /// one connection), printing the port on stdout.
    #[arg(long, hide = true)]
    raw_echo_server: Option<usize>,
}

#[derive(Clone, Debug, Default)]
struct Cell {
    system: &'static str,
    size: usize,
    clients: usize,
    depth: usize,
    calls: u64,
    rps: f64,
    mbps: f64,
    p50: f64,
    p99: f64,
    p999: f64,
    /// CPU time (user + system) of client and server processes per call, microseconds.
    cpu_us_per_call: Option<f64>,
    /// [`core_to_core_ns`] just before and just after the cell.
    c2c_ns: Option<(f64, f64)>,
}

/// Round trip of one cache line between the first two CPUs this process may run on, in
/// nanoseconds (the median of five rounds of 20,000), or `None` with fewer than two CPUs.
///
/// It tells which state the host keeps the machine in, which moves every figure that
/// crosses cores: on the project's 2-vCPU VMs it reads about 60 ns while the two vCPUs
/// share an L3 cache and about 330 ns while the host runs them apart, which also halves
/// the bandwidth of a copy from one core's writes (10 against 17 GB/s for 8 MiB) and cuts
/// HMC_BUFFER echo over shared memory to a third. The host changes it within seconds, so
/// each cell records it before and after.
fn core_to_core_ns() -> Option<f64> {
    use std::sync::atomic::{AtomicU64, Ordering};
    const ROUND_TRIPS: u64 = 20_000;
    let cpus = allowed_cpus();
    let (a, b) = (*cpus.first()?, *cpus.get(1)?);
    let flag = Arc::new(AtomicU64::new(0));
    let mut rounds = Vec::new();
    for _ in 0..5 {
        flag.store(0, Ordering::SeqCst);
        let f = flag.clone();
        let echo = std::thread::spawn(move || {
            pin_to_cpu(b);
            for i in 1..=ROUND_TRIPS {
                while f.load(Ordering::Acquire) != 2 * i - 1 {
                    std::hint::spin_loop();
                }
                f.store(2 * i, Ordering::Release);
            }
        });
        let f = flag.clone();
        let ping = std::thread::spawn(move || {
            pin_to_cpu(a);
            let t = Instant::now();
            for i in 1..=ROUND_TRIPS {
                f.store(2 * i - 1, Ordering::Release);
                while f.load(Ordering::Acquire) != 2 * i {
                    std::hint::spin_loop();
                }
            }
            t.elapsed().as_nanos() as f64 / ROUND_TRIPS as f64
        });
        echo.join().ok()?;
        rounds.push(ping.join().ok()?);
    }
    rounds.sort_by(f64::total_cmp);
    Some(rounds[rounds.len() / 2])
}

/// The CPUs this process may run on (`sched_getaffinity`), in order.
fn allowed_cpus() -> Vec<usize> {
    let mut set = std::mem::MaybeUninit::<libc::cpu_set_t>::zeroed();
    // SAFETY: `set` is a zeroed (valid) `cpu_set_t` of the size passed; pid 0 is this thread.
    let r = unsafe {
        libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set.as_mut_ptr())
    };
    if r != 0 {
        return Vec::new();
    }
    // SAFETY: zero-initialised and filled in on success.
    let set = unsafe { set.assume_init() };
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `i` is below `CPU_SETSIZE`, the bit count of `set`.
        .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
        .collect()
}

/// Pins the calling thread to `cpu` (best effort: unpinned, the round trip is measured
/// wherever the scheduler runs the two threads).
fn pin_to_cpu(cpu: usize) {
    // SAFETY: `CPU_ZERO`/`CPU_SET` write a local `cpu_set_t`; `cpu` is below `CPU_SETSIZE`
    // (it came from `allowed_cpus`); `sched_setaffinity` reads the set we pass.
    unsafe {
        let mut set = std::mem::zeroed::<libc::cpu_set_t>();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// A cell's "host c2c ns" column: before/after.
fn fmt_c2c(c: &Cell) -> String {
    c.c2c_ns
        .map_or("-".to_string(), |(b, a)| format!("{b:.0}/{a:.0}"))
}

/// Microseconds of CPU (user + system) used by process `pid` (`None`: this process) and
/// by its children it has waited for, from `/proc/PID/stat` (Linux; `None` elsewhere).
fn proc_cpu_us(pid: Option<u32>) -> Option<(f64, f64)> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/stat"),
        None => "/proc/self/stat".to_string(),
    };
    let stat = std::fs::read_to_string(path).ok()?;
    // Fields after the command name, from field 3 (state); proc(5) numbers utime, stime,
    // cutime, cstime 14 to 17, in USER_HZ ticks (100 per second on Linux).
    let f: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let t = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
    const US_PER_TICK: f64 = 10_000.0;
    Some((
        (t(11)? + t(12)?) * US_PER_TICK,
        (t(13)? + t(14)?) * US_PER_TICK,
    ))
}

/// CPU time of a cell's two sides, read before and after it.
struct CpuProbe {
    server: u32,
    /// The client is a child process this one waits for (tonic), not this process.
    child_client: bool,
    at: Option<(f64, f64)>,
}

impl CpuProbe {
    fn start(server: u32, child_client: bool) -> Self {
        let mut p = CpuProbe {
            server,
            child_client,
            at: None,
        };
        p.at = p.read();
        p
    }

    fn read(&self) -> Option<(f64, f64)> {
        let me = proc_cpu_us(None)?;
        let client = if self.child_client { me.1 } else { me.0 };
        Some((client, proc_cpu_us(Some(self.server))?.0))
    }

    /// Client + server CPU microseconds per call since `start`.
    fn per_call(&self, calls: u64) -> Option<f64> {
        let (c0, s0) = self.at?;
        let (c1, s1) = self.read()?;
        (calls > 0).then(|| (c1 - c0 + s1 - s0) / calls as f64)
    }
}

fn percentile(sorted: &[u32], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * q) as usize] as f64
}

fn cell_from(
    system: &'static str,
    size: usize,
    clients: usize,
    depth: usize,
    mut lat: Vec<u32>,
    secs: f64,
) -> Cell {
    lat.sort_unstable();
    let calls = lat.len() as u64;
    Cell {
        system,
        size,
        clients,
        depth,
        calls,
        rps: calls as f64 / secs,
        mbps: calls as f64 * size as f64 / secs / 1e6,
        p50: percentile(&lat, 0.5),
        p99: percentile(&lat, 0.99),
        p999: percentile(&lat, 0.999),
        cpu_us_per_call: None,
        c2c_ns: None,
    }
}

async fn bench_hmc(
    addr: &PeerAddr,
    size: usize,
    clients: usize,
    depth: usize,
    secs: f64,
    stream_crc: bool,
) -> Result<Cell, String> {
    bench_hmc_dp::<NoDataPlane>(addr, size, clients, depth, secs, stream_crc, None).await
}

async fn bench_hmc_dp<C: Communicator>(
    addr: &PeerAddr,
    size: usize,
    clients: usize,
    depth: usize,
    secs: f64,
    stream_crc: bool,
    // The data plane, and whether request bodies are built in its request buffers.
    dp: Option<(Arc<ClientDataPlane<C>>, bool)>,
) -> Result<Cell, String> {
    let in_place = dp
        .as_ref()
        .filter(|(_, in_place)| *in_place)
        .map(|(dp, _)| dp.clone());
    let dp = dp.map(|(dp, _)| dp);
    let mut config = ClientConfig::default();
    config.conn.stream_crc = stream_crc;
    match dp {
        None => {
            let mut conns = Vec::new();
            for _ in 0..clients {
                conns.push(
                    Client::connect(addr, config.clone())
                        .await
                        .map_err(|e| e.to_string())?,
                );
            }
            bench_conns(conns, size, depth, secs, "hmc-rpc", None).await
        }
        Some(dp) => {
            let mut conns = Vec::new();
            for _ in 0..clients {
                conns.push(
                    Client::connect(addr, config.clone())
                        .await
                        .map_err(|e| e.to_string())?
                        .with_client_data_plane(dp.clone()),
                );
            }
            bench_conns(conns, size, depth, secs, "hmc-rpc-buffer", in_place).await
        }
    }
}

async fn bench_conns<C: Communicator>(
    conns: Vec<Client<C>>,
    size: usize,
    depth: usize,
    secs: f64,
    system: &'static str,
    in_place: Option<Arc<ClientDataPlane<C>>>,
) -> Result<Cell, String> {
    let clients = conns.len();
    let template: Arc<Vec<u8>> = Arc::new((0..size).map(|i| (i % 251) as u8).collect());
    // Warm up each connection.
    for c in &conns {
        c.call(demo::ECHO, Bytes::from(template.to_vec()))
            .await
            .map_err(|e| e.to_string())?;
    }
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for (ci, c) in conns.iter().enumerate() {
        for d in 0..depth {
            let c = c.clone();
            let template = template.clone();
            let in_place = in_place.clone();
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut n: u64 = ((ci * 1000 + d) as u64) << 32;
                while Instant::now() < end {
                    n += 1;
                    // A fresh, numbered body per call (one copy, as tonic's client makes).
                    let stamp = n.to_be_bytes();
                    let k = stamp.len().min(template.len());
                    let body = match &in_place {
                        Some(dp) => {
                            let mut rb = dp.request_buffer(size).map_err(|e| e.to_string())?;
                            let b = rb.as_mut_slice();
                            b.copy_from_slice(&template);
                            b[..k].copy_from_slice(&stamp[..k]);
                            rb.freeze()
                        }
                        None => {
                            let mut body = template.to_vec();
                            body[..k].copy_from_slice(&stamp[..k]);
                            Bytes::from(body)
                        }
                    };
                    let t = Instant::now();
                    let r = c
                        .call(demo::ECHO, body.clone())
                        .await
                        .map_err(|e| e.to_string())?;
                    lat.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
                    if r[..] != body[..] {
                        return Err(format!("response {n} differs from its request"));
                    }
                }
                Ok::<_, String>(lat)
            }));
        }
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.map_err(|e| e.to_string())??);
    }
    let el = start.elapsed().as_secs_f64();
    Ok(cell_from(system, size, clients, depth, all, el))
}

/// `ucx_perftest -t tag_bw -s SIZE` as two child processes (server without an address,
/// client with 127.0.0.1) on the current `UCX_TLS`; the overall bandwidth in bytes/s.
/// `peer_errors` adds `-e`: endpoints with peer error handling (`UCP_ERR_HANDLING_MODE_PEER`),
/// as `UcxCommunicator` creates them, with `UCX_MM_ERROR_HANDLING=y` as it sets for shared
/// memory (unless the environment says otherwise). UCX 1.13 then avoids its zero-copy
/// rendezvous over tcp (a 1 MiB `tag_lat` went from 166–184 to 267–313 µs here,
/// `docs/benchmarks.md`).
fn ucx_tag_bw(bin: &PathBuf, size: usize, peer_errors: bool) -> Result<f64, String> {
    let size = size.to_string();
    let e: &[&str] = if peer_errors { &["-e"] } else { &[] };
    // The environment's own choice wins, for both kinds of run.
    let mm_errors: &[(&str, &str)] =
        if peer_errors && std::env::var_os("UCX_MM_ERROR_HANDLING").is_none() {
            &[("UCX_MM_ERROR_HANDLING", "y")]
        } else {
            &[]
        };
    let iters = "2000";
    // The same UCX_TCP_TX_SEG_SIZE as our UCX communicators apply (unless the environment
    // sets one for both).
    let seg = std::env::var("UCX_TCP_TX_SEG_SIZE")
        .unwrap_or_else(|_| hmc_transport_ucx::TCP_TX_SEG_SIZE.to_string());
    let mut last = String::new();
    // perftest takes a port we choose by bind-and-close, which another socket may take
    // first: a server that exits at once gets another port.
    for _attempt in 0..3 {
        let port = free_port().to_string();
        let server = Command::new(bin)
            .env("UCX_TCP_TX_SEG_SIZE", &seg)
            .envs(mm_errors.iter().copied())
            .args(["-t", "tag_bw", "-s", &size, "-n", iters, "-p", &port])
            .args(e)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", bin.display()))?;
        let mut server = Proc(server);
        for _ in 0..50 {
            std::thread::sleep(Duration::from_millis(100));
            if let Ok(Some(status)) = server.0.try_wait() {
                last = format!("the ucx_perftest server on port {port} exited ({status})");
                break;
            }
            let out = Command::new(bin)
                .env("UCX_TCP_TX_SEG_SIZE", &seg)
                .envs(mm_errors.iter().copied())
                .args([
                    "127.0.0.1",
                    "-t",
                    "tag_bw",
                    "-s",
                    &size,
                    "-n",
                    iters,
                    "-p",
                    &port,
                ])
                .args(e)
                .output()
                .map_err(|e| e.to_string())?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            if let Some(line) = text.lines().find(|l| l.starts_with("Final:")) {
                // Final: iterations, 50%ile, avg, overall (usec), bandwidth avg, overall
                // (MB/s), …
                let f: Vec<&str> = line.split_whitespace().collect();
                let mbps: f64 = f
                    .get(6)
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| format!("unexpected ucx_perftest line `{line}`"))?;
                return Ok(mbps * 1024.0 * 1024.0);
            }
            last = format!("{text}{}", String::from_utf8_lossy(&out.stderr));
        }
    }
    Err(format!("ucx_perftest client never reported: {last}"))
}

struct DpRow {
    plane: DataPlaneKind,
    buffer: Cell,
    stream: Option<Cell>,
    /// tag_bw in bytes/s (median, min, max over `--tag-bw-runs`): perftest's default
    /// endpoints, and endpoints with peer error handling (`-e`) as ours.
    tag_bw: Option<(TagBw, Option<TagBw>)>,
}

/// Median, min and max in bytes/s.
type TagBw = (f64, f64, f64);

/// `ucx_perftest -t tag_bw` over `runs` runs each without and with `-e`, alternated so
/// that both see the same host states: (default, peer error handling). A failing `-e` run
/// drops only the second figure (with a note).
fn ucx_tag_bw_runs(
    bin: &PathBuf,
    size: usize,
    runs: usize,
) -> Result<(TagBw, Option<TagBw>), String> {
    let (mut plain, mut peer) = (Vec::new(), Some(Vec::new()));
    for _ in 0..runs.max(1) {
        plain.push(ucx_tag_bw(bin, size, false)?);
        if let Some(v) = &mut peer {
            match ucx_tag_bw(bin, size, true) {
                Ok(b) => v.push(b),
                Err(e) => {
                    eprintln!("note: ucx_perftest -e: {e}");
                    peer = None;
                }
            }
        }
    }
    let stats = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0], v[v.len() - 1])
    };
    Ok((stats(plain), peer.map(stats)))
}

/// HMC_BUFFER rows: a server with `--data-plane`, clients with the same data plane.
async fn bench_data_planes(
    args: &Args,
    server_bin: &PathBuf,
    stream_cells: &[(Cell, Option<Cell>)],
) -> Result<Vec<DpRow>, String> {
    let mut rows = Vec::new();
    for &plane in &args.data_planes {
        let (_server, port) = match start_server(
            server_bin,
            args,
            &[
                "--data-plane",
                &format!("{plane:?}").to_lowercase(),
                "--ucx-threshold",
                &args.ucx_threshold.to_string(),
            ],
        ) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("note: {e}; skipping --data-plane {plane:?}");
                continue;
            }
        };
        let comm = match open_data_plane(plane, [127, 0, 0, 1].into()) {
            Ok(Some(c)) => Arc::new(c),
            Ok(None) => continue,
            Err(e) => {
                eprintln!("note: data plane {plane:?} unavailable here ({e}); skipping it");
                continue;
            }
        };
        let dp = Arc::new(ClientDataPlane::new(
            comm,
            DataPlaneConfig {
                threshold: args.ucx_threshold,
                ..DataPlaneConfig::default()
            },
        ));
        let addr = PeerAddr::Tcp(SocketAddr::from(([127, 0, 0, 1], port)));
        for &size in &args.dp_sizes {
            let tag_bw = if plane == DataPlaneKind::Ucx {
                match ucx_tag_bw_runs(&args.ucx_perftest, size, args.tag_bw_runs) {
                    Ok(b) => Some(b),
                    Err(e) => {
                        eprintln!("note: ucx_perftest: {e}");
                        None
                    }
                }
            } else {
                None
            };
            for &clients in &args.clients {
                for &depth in &args.depths {
                    eprintln!(
                        "HMC_BUFFER over {plane:?}: {} x {clients} client(s) x {depth} in flight",
                        fmt_size(size)
                    );
                    let before = core_to_core_ns();
                    let cpu = CpuProbe::start(_server.0.id(), false);
                    let mut buffer = bench_hmc_dp(
                        &addr,
                        size,
                        clients,
                        depth,
                        args.seconds,
                        args.stream_crc,
                        Some((dp.clone(), args.dp_request_buffers)),
                    )
                    .await?;
                    buffer.cpu_us_per_call = cpu.per_call(buffer.calls);
                    buffer.c2c_ns = before.zip(core_to_core_ns());
                    let stream = stream_cells
                        .iter()
                        .find(|(h, _)| h.size == size && h.clients == clients && h.depth == depth)
                        .map(|(h, _)| h.clone());
                    rows.push(DpRow {
                        plane,
                        buffer,
                        stream,
                        tag_bw,
                    });
                }
            }
        }
        let st = dp.stats();
        eprintln!(
            "  client data plane: {} HMC_BUFFER calls, {} fallbacks, {} failures, {} registrations",
            st.buffer_calls, st.fallbacks, st.failures, st.pool.registrations
        );
    }
    Ok(rows)
}

/// The deep side of the pipelining table (depth 8 against depth 1 on one connection).
const PIPELINE_DEPTH: usize = 8;

/// Largest batch (`depth` x payload) the raw pipelined baseline sends in one write: both
/// sides write before they read, so a batch must fit in the sockets' buffers.
const RAW_BATCH_MAX: usize = 256 << 10;

/// Blocking TCP ping-pong on one connection, `size` bytes each way. Depth 1: one message
/// in flight, echoed whole. Depth `d`: the client writes `d` messages in one write and reads
/// their echo (the server echoes whatever each read returned), so each round trip moves `d`
/// messages with one write and as few reads as the kernel allows on either side: what
/// blocking sockets get with `d` messages in flight on one connection, without RPC framing
/// (each side sleeps in `read` between rounds, as the depth-1 baseline does).
fn bench_raw_tcp(size: usize, depth: usize, secs: f64) -> std::io::Result<Cell> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let server = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = l.accept()?;
        s.set_nodelay(true)?;
        if depth == 1 {
            return echo_messages(&mut s, size);
        }
        let mut buf = vec![0u8; RAW_BATCH_MAX];
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return Ok(()),
                Ok(n) => s.write_all(&buf[..n])?,
            }
        }
    });
    let mut c = TcpStream::connect(addr)?;
    c.set_nodelay(true)?;
    let (lat, el) = ping_pong(&mut c, size, depth, secs)?;
    drop(c);
    let _ = server.join();
    Ok(cell_from("raw-tcp", size, 1, depth, lat, el))
}

/// Echoes whole messages of `size` bytes until the peer closes (the depth-1 raw server).
fn echo_messages(s: &mut TcpStream, size: usize) -> std::io::Result<()> {
    let mut buf = vec![0u8; size];
    while s.read_exact(&mut buf).is_ok() {
        s.write_all(&buf)?;
    }
    Ok(())
}

/// The raw client: for `secs`, writes `depth` messages of `size` bytes in one write and
/// reads their echo, checking it; each message's latency is its round's, and the elapsed
/// seconds come back beside them.
fn ping_pong(
    c: &mut TcpStream,
    size: usize,
    depth: usize,
    secs: f64,
) -> std::io::Result<(Vec<u32>, f64)> {
    let msg: Vec<u8> = (0..size * depth).map(|i| (i % 251) as u8).collect();
    let mut back = vec![0u8; size * depth];
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let mut lat = Vec::new();
    while Instant::now() < end {
        let t = Instant::now();
        c.write_all(&msg)?;
        c.read_exact(&mut back)?;
        let took = t.elapsed().as_micros() as u32;
        lat.extend(std::iter::repeat_n(took, depth));
        if back != msg {
            return Err(std::io::Error::other("the raw echo answered other bytes"));
        }
    }
    Ok((lat, start.elapsed().as_secs_f64()))
}

/// One call at a time through [`DirectClient`] (the caller's thread writes and sleeps in
/// `read`, no runtime), same numbered, verified bodies as the other hmc-rpc cells.
fn bench_direct(addr: &PeerAddr, size: usize, secs: f64) -> Result<Cell, String> {
    let c = DirectClient::connect(addr, ClientConfig::default()).map_err(|e| e.to_string())?;
    let template: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    c.call(demo::ECHO, template.clone())
        .map_err(|e| e.to_string())?;
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let mut lat = Vec::new();
    let mut n: u64 = 0;
    while Instant::now() < end {
        n += 1;
        let mut body = template.clone();
        let stamp = n.to_be_bytes();
        let k = stamp.len().min(size);
        body[..k].copy_from_slice(&stamp[..k]);
        let body = Bytes::from(body);
        let t = Instant::now();
        let r = c
            .call(demo::ECHO, body.clone())
            .map_err(|e| e.to_string())?;
        lat.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
        if r != body {
            return Err(format!(
                "direct client: response {n} differs from its request"
            ));
        }
    }
    Ok(cell_from(
        "hmc-rpc-direct",
        size,
        1,
        1,
        lat,
        start.elapsed().as_secs_f64(),
    ))
}

/// The server side of [`bench_raw_tcp_processes`]: one connection, messages of `size` bytes
/// echoed whole, until the client closes.
fn raw_echo_server(size: usize) -> std::io::Result<()> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    println!("port {}", l.local_addr()?.port());
    std::io::stdout().flush()?;
    let (mut s, _) = l.accept()?;
    s.set_nodelay(true)?;
    echo_messages(&mut s, size)
}

/// The depth-1 raw ping-pong with the echo in another process (this binary run with
/// `--raw-echo-server`), as hmc-rpc's server is: each round trip then also switches between
/// address spaces, which the threads of [`bench_raw_tcp`] never do.
fn bench_raw_tcp_processes(size: usize, secs: f64) -> Result<Cell, String> {
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = Command::new(me)
        .args(["--raw-echo-server", &size.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting the raw echo server: {e}"))?;
    let mut line = String::new();
    let read = BufReader::new(child.stdout.take().expect("piped stdout")).read_line(&mut line);
    let child = Proc(child);
    read.map_err(|e| e.to_string())?;
    let port: u16 = line
        .trim()
        .strip_prefix("port ")
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("unexpected line from the raw echo server: {line:?}"))?;
    let io = |e: std::io::Error| e.to_string();
    let mut c = TcpStream::connect(("127.0.0.1", port)).map_err(io)?;
    c.set_nodelay(true).map_err(io)?;
    let (lat, el) = ping_pong(&mut c, size, 1, secs).map_err(io)?;
    drop(c);
    drop(child);
    Ok(cell_from("raw-tcp-processes", size, 1, 1, lat, el))
}

/// Starts `hmc-rpc-server` on a port it picks itself (`--port 0`: no race with other
/// sockets for a port chosen here) with the bench's limits and `extra` arguments; its
/// process and port, read from the line it prints once it listens.
fn start_server(server_bin: &PathBuf, args: &Args, extra: &[&str]) -> Result<(Proc, u16), String> {
    let mut server = Command::new(server_bin)
        .env("GLIBC_TUNABLES", hmc_rpc_tools::tuning::GLIBC_TUNABLES)
        .args(["--port", "0", "--workers", &args.server_workers.to_string()])
        .args(["--max-inflight", "256", "--max-connections", "1024"])
        .args(["--stream-crc", &args.stream_crc.to_string()])
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| {
            format!(
                "starting {} (build it with the bench): {e}",
                server_bin.display()
            )
        })?;
    let mut line = String::new();
    let read = BufReader::new(server.stdout.take().expect("piped stdout")).read_line(&mut line);
    let server = Proc(server);
    read.map_err(|e| e.to_string())?;
    // "hmc-rpc-server listening on tcp://127.0.0.1:PORT"
    let port = line
        .trim()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("the server did not start (it printed `{}`)", line.trim()))?;
    Ok((server, port))
}

struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(18099)
}

fn wait_port(port: u16) {
    for _ in 0..100 {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn bench_tonic(
    bin: &PathBuf,
    port: u16,
    size: usize,
    clients: usize,
    depth: usize,
    secs: f64,
) -> Result<Cell, String> {
    let out = Command::new(bin)
        .args([
            "client",
            &port.to_string(),
            &size.to_string(),
            &clients.to_string(),
            &depth.to_string(),
            &secs.to_string(),
        ])
        .output()
        .map_err(|e| format!("running {}: {e}", bin.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |k: &str| -> f64 {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    if !out.status.success() || field("rps=") == 0.0 {
        return Err(format!(
            "tonic client failed: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(Cell {
        system: "tonic",
        size,
        clients,
        depth,
        calls: field("calls=") as u64,
        rps: field("rps="),
        mbps: field("MBps="),
        p50: field("p50_us="),
        p99: field("p99_us="),
        p999: f64::NAN,
        cpu_us_per_call: None,
        c2c_ns: None,
    })
}

/// Resident memory of a process, KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// KiB of the server's RSS per connection, for `n` connections that send nothing (opened
/// after one warm-up connection, measured once the server has accepted them all).
fn idle_conn_kib(pid: u32, port: u16, n: usize) -> Option<f64> {
    drop(TcpStream::connect(("127.0.0.1", port)).ok()?);
    std::thread::sleep(Duration::from_millis(200));
    let before = rss_kib(pid)?;
    let conns: Vec<TcpStream> = (0..n)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", port)).ok())
        .collect();
    std::thread::sleep(Duration::from_millis(800));
    let after = rss_kib(pid)?;
    let opened = conns.len().max(1);
    drop(conns);
    Some(after.saturating_sub(before) as f64 / opened as f64)
}

fn fmt_size(s: usize) -> String {
    if s >= 1 << 20 && s.is_multiple_of(1 << 20) {
        format!("{} MiB", s >> 20)
    } else if s >= 1024 && s.is_multiple_of(1024) {
        format!("{} KiB", s >> 10)
    } else {
        format!("{s} B")
    }
}

/// A note under the results table when the client's runtime threads and the server's
/// workers together outnumber the CPUs: each cell then has threads waiting for a CPU, which
/// shows in the tail (`docs/benchmarks.md`: a p999 of about 4 ms on two vCPUs with 2 + 2).
fn oversubscription_note(client_threads: Option<usize>, server_workers: usize) -> Option<String> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let client = match client_threads {
        Some(0) => 1,
        Some(n) => n,
        None => cpus,
    };
    (client + server_workers > cpus).then(|| {
        format!(
            "runtime threads: {client} client + {server_workers} server on {cpus} CPUs. With more \
             threads than CPUs, a thread that has work waits for a CPU and its connections' calls \
             with it: that is in the p99/p999 of the many-client cells. Client and server sized \
             to the CPUs (e.g. --client-threads 0 --server-workers {}) show the protocol's own tail.",
            cpus.saturating_sub(1).max(1)
        )
    })
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
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
    // Killed when `run` returns.
    let (server, port) = start_server(&server_bin, &args, &[])?;
    let server_pid = server.0.id();
    let addr = PeerAddr::Tcp(SocketAddr::from(([127, 0, 0, 1], port)));

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
    let tonic_pid = _tonic.as_ref().map(|p| p.0.id());
    // Before any load, so that the figures are the connections' own.
    let idle = (args.idle_conns > 0).then(|| {
        eprintln!("idle connections: {} to each server", args.idle_conns);
        (
            idle_conn_kib(server_pid, port, args.idle_conns),
            tonic_pid.and_then(|pid| idle_conn_kib(pid, tonic_port, args.idle_conns)),
        )
    });

    let mut cells: Vec<(Cell, Option<Cell>)> = Vec::new();
    let mut raw: Vec<Cell> = Vec::new();
    let mut raw_deep: Vec<Cell> = Vec::new();
    let mut raw_proc: Vec<Cell> = Vec::new();
    let mut direct: Vec<Cell> = Vec::new();
    let total = args.sizes.len() * (1 + args.clients.len() * args.depths.len());
    let mut step = 0;
    for &size in &args.sizes {
        step += 1;
        eprintln!("[{step}/{total}] raw TCP ping-pong, {}", fmt_size(size));
        let before = core_to_core_ns();
        let mut r = bench_raw_tcp(size, 1, args.seconds.min(2.0)).map_err(|e| e.to_string())?;
        let mut c2c_before = core_to_core_ns();
        r.c2c_ns = before.zip(c2c_before);
        raw.push(r);
        let mut r = bench_raw_tcp_processes(size, args.seconds.min(2.0))?;
        let after = core_to_core_ns();
        r.c2c_ns = c2c_before.zip(after);
        c2c_before = after;
        raw_proc.push(r);
        if args.clients.contains(&1) && args.depths.contains(&1) {
            let (a, secs) = (addr.clone(), args.seconds.min(2.0));
            let mut r = tokio::task::spawn_blocking(move || bench_direct(&a, size, secs))
                .await
                .map_err(|e| e.to_string())??;
            let after = core_to_core_ns();
            r.c2c_ns = c2c_before.zip(after);
            c2c_before = after;
            direct.push(r);
        }
        // Raw blocking TCP with as many messages in flight as the pipelining figure's deep
        // side, beside it.
        if args.depths.contains(&PIPELINE_DEPTH)
            && args.clients.contains(&1)
            && size * PIPELINE_DEPTH <= RAW_BATCH_MAX
        {
            let mut r = bench_raw_tcp(size, PIPELINE_DEPTH, args.seconds.min(2.0))
                .map_err(|e| e.to_string())?;
            let after = core_to_core_ns();
            r.c2c_ns = c2c_before.zip(after);
            c2c_before = after;
            raw_deep.push(r);
        }
        for &clients in &args.clients {
            for &depth in &args.depths {
                step += 1;
                eprintln!(
                    "[{step}/{total}] {} x {clients} client(s) x {depth} in flight: hmc-rpc{}",
                    fmt_size(size),
                    if tonic_bin.is_some() { ", tonic" } else { "" }
                );
                let cpu = CpuProbe::start(server_pid, false);
                let mut h =
                    bench_hmc(&addr, size, clients, depth, args.seconds, args.stream_crc).await?;
                h.cpu_us_per_call = cpu.per_call(h.calls);
                let c2c_between = core_to_core_ns();
                h.c2c_ns = c2c_before.zip(c2c_between);
                c2c_before = c2c_between;
                let cpu = CpuProbe::start(tonic_pid.unwrap_or(0), true);
                let t = match &tonic_bin {
                    Some(b) => match bench_tonic(b, tonic_port, size, clients, depth, args.seconds)
                    {
                        Ok(mut t) => {
                            t.cpu_us_per_call = cpu.per_call(t.calls);
                            let c2c_after = core_to_core_ns();
                            t.c2c_ns = c2c_before.zip(c2c_after);
                            c2c_before = c2c_after;
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
                cells.push((h, t));
            }
        }
    }

    let dp_rows = bench_data_planes(&args, &server_bin, &cells).await?;

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
        "| payload | clients | in flight | hmc RPC/s | hmc MB/s | hmc p50 us | hmc p99 us | hmc p999 us | tonic RPC/s | tonic MB/s | tonic p50 us | RPC/s ratio | hmc CPU us/call | tonic CPU us/call | host c2c ns |"
    );
    println!(
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    let cpu = |c: Option<&Cell>| {
        c.and_then(|c| c.cpu_us_per_call)
            .map_or("-".to_string(), |v| format!("{v:.1}"))
    };
    for (h, t) in &cells {
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
            "| {} | {} | {} | {:.0} | {:.1} | {:.0} | {:.0} | {:.0} | {tr} | {tm} | {tp} | {ratio} | {} | {} | {} |",
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
            fmt_c2c(h)
        );
    }
    println!(
        "\nhost c2c ns: a cache line's round trip between the first two CPUs, just before/after \
         the cell. Tens of ns: the cores share a cache; several times that: the host runs them \
         apart (on the project's VMs about 60 against 330 ns), which slows every figure that \
         crosses cores; the host changes it within seconds."
    );
    if let Some(note) = oversubscription_note(args.client_threads, args.server_workers) {
        println!("\n{note}");
    }
    if let Some((hmc, tonic)) = idle {
        let kib = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
        println!(
            "\n## idle connections ({} that send nothing; server RSS growth per connection)\n",
            args.idle_conns
        );
        println!("| hmc-rpc KiB/conn | tonic KiB/conn |\n| --- | --- |");
        println!("| {} | {} |", kib(hmc), kib(tonic));
    }
    println!(
        "\n## raw TCP ping-pong baseline (1 connection, 1 in flight, blocking; echo in a thread of this process, and in another process as hmc-rpc's server is)\n"
    );
    println!(
        "| payload | round trips/s | MB/s | p50 us | p99 us | hmc-rpc 1x1 p50 us | p50 ratio | two processes: p50 us | p50 ratio | DirectClient p50 us | p50 ratio | host c2c ns |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for r in &raw {
        let h = cells
            .iter()
            .find(|(h, _)| h.size == r.size && h.clients == 1 && h.depth == 1)
            .map(|(h, _)| h.p50);
        let p = raw_proc.iter().find(|p| p.size == r.size).map(|p| p.p50);
        let d = direct.iter().find(|d| d.size == r.size).map(|d| d.p50);
        println!(
            "| {} | {:.0} | {:.1} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} | {} |",
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
            fmt_c2c(r)
        );
    }
    println!("\n## pipelining on one connection (1 client)\n");
    println!(
        "| payload | depth 1 RPC/s | depth 8 RPC/s | ratio | raw TCP depth 1 msg/s | raw TCP depth 8 msg/s | raw ratio | hmc depth 8 / raw depth 8 |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for &size in &args.sizes {
        let find = |d: usize| {
            cells
                .iter()
                .find(|(h, _)| h.size == size && h.clients == 1 && h.depth == d)
                .map(|(h, _)| h.rps)
        };
        let raw1 = raw.iter().find(|r| r.size == size).map(|r| r.rps);
        let raw8 = raw_deep
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

    if !dp_rows.is_empty() {
        println!(
            "\n## HMC_BUFFER echo vs TCP_STREAM and ucx_perftest tag_bw (bytes moved = request + response; UCX_TLS={})\n",
            std::env::var("UCX_TLS").unwrap_or_else(|_| "(UCX default)".into())
        );
        println!(
            "| data plane | payload | clients | in flight | RPC/s | p50 us | bytes moved MB/s | TCP_STREAM MB/s | vs TCP_STREAM | tag_bw MB/s median (range) | vs tag_bw median | tag_bw -e MB/s median (range) | vs tag_bw -e median | CPU us/call (TCP_STREAM) | host c2c ns |"
        );
        println!(
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
        );
        for r in &dp_rows {
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
            println!(
                "| {:?} | {} | {} | {} | {:.0} | {:.0} | {moved:.1} | {stream} | {vs_stream} | {tag} | {vs_tag} | {tag_e} | {vs_tag_e} | {} ({}) | {} |",
                r.plane,
                fmt_size(r.buffer.size),
                r.buffer.clients,
                r.buffer.depth,
                r.buffer.rps,
                r.buffer.p50,
                cpu(Some(&r.buffer)),
                cpu(r.stream.as_ref()),
                fmt_c2c(&r.buffer)
            );
        }
    }

    if let Some(dir) = args.csv.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let mut csv = String::from(
        "system,payload_bytes,clients,in_flight,calls,rps,mbps,p50_us,p99_us,p999_us,cpu_us_per_call,c2c_before_ns,c2c_after_ns\n",
    );
    for c in cells
        .iter()
        .flat_map(|(h, t)| std::iter::once(h).chain(t.iter()))
        .chain(raw.iter())
        .chain(raw_deep.iter())
        .chain(raw_proc.iter())
        .chain(direct.iter())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oversubscription_note_appears_only_with_more_runtime_threads_than_cpus() {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        // The default client runtime takes every CPU: any server worker is one too many.
        let note = oversubscription_note(None, 1).expect("cpus + 1 threads on cpus CPUs");
        assert!(
            note.contains(&format!("{cpus} client + 1 server on {cpus} CPUs")),
            "{note}"
        );
        // A current-thread client beside cpus - 1 workers fits.
        if cpus > 1 {
            assert_eq!(oversubscription_note(Some(0), cpus - 1), None);
        }
        assert!(oversubscription_note(Some(0), cpus).is_some());
        assert!(oversubscription_note(Some(cpus), 0).is_none());
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn core_to_core_round_trip_is_measured_when_two_cpus_are_allowed() {
        let ns = core_to_core_ns();
        if allowed_cpus().len() < 2 {
            assert_eq!(ns, None);
            return;
        }
        let ns = ns.expect("two CPUs: measured");
        // A cache line's round trip: above a few ns, far below a scheduler time slice
        // (two spinning threads on two allowed CPUs never wait for each other's turn).
        assert!(ns > 5.0 && ns < 100_000.0, "{ns} ns");
        // Only the measuring threads were pinned, not this one.
        assert!(allowed_cpus().len() >= 2);
    }

    /// The raw baseline verifies every echoed batch (it asserts), and counts messages, not
    /// rounds, at depth 8.
    #[test]
    fn raw_tcp_baseline_counts_messages_at_each_depth() {
        for (size, depth) in [(64, 1), (64, 8), (4096, 8), (1 << 20, 1)] {
            let c = bench_raw_tcp(size, depth, 0.05).expect("loopback TCP");
            assert_eq!((c.size, c.depth), (size, depth));
            assert!(c.calls > 0, "{size} x {depth}: no round trip");
            assert_eq!(
                c.calls % depth as u64,
                0,
                "whole rounds of {depth} messages"
            );
        }
        const { assert!(4096 * 8 <= RAW_BATCH_MAX) };
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn cpu_of_this_process_is_read_and_grows() {
        let (a, _) = proc_cpu_us(None).expect("/proc/self/stat parses");
        let mut x = 0u64;
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(50) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        let (b, _) = proc_cpu_us(None).expect("/proc/self/stat parses");
        assert!(b >= a, "{a} -> {b} ({x})");
        assert!(proc_cpu_us(Some(std::process::id())).is_some());
    }
}
