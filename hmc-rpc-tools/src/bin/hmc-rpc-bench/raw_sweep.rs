//! The connection sweep's machine baseline (`--conn-sweep … --sweep-raw`): the same steps
//! with a raw tokio TCP echo instead of hmc-rpc, one echo in flight per connection.
//!
//! The raw echo is what every tokio RPC stack on this machine pays at the least: a server
//! process whose runtime has as many workers as `hmc-rpc-server`'s and one task per
//! connection that reads a message and writes it back, and clients as tokio tasks of this
//! process, one connection each. How its CPU per echo grows from a few connections to
//! 1,024 is the machine's share (kernel sockets, the runtimes' scheduling, caches) of how
//! hmc-rpc's CPU per call grows.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::Args;
use crate::baselines::read_port;
use hmc_rpc_tools::sweep::CpuMeter;

/// One step of the baseline.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawPoint {
    pub(crate) conns: usize,
    pub(crate) rate: f64,
    pub(crate) cpu_us_per_op: Option<f64>,
}

/// Internal mode (`--raw-tokio-echo-server SIZE`): serves the baseline's echo of `size`-byte
/// messages on a runtime of `workers` threads, one task per connection, printing its port.
pub(crate) fn raw_tokio_echo_server(size: usize, workers: usize) -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers.max(1))
        .enable_all()
        .build()?;
    rt.block_on(async {
        let l = TcpListener::bind("127.0.0.1:0").await?;
        println!(
            "raw tokio echo listening on tcp://127.0.0.1:{}",
            l.local_addr()?.port()
        );
        std::io::stdout().flush()?;
        loop {
            let (mut s, _) = l.accept().await?;
            s.set_nodelay(true)?;
            tokio::spawn(async move {
                let mut buf = vec![0u8; size];
                while s.read_exact(&mut buf).await.is_ok() {
                    if s.write_all(&buf).await.is_err() {
                        break;
                    }
                }
            });
        }
    })
}

/// Runs the baseline at connection count `n` on a fresh raw echo server.
pub(crate) async fn raw_step(args: &Args, n: usize) -> Result<RawPoint, String> {
    let size = args.sweep_size.max(8);
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let child = Command::new(me)
        .args(["--raw-tokio-echo-server", &size.to_string()])
        .args(["--server-workers", &args.server_workers.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting the raw echo server: {e}"))?;
    let (server, port) = read_port(child)?;
    let mut conns = Vec::with_capacity(n);
    for i in 0..n {
        let s = TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| format!("raw connection {} of {n}: {e}", i + 1))?;
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        conns.push(s);
    }
    let cpu = CpuMeter::start(server.0.id());
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(args.seconds);
    let tasks: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(ci, mut s)| {
            tokio::spawn(async move {
                let mut body: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
                let mut back = vec![0u8; size];
                let mut n: u64 = (ci as u64) << 32;
                let mut echoes = 0u64;
                while Instant::now() < end {
                    // A numbered message each time, checked on its way back.
                    n += 1;
                    body[..8].copy_from_slice(&n.to_be_bytes());
                    s.write_all(&body).await?;
                    s.read_exact(&mut back).await?;
                    if back != body {
                        return Err(std::io::Error::other("the raw echo answered other bytes"));
                    }
                    echoes += 1;
                }
                Ok::<_, std::io::Error>(echoes)
            })
        })
        .collect();
    let mut total = 0u64;
    for t in tasks {
        total += t
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu_us_per_op = cpu.per_op(total);
    drop(server);
    Ok(RawPoint {
        conns: n,
        rate: total as f64 / secs,
        cpu_us_per_op,
    })
}

/// The baseline's table, beside hmc-rpc's: rate, share of its own peak, CPU per echo, and
/// each step's CPU per echo against the first step's (the growth to compare with hmc-rpc's).
pub(crate) fn raw_table(points: &[RawPoint]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n## raw tokio TCP echo baseline (same steps, one echo in flight per connection, a fresh echo server with the same workers per step)\n"
    );
    let _ = writeln!(
        out,
        "| connections | echoes/s | share of peak | CPU us/op (both sides) | CPU/op vs the first step |"
    );
    let _ = writeln!(out, "| --- | --- | --- | --- | --- |");
    let peak = points.iter().map(|p| p.rate).fold(0.0, f64::max);
    let first = points.first().and_then(|p| p.cpu_us_per_op);
    for p in points {
        let growth = first.zip(p.cpu_us_per_op).map_or("-".into(), |(f, c)| {
            format!("{:.2}x", c / f.max(f64::MIN_POSITIVE))
        });
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.0}% | {} | {growth} |",
            p.conns,
            p.rate,
            100.0 * p.rate / peak.max(f64::MIN_POSITIVE),
            p.cpu_us_per_op.map_or("-".into(), |c| format!("{c:.1}")),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_raw_table_shows_each_step_against_the_first() {
        let pts = [
            RawPoint {
                conns: 16,
                rate: 100_000.0,
                cpu_us_per_op: Some(10.0),
            },
            RawPoint {
                conns: 1024,
                rate: 80_000.0,
                cpu_us_per_op: Some(15.0),
            },
        ];
        let t = raw_table(&pts);
        assert!(t.contains("| 16 | 100000 | 100% | 10.0 | 1.00x |"), "{t}");
        assert!(t.contains("| 1024 | 80000 | 80% | 15.0 | 1.50x |"), "{t}");
    }
}
