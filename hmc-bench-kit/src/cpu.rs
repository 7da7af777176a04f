//! CPU accounting for the benches: the CPU time (user and system, every thread) of each
//! process taking part in a measured section, from the processes' own accounting, turned
//! into CPU-seconds per GiB moved and CPU-microseconds per operation, computed one way in
//! every bench.
//!
//! - this process: `getrusage(RUSAGE_SELF)` (every thread, exact to the scheduler's
//!   accounting);
//! - another live process: `utime` and `stime` of `/proc/<pid>/stat` (every thread, in
//!   clock ticks, `sysconf(_SC_CLK_TCK)` per second);
//! - processes that exit during the section (an `iperf3` client and its one-off server):
//!   `getrusage(RUSAGE_CHILDREN)`, which holds the children this process has waited for.
//!
//! ```
//! use hmc_bench_kit::cpu::{ProcessCpu, cpu_s_per_gib};
//! let meter = ProcessCpu::this_process();
//! let data = vec![1u8; 1 << 20];
//! let sum: u64 = data.iter().map(|&b| b as u64).sum();
//! let used = meter.used().expect("this process's accounting");
//! assert_eq!(sum, 1 << 20);
//! assert!(cpu_s_per_gib(used, 1 << 20).is_some_and(|c| c >= 0.0));
//! ```
//!
//! A section's figure is no finer than the coarsest clock it reads: a process read from
//! `/proc` counts in ticks (10 ms at the usual 100 per second), so a section should run
//! long enough for its processes to use many ticks.

use std::time::Duration;

/// Bytes in a GiB.
const GIB: f64 = (1u64 << 30) as f64;

/// User and system CPU time.
#[derive(Clone, Copy, Debug, Default, PartialEq, PartialOrd)]
pub struct CpuTime {
    pub user: Duration,
    pub system: Duration,
}

impl CpuTime {
    /// User plus system.
    pub fn total(&self) -> Duration {
        self.user + self.system
    }

    /// `self - earlier`, each part saturating at zero.
    pub fn since(&self, earlier: &CpuTime) -> CpuTime {
        CpuTime {
            user: self.user.saturating_sub(earlier.user),
            system: self.system.saturating_sub(earlier.system),
        }
    }

    fn plus(&self, other: &CpuTime) -> CpuTime {
        CpuTime {
            user: self.user + other.user,
            system: self.system + other.system,
        }
    }
}

/// `getrusage(who)`'s user and system time.
#[allow(unsafe_code)]
fn rusage(who: libc::c_int) -> Option<CpuTime> {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `ru` is a zeroed `rusage` that the call fills; `who` is RUSAGE_SELF or
    // RUSAGE_CHILDREN.
    let r = unsafe { libc::getrusage(who, ru.as_mut_ptr()) };
    if r != 0 {
        return None;
    }
    // SAFETY: zero-initialised and filled in on success.
    let ru = unsafe { ru.assume_init() };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    Some(CpuTime {
        user: tv(ru.ru_utime),
        system: tv(ru.ru_stime),
    })
}

/// This process's CPU time so far, every thread (`RUSAGE_SELF`).
pub fn this_process() -> Option<CpuTime> {
    rusage(libc::RUSAGE_SELF)
}

/// The CPU time of the children this process has waited for (`RUSAGE_CHILDREN`): where a
/// process that exits during a section (iperf3) is counted once it is reaped.
pub fn waited_children() -> Option<CpuTime> {
    rusage(libc::RUSAGE_CHILDREN)
}

