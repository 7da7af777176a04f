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
//!
//! Deadlines: the server (task or thread) keeps one timer, armed at the earliest deadline
//! it has seen, and keeps it armed when that waiter leaves (a timer that fires with nothing
//! due costs one spurious wake-up). A new waiter kicks the server only when its deadline is
//! earlier than the armed one, so back-to-back operations with the same timeout neither
//! wake the server nor re-arm its timer each time.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::Waker;
use std::time::Instant;

use hmc_core::{Error, Result};
use hmc_transport_kit::wake::{WakeFd, drain_fd, poll_in};
use parking_lot::Mutex;

struct Waiter {
    id: u64,
    waker: Waker,
    deadline: Instant,
}

/// The waiters, and when the server wakes for deadlines at the latest (`None`: only at a
/// signal). One lock, so a waiter that decides not to kick saw the server's timer.
#[derive(Default)]
struct Table {
    waiters: Vec<Waiter>,
    armed: Option<Instant>,
}

struct Shared {
    table: Mutex<Table>,
    /// The host's own eventfd: wakes the thread to re-read deadlines or to stop.
    kick: WakeFd,
    stop: AtomicBool,
}

/// The waiter table and what serves it.
pub(crate) struct Events {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
    task: Option<(tokio::task::JoinHandle<()>, Arc<tokio::sync::Notify>)>,
    next_id: AtomicU64,
}

fn eventfd() -> Result<WakeFd> {
    WakeFd::new("the eventfd of a plugin's event thread")
}

