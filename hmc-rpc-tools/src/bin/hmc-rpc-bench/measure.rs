//! Measuring helpers: core-to-core latency, CPU pinning and CPU time, percentiles, memory
//! (RSS, idle connections) and the cell and size formatting of the table.

use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmc_rpc_tools::sweep::{bytes_per_conn, proc_cpu_us, rss_kib};

#[derive(Clone, Debug, Default)]
pub(crate) struct Cell {
    pub(crate) system: &'static str,
    pub(crate) size: usize,
    pub(crate) clients: usize,
    pub(crate) depth: usize,
    pub(crate) calls: u64,
    pub(crate) rps: f64,
    pub(crate) mbps: f64,
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) p999: f64,
    /// CPU time (user + system) of client and server processes per call, microseconds.
    pub(crate) cpu_us_per_call: Option<f64>,
    /// [`core_to_core_ns`] just before and just after the cell.
    pub(crate) c2c_ns: Option<(f64, f64)>,
}

/// [`core_to_core_ns`] taken between cells, so that each cell gets the round trip just
/// before it and just after it.
pub(crate) struct C2cMarks(Option<f64>);

impl C2cMarks {
    /// The first mark, before the first cell.
    pub(crate) fn start() -> Self {
        C2cMarks(core_to_core_ns())
    }

    /// A mark after the cell just measured: that cell's (before, after) pair, `after`
    /// being the next cell's `before`.
    pub(crate) fn next(&mut self) -> Option<(f64, f64)> {
        let after = core_to_core_ns();
        let pair = self.0.zip(after);
        self.0 = after;
        pair
    }
}

/// Round trip of one cache line between the first two CPUs this process may run on, in
/// nanoseconds (the median of five rounds of 20,000), or `None` with fewer than two CPUs.
///
/// It tells which state the host keeps the machine in, which moves every figure that
/// crosses cores: on the project's 2-vCPU VMs it reads several times higher while the host
/// runs the two vCPUs apart than while they share a cache, which also slows copies across
/// cores and HMC_BUFFER echo over shared memory (the figures are in `docs/benchmarks.md`).
/// The host changes it within seconds, so each cell records it before and after.
pub(crate) fn core_to_core_ns() -> Option<f64> {
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
pub(crate) fn allowed_cpus() -> Vec<usize> {
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
pub(crate) fn pin_to_cpu(cpu: usize) {
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
pub(crate) fn fmt_c2c(c: &Cell) -> String {
    c.c2c_ns
        .map_or("-".to_string(), |(b, a)| format!("{b:.0}/{a:.0}"))
}

/// CPU time of a cell's two sides, read before and after it.
pub(crate) struct CpuProbe {
    pub(crate) server: u32,
    /// The client is a child process this one waits for (tonic), not this process.
    pub(crate) child_client: bool,
    pub(crate) at: Option<(f64, f64)>,
}

impl CpuProbe {
    pub(crate) fn start(server: u32, child_client: bool) -> Self {
        let mut p = CpuProbe {
            server,
            child_client,
            at: None,
        };
        p.at = p.read();
        p
    }

    pub(crate) fn read(&self) -> Option<(f64, f64)> {
        let me = proc_cpu_us(None)?;
        let client = if self.child_client { me.1 } else { me.0 };
        Some((client, proc_cpu_us(Some(self.server))?.0))
    }

    /// Client + server CPU microseconds per call since `start`.
    pub(crate) fn per_call(&self, calls: u64) -> Option<f64> {
        let (c0, s0) = self.at?;
        let (c1, s1) = self.read()?;
        (calls > 0).then(|| (c1 - c0 + s1 - s0) / calls as f64)
    }
}

/// CPU-seconds per GiB of payload moved (request and response) from a cell's CPU per call.
pub(crate) fn cpu_s_per_gib(c: &Cell) -> Option<f64> {
    let bytes_per_call = 2 * c.size as u64;
    hmc_bench_kit::cpu::s_per_gib_from_us_per_op(c.cpu_us_per_call?, bytes_per_call)
}

pub(crate) fn percentile(sorted: &[u32], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * q) as usize] as f64
}

pub(crate) fn cell_from(
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

/// KiB of the server's RSS per connection, for `n` connections that send nothing (opened
/// after one warm-up connection, measured once the server has accepted them all).
pub(crate) fn idle_conn_kib(pid: u32, port: u16, n: usize) -> Option<f64> {
    drop(TcpStream::connect(("127.0.0.1", port)).ok()?);
    std::thread::sleep(Duration::from_millis(200));
    let before = rss_kib(pid)?;
    let conns: Vec<TcpStream> = (0..n)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", port)).ok())
        .collect();
    std::thread::sleep(Duration::from_millis(800));
    let after = rss_kib(pid)?;
    let opened = conns.len();
    drop(conns);
    Some(bytes_per_conn(before, after, opened) / 1024.0)
}

pub(crate) fn fmt_size(s: usize) -> String {
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
/// shows in the tail (`docs/benchmarks.md` has the p999 this gives on two vCPUs).
pub(crate) fn oversubscription_note(
    client_threads: Option<usize>,
    server_workers: usize,
) -> Option<String> {
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
}
