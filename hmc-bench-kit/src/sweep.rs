//! What the connection sweeps share (`hmc-rpc-bench --conn-sweep` and the engine bench's
//! `--conn-sweep`): the steps (powers of two to 1,024, then as many as the machine allows),
//! the server's memory per connection from its RSS, the CPU both sides spend per operation
//! (the figure that shows a per-connection cost on a machine too loaded for rates to
//! compare), the summary against the targets (rate at 1,024 connections against
//! the peak, bytes per idle connection), and the two markdown tables the report reads.

/// The steps of `--conn-sweep` given without a list: powers of two to 1,024, then `max`.
pub const DEFAULT_STEPS: &str = "1,2,4,8,16,32,64,128,256,512,1024,max";

/// Target: the rate at 1,024 connections against the sweep's peak.
pub const TARGET_SHARE_OF_PEAK: f64 = 0.80;
/// Target: bytes of server memory per idle connection.
pub const TARGET_IDLE_BYTES: f64 = 64.0 * 1024.0;

/// The connection counts to measure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SweepPlan {
    /// The listed counts, in order.
    pub steps: Vec<usize>,
    /// `max` was listed: after the last count, keep doubling until connects fail.
    pub beyond: bool,
}

impl SweepPlan {
    /// `1,2,4,…[,max]`: positive counts, `max` last if at all.
    pub fn parse(s: &str) -> Result<Self, String> {
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

    /// Step `index` (from 0), `done` the connections of the last completed step; `None`:
    /// the sweep is over.
    pub fn next(&self, index: usize, done: usize) -> Option<usize> {
        match self.steps.get(index) {
            Some(&n) => Some(n),
            None if self.beyond => Some(done.max(1).saturating_mul(2)),
            None => None,
        }
    }
}

impl SweepPlan {
    /// Runs `step(n)` for each step's connection count until the plan ends or a step fails;
    /// the completed steps and why the sweep stopped. `progress` gets a line per step
    /// (the binaries print it on stderr).
    pub async fn run<F, Fut>(
        &self,
        mut step: F,
        mut progress: impl FnMut(String),
    ) -> (Vec<SweepPoint>, String)
    where
        F: FnMut(usize) -> Fut,
        Fut: std::future::Future<Output = Result<SweepPoint, String>>,
    {
        let mut points: Vec<SweepPoint> = Vec::new();
        let (mut index, mut done) = (0, 0);
        while let Some(n) = self.next(index, done) {
            index += 1;
            progress(format!("[sweep step {index}] {n} connection(s)"));
            match step(n).await {
                Ok(p) => {
                    progress(format!(
                        "  {:.0}/s, p50 {:.0} us, server {} B/idle connection",
                        p.rate,
                        p.p50_us,
                        p.idle_bytes_per_conn
                            .map_or("-".into(), |b| format!("{b:.0}"))
                    ));
                    points.push(p);
                    done = n;
                }
                Err(why) => {
                    progress(format!("  stopped: {why}"));
                    return (points, format!("{n} connections: {why}"));
                }
            }
        }
        (points, "every listed step ran".into())
    }
}

/// One step's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepPoint {
    pub conns: usize,
    /// Calls or operations per second, all connections together.
    pub rate: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Server RSS growth per connection once every connection has made one call and
    /// waits, bytes.
    pub idle_bytes_per_conn: Option<f64>,
    /// The same after the load, bytes (buffers a busy connection grew and kept).
    pub loaded_bytes_per_conn: Option<f64>,
    /// CPU time (user + system) of the client and the server process together per
    /// operation during the load, microseconds ([`CpuMeter`]).
    pub cpu_us_per_op: Option<f64>,
}

/// What the sweep came to: peak, the 1,024-connection step against it.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepSummary {
    pub peak: f64,
    pub peak_conns: usize,
    /// The rate at 1,024 connections and its share of the peak.
    pub at_1024: Option<(f64, f64)>,
    pub idle_bytes_at_1024: Option<f64>,
    pub most_conns: usize,
}

