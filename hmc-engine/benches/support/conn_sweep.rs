//! The engine's connection sweep (`--conn-sweep [1,2,…,1024,max]`): at each step a fresh
//! target process, and that many initiator engines in this process (each its own transport
//! and engine, connected to the target by name; tokio tasks, never a thread per engine),
//! each writing `--sweep-size` bytes one sync WRITE at a time for `--seconds`. The target's
//! RSS before and after the engines connect (each after one verified WRITE) gives its
//! memory per idle connected engine. Steps and tables are `hmc_bench_kit::sweep`'s, as in
//! `hmc-rpc-bench --conn-sweep`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hmc_bench_kit::sweep::{
    CpuMeter, SweepPlan, SweepPoint, bytes_per_conn, raise_fd_limit, rss_kib, tables,
};
use hmc_core::Communicator;
use hmc_engine::{Engine, EngineConfig, MemDesc, MemType, TransferOp, TransferOpDesc};

use crate::{Args, T, TargetProc, spawn_target};

/// How long one engine may take to start and connect before the step stops with that as
/// its reason.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// An initiator engine connected to the target, with its registered source buffer.
struct Initiator<C: Communicator> {
    engine: Engine<C>,
    buf: Vec<u8>,
}

impl<C: Communicator> Initiator<C> {
    async fn connect(comm: C, target: &str, size: usize) -> Result<Self, String> {
        // The engine registers only async RPC handlers: its server's pool of threads for
        // blocking ones sits idle, 4 threads per engine by default, which thousands of
        // engines in one process cannot have (in a deployment each is its own process).
        // One, the least the server takes: the only thread each initiator adds.
        let mut config = EngineConfig::default();
        config.rpc.workers = 1;
        let engine = Engine::initialize(Arc::new(comm), "127.0.0.1", config)
            .await
            .map_err(|e| e.to_string())?;
        let buf = vec![7u8; size.max(1)];
        // SAFETY: `buf` is owned by the initiator beside the engine and outlives every
        // transfer it makes (the engine is dropped with it).
        unsafe {
            engine
                .register_mem(
                    MemDesc {
                        addr: buf.as_ptr() as u64,
                        len: buf.len(),
                    },
                    MemType::Host,
                    hmc_engine::Access::READ_WRITE,
                )
                .map_err(|e| e.to_string())?;
        }
        engine.connect(target, T).await.map_err(|e| e.to_string())?;
        Ok(Initiator { engine, buf })
    }

    async fn write(&self, target: &str, remote: u64, size: usize) -> Result<(), String> {
        let d = [TransferOpDesc {
            local_addr: self.buf.as_ptr() as u64,
            remote_addr: remote,
            len: size,
        }];
        self.engine
            .transfer(target, TransferOp::Write, &d, T)
            .await
            .map_err(|e| e.to_string())
    }
}

/// Runs the sweep and prints its tables.
pub(crate) async fn run<C: Communicator>(
    a: &Args,
    plan: &SweepPlan,
    open: impl Fn() -> Result<C, String>,
) {
    let limits = raise_fd_limit();
    let (points, stopped) = plan
        .run(|n| step(a, n, &open), |line| eprintln!("{line}"))
        .await;
    let setup = format!(
        "{} transport, {} B sync WRITEs, one in flight per initiator engine, {} s per step, a fresh target process per step; initiators are tokio tasks of one process",
        a.transport, a.sweep_size, a.seconds
    );
    let failed = points.is_empty();
    print!(
        "{}",
        tables(
            "engine connection sweep",
            &setup,
            "WRITE ops/s",
            &points,
            &stopped,
            limits,
        )
    );
    if failed {
        eprintln!("error: no sweep step completed ({stopped})");
        std::process::exit(1);
    }
}

async fn step<C: Communicator>(
    a: &Args,
    n: usize,
    open: &impl Fn() -> Result<C, String>,
) -> Result<SweepPoint, String> {
    let target = spawn_target(a);
    let result = measure(a, n, open, &target).await;
    let TargetProc { mut child, .. } = target;
    let _ = child.kill();
    let _ = child.wait();
    result
}

async fn measure<C: Communicator>(
    a: &Args,
    n: usize,
    open: &impl Fn() -> Result<C, String>,
    target: &TargetProc,
) -> Result<SweepPoint, String> {
    let size = a.sweep_size;
    let (name, remote) = (target.name.as_str(), target.remote_buf);
    let pid = target.child.id();
    let connect = || async {
        let i = tokio::time::timeout(CONNECT_TIMEOUT, Initiator::connect(open()?, name, size))
            .await
            .map_err(|_| {
                format!(
                    "no connection within {CONNECT_TIMEOUT:?} (a target that can open no more sockets, e.g. at its RLIMIT_NOFILE, leaves new connections unanswered)"
                )
            })??;
        i.write(name, remote, size).await?;
        Ok::<_, String>(i)
    };
    // One engine first, so that the target's one-time allocations are in "before".
    drop(connect().await.map_err(|e| format!("first engine: {e}"))?);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = rss_kib(pid);
    let mut engines = Vec::with_capacity(n);
    for i in 0..n {
        engines.push(
            connect()
                .await
                .map_err(|e| format!("engine {} of {n}: {e}", i + 1))?,
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let idle = before
        .zip(rss_kib(pid))
        .map(|(b, after)| bytes_per_conn(b, after, n));
    let cpu = CpuMeter::start(pid);
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(a.seconds);
    let tasks: Vec<_> = engines
        .into_iter()
        .map(|e| {
            let name = name.to_string();
            tokio::spawn(async move {
                let mut lat = Vec::new();
                while Instant::now() < end {
                    let t = Instant::now();
                    e.write(&name, remote, size).await?;
                    lat.push(t.elapsed().as_micros() as u64);
                }
                Ok::<_, String>((e, lat))
            })
        })
        .collect();
    let (mut lat, mut kept) = (Vec::new(), Vec::new());
    for t in tasks {
        let (e, l) = t.await.map_err(|e| e.to_string())??;
        kept.push(e);
        lat.extend(l);
    }
    let secs = start.elapsed().as_secs_f64();
    let loaded = before
        .zip(rss_kib(pid))
        .map(|(b, after)| bytes_per_conn(b, after, n));
    lat.sort_unstable();
    let q = |f: f64| {
        lat.get(((lat.len().max(1) - 1) as f64 * f) as usize)
            .copied()
    };
    Ok(SweepPoint {
        conns: n,
        rate: lat.len() as f64 / secs,
        p50_us: q(0.5).unwrap_or(0) as f64,
        p99_us: q(0.99).unwrap_or(0) as f64,
        idle_bytes_per_conn: idle,
        loaded_bytes_per_conn: loaded,
        cpu_us_per_op: cpu.per_op(lat.len() as u64),
    })
}
