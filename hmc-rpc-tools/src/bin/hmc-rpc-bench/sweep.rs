//! The connection sweep (`--conn-sweep`): echo RPC/s and the server's memory per idle
//! connection from one connection to 1,024 and then as many as the machine allows.
//!
//! Every step starts a fresh `hmc-rpc-server` (so memory an earlier, larger step left in
//! the server's allocator cannot hide the growth), reads its RSS, opens the step's
//! connections as tokio tasks of this process (never a thread per connection), makes one
//! call on each, reads the RSS again (the idle figure: connections that have served a call
//! and wait), then runs the echo load on all of them for `--seconds`.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hmc_core::PeerAddr;
use hmc_rpc::{Client, ClientConfig, demo};

use crate::Args;
use crate::baselines::start_server;
use crate::hmc::bench_conns;
use crate::measure::fmt_size;
use crate::raw_sweep::{raw_step, raw_table};
use hmc_rpc_tools::sweep::{
    CpuMeter, SweepPlan, SweepPoint, bytes_per_conn, raise_fd_limit, rss_kib, tables,
};

/// How long one connect (and the first call on it) may take before the step stops with
/// that as its reason.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs the sweep and prints its two tables (steps, summary).
pub(crate) async fn run_sweep(
    args: &Args,
    plan: &SweepPlan,
    server_bin: &Path,
) -> Result<(), String> {
    let limits = raise_fd_limit();
    let (size, depth) = (args.sweep_size, args.sweep_depth);
    eprintln!(
        "connection sweep: {} echo, {depth} in flight per connection, {} s per step; RLIMIT_NOFILE {}",
        fmt_size(size),
        args.seconds,
        limits.map_or("unknown".into(), |(s, h)| format!("{s} (hard {h})"))
    );
    let raw = std::cell::RefCell::new(Vec::new());
    let (points, stopped) = plan
        .run(
            |n| {
                let raw = &raw;
                async move {
                    let point = sweep_step(args, server_bin, n, size, depth).await?;
                    if args.sweep_raw {
                        match raw_step(args, n).await {
                            Ok(r) => {
                                eprintln!("  raw tokio echo: {:.0}/s", r.rate);
                                raw.borrow_mut().push(r);
                            }
                            Err(e) => eprintln!("  raw tokio echo failed: {e}"),
                        }
                    }
                    Ok(point)
                }
            },
            |line| eprintln!("{line}"),
        )
        .await;
    let setup = format!(
        "{} echo, {depth} in flight per connection, {} s per step, a fresh server with {} workers per step; clients are tokio tasks on one runtime",
        fmt_size(size),
        args.seconds,
        args.server_workers
    );
    print!(
        "{}",
        tables(
            "connection sweep",
            &setup,
            "RPC/s",
            &points,
            &stopped,
            limits,
        )
    );
    if args.sweep_raw {
        print!("{}", raw_table(&raw.borrow()));
    }
    if points.is_empty() {
        return Err(format!("no sweep step completed ({stopped})"));
    }
    Ok(())
}

/// One step on a fresh server.
async fn sweep_step(
    args: &Args,
    server_bin: &Path,
    n: usize,
    size: usize,
    depth: usize,
) -> Result<SweepPoint, String> {
    // No server-side limit below what the step asks for: the sweep measures the machine.
    let conns_limit = (n + 16).to_string();
    let inflight_total = (n * depth + 16).to_string();
    let (server, port) = start_server(
        server_bin,
        args,
        &conns_limit,
        &["--max-inflight-total", &inflight_total],
    )?;
    let pid = server.0.id();
    let addr = PeerAddr::Tcp(SocketAddr::from(([127, 0, 0, 1], port)));
    let body = Bytes::from(vec![0x5a; size]);
    // One connection and call first, so that the server's one-time allocations are in the
    // "before" figure.
    let first = connect_and_call(&addr, &body)
        .await
        .map_err(|e| format!("first connection: {e}"))?;
    drop(first);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = rss_kib(pid);
    let mut conns = Vec::with_capacity(n);
    for i in 0..n {
        match connect_and_call(&addr, &body).await {
            Ok(c) => conns.push(c),
            Err(e) => return Err(format!("connection {} of {n} failed: {e}", i + 1)),
        }
    }
    // Let the server finish accepting and settle before reading its memory.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let idle = before
        .zip(rss_kib(pid))
        .map(|(b, a)| bytes_per_conn(b, a, n));
    let cpu = CpuMeter::start(pid);
    let cell = bench_conns(conns, size, depth, args.seconds, "hmc-rpc", None).await?;
    let cpu_us_per_op = cpu.per_op(cell.calls);
    let loaded = before
        .zip(rss_kib(pid))
        .map(|(b, a)| bytes_per_conn(b, a, n));
    // The server goes first: its sockets, not this process's ports, wait in TIME_WAIT.
    drop(server);
    Ok(SweepPoint {
        conns: n,
        rate: cell.rps,
        p50_us: cell.p50,
        p99_us: cell.p99,
        idle_bytes_per_conn: idle,
        loaded_bytes_per_conn: loaded,
        cpu_us_per_op,
    })
}

/// A connection that has made one verified echo call.
async fn connect_and_call(addr: &PeerAddr, body: &Bytes) -> Result<Client, String> {
    let once = async {
        let c = Client::connect(addr, ClientConfig::default())
            .await
            .map_err(|e| e.to_string())?;
        let r = c
            .call(demo::ECHO, body.clone())
            .await
            .map_err(|e| e.to_string())?;
        if r != *body {
            return Err("the echo answered other bytes".to_string());
        }
        Ok(c)
    };
    let t = Instant::now();
    tokio::time::timeout(CONNECT_TIMEOUT, once)
        .await
        .map_err(|_| {
            format!(
                "no answer within {:.1} s (a server that can open no more sockets, e.g. at its RLIMIT_NOFILE, leaves new connections unanswered)",
                t.elapsed().as_secs_f64()
            )
        })?
}
