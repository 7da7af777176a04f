//! The baselines and peer processes: raw TCP ping-pong (in process and between
//! processes), the server and tonic peer processes and their ports.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hmc_bench_kit::cpu::{self, ProcessCpu};

use crate::Args;
use crate::measure::{Cell, cell_from};

/// The deep side of the pipelining table (depth 8 against depth 1 on one connection).
pub(crate) const PIPELINE_DEPTH: usize = 8;

/// Largest batch (`depth` x payload) the raw pipelined baseline sends in one write: both
/// sides write before they read, so a batch must fit in the sockets' buffers.
pub(crate) const RAW_BATCH_MAX: usize = 256 << 10;

/// Blocking TCP ping-pong on one connection, `size` bytes each way. Depth 1: one message
/// in flight, echoed whole. Depth `d`: the client writes `d` messages in one write and reads
/// their echo (the server echoes whatever each read returned), so each round trip moves `d`
/// messages with one write and as few reads as the kernel allows on either side: what
/// blocking sockets get with `d` messages in flight on one connection, without RPC framing
/// (each side sleeps in `read` between rounds, as the depth-1 baseline does).
pub(crate) fn bench_raw_tcp(size: usize, depth: usize, secs: f64) -> std::io::Result<Cell> {
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
    // Both ends are threads of this process.
    let meter = ProcessCpu::this_process();
    let (lat, el) = ping_pong(&mut c, size, depth, secs)?;
    let used = meter.used();
    drop(c);
    let _ = server.join();
    let mut cell = cell_from("raw-tcp", size, 1, depth, lat, el);
    cell.cpu_us_per_call = used.and_then(|u| cpu::cpu_us_per_op(u, cell.calls));
    Ok(cell)
}

/// Echoes whole messages of `size` bytes until the peer closes (the depth-1 raw server).
pub(crate) fn echo_messages(s: &mut TcpStream, size: usize) -> std::io::Result<()> {
    let mut buf = vec![0u8; size];
    while s.read_exact(&mut buf).is_ok() {
        s.write_all(&buf)?;
    }
    Ok(())
}

/// The raw client: for `secs`, writes `depth` messages of `size` bytes in one write and
/// reads their echo, checking it; each message's latency is its round's, and the elapsed
/// seconds come back beside them.
pub(crate) fn ping_pong(
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

/// The server side of [`bench_raw_tcp_processes`]: one connection, messages of `size` bytes
/// echoed whole, until the client closes.
pub(crate) fn raw_echo_server(size: usize) -> std::io::Result<()> {
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
pub(crate) fn bench_raw_tcp_processes(size: usize, secs: f64) -> Result<Cell, String> {
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
    let meter = ProcessCpu::with_peer(child.0.id());
    let (lat, el) = ping_pong(&mut c, size, 1, secs).map_err(io)?;
    let used = meter.used();
    drop(c);
    drop(child);
    let mut cell = cell_from("raw-tcp-processes", size, 1, 1, lat, el);
    cell.cpu_us_per_call = used.and_then(|u| cpu::cpu_us_per_op(u, cell.calls));
    Ok(cell)
}

/// Starts `hmc-rpc-server` on a port it picks itself (`--port 0`: no race with other
/// sockets for a port chosen here) with the bench's limits and `extra` arguments; its
/// process and port, read from the line it prints once it listens. `max_connections`: the
/// server's limit (the matrix's 1024; the connection sweep's step and a margin).
pub(crate) fn start_server(
    server_bin: &Path,
    args: &Args,
    max_connections: &str,
    extra: &[&str],
) -> Result<(Proc, u16), String> {
    let server = Command::new(server_bin)
        .env("GLIBC_TUNABLES", hmc_rpc_tools::tuning::GLIBC_TUNABLES)
        .args(["--port", "0", "--workers", &args.server_workers.to_string()])
        .args([
            "--max-inflight",
            "256",
            "--max-connections",
            max_connections,
        ])
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
    read_port(server)
}

/// Reads the port a freshly started server prints on its first line (`… listening on
/// tcp://127.0.0.1:PORT`); the server is killed when the returned [`Proc`] drops.
pub(crate) fn read_port(mut server: Child) -> Result<(Proc, u16), String> {
    let mut line = String::new();
    let read = BufReader::new(server.stdout.take().expect("piped stdout")).read_line(&mut line);
    let server = Proc(server);
    read.map_err(|e| e.to_string())?;
    let port = line
        .trim()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("the server did not start (it printed `{}`)", line.trim()))?;
    Ok((server, port))
}

pub(crate) struct Proc(pub(crate) Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(18099)
}

pub(crate) fn wait_port(port: u16) {
    for _ in 0..100 {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub(crate) fn bench_tonic(
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