/// The summary of `points` (`None` when no step completed).
pub fn summarize(points: &[SweepPoint]) -> Option<SweepSummary> {
    let peak = points.iter().max_by(|a, b| a.rate.total_cmp(&b.rate))?;
    let at = points.iter().find(|p| p.conns == 1024);
    Some(SweepSummary {
        peak: peak.rate,
        peak_conns: peak.conns,
        at_1024: at.map(|p| (p.rate, p.rate / peak.rate.max(f64::MIN_POSITIVE))),
        idle_bytes_at_1024: at.and_then(|p| p.idle_bytes_per_conn),
        most_conns: points.iter().map(|p| p.conns).max().unwrap_or(0),
    })
}

/// Resident memory of a process, KiB (`VmRSS` of `/proc/<pid>/status`).
pub fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Microseconds of CPU (user + system) used by process `pid` (`None`: this process) and
/// by its children it has waited for: [`crate::cpu`]'s readings (`getrusage` for this
/// process, `/proc/PID/stat` for another; Linux, `None` elsewhere).
pub fn proc_cpu_us(pid: Option<u32>) -> Option<(f64, f64)> {
    let (own, children) = match pid {
        Some(p) => crate::cpu::of_pid_and_children(p)?,
        None => (crate::cpu::this_process()?, crate::cpu::waited_children()?),
    };
    let us = |t: crate::cpu::CpuTime| t.total().as_secs_f64() * 1e6;
    Some((us(own), us(children)))
}

/// The CPU time of a sweep step's two sides, this process (the clients) and the server
/// process, from the start of its load: on a loaded machine the rate follows whatever
/// share of the cores the step got, while the CPU per operation shows what each
/// operation costs at that connection count.
pub struct CpuMeter {
    server: u32,
    at: Option<f64>,
}

impl CpuMeter {
    /// Starts counting, for this process and the server process `server`.
    pub fn start(server: u32) -> Self {
        let at = Self::both(server);
        CpuMeter { server, at }
    }

    fn both(server: u32) -> Option<f64> {
        Some(proc_cpu_us(None)?.0 + proc_cpu_us(Some(server))?.0)
    }

    /// Microseconds of CPU of both sides per operation since [`CpuMeter::start`]
    /// (`None` with no operations, or where `/proc` cannot be read).
    pub fn per_op(&self, ops: u64) -> Option<f64> {
        let used = Self::both(self.server)? - self.at?;
        (ops > 0).then(|| used / ops as f64)
    }
}

/// Bytes of RSS growth per connection, from the RSS in KiB before and after `n`
/// connections were opened (0 when it did not grow; `n` of 0 counts as one).
pub fn bytes_per_conn(before_kib: u64, after_kib: u64, n: usize) -> f64 {
    after_kib.saturating_sub(before_kib) as f64 * 1024.0 / n.max(1) as f64
}

/// Raises this process's `RLIMIT_NOFILE` soft limit to its hard limit (child processes
/// inherit it); the (soft, hard) limits after the call.
#[allow(unsafe_code)]
pub fn raise_fd_limit() -> Option<(libc::rlim_t, libc::rlim_t)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid `rlimit` the call fills in.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    lim.rlim_cur = lim.rlim_max;
    // SAFETY: `lim` is a valid `rlimit`; raising the soft limit to the hard one needs no
    // privilege. On failure the old limits stay and are read back below.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    // SAFETY: as the first call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    Some((lim.rlim_cur, lim.rlim_max))
}

