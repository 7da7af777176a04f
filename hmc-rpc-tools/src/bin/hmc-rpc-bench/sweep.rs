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
use crate::measure::{bytes_per_conn, fmt_size, rss_kib};

/// The steps of `--conn-sweep` given without a list: powers of two to 1,024, then `max`.
pub(crate) const DEFAULT_STEPS: &str = "1,2,4,8,16,32,64,128,256,512,1024,max";

/// The targets: RPC/s at 1,024 connections against the sweep's peak, and the
/// server's memory per idle connection.
pub(crate) const TARGET_SHARE_OF_PEAK: f64 = 0.80;
pub(crate) const TARGET_IDLE_BYTES: f64 = 64.0 * 1024.0;

/// How long one connect (and the first call on it) may take before the step stops with
/// that as its reason.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The connection counts to measure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SweepPlan {
    /// The listed counts, in order.
    pub(crate) steps: Vec<usize>,
    /// `max` was listed: after the last count, keep doubling until connects fail.
    pub(crate) beyond: bool,
}

impl SweepPlan {
    /// `1,2,4,…[,max]`: positive counts, `max` last if at all.
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        let mut plan = SweepPlan {
            steps: Vec::new(),
            beyond: false,
        };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if plan.beyond {
                return Err(format!("`max` must be the sweep's last step (got `{s}`)"));
            }
            if part == "max" {
                plan.beyond = true;
                continue;
            }
            let n: usize = part
                .parse()
                .map_err(|_| format!("`{part}` is not a connection count (or `max`)"))?;
            if n == 0 {
                return Err("a sweep step needs at least one connection".into());
            }
            plan.steps.push(n);
        }
        if plan.steps.is_empty() {
            return Err(format!(
                "the sweep needs a connection count, e.g. `{DEFAULT_STEPS}`"
            ));
        }
        Ok(plan)
    }

    /// The step after `done` connections (`None`: the sweep is over).
    fn next(&self, index: usize, done: usize) -> Option<usize> {
        match self.steps.get(index) {
            Some(&n) => Some(n),
            None if self.beyond => Some(done.max(1).saturating_mul(2)),
            None => None,
        }
    }
}

/// One step's figures.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SweepPoint {
    pub(crate) conns: usize,
    pub(crate) rps: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    /// Server RSS growth per connection once every connection has made one call and
    /// waits, bytes.
    pub(crate) idle_bytes_per_conn: Option<f64>,
    /// The same after the load, bytes (buffers a busy connection grew and kept).
    pub(crate) loaded_bytes_per_conn: Option<f64>,
}

/// What the sweep came to: peak, the 1,024-connection step against it, and why it stopped.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SweepSummary {
    pub(crate) peak_rps: f64,
    pub(crate) peak_conns: usize,
    /// RPC/s at 1,024 connections and its share of the peak.
    pub(crate) at_1024: Option<(f64, f64)>,
    pub(crate) idle_bytes_at_1024: Option<f64>,
    pub(crate) most_conns: usize,
}

/// The summary of `points` (`None` when no step completed).
pub(crate) fn summarize(points: &[SweepPoint]) -> Option<SweepSummary> {
    let peak = points.iter().max_by(|a, b| a.rps.total_cmp(&b.rps))?;
    let at = points.iter().find(|p| p.conns == 1024);
    Some(SweepSummary {
        peak_rps: peak.rps,
        peak_conns: peak.conns,
        at_1024: at.map(|p| (p.rps, p.rps / peak.rps.max(f64::MIN_POSITIVE))),
        idle_bytes_at_1024: at.and_then(|p| p.idle_bytes_per_conn),
        most_conns: points.iter().map(|p| p.conns).max().unwrap_or(0),
    })
}

