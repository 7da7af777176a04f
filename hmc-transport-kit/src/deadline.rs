//! Deadlines across processes: `hmc_core::Deadline` as absolute `CLOCK_MONOTONIC` nanoseconds, the clock every process of a host shares (what the plugin ABI passes, too).

use std::time::Duration;

use hmc_core::Deadline;

/// No deadline, as a nanosecond value (the plugin ABI's `HMC_NO_DEADLINE`).
pub const NO_DEADLINE_NS: u64 = u64::MAX;

/// Now, in `CLOCK_MONOTONIC` nanoseconds.
pub fn monotonic_now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec on the stack.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `deadline` as `CLOCK_MONOTONIC` nanoseconds (saturating below [`NO_DEADLINE_NS`]).
pub fn to_monotonic_ns(deadline: Deadline) -> u64 {
    let left = u64::try_from(deadline.remaining().as_nanos()).unwrap_or(u64::MAX);
    monotonic_now_ns()
        .saturating_add(left)
        .min(NO_DEADLINE_NS - 1)
}

/// The deadline at `ns` `CLOCK_MONOTONIC` nanoseconds ([`NO_DEADLINE_NS`]: a year from now).
pub fn from_monotonic_ns(ns: u64) -> Deadline {
    if ns == NO_DEADLINE_NS {
        return Deadline::after(Duration::from_secs(86_400 * 365));
    }
    Deadline::after(Duration::from_nanos(ns.saturating_sub(monotonic_now_ns())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_round_trip_and_past_ones_stay_past() {
        let d = Deadline::after(Duration::from_millis(300));
        let back = from_monotonic_ns(to_monotonic_ns(d));
        assert!(back.remaining() <= Duration::from_millis(300));
        assert!(back.remaining() > Duration::from_millis(100));
        assert!(from_monotonic_ns(monotonic_now_ns().saturating_sub(1)).is_expired());
        assert!(from_monotonic_ns(NO_DEADLINE_NS).remaining() > Duration::from_secs(86_400));
        assert!(to_monotonic_ns(Deadline::after(Duration::MAX)) < NO_DEADLINE_NS);
    }
}