/// The sweep's two markdown tables (the binaries print them): `## <name> (<setup>)` with one row per step,
/// `rate` naming the rate's column (`RPC/s`), then `## <name> summary` against the targets,
/// with why the sweep `stopped` and the fd limit it ran under.
pub fn tables(
    name: &str,
    setup: &str,
    rate: &str,
    points: &[SweepPoint],
    stopped: &str,
    limits: Option<(libc::rlim_t, libc::rlim_t)>,
) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let kib = |b: Option<f64>| b.map_or("-".into(), |b| format!("{:.1}", b / 1024.0));
    let _ = writeln!(out, "\n## {name} ({setup})\n");
    let _ = writeln!(
        out,
        "| connections | {rate} | p50 us | p99 us | share of peak | CPU us/op (both sides) | server KiB/idle conn | server KiB/conn after load |"
    );
    let _ = writeln!(out, "| --- | --- | --- | --- | --- | --- | --- | --- |");
    let peak = points.iter().map(|p| p.rate).fold(0.0, f64::max);
    for p in points {
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.0} | {:.0} | {:.0}% | {} | {} | {} |",
            p.conns,
            p.rate,
            p.p50_us,
            p.p99_us,
            100.0 * p.rate / peak.max(f64::MIN_POSITIVE),
            p.cpu_us_per_op.map_or("-".into(), |c| format!("{c:.1}")),
            kib(p.idle_bytes_per_conn),
            kib(p.loaded_bytes_per_conn)
        );
    }
    let _ = writeln!(out, "\n## {name} summary\n");
    let _ = writeln!(
        out,
        "| peak {rate} | peak at connections | {rate} at 1024 | at 1024 / peak (target ≥ {:.0}%) | server KiB/idle conn at 1024 (target ≤ {:.0}) | most connections | stopped | RLIMIT_NOFILE |",
        100.0 * TARGET_SHARE_OF_PEAK,
        TARGET_IDLE_BYTES / 1024.0
    );
    let _ = writeln!(out, "| --- | --- | --- | --- | --- | --- | --- | --- |");
    if let Some(s) = summarize(points) {
        let (at, share) = s.at_1024.map_or(("-".into(), "-".into()), |(r, share)| {
            (format!("{r:.0}"), format!("{:.0}%", 100.0 * share))
        });
        let _ = writeln!(
            out,
            "| {:.0} | {} | {at} | {share} | {} | {} | {} | {} |",
            s.peak,
            s.peak_conns,
            kib(s.idle_bytes_at_1024),
            s.most_conns,
            stopped.replace('|', "/"),
            limits.map_or("-".into(), |(soft, _)| soft.to_string())
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;
    use std::time::{Duration, Instant};

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

    fn point(conns: usize, rate: f64, idle: Option<f64>) -> SweepPoint {
        SweepPoint {
            conns,
            rate,
            p50_us: 0.0,
            p99_us: 0.0,
            idle_bytes_per_conn: idle,
            loaded_bytes_per_conn: None,
            cpu_us_per_op: (conns == 1024).then_some(12.5),
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
        assert_eq!((s.peak, s.peak_conns, s.most_conns), (50_000.0, 64, 2048));
        assert_eq!(s.at_1024, Some((40_000.0, 0.8)));
        assert_eq!(s.idle_bytes_at_1024, Some(9000.0));
        // A sweep that stopped before 1,024 has no such figure.
        let s = summarize(&pts[..2]).unwrap();
        assert_eq!(s.at_1024, None);
        assert_eq!(summarize(&[]), None);
    }

    #[tokio::test]
    async fn a_failing_step_stops_the_sweep_and_is_its_reason() {
        let plan = SweepPlan::parse("1,2,max").unwrap();
        let mut lines = Vec::new();
        let step = |n: usize| async move {
            if n > 8 {
                Err("Too many open files (os error 24)".to_string())
            } else {
                Ok(point(n, n as f64, None))
            }
        };
        let (points, stopped) = plan.run(step, |l| lines.push(l)).await;
        let conns: Vec<usize> = points.iter().map(|p| p.conns).collect();
        assert_eq!(conns, [1, 2, 4, 8]);
        assert_eq!(stopped, "16 connections: Too many open files (os error 24)");
        assert_eq!(
            lines.last().unwrap(),
            "  stopped: Too many open files (os error 24)"
        );
        // A plan without `max` ends after its list.
        let plan = SweepPlan::parse("1,2").unwrap();
        let (points, stopped) = plan.run(step, |_| {}).await;
        assert_eq!(
            (points.len(), stopped.as_str()),
            (2, "every listed step ran")
        );
    }

    #[test]
    fn the_tables_name_the_rate_and_say_why_the_sweep_stopped() {
        let pts = [
            point(1, 10_000.0, Some(2048.0)),
            point(1024, 9_000.0, Some(4096.0)),
        ];
        let t = tables(
            "engine connection sweep",
            "64 B",
            "WRITE ops/s",
            &pts,
            "a | b",
            Some((20, 20)),
        );
        assert!(t.contains("## engine connection sweep (64 B)\n"), "{t}");
        assert!(t.contains("| connections | WRITE ops/s |"), "{t}");
        assert!(
            t.contains("| 1024 | 9000 | 0 | 0 | 90% | 12.5 | 4.0 | - |"),
            "{t}"
        );
        assert!(
            t.contains("| 1 | 10000 | 0 | 0 | 100% | - | 2.0 | - |"),
            "{t}"
        );
        assert!(
            t.contains("| 10000 | 1 | 9000 | 90% | 4.0 | 1024 | a / b | 20 |"),
            "{t}"
        );
    }

    #[rstest]
    #[case(1000, 1000, 10, 0.0)]
    #[case(1000, 2024, 1024, 1024.0)]
    #[case(1000, 1064, 1, 65536.0)]
    // RSS that shrank (the allocator returned pages) is no growth, not a negative cost.
    #[case(2000, 1000, 8, 0.0)]
    #[case(1000, 1001, 0, 1024.0)]
    fn memory_per_connection_is_rss_growth_in_bytes_over_the_connections(
        #[case] before_kib: u64,
        #[case] after_kib: u64,
        #[case] n: usize,
        #[case] bytes: f64,
    ) {
        assert_eq!(bytes_per_conn(before_kib, after_kib, n), bytes);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn rss_of_this_process_is_read() {
        let kib = rss_kib(std::process::id()).expect("/proc/PID/status has VmRSS");
        assert!(kib > 0);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn cpu_of_this_process_is_read_and_grows() {
        let (a, _) = proc_cpu_us(None).expect("getrusage");
        let mut x = 0u64;
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(50) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        let (b, _) = proc_cpu_us(None).expect("getrusage");
        assert!(b >= a, "{a} -> {b} ({x})");
        assert!(proc_cpu_us(Some(std::process::id())).is_some());
    }

    #[test]
    fn the_cpu_meter_counts_this_process_per_operation() {
        let me = std::process::id();
        // This process read both ways the meter reads its two sides: `getrusage` (exact)
        // and `/proc/<pid>/stat` (whole clock ticks, so it may lag the other by a tick).
        let cpu = || {
            let own = proc_cpu_us(None).expect("getrusage").0;
            (own, proc_cpu_us(Some(me)).expect("/proc/PID/stat parses").0)
        };
        let m = CpuMeter::start(me);
        // Spin until both readings show 20 ms more CPU (however loaded the machine).
        let (from, mut x) = (cpu(), 0u64);
        while {
            let now = cpu();
            now.0 < from.0 + 20_000.0 || now.1 < from.1 + 20_000.0
        } {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        // This process is both sides here: its 20 ms count twice.
        let per = m.per_op(1).expect("/proc is readable");
        assert!(per >= 40_000.0, "{per} us ({x})");
        assert!(
            m.per_op(4).unwrap() <= per / 4.0 + 20_000.0,
            "per operation"
        );
        assert_eq!(m.per_op(0), None, "no operations, no figure");
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