/// Clock ticks per second of `/proc/<pid>/stat`'s times.
#[allow(unsafe_code)]
fn ticks_per_second() -> f64 {
    // SAFETY: sysconf reads a constant of the system.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// Process `pid`'s CPU time so far, every thread, from `utime` and `stime` of
/// `/proc/<pid>/stat` (fields 14 and 15 of proc(5)); `None` once it is gone.
pub fn of_pid(pid: u32) -> Option<CpuTime> {
    Some(of_pid_and_children(pid)?.0)
}

/// Process `pid`'s CPU time and that of the children it has waited for (`cutime` and
/// `cstime`, fields 16 and 17), from `/proc/<pid>/stat`; `None` once it is gone.
pub fn of_pid_and_children(pid: u32) -> Option<(CpuTime, CpuTime)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: the fields after its last `)`
    // start at field 3 (state), so utime, stime, cutime and cstime are the 12th to 15th.
    let f: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let hz = ticks_per_second();
    let d = |i: usize| {
        let ticks = f.get(i)?.parse::<u64>().ok()?;
        Some(Duration::from_secs_f64(ticks as f64 / hz))
    };
    Some((
        CpuTime {
            user: d(11)?,
            system: d(12)?,
        },
        CpuTime {
            user: d(13)?,
            system: d(14)?,
        },
    ))
}

/// One process whose CPU a [`ProcessCpu`] counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Process {
    /// This process (`getrusage(RUSAGE_SELF)`).
    This,
    /// A live process by id (`/proc/<pid>/stat`).
    Pid(u32),
    /// The children this process reaps during the section (`RUSAGE_CHILDREN`).
    WaitedChildren,
}

impl Process {
    fn read(self) -> Option<CpuTime> {
        match self {
            Process::This => this_process(),
            Process::Pid(p) => of_pid(p),
            Process::WaitedChildren => waited_children(),
        }
    }
}

/// The CPU time of a set of processes from a start: snapshot at [`ProcessCpu::start`],
/// [`ProcessCpu::used`] for what they used since.
#[derive(Clone, Debug)]
pub struct ProcessCpu {
    procs: Vec<Process>,
    at: Option<CpuTime>,
}

impl ProcessCpu {
    /// Starts counting `procs` (their sum).
    pub fn start(procs: &[Process]) -> ProcessCpu {
        let procs = procs.to_vec();
        let at = Self::sum(&procs);
        ProcessCpu { procs, at }
    }

    /// Starts counting this process alone.
    pub fn this_process() -> ProcessCpu {
        Self::start(&[Process::This])
    }

    /// Starts counting this process and the live process `pid` (a bench and its peer).
    pub fn with_peer(pid: u32) -> ProcessCpu {
        Self::start(&[Process::This, Process::Pid(pid)])
    }

    fn sum(procs: &[Process]) -> Option<CpuTime> {
        procs
            .iter()
            .try_fold(CpuTime::default(), |acc, p| Some(acc.plus(&p.read()?)))
    }

    /// The CPU time the processes used since the start (`None` where one could not be
    /// read, at the start or now: a figure missing a process would be too low).
    pub fn used(&self) -> Option<CpuTime> {
        Some(Self::sum(&self.procs)?.since(&self.at?))
    }
}

/// CPU-seconds per GiB for `used` over `bytes` moved (`None` for no bytes).
pub fn cpu_s_per_gib(used: CpuTime, bytes: u64) -> Option<f64> {
    (bytes > 0).then(|| used.total().as_secs_f64() / (bytes as f64 / GIB))
}

/// CPU-microseconds per operation for `used` over `ops` operations (`None` for none).
pub fn cpu_us_per_op(used: CpuTime, ops: u64) -> Option<f64> {
    (ops > 0).then(|| used.total().as_secs_f64() * 1e6 / ops as f64)
}

/// CPU-seconds per GiB from CPU-microseconds per operation of `bytes_per_op` bytes (a
/// bench that keeps the per-op figure of its rounds; `None` for no bytes).
pub fn s_per_gib_from_us_per_op(cpu_us_per_op: f64, bytes_per_op: u64) -> Option<f64> {
    (bytes_per_op > 0).then(|| cpu_us_per_op * 1e-6 / (bytes_per_op as f64 / GIB))
}

/// A table cell for an optional figure with `decimals` decimals, `-` for none.
pub fn cell(v: Option<f64>, decimals: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.decimals$}"))
}