impl Events {
    /// Starts serving `plugin_fd` (which must stay open until [`Events::stop`] returns):
    /// on the current tokio runtime when there is one with I/O and time, else on a thread.
    pub(crate) fn start(plugin: &str, plugin_fd: RawFd) -> Result<Events> {
        let shared = Arc::new(Shared {
            table: Mutex::new(Table::default()),
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
        let mut t = self.shared.table.lock();
        match t.waiters.iter_mut().find(|x| x.id == id) {
            Some(x) => {
                x.waker.clone_from(waker);
                x.deadline = deadline;
            }
            None => t.waiters.push(Waiter {
                id,
                waker: waker.clone(),
                deadline,
            }),
        }
        let kick = t.armed.is_none_or(|armed| deadline < armed);
        if kick {
            // Until the server re-reads the table: later waiters need not kick again.
            t.armed = Some(deadline);
        }
        drop(t);
        if kick {
            match &self.task {
                Some((_, notify)) => notify.notify_one(),
                None => self.shared.kick.signal(),
            }
        }
    }

    /// Forgets waiter `id`.
    pub(crate) fn forget(&self, id: u64) {
        self.shared.table.lock().waiters.retain(|x| x.id != id);
    }

    /// Stops the thread and waits for it.
    pub(crate) fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.kick.signal();
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

/// Wakes every waiter when `signalled`, else those whose deadline passed; `due` is scratch
/// space kept by the caller, so a completion allocates nothing.
fn wake_due(s: &Shared, signalled: bool, due: &mut Vec<Waker>) {
    let now = Instant::now();
    s.table.lock().waiters.retain(|x| {
        if signalled || x.deadline <= now {
            due.push(x.waker.clone());
            false
        } else {
            true
        }
    });
    due.drain(..).for_each(Waker::wake);
}

/// When the server's timer should fire next, given the one it has armed (`armed`): the
/// earliest deadline of a waiter, or the armed time if that is earlier or nobody waits
/// (kept rather than re-armed); recorded in the table for [`Events::wait`].
fn next_timer(s: &Shared, armed: Option<Instant>) -> Option<Instant> {
    let mut t = s.table.lock();
    let earliest = t.waiters.iter().map(|w| w.deadline).min();
    let next = match (earliest, armed) {
        (Some(e), Some(a)) => Some(e.min(a)),
        (e, a) => e.or(a),
    };
    t.armed = next;
    next
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
        let mut due = Vec::new();
        // One timer for the task's life, reset only when the target moves.
        let sleep = tokio::time::sleep(std::time::Duration::from_secs(3600));
        tokio::pin!(sleep);
        let mut armed: Option<Instant> = None;
        while !s.stop.load(Ordering::Acquire) {
            let next = next_timer(&s, armed);
            if next != armed
                && let Some(at) = next
            {
                sleep.as_mut().reset(at.into());
            }
            armed = next;
            tokio::select! {
                ready = afd.readable() => match ready {
                    Ok(mut guard) => {
                        drain_fd(afd.get_ref().as_raw_fd());
                        guard.clear_ready();
                        wake_due(&s, true, &mut due);
                    }
                    Err(e) => {
                        tracing::error!("watching a plugin's event fd failed: {e}");
                        return;
                    }
                },
                () = &mut sleep, if armed.is_some() => {
                    armed = None;
                    wake_due(&s, false, &mut due);
                }
                () = n.notified() => {}
            }
        }
    });
    Some((task, notify))
}

fn run(s: &Shared, plugin_fd: RawFd) {
    let kick = s.kick.as_raw_fd();
    let mut due = Vec::new();
    let mut armed: Option<Instant> = None;
    while !s.stop.load(Ordering::Acquire) {
        let now = Instant::now();
        armed = next_timer(s, armed);
        let wait = armed.map(|d| d.saturating_duration_since(now));
        let ready = match poll_in([plugin_fd, kick], wait) {
            Ok(ready) => ready,
            Err(e) => {
                tracing::error!(
                    "poll on a plugin's event fd failed: {e}; its operations wake only at their deadlines"
                );
                std::thread::sleep(std::time::Duration::from_millis(1));
                continue;
            }
        };
        if ready[1] != 0 {
            drain_fd(kick);
        }
        if ready[0] & (libc::POLLNVAL | libc::POLLERR) != 0 {
            tracing::error!(
                "a plugin's event fd is invalid; its operations now wake only at their deadlines"
            );
            wake_due(s, true, &mut due);
            std::thread::sleep(std::time::Duration::from_millis(10));
            continue;
        }
        let signalled = ready[0] != 0;
        if signalled {
            drain_fd(plugin_fd);
        }
        if armed.is_some_and(|at| at <= Instant::now()) {
            armed = None;
        }
        wake_due(s, signalled, &mut due);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hmc_transport_kit::wake::signal_fd;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;
    use std::time::Duration;

    /// Counts wake-ups and remembers when the first came.
    #[derive(Default)]
    struct Woken {
        count: AtomicUsize,
        first: Mutex<Option<Instant>>,
    }

    impl Wake for Woken {
        fn wake(self: Arc<Self>) {
            self.first.lock().get_or_insert_with(Instant::now);
            self.count.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Registers a fresh waiter due in `after`; returns it and its deadline.
    fn waiter(ev: &Events, after: Duration) -> (u64, Arc<Woken>, Instant) {
        let (id, w, at) = (ev.id(), Arc::new(Woken::default()), Instant::now() + after);
        ev.wait(id, &Waker::from(w.clone()), at);
        (id, w, at)
    }

    /// When `w` was first woken, waiting for it up to a minute (only a hang fails).
    fn woken_at(w: &Woken) -> Instant {
        let give_up = Instant::now() + Duration::from_secs(60);
        while w.count.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < give_up, "never woken");
            std::thread::sleep(Duration::from_millis(2));
        }
        w.first.lock().expect("set before the count")
    }

    fn deadlines_and_signals_wake_the_right_waiters(ev: &Events, plugin_fd: RawFd) {
        // A far deadline arms the timer; an earlier one must still wake on time.
        let (far, far_w, _) = waiter(ev, Duration::from_secs(600));
        let (_, near_w, near_at) = waiter(ev, Duration::from_millis(30));
        assert!(woken_at(&near_w) >= near_at);
        // A waiter that leaves keeps its timer armed; a later waiter is woken at its own
        // deadline, not at the leaver's.
        let (early, _, _) = waiter(ev, Duration::from_millis(20));
        ev.forget(early);
        let (_, late_w, late_at) = waiter(ev, Duration::from_millis(150));
        assert!(woken_at(&late_w) >= late_at);
        // A signal wakes everyone still waiting, long before their deadlines.
        let (_, other_w, _) = waiter(ev, Duration::from_secs(600));
        signal_fd(plugin_fd);
        woken_at(&other_w);
        woken_at(&far_w);
        ev.forget(far);
    }

    #[test]
    fn a_thread_serves_deadlines_and_signals() {
        let plugin = eventfd().unwrap();
        let mut ev = Events::start("test", plugin.as_raw_fd()).unwrap();
        assert!(ev.thread.is_some(), "outside a runtime: a thread");
        deadlines_and_signals_wake_the_right_waiters(&ev, plugin.as_raw_fd());
        ev.stop();
    }

    #[test]
    fn a_runtime_task_serves_deadlines_and_signals() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let plugin = eventfd().unwrap();
        let mut ev = rt.block_on(async { Events::start("test", plugin.as_raw_fd()).unwrap() });
        assert!(ev.task.is_some(), "inside a runtime: a task");
        deadlines_and_signals_wake_the_right_waiters(&ev, plugin.as_raw_fd());
        ev.stop();
    }
}
