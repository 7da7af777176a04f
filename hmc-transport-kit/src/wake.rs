//! Waking a thread parked in `poll(2)`: the UCX progress thread, the RDMA completion
//! thread, the plugin host's event thread and an exported plugin communicator each sleep
//! on their device's descriptor plus an `eventfd` that other threads signal. This module
//! is that `eventfd` ([`WakeFd`]) and the wait on a few descriptors ([`poll_in`]), so the
//! four loops share one set of system calls and one rounding rule for timeouts.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use hmc_core::{Error, Result};

/// A non-blocking, close-on-exec `eventfd` that a parked thread polls and others signal.
#[derive(Debug)]
pub struct WakeFd(OwnedFd);

impl WakeFd {
    /// A new `eventfd`; `what` names its owner in the error ("the UCX engine's wake
    /// eventfd").
    pub fn new(what: &str) -> Result<WakeFd> {
        // SAFETY: plain system call; the result is checked before it is owned.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::io(
                format!("creating {what}"),
                io::Error::last_os_error(),
            ));
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        Ok(WakeFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Adds one to the counter, which makes the descriptor readable until drained. It
    /// cannot block (the counter would need 2^64 - 1 signals without a drain) and has
    /// nothing to report: a failed write could only mean the descriptor is gone.
    #[inline]
    pub fn signal(&self) {
        signal_fd(self.0.as_raw_fd());
    }

    /// Resets the counter, so that the next poll sleeps until the next [`signal`](Self::signal).
    #[inline]
    pub fn drain(&self) {
        drain_fd(self.0.as_raw_fd());
    }
}

impl AsRawFd for WakeFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// [`WakeFd::signal`] on a descriptor owned elsewhere (a plugin's `eventfd`).
#[inline]
pub fn signal_fd(fd: RawFd) {
    let one = 1u64;
    // SAFETY: writes 8 bytes from a live u64; on a closed or foreign fd the call fails
    // with EBADF or EINVAL and touches no memory of ours.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// [`WakeFd::drain`] on a descriptor owned elsewhere. On a descriptor that is not an
/// `eventfd` (a plugin may hand over a pipe) it reads up to 8 bytes, or fails with
/// EAGAIN when there are none.
#[inline]
pub fn drain_fd(fd: RawFd) {
    let mut v = 0u64;
    // SAFETY: reads at most 8 bytes into a live u64.
    unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
}

/// A `poll(2)` timeout: `None` waits without end (-1); a duration is rounded up to the
/// next whole millisecond, so that a loop never wakes before its deadline and spins.
pub fn timeout_ms(wait: Option<Duration>) -> i32 {
    match wait {
        None => -1,
        Some(d) => d.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32,
    }
}

/// Waits until one of `fds` is readable or `wait` passes ([`timeout_ms`]); returns each
/// descriptor's `revents` (0 for those not ready). A negative descriptor is skipped by
/// the kernel, which lets a caller leave one out without a second shape of call. An
/// interrupted wait (EINTR) returns all zeros, as a timeout does: callers loop anyway.
pub fn poll_in<const N: usize>(fds: [RawFd; N], wait: Option<Duration>) -> io::Result<[i16; N]> {
    let mut set = fds.map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    // SAFETY: `set` is an array of N initialised pollfds, live for the call.
    let n = unsafe { libc::poll(set.as_mut_ptr(), N as libc::nfds_t, timeout_ms(wait)) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok([0; N]);
        }
        return Err(e);
    }
    Ok(set.map(|p| p.revents))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_signal_wakes_the_poll_and_a_drain_quiets_it() {
        let w = WakeFd::new("a test eventfd").unwrap();
        let r = poll_in([w.as_raw_fd()], Some(Duration::ZERO)).unwrap();
        assert_eq!(r, [0], "fresh: not readable");
        w.signal();
        w.signal();
        let r = poll_in([w.as_raw_fd()], Some(Duration::from_secs(5))).unwrap();
        assert_eq!(r[0] & libc::POLLIN, libc::POLLIN);
        w.drain();
        let r = poll_in([w.as_raw_fd()], Some(Duration::ZERO)).unwrap();
        assert_eq!(r, [0], "one drain resets every signal");
    }

    #[test]
    fn a_signal_from_another_thread_ends_an_endless_wait() {
        let w = std::sync::Arc::new(WakeFd::new("a test eventfd").unwrap());
        let w2 = w.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            w2.signal();
        });
        let r = poll_in([-1, w.as_raw_fd()], None).unwrap();
        t.join().unwrap();
        assert_eq!(r[0], 0, "a negative descriptor is skipped");
        assert_ne!(r[1], 0);
    }

    #[test]
    fn a_timeout_is_never_shorter_than_asked() {
        assert_eq!(timeout_ms(None), -1);
        assert_eq!(timeout_ms(Some(Duration::ZERO)), 0);
        assert_eq!(timeout_ms(Some(Duration::from_micros(1))), 1);
        assert_eq!(timeout_ms(Some(Duration::from_micros(1_001))), 2);
        assert_eq!(timeout_ms(Some(Duration::from_millis(7))), 7);
        assert_eq!(timeout_ms(Some(Duration::from_secs(u64::MAX))), i32::MAX);
        let w = WakeFd::new("a test eventfd").unwrap();
        let start = Instant::now();
        poll_in([w.as_raw_fd()], Some(Duration::from_micros(2_500))).unwrap();
        assert!(start.elapsed() >= Duration::from_micros(2_500));
    }

    #[test]
    fn a_closed_descriptor_is_reported_not_waited_on() {
        let (r, w) = std::os::unix::net::UnixStream::pair().unwrap();
        let fd = r.as_raw_fd();
        drop(w);
        let got = poll_in([fd], Some(Duration::from_secs(5))).unwrap();
        assert_ne!(
            got[0] & (libc::POLLIN | libc::POLLHUP),
            0,
            "peer gone: readable"
        );
    }
}