/// The sentence the benches print under a table with CPU columns, so that every table
/// says the same thing about what they count.
pub const CPU_NOTE: &str = "CPU-s/GiB and CPU us/op: user and system CPU time of every process \
     taking part (every thread; this process by getrusage, the others by /proc/PID/stat), \
     over the measured loop, per GiB moved and per operation.";

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// Spins on a thread of this process until this process has used `cpu` more CPU time.
    fn spin_for(cpu: Duration) -> u64 {
        let from = this_process().unwrap().total();
        std::thread::spawn(move || {
            let mut x = 0u64;
            while this_process().unwrap().total() < from + cpu {
                for i in 0..10_000u64 {
                    x = std::hint::black_box(x.wrapping_add(i));
                }
            }
            x
        })
        .join()
        .unwrap()
    }

    #[test]
    fn a_busy_thread_registers_cpu_on_this_process() {
        let m = ProcessCpu::this_process();
        spin_for(Duration::from_millis(60));
        let used = m.used().unwrap();
        assert!(used.total() >= Duration::from_millis(60), "{used:?}");
        assert!(
            used.user > used.system,
            "a spin loop is user time: {used:?}"
        );
    }

    #[test]
    fn an_idle_sleep_registers_almost_none() {
        let m = ProcessCpu::this_process();
        let t = Instant::now();
        std::thread::sleep(Duration::from_millis(300));
        let used = m.used().unwrap();
        assert!(t.elapsed() >= Duration::from_millis(300));
        // Other tests of this binary may run on other threads meanwhile; a sleeping process
        // would count close to nothing, a spinning one 300 ms.
        assert!(used.total() < Duration::from_millis(250), "{used:?}");
    }

    #[test]
    fn another_process_is_read_from_proc_and_its_busy_loop_counts() {
        // A child that spins for about 0.3 s of CPU, counted while it is alive.
        let mut child = std::process::Command::new("sh")
            .args([
                "-c",
                "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; sleep 5",
            ])
            .spawn()
            .unwrap();
        let pid = child.id();
        let m = ProcessCpu::start(&[Process::Pid(pid)]);
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut used = CpuTime::default();
        while Instant::now() < deadline {
            used = m.used().unwrap();
            if used.total() >= Duration::from_millis(50) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(used.total() >= Duration::from_millis(50), "{used:?}");
        assert!(of_pid(pid).is_none(), "a reaped process has no /proc entry");
        assert!(
            m.used().is_none(),
            "a process gone mid-section gives no figure"
        );
    }

    #[test]
    fn a_waited_child_lands_in_rusage_children() {
        let m = ProcessCpu::start(&[Process::WaitedChildren]);
        let ok = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"])
            .status()
            .unwrap();
        assert!(ok.success());
        let used = m.used().unwrap();
        assert!(used.total() >= Duration::from_millis(20), "{used:?}");
    }

    #[test]
    fn per_gib_and_per_op_divide_the_total() {
        let used = CpuTime {
            user: Duration::from_millis(1500),
            system: Duration::from_millis(500),
        };
        assert_eq!(cpu_s_per_gib(used, 4 << 30), Some(0.5));
        assert_eq!(cpu_us_per_op(used, 1000), Some(2000.0));
        assert_eq!(cpu_s_per_gib(used, 0), None);
        assert_eq!(cpu_us_per_op(used, 0), None);
        // 2,000 us per op of 1 GiB / 4: 8 CPU-s per GiB, the same as from the totals.
        assert_eq!(s_per_gib_from_us_per_op(2000.0, 1 << 28), Some(0.008));
        assert_eq!(s_per_gib_from_us_per_op(2000.0, 0), None);
        assert_eq!(cell(Some(0.1234), 2), "0.12");
        assert_eq!(cell(None, 2), "-");
    }

    #[test]
    fn since_saturates_and_total_adds_the_parts() {
        let a = CpuTime {
            user: Duration::from_millis(10),
            system: Duration::from_millis(5),
        };
        let b = CpuTime {
            user: Duration::from_millis(4),
            system: Duration::from_millis(9),
        };
        let d = a.since(&b);
        assert_eq!(d.user, Duration::from_millis(6));
        assert_eq!(d.system, Duration::ZERO);
        assert_eq!(a.total(), Duration::from_millis(15));
    }
}
