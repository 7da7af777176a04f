//! What the plugin boundary costs: hmc-transport-tcp linked statically against the same transport loaded as the rtcp example plugin (release build), one-sided WRITE and READ of 64 KiB and 1 MiB on loopback, median, p10 and p90 per op, the two measured in 100 alternating blocks.
//!
//! On a loaded machine the medians of both move between modes (a thread losing its core);
//! the p10 column is the least disturbed estimate of what each path costs.
//!
//! `cargo bench -p hmc-plugin --bench plugin_vs_static [-- --iters N | --quick]
//! [--only static|plugin] [--op read|write] [--size 64k|1m] [--plugin PATH]`: `--quick` runs
//! a fifth of the default ops; `--only`, `--op` and `--size` narrow the run to one path, one
//! direction or one size, for profiling one of them (`perf record -g`); `--plugin` loads
//! another build of the rtcp plugin instead of building it (to compare two builds of the
//! glue under the same host).

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use hmc_backend_cpu::HostMemory;
use hmc_core::{Access, Communicator, ConnBuffer, Deadline, Op, RegisteredBuffer, TransferDesc};
use hmc_plugin::{Plugin, PluginCommunicator};
use hmc_transport_tcp::TcpCommunicator;

/// Two communicators, a target region and a local one: everything one op needs.
struct Rig<C: Communicator> {
    a: Arc<C>,
    ep: C::Endpoint,
    key: C::RemoteKey,
    local: RegisteredBuffer<HostMemory, C>,
    _target: RegisteredBuffer<HostMemory, C>,
    len: usize,
    times: Vec<f64>,
}

impl<C: Communicator> Rig<C> {
    async fn new(a: Arc<C>, b: Arc<C>, len: usize) -> Self {
        let mem = Arc::new(HostMemory::new());
        let target =
            RegisteredBuffer::new(mem.clone(), b.clone(), len, Access::READ_WRITE).unwrap();
        let local = RegisteredBuffer::new(mem, a.clone(), len, Access::READ_WRITE).unwrap();
        let ep = a.connect(&b.address(), Deadline::default()).await.unwrap();
        let key = a.import(&ep, &target.export().unwrap()).unwrap();
        Rig {
            a,
            ep,
            key,
            local,
            _target: target,
            len,
            times: Vec::new(),
        }
    }

    /// `n` ops of direction `op`, each timed (`keep`: recorded).
    async fn run(&mut self, op: Op, n: usize, keep: bool) {
        let d = [TransferDesc::<C> {
            local: self.local.registration(),
            local_offset: 0,
            remote: &self.key,
            remote_offset: 0,
            len: self.len,
        }];
        for _ in 0..n {
            let start = Instant::now();
            self.a
                .transfer(&self.ep, op, &d, Deadline::after(Duration::from_secs(10)))
                .await
                .unwrap();
            if keep {
                self.times.push(start.elapsed().as_secs_f64() * 1e6);
            }
        }
    }

    /// Median, p10 and p90 of what was recorded, in µs; clears the record.
    fn take(&mut self) -> (f64, f64, f64) {
        let mut t = std::mem::take(&mut self.times);
        if t.is_empty() {
            return (f64::NAN, f64::NAN, f64::NAN);
        }
        t.sort_by(f64::total_cmp);
        (t[t.len() / 2], t[t.len() / 10], t[t.len() * 9 / 10])
    }
}

/// The value after `--name` on the command line.
fn arg(name: &str) -> Option<String> {
    std::env::args().skip_while(|a| a != name).nth(1)
}

fn main() {
    // `--quick` (as `cargo xtask bench --quick` passes it): a fifth of the ops.
    let quick = std::env::args().any(|a| a == "--quick");
    let iters: usize = arg("--iters")
        .and_then(|n| n.parse().ok())
        .unwrap_or(if quick { 400 } else { 2000 });
    let only = arg("--only");
    let (run_static, run_plugin) = (
        only.as_deref() != Some("plugin"),
        only.as_deref() != Some("static"),
    );
    let op_filter = arg("--op").map(|o| o.to_ascii_lowercase());
    let size_filter = arg("--size").map(|s| s.to_ascii_lowercase());
    let lib = arg("--plugin").map_or_else(|| common::build_rust_plugin(true), Into::into);
    let plugin = Plugin::load(&lib).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "| op | size | static median µs (p10–p90) | plugin median µs (p10–p90) | \
         plugin / static, median | plugin / static, p10 |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    rt.block_on(async {
        for (len, n, size) in [(64 << 10, iters, "64k"), (1 << 20, iters / 4, "1m")] {
            if size_filter.as_deref().is_some_and(|f| f != size) {
                continue;
            }
            for op in [Op::Write, Op::Read] {
                if op_filter
                    .as_deref()
                    .is_some_and(|f| f != format!("{op:?}").to_ascii_lowercase())
                {
                    continue;
                }
                let addr = "tcp://127.0.0.1:0".parse().unwrap();
                let tcp = || Arc::new(TcpCommunicator::bind(&addr, Default::default()).unwrap());
                let open = || {
                    Arc::new(PluginCommunicator::open(plugin.clone(), "bind=127.0.0.1\n").unwrap())
                };
                let mut native = Rig::new(tcp(), tcp(), len).await;
                let mut plugged = Rig::new(open(), open(), len).await;
                // Warm up, then alternate blocks so both see the same load on a shared host.
                // With `--only`, the other path runs no op (its figures print as NaN).
                let (sn, pn) = (usize::from(run_static), usize::from(run_plugin));
                native.run(op, sn * n / 10, false).await;
                plugged.run(op, pn * n / 10, false).await;
                let blocks = 100;
                // At least one op per block, whatever `--iters` says.
                let per_block = (n / blocks).max(1);
                for _ in 0..blocks {
                    native.run(op, sn * per_block, true).await;
                    plugged.run(op, pn * per_block, true).await;
                }
                let ((s50, s10, s90), (p50, p10, p90)) = (native.take(), plugged.take());
                println!(
                    "| {op:?} | {} KiB | {s50:.1} ({s10:.1}–{s90:.1}) | {p50:.1} ({p10:.1}–{p90:.1}) \
                     | {:.3} | {:.3} |",
                    len >> 10,
                    p50 / s50,
                    p10 / s10
                );
            }
        }
    });
}
