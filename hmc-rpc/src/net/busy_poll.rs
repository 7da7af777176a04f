//! Bounded busy-polling of the connection tasks: after a small message, a connection may
//! spin on its socket for a short window instead of parking, when no other window is open
//! and polling has been paying off (it pauses itself when it loses the core or parking
//! proves faster).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The busy-polling windows open in this process, as their end times (nanoseconds since
/// [`window_clock`]'s origin; 0: a free slot). A connection polls only while no other
/// window is open and unexpired (several busy connections keep the cores busy anyway, and
/// a poller would take a core from them). A window ends by itself at its end time, so a
/// connection that went idle inside its window does not stop others from polling; with
/// more windows open than slots, none of the extra ones polls.
static WINDOW_ENDS: [AtomicU64; WINDOW_SLOTS] = [const { AtomicU64::new(0) }; WINDOW_SLOTS];
const WINDOW_SLOTS: usize = 64;

/// Nanoseconds from a process-wide origin to `t` (at least 1, so 0 marks a free slot).
fn window_clock(t: Instant) -> u64 {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let origin = *ORIGIN.get_or_init(Instant::now);
    u64::try_from(t.saturating_duration_since(origin).as_nanos())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// Only waits that follow messages of at most this many bytes poll: a large transfer
/// takes far longer than a wake-up, and a poller would take CPU from its copies.
pub(crate) const POLL_MAX_MESSAGE: usize = 64 * 1024;

/// A wait that includes data-plane work (an HMC_BUFFER call: the server READs the request
/// and WRITEs the response; the client consumes one and builds the next) gets one
/// microsecond more of window per this many bytes of that work, about the rate of a copy
/// through a shared-memory mapping with the peer's own bookkeeping. Where the
/// work is slower (UCX over tcp), windows run out and the usual back-off mostly stops
/// polling (polling neither helps nor hurts there: see `docs/benchmarks.md`).
const POLL_WORK_BYTES_PER_US: u64 = 8 * 1024;
/// A wait that covers several calls (the answers to several calls in flight, or a
/// server's next requests after answering several) gets this much more window per call
/// beyond the first: about the CPU a peer spends turning one call around (the client takes
/// an answer and builds the next call). Without it, pipelined calls on one
/// connection outlast the budget and park between every batch.
const POLL_PER_CALL: Duration = Duration::from_micros(8);
/// The longest window a wait with data-plane work or many calls gets.
const POLL_MAX_WINDOW: Duration = Duration::from_micros(500);

/// After a busy-polling window that did not pay off, polling pauses for this many waits
/// at first, twice as many after each further miss, up to [`MAX_PAUSE`].
const FIRST_PAUSE: u32 = 4;
/// Windows in a row that run out (without losing their core) before polling pauses:
/// more than [`FIRST_PAUSE`], so that a peer's pause alone does not pause this side too.
const LATE_MISSES: u32 = 8;
/// The longest pause, in waits: on a machine where polling never pays off, one wait in
/// this many polls, to notice when it would again.
const MAX_PAUSE: u32 = 4096;

/// Every this many polling windows, the next [`PROBE_WAITS`] waits park instead, to
/// compare: when parking is the faster (the peer does not poll, and this side's poller
/// only crowds it), polling pauses for [`SLOWER_PAUSE`] waits.
///
/// Waits that include data-plane work take no part: the transfer's own time varies with
/// what else the cores do, and per-wait medians misjudged it: on shared memory the probe
/// paused polling for 1 MiB HMC_BUFFER echoes although runs that kept polling were faster
/// end to end (the runs are in `docs/log/2026-12-01-benchmark-history.md`).
const PROBE_EVERY: u32 = 256;
/// Waits of one comparison.
const PROBE_WAITS: u32 = 16;
/// The pause, in waits, after parking proved the faster.
const SLOWER_PAUSE: u32 = 1024;
/// Waits longer than this are idle gaps rather than latency, and are not compared.
const SAMPLE_MAX: Duration = Duration::from_millis(1);

/// Involuntary context switches of the calling thread so far: the kernel took its core
/// for another runnable thread.
fn preempted() -> Option<i64> {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `getrusage` writes one `rusage` to the valid, writable pointer.
    #[allow(unsafe_code)]
    let r = unsafe { libc::getrusage(libc::RUSAGE_THREAD, ru.as_mut_ptr()) };
    // SAFETY: zero-initialised (a valid `rusage`) and filled in on success.
    #[allow(unsafe_code)]
    (r == 0).then(|| unsafe { ru.assume_init() }.ru_nivcsw)
}

/// A connection task's busy-polling window (`ConnConfig::busy_poll`): right after
/// traffic, while the connection waits for the next message (a lone call's answer, the
/// next of several small calls' answers, a server's next request), the task asks the
/// socket itself (and yields to every other ready task in between) for up to the window
/// instead of parking on the poller, saving the poller's and the scheduler's wake-ups. The
/// window is the budget, plus the expected time of the data-plane work the wait includes;
/// only one connection of the process polls at a time ([`WINDOW_ENDS`]).
///
/// It backs off when polling does not pay: a window during which the kernel took the
/// poller's core for another thread (the cores are all busy, and the poller delays the
/// very peer it waits for), or [`LATE_MISSES`] windows in a row that ran out, pause
/// polling for [`FIRST_PAUSE`] waits, doubling with each miss up to [`MAX_PAUSE`]; each
/// window that pays halves the pause. Now and then a few waits park instead, and polling
/// pauses when they were the faster (see [`PROBE_EVERY`]). The window opens only on
/// traffic, so an idle connection never polls.
pub(crate) struct BusyPoll {
    budget: Duration,
    /// The open window's length: the budget, plus the expected time of known work.
    window: Duration,
    /// The table of open windows ([`WINDOW_ENDS`]; tests use their own), and the open
    /// window's slot in it with the end it wrote there.
    table: &'static [AtomicU64],
    slot: Option<(usize, u64)>,
    /// The open window: when it opened and whether this wait may poll.
    open: Option<(Instant, bool)>,
    /// Where polling started in this window: the thread and its involuntary context
    /// switches then.
    polling: Option<(std::thread::ThreadId, Option<i64>)>,
    /// Waits left before polling again, and the current pause.
    skip: u32,
    pause: u32,
    /// Windows in a row that ran out on a core of their own.
    late: u32,
    /// This window polled; it parks to compare.
    polled: bool,
    probing: bool,
    /// The open window's wait takes part in the park-to-compare probe (no data-plane
    /// work; see [`PROBE_EVERY`]).
    compares: bool,
    /// Polling windows so far; comparison waits left to park.
    windows: u32,
    probe: u32,
    /// Recent waits that polled, and the waits that parked to compare.
    polled_waits: Waits<64>,
    parked_waits: Waits<{ PROBE_WAITS as usize }>,
}

/// The most recent `N` wait times of one kind. Comparisons use medians: a few polled
/// waits that lost their core for a time slice must not outweigh hundreds that paid.
#[derive(Clone, Copy)]
struct Waits<const N: usize> {
    ns: [u32; N],
    count: usize,
}

impl<const N: usize> Waits<N> {
    const EMPTY: Self = Waits {
        ns: [0; N],
        count: 0,
    };

    fn push(&mut self, took: Duration) {
        self.ns[self.count % N] = u32::try_from(took.as_nanos()).unwrap_or(u32::MAX);
        self.count += 1;
    }

    fn len(&self) -> usize {
        self.count.min(N)
    }

    fn median(&self) -> Option<u32> {
        let mut v = self.ns;
        let v = &mut v[..self.len()];
        if v.is_empty() {
            return None;
        }
        let mid = v.len() / 2;
        Some(*v.select_nth_unstable(mid).1)
    }
}

impl BusyPoll {
    pub(crate) fn new(budget: Duration) -> Self {
        Self::with_table(budget, &WINDOW_ENDS)
    }

    fn with_table(budget: Duration, table: &'static [AtomicU64]) -> Self {
        BusyPoll {
            budget,
            window: budget,
            table,
            slot: None,
            open: None,
            polling: None,
            skip: 0,
            pause: 0,
            late: 0,
            polled: false,
            probing: false,
            compares: true,
            windows: 0,
            probe: 0,
            polled_waits: Waits::EMPTY,
            parked_waits: Waits::EMPTY,
        }
    }

    /// Opens the window at `now`: the connection now waits for one message, and that wait
    /// includes `work_bytes` of data-plane work on either side (0 for plain messages; see
    /// [`POLL_WORK_BYTES_PER_US`]) and covers `calls` calls ([`POLL_PER_CALL`]), which
    /// lengthen the window by their expected time, up to [`POLL_MAX_WINDOW`]. A window
    /// already open keeps its start, and lengthens when the wait now covers more (calls
    /// that joined it).
    pub(crate) fn arm_for(&mut self, now: Instant, work_bytes: u64, calls: usize) {
        if self.budget.is_zero() {
            return;
        }
        let extra = Duration::from_micros(work_bytes / POLL_WORK_BYTES_PER_US)
            + POLL_PER_CALL * calls.saturating_sub(1).min(1024) as u32;
        let window = (self.budget + extra).min(self.budget.max(POLL_MAX_WINDOW));
        if let Some((since, _)) = self.open {
            if window > self.window {
                self.window = window;
                if let Some((i, end)) = self.slot {
                    let new_end = window_clock(since + window);
                    if self.table[i]
                        .compare_exchange(end, new_end, Ordering::Relaxed, Ordering::Relaxed)
                        .is_ok()
                    {
                        self.slot = Some((i, new_end));
                    }
                }
            }
            return;
        }
        self.window = window;
        self.compares = work_bytes == 0;
        self.probing = false;
        let poll = if self.skip > 0 {
            self.skip -= 1;
            false
        } else if self.probe > 0 && self.compares {
            self.probe -= 1;
            self.probing = true;
            false
        } else {
            if self.compares {
                self.windows = self.windows.wrapping_add(1);
            }
            if self.compares && self.windows.is_multiple_of(PROBE_EVERY) {
                // Compares the polling windows since the last comparison with the next
                // waits that park.
                self.probe = PROBE_WAITS;
                self.parked_waits = Waits::EMPTY;
            }
            true
        };
        self.open = Some((now, poll));
        self.polling = None;
        self.polled = false;
        // Take a free or expired slot for this window's end; with none left, this window
        // counts as one of many and does not poll.
        let end = window_clock(now + self.window);
        let clock = window_clock(now);
        self.slot = self.table.iter().enumerate().find_map(|(i, e)| {
            let old = e.load(Ordering::Relaxed);
            (old <= clock
                && e.compare_exchange(old, end, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok())
            .then_some((i, end))
        });
        if self.slot.is_none() {
            self.open = Some((now, false));
        }
    }

    /// Another connection of this process is inside an unexpired window at `now`.
    fn others_waiting(&self, now: Instant) -> bool {
        let clock = window_clock(now);
        let own = self.slot.map(|(i, _)| i);
        self.table
            .iter()
            .enumerate()
            .any(|(i, e)| Some(i) != own && e.load(Ordering::Relaxed) > clock)
    }

    /// Closes the window (the connection no longer waits for exactly one message).
    pub(crate) fn disarm(&mut self) {
        self.open = None;
        if let Some((i, end)) = self.slot.take() {
            // Only if the slot still holds this window (an expired one may have been
            // taken over).
            let _ = self.table[i].compare_exchange(end, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
        self.polling = None;
    }

    /// Traffic arrived at `now`: ends the wait; a polling window that got it in time and
    /// kept its core paid off.
    pub(crate) fn arrived(&mut self, now: Instant) {
        if let (Some((since, _)), Some(_)) = (self.open, self.polling) {
            let kept_core = self.kept_core();
            self.settle(now < since + self.window, kept_core);
        }
        if let Some((since, _)) = self.open
            && self.compares
        {
            self.compare(now.saturating_duration_since(since));
        }
        self.disarm();
    }

    /// Counts one wait that polled, or that parked to compare; after the comparison's
    /// last, pauses polling if parking was the faster.
    fn compare(&mut self, took: Duration) {
        let kind = match (self.polled, self.probing) {
            (true, _) => 0,
            (false, true) => 1,
            (false, false) => return,
        };
        if took > SAMPLE_MAX {
            return;
        }
        if kind == 0 {
            self.polled_waits.push(took);
            return;
        }
        self.parked_waits.push(took);
        if self.probe == 0 {
            if let (Some(poll), Some(park)) =
                (self.polled_waits.median(), self.parked_waits.median())
                && park < poll
            {
                self.pause = self.pause.max(SLOWER_PAUSE);
                self.skip = self.pause;
            }
            self.polled_waits = Waits::EMPTY;
            self.parked_waits = Waits::EMPTY;
        }
    }

    /// Counts a polling window that ended.
    fn settle(&mut self, in_time: bool, kept_core: bool) {
        self.polling = None;
        if in_time && kept_core {
            self.pause /= 2;
            self.late = 0;
            return;
        }
        if kept_core && self.late + 1 < LATE_MISSES {
            // Late only burnt this task's own time, and the peer may just be pausing.
            self.late += 1;
        } else {
            self.late = 0;
            self.pause = (self.pause * 2).clamp(FIRST_PAUSE, MAX_PAUSE);
            self.skip = self.pause;
        }
    }

    /// Polling so far ran on one thread that kept its core.
    fn kept_core(&self) -> bool {
        self.polling.is_some_and(|(thread, before)| {
            thread == std::thread::current().id() && before.is_some() && preempted() == before
        })
    }

    /// True while the window is open at `now`, this wait may poll, and no other
    /// connection of the process is waiting in a window.
    pub(crate) fn active(&mut self, now: Instant) -> bool {
        let Some((since, true)) = self.open else {
            return false;
        };
        if now >= since + self.window {
            if self.polling.is_some() {
                // Ran out: polling did not pay this time.
                let kept_core = self.kept_core();
                self.settle(false, kept_core);
            }
            self.open = Some((since, false));
            return false;
        }
        if self.others_waiting(now) {
            return false;
        }
        if self.polling.is_none() {
            self.polling = Some((std::thread::current().id(), preempted()));
            self.polled = true;
        }
        true
    }
}

impl Drop for BusyPoll {
    fn drop(&mut self) {
        self.disarm();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table of windows of a test's own (tests run in parallel).
    fn test_table() -> &'static [AtomicU64; 4] {
        Box::leak(Box::new([const { AtomicU64::new(0) }; 4]))
    }

    /// A `BusyPoll` with a table of windows of its own.
    fn test_poll(budget: Duration) -> BusyPoll {
        BusyPoll::with_table(budget, test_table())
    }

    #[test]
    fn data_plane_work_lengthens_the_window_up_to_the_cap() {
        let mut p = test_poll(Duration::from_micros(50));
        let t0 = Instant::now();
        p.arm_for(t0, 1 << 20, 1);
        assert_eq!(
            p.window,
            Duration::from_micros(50 + (1 << 20) / POLL_WORK_BYTES_PER_US)
        );
        assert!(
            p.active(t0 + Duration::from_micros(100)),
            "still inside the longer window"
        );
        p.disarm();
        p.arm_for(t0, 1 << 30, 1);
        assert_eq!(p.window, POLL_MAX_WINDOW);
        p.disarm();
        p.arm_for(t0, 0, 1);
        assert_eq!(p.window, Duration::from_micros(50));
    }

    #[test]
    fn calls_joining_a_wait_lengthen_its_window_from_the_same_start() {
        let table = test_table();
        let mut p = BusyPoll::with_table(Duration::from_micros(50), table);
        let mut other = BusyPoll::with_table(Duration::from_micros(50), table);
        let t0 = Instant::now();
        // The first of eight pipelined calls goes out alone; the other seven join it.
        p.arm_for(t0, 0, 1);
        assert_eq!(p.window, Duration::from_micros(50));
        p.arm_for(t0 + Duration::from_micros(20), 0, 8);
        assert_eq!(p.window, Duration::from_micros(50) + POLL_PER_CALL * 7);
        // The table holds the lengthened end: another connection sees this one waiting
        // after the first window would have ended.
        let t1 = t0 + Duration::from_micros(70);
        other.arm_for(t1, 0, 1);
        assert!(
            !other.active(t1),
            "the other connection sees the lengthened window"
        );
        other.disarm();
        assert!(
            p.active(t0 + Duration::from_micros(90)),
            "inside the lengthened window, counted from the first call"
        );
        assert!(
            !p.active(t0 + Duration::from_micros(50) + POLL_PER_CALL * 7),
            "the lengthened window ends"
        );
        // Fewer calls never shorten an open window.
        p.disarm();
        p.arm_for(t0, 0, 8);
        p.arm_for(t0, 0, 2);
        assert_eq!(p.window, Duration::from_micros(50) + POLL_PER_CALL * 7);
        p.disarm();
        // Many calls: capped.
        p.arm_for(t0, 0, 100_000);
        assert_eq!(p.window, POLL_MAX_WINDOW);
    }

    #[test]
    fn another_open_window_stops_polling_until_it_ends() {
        let table = test_table();
        let mut idle = BusyPoll::with_table(Duration::from_micros(50), table);
        let mut busy = BusyPoll::with_table(Duration::from_micros(200), table);
        let t0 = Instant::now();
        // `idle` answered its last call and waits in its window for a request that never
        // comes; its task never runs again.
        idle.arm_for(t0, 0, 1);
        busy.arm_for(t0, 0, 1);
        assert!(
            !busy.active(t0 + Duration::from_micros(10)),
            "two connections wait"
        );
        assert!(
            busy.active(t0 + Duration::from_micros(60)),
            "the idle connection's window has ended by itself"
        );
        busy.disarm();
        // A full table: the extra window does not poll.
        let mut others: Vec<BusyPoll> = (0..4)
            .map(|_| BusyPoll::with_table(Duration::from_micros(200), table))
            .collect();
        let t1 = t0 + Duration::from_millis(1);
        for o in &mut others {
            o.arm_for(t1, 0, 1);
        }
        busy.arm_for(t1, 0, 1);
        assert!(
            matches!(busy.open, Some((_, false))),
            "no slot left: this wait parks"
        );
        drop(others);
        busy.disarm();
        busy.arm_for(t1, 0, 1);
        assert!(busy.active(t1), "closed windows free their slots");
    }

    /// Opens and closes one window that may poll, as if it polled and then `settle`d.
    fn polled_window(p: &mut BusyPoll, in_time: bool, kept_core: bool) {
        p.arm_for(Instant::now(), 0, 1);
        assert!(matches!(p.open, Some((_, true))), "this wait may poll");
        p.settle(in_time, kept_core);
        p.disarm();
    }

    /// Waits that do not poll before the next one that may.
    fn paused_waits(p: &mut BusyPoll) -> u32 {
        let mut n = 0;
        loop {
            p.arm_for(Instant::now(), 0, 1);
            let poll = matches!(p.open, Some((_, true)));
            p.disarm();
            if poll {
                return n;
            }
            n += 1;
        }
    }

    #[test]
    fn a_zero_budget_never_opens_a_window() {
        let mut p = test_poll(Duration::ZERO);
        p.arm_for(Instant::now(), 0, 1);
        assert!(p.open.is_none());
        assert!(!p.active(Instant::now()));
    }

    #[test]
    fn a_window_runs_out_after_its_budget() {
        let mut p = test_poll(Duration::from_micros(50));
        let t0 = Instant::now();
        p.arm_for(t0, 0, 1);
        assert!(!p.active(t0 + Duration::from_micros(50)));
        assert!(
            matches!(p.open, Some((_, false))),
            "polls no more this wait"
        );
        p.arrived(t0 + Duration::from_micros(60));
        assert!(p.open.is_none());
    }

    #[test]
    fn losing_the_core_pauses_polling_doubling_and_paying_windows_halve_it() {
        let mut p = test_poll(Duration::from_micros(50));
        polled_window(&mut p, true, false);
        assert_eq!(paused_waits(&mut p), FIRST_PAUSE);
        p.disarm();
        polled_window(&mut p, true, false);
        assert_eq!(paused_waits(&mut p), 2 * FIRST_PAUSE);
        for _ in 0..20 {
            polled_window(&mut p, true, false);
            let _ = paused_waits(&mut p);
        }
        assert_eq!(p.pause, MAX_PAUSE, "capped");
        polled_window(&mut p, true, true);
        assert_eq!(p.pause, MAX_PAUSE / 2);
        assert_eq!(
            paused_waits(&mut p),
            0,
            "a paying window polls again at once"
        );
    }

    /// Counts `polls` polled waits of `poll` and then a comparison's parked waits of
    /// `park`.
    fn compared(poll: Duration, park: Duration) -> BusyPoll {
        let mut p = test_poll(Duration::from_micros(50));
        for _ in 0..4 {
            (p.polled, p.probing) = (true, false);
            p.compare(poll);
        }
        (p.polled, p.probing) = (false, true);
        for left in (0..PROBE_WAITS).rev() {
            p.probe = left;
            p.compare(park);
        }
        p
    }

    #[test]
    fn polling_pauses_when_parking_proved_the_faster() {
        let p = compared(Duration::from_micros(26), Duration::from_micros(20));
        assert_eq!(p.skip, SLOWER_PAUSE);
        let p = compared(Duration::from_micros(11), Duration::from_micros(60));
        assert_eq!(p.skip, 0, "polling was the faster");
        assert_eq!(
            (p.polled_waits.len(), p.parked_waits.len()),
            (0, 0),
            "each comparison starts afresh"
        );
        let p = compared(Duration::from_micros(11), Duration::from_millis(5));
        assert_eq!(p.skip, 0, "idle gaps are not compared");
        // A few polled waits that lost their core for a time slice (their average, 66 us,
        // is above the parked waits') do not outweigh the many that paid.
        let mut p = test_poll(Duration::from_micros(50));
        (p.polled, p.probing) = (true, false);
        for i in 0..64 {
            p.compare(Duration::from_micros(if i % 16 == 0 { 900 } else { 11 }));
        }
        (p.polled, p.probing) = (false, true);
        for left in (0..PROBE_WAITS).rev() {
            p.probe = left;
            p.compare(Duration::from_micros(40));
        }
        assert_eq!(p.skip, 0, "compared by medians");
    }

    #[test]
    fn data_plane_waits_take_no_part_in_the_probe() {
        let mut p = test_poll(Duration::from_micros(50));
        let t0 = Instant::now();
        for i in 0..2 * PROBE_EVERY {
            p.arm_for(t0, 1 << 20, 1);
            assert!(matches!(p.open, Some((_, true))), "wait {i} polls");
            p.arrived(t0 + Duration::from_micros(100));
        }
        assert_eq!(p.probe, 0, "no comparison started");
        assert_eq!(p.polled_waits.len(), 0, "their times are not compared");
        // Plain waits still compare: the PROBE_EVERY-th starts a comparison, whose waits
        // park.
        for _ in 0..PROBE_EVERY {
            p.arm_for(t0, 0, 1);
            p.disarm();
        }
        p.arm_for(t0, 0, 1);
        assert!(
            matches!(p.open, Some((_, false))),
            "a comparison wait parks"
        );
        p.disarm();
        // A data-plane wait in the middle of a comparison polls and leaves it as it was.
        let left = p.probe;
        p.arm_for(t0, 1 << 20, 1);
        assert!(matches!(p.open, Some((_, true))));
        assert_eq!(p.probe, left);
    }

    #[test]
    fn only_several_late_windows_in_a_row_pause_polling() {
        let mut p = test_poll(Duration::from_micros(50));
        for _ in 0..LATE_MISSES - 1 {
            polled_window(&mut p, false, true);
        }
        assert_eq!(paused_waits(&mut p), 0);
        p.disarm();
        polled_window(&mut p, true, true);
        for _ in 0..LATE_MISSES - 1 {
            polled_window(&mut p, false, true);
        }
        assert_eq!(
            paused_waits(&mut p),
            0,
            "a paying window restarts the count"
        );
        p.disarm();
        polled_window(&mut p, false, true);
        assert_eq!(paused_waits(&mut p), FIRST_PAUSE);
    }
}
