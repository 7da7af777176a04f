//! The host side of a plugin's completion signal: per communicator, a task on the caller's tokio runtime (or, outside one, a thread) polls the plugin's event fd and wakes the futures waiting on it, and wakes each at its deadline.
//!
//! Inside a tokio runtime (with I/O and time enabled) the fd is watched by that runtime's
//! own poller, so a completion wakes the waiting task without a thread of ours in between;
//! the fd is duplicated first, so the runtime's registration never outlives the plugin's
//! descriptor into a reused fd number.
//!
//! A future registers its waker *before* it asks the plugin (`transfer_poll`,
//! `recv_notification`), so a signal that arrives between the question and the
//! registration is never lost. Every signal wakes every waiter: each asks the plugin again
//! and registers again if still pending.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::Waker;
use std::time::Instant;

use hmc_core::{Error, Result};
use parking_lot::Mutex;

struct Waiter {
    id: u64,
    waker: Waker,
    deadline: Instant,
}

struct Shared {
    waiters: Mutex<Vec<Waiter>>,
    /// The host's own eventfd: wakes the thread to re-read deadlines or to stop.
    kick: OwnedFd,
    stop: AtomicBool,
}

/// The waiter table and what serves it.
pub(crate) struct Events {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
    task: Option<(tokio::task::JoinHandle<()>, Arc<tokio::sync::Notify>)>,
    next_id: AtomicU64,
}