/// Raises this process's `RLIMIT_NOFILE` soft limit to its hard limit (the server children
/// inherit it); the limits after the call.
pub(crate) fn raise_fd_limit() -> Option<(libc::rlim_t, libc::rlim_t)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid `rlimit` the call fills in.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    lim.rlim_cur = lim.rlim_max;
    // SAFETY: `lim` is a valid `rlimit`; raising the soft limit to the hard one is allowed
    // without privileges. On failure the old limits stay and are read back below.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    // SAFETY: as the first call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    Some((lim.rlim_cur, lim.rlim_max))
}

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
    let mut points: Vec<SweepPoint> = Vec::new();
    let mut stopped = String::from("every listed step ran");
    let mut index = 0;
    let mut done = 0;
    while let Some(n) = plan.next(index, done) {
        index += 1;
        eprintln!("[sweep step {index}] {n} connection(s)");
        match sweep_step(args, server_bin, n, size, depth).await {
            Ok(p) => {
                eprintln!(
                    "  {:.0} RPC/s, p50 {:.0} us, server {} B/idle connection",
                    p.rps,
                    p.p50_us,
                    p.idle_bytes_per_conn
                        .map_or("-".into(), |b| format!("{b:.0}"))
                );
                points.push(p);
                done = n;
            }
            Err(why) => {
                eprintln!("  stopped: {why}");
                stopped = format!("{n} connections: {why}");
                break;
            }
        }
    }
    print_tables(args, &points, &stopped, limits);
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
    let cell = bench_conns(conns, size, depth, args.seconds, "hmc-rpc", None).await?;
    let loaded = before
        .zip(rss_kib(pid))
        .map(|(b, a)| bytes_per_conn(b, a, n));
    // The server goes first: its sockets, not this process's ports, wait in TIME_WAIT.
    drop(server);
    Ok(SweepPoint {
        conns: n,
        rps: cell.rps,
        p50_us: cell.p50,
        p99_us: cell.p99,
        idle_bytes_per_conn: idle,
        loaded_bytes_per_conn: loaded,
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
        .map_err(|_| format!("no answer within {:?}", t.elapsed()))?
}

fn print_tables(
    args: &Args,
    points: &[SweepPoint],
    stopped: &str,
    limits: Option<(libc::rlim_t, libc::rlim_t)>,
) {
    let kib = |b: Option<f64>| b.map_or("-".into(), |b| format!("{:.1}", b / 1024.0));
    println!(
        "\n## connection sweep ({} echo, {} in flight per connection, {} s per step, a fresh server with {} workers per step; clients are tokio tasks on one runtime)\n",
        fmt_size(args.sweep_size),
        args.sweep_depth,
        args.seconds,
        args.server_workers
    );
    println!(
        "| connections | RPC/s | p50 us | p99 us | share of peak | server KiB/idle conn | server KiB/conn after load |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    let peak = points.iter().map(|p| p.rps).fold(0.0, f64::max);
    for p in points {
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.0}% | {} | {} |",
            p.conns,
            p.rps,
            p.p50_us,
            p.p99_us,
            100.0 * p.rps / peak.max(f64::MIN_POSITIVE),
            kib(p.idle_bytes_per_conn),
            kib(p.loaded_bytes_per_conn)
        );
    }
    println!("\n## connection sweep summary\n");
    println!(
        "| peak RPC/s | peak at connections | RPC/s at 1024 | at 1024 / peak (target ≥ {:.0}%) | server KiB/idle conn at 1024 (target ≤ {:.0}) | most connections | stopped | RLIMIT_NOFILE |",
        100.0 * TARGET_SHARE_OF_PEAK,
        TARGET_IDLE_BYTES / 1024.0
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    if let Some(s) = summarize(points) {
        let (at, share) = s.at_1024.map_or(("-".into(), "-".into()), |(r, share)| {
            (format!("{r:.0}"), format!("{:.0}%", 100.0 * share))
        });
        println!(
            "| {:.0} | {} | {at} | {share} | {} | {} | {} | {} |",
            s.peak_rps,
            s.peak_conns,
            kib(s.idle_bytes_at_1024),
            s.most_conns,
            stopped.replace('|', "/"),
            limits.map_or("-".into(), |(soft, _)| soft.to_string())
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("1,2,4", &[1, 2, 4], false)]
    #[case(DEFAULT_STEPS, &[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024], true)]
    #[case(" 3 , max", &[3], true)]
    fn sweep_steps_parse(#[case] text: &str, #[case] steps: &[usize], #[case] beyond: bool) {
        let plan = SweepPlan::parse(text).expect("valid");
        assert_eq!(plan.steps, steps);
        assert_eq!(plan.beyond, beyond);
    }

    #[rstest]
    #[case("0,1")]
    #[case("max,4")]
    #[case("max")]
    #[case("four")]
    fn bad_sweep_steps_are_refused(#[case] text: &str) {
        assert!(SweepPlan::parse(text).is_err(), "{text}");
    }

    #[test]
    fn beyond_the_list_the_sweep_doubles_the_last_completed_step() {
        let plan = SweepPlan::parse("1,1024,max").unwrap();
        assert_eq!(plan.next(0, 0), Some(1));
        assert_eq!(plan.next(1, 1), Some(1024));
        assert_eq!(plan.next(2, 1024), Some(2048));
        assert_eq!(plan.next(3, 2048), Some(4096));
        let plain = SweepPlan::parse("1,2").unwrap();
        assert_eq!(plain.next(2, 2), None);
    }

    fn point(conns: usize, rps: f64, idle: Option<f64>) -> SweepPoint {
        SweepPoint {
            conns,
            rps,
            p50_us: 0.0,
            p99_us: 0.0,
            idle_bytes_per_conn: idle,
            loaded_bytes_per_conn: None,
        }
    }

    #[test]
    fn the_summary_compares_1024_connections_with_the_peak() {
        let pts = [
            point(1, 10_000.0, None),
            point(64, 50_000.0, None),
            point(1024, 40_000.0, Some(9000.0)),
            point(2048, 30_000.0, None),
        ];
        let s = summarize(&pts).unwrap();
        assert_eq!(
            (s.peak_rps, s.peak_conns, s.most_conns),
            (50_000.0, 64, 2048)
        );
        assert_eq!(s.at_1024, Some((40_000.0, 0.8)));
        assert_eq!(s.idle_bytes_at_1024, Some(9000.0));
        // A sweep that stopped before 1,024 has no such figure.
        let s = summarize(&pts[..2]).unwrap();
        assert_eq!(s.at_1024, None);
        assert_eq!(summarize(&[]), None);
    }

    #[test]
    fn the_fd_limit_is_raised_to_the_hard_limit() {
        let (soft, hard) = raise_fd_limit().expect("getrlimit");
        // An unlimited hard limit cannot be the soft one (the kernel caps it at nr_open).
        assert!(
            soft == hard || hard == libc::RLIM_INFINITY,
            "{soft} / {hard}"
        );
    }
}