fn eventfd() -> Result<OwnedFd> {
    // SAFETY: plain syscall; the returned fd is owned below.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(Error::io(
            "eventfd for a plugin's event thread",
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: `fd` was just created and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn drain(fd: RawFd) {
    let mut v = 0u64;
    // SAFETY: reads 8 bytes into `v`; a non-eventfd fd just yields fewer bytes or EAGAIN.
    unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
}

fn signal(fd: RawFd) {
    let one = 1u64;
    // SAFETY: writes 8 bytes from `one` to an eventfd the caller owns.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

impl Events {
    /// Starts serving `plugin_fd` (which must stay open until [`Events::stop`] returns):
    /// on the current tokio runtime when there is one with I/O and time, else on a thread.
    pub(crate) fn start(plugin: &str, plugin_fd: RawFd) -> Result<Events> {
        let shared = Arc::new(Shared {
            waiters: Mutex::new(Vec::new()),
            kick: eventfd()?,
            stop: AtomicBool::new(false),
        });
        if let Some(task) = start_task(&shared, plugin_fd) {
            return Ok(Events {
                shared,
                thread: None,
                task: Some(task),
                next_id: AtomicU64::new(1),
            });
        }
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("hmc-plugin-{plugin}"))
            .spawn(move || run(&s, plugin_fd))
            .map_err(|e| Error::io("spawning a plugin's event thread", e))?;
        Ok(Events {
            shared,
            thread: Some(thread),
            task: None,
            next_id: AtomicU64::new(1),
        })
    }

    /// A fresh waiter id.
    pub(crate) fn id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Wakes `waker` at the next signal, or at `deadline`, whichever is first.
    pub(crate) fn wait(&self, id: u64, waker: &Waker, deadline: Instant) {
        let mut w = self.shared.waiters.lock();
        let earliest = w.iter().map(|x| x.deadline).min();
        match w.iter_mut().find(|x| x.id == id) {
            Some(x) => {
                x.waker.clone_from(waker);
                x.deadline = deadline;
            }
            None => w.push(Waiter {
                id,
                waker: waker.clone(),
                deadline,
            }),
        }
        drop(w);
        if earliest.is_none_or(|e| deadline < e) {
            match &self.task {
                Some((_, notify)) => notify.notify_one(),
                None => signal(self.shared.kick.as_raw_fd()),
            }
        }
    }

    /// Forgets waiter `id`.
    pub(crate) fn forget(&self, id: u64) {
        self.shared.waiters.lock().retain(|x| x.id != id);
    }

    /// Stops the thread and waits for it.
    pub(crate) fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        signal(self.shared.kick.as_raw_fd());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // The task watches a duplicate of the plugin's fd, so it may end after this.
        if let Some((task, _)) = self.task.take() {
            task.abort();
        }
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Wakes every waiter when `signalled`, else those whose deadline passed.
fn wake_due(s: &Shared, signalled: bool) {
    let now = Instant::now();
    let due: Vec<Waker> = {
        let mut w = s.waiters.lock();
        let mut due = Vec::new();
        w.retain(|x| {
            if signalled || x.deadline <= now {
                due.push(x.waker.clone());
                false
            } else {
                true
            }
        });
        due
    };
    due.into_iter().for_each(Waker::wake);
}

/// Serves the waiters from a task of the current tokio runtime; `None` outside one, or in
/// one without I/O or time.
fn start_task(
    shared: &Arc<Shared>,
    plugin_fd: RawFd,
) -> Option<(tokio::task::JoinHandle<()>, Arc<tokio::sync::Notify>)> {
    use tokio::io::Interest;
    use tokio::io::unix::AsyncFd;
    let handle = tokio::runtime::Handle::try_current().ok()?;
    // A runtime without timers panics at the first sleep: find out before relying on it.
    let timers = std::panic::catch_unwind(|| drop(tokio::time::sleep(std::time::Duration::ZERO)));
    if timers.is_err() {
        return None;
    }
    // SAFETY: duplicates a descriptor the plugin keeps open for this call; the duplicate
    // is owned below.
    let dup = unsafe { libc::fcntl(plugin_fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return None;
    }
    // SAFETY: `dup` was just created and is owned by nobody else.
    let owned = unsafe { OwnedFd::from_raw_fd(dup) };
    // A runtime without I/O panics here: fall back to the thread then.
    let afd = std::panic::catch_unwind(move || {
        // SAFETY: `owned` is an open descriptor that the AsyncFd owns, unchanged, for its
        // whole life.
        unsafe { AsyncFd::register_with_interest(owned, Interest::READABLE) }
    })
    .ok()?
    .ok()?;
    let notify = Arc::new(tokio::sync::Notify::new());
    let (s, n) = (shared.clone(), notify.clone());
    let task = handle.spawn(async move {
        while !s.stop.load(Ordering::Acquire) {
            let next = s.waiters.lock().iter().map(|w| w.deadline).min();
            let sleep = async {
                match next {
                    Some(d) => tokio::time::sleep_until(d.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                ready = afd.readable() => match ready {
                    Ok(mut guard) => {
                        drain(afd.get_ref().as_raw_fd());
                        guard.clear_ready();
                        wake_due(&s, true);
                    }
                    Err(e) => {
                        tracing::error!("watching a plugin's event fd failed: {e}");
                        return;
                    }
                },
                () = sleep => wake_due(&s, false),
                () = n.notified() => {}
            }
        }
    });
    Some((task, notify))
}

fn run(s: &Shared, plugin_fd: RawFd) {
    let kick = s.kick.as_raw_fd();
    while !s.stop.load(Ordering::Acquire) {
        let now = Instant::now();
        let next = s.waiters.lock().iter().map(|w| w.deadline).min();
        let timeout_ms = match next {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(now);
                // Round up, so a deadline is never polled for early in a loop.
                left.as_millis().min(i32::MAX as u128) as i32 + i32::from(!left.is_zero())
            }
        };
        let mut fds = [
            libc::pollfd {
                fd: plugin_fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: kick,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a valid array of two pollfds for the duration of the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                tracing::error!(
                    "poll on a plugin's event fd failed: {e}; its operations wake only at their deadlines"
                );
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            continue;
        }
        if fds[1].revents != 0 {
            drain(kick);
        }
        if fds[0].revents & (libc::POLLNVAL | libc::POLLERR) != 0 {
            tracing::error!(
                "a plugin's event fd is invalid; its operations now wake only at their deadlines"
            );
            wake_due(s, true);
            std::thread::sleep(std::time::Duration::from_millis(10));
            continue;
        }
        let signalled = fds[0].revents != 0;
        if signalled {
            drain(plugin_fd);
        }
        wake_due(s, signalled);
    }
}
