//! The completion side: the slab that maps `wr_id`s to in-flight chains, per-batch state, the initiator's QP links, timers, and the thread that polls the CQ, busy-polls briefly, then arms it and sleeps on the completion channel's fd.

use std::collections::BTreeMap;
use std::ffi::c_int;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::task::Waker;
use std::time::{Duration, Instant};

use hmc_core::{Error, Result};
use hmc_transport_kit::wake::{WakeFd, poll_in};
use parking_lot::{Condvar, Mutex};

use crate::nic::{Nic, Qp};
use crate::sys::*;
use crate::wire::wr_id;

/// What a batch's chains came back with.
#[derive(Default)]
pub(crate) struct BatchState {
    /// Chains posted and not yet completed (their last WR's completion not seen).
    pub outstanding: usize,
    /// The first real error.
    pub error: Option<Error>,
    /// Some WR was flushed because its QP went to ERR for another reason (a cancel, another
    /// batch's error): the batch is re-posted once the QP is re-established.
    pub retry: bool,
    pub waker: Option<Waker>,
}

/// One `transfer` call's in-flight state, shared with the completion thread.
#[derive(Default)]
pub(crate) struct Batch {
    pub state: Mutex<BatchState>,
    pub cv: Condvar,
}

/// Where an initiator QP stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum LinkState {
    /// In RTS.
    Ready,
    /// In ERR (an error completion, or moved there by a cancel): re-established once its
    /// outstanding WRs have all completed.
    Broken,
    /// The peer is gone; every operation fails with this reason.
    Dead(String),
}

pub(crate) struct LinkInner {
    pub qp: Qp,
    /// Changes at every (re-)establishment: the `wr_id` generation.
    pub generation: u32,
    pub state: LinkState,
    /// WRs posted and not yet known complete (SQ slots in use).
    pub outstanding: u32,
    /// Tasks waiting for SQ room or for the link to settle.
    pub waiters: Vec<Waker>,
}

/// One initiator QP of an endpoint.
pub(crate) struct Link {
    pub index: u8,
    pub peer: String,
    pub inner: Mutex<LinkInner>,
}

impl Link {
    pub fn wake_all(inner: &mut LinkInner) {
        for w in inner.waiters.drain(..) {
            w.wake();
        }
    }
}

struct Entry {
    generation: u32,
    batch: Arc<Batch>,
    link: Arc<Link>,
    wrs: u32,
}

#[derive(Default)]
struct Slab {
    entries: Vec<Option<Entry>>,
    free: Vec<u32>,
}

/// Counters of the completion side.
#[derive(Default)]
pub(crate) struct EngineCounters {
    pub completions: AtomicU64,
    pub sleeps: AtomicU64,
    pub chains: AtomicU64,
}

/// Everything the completion thread shares with the communicator.
pub(crate) struct Shared {
    pub nic: Arc<Nic>,
    slab: Mutex<Slab>,
    timers: Mutex<BTreeMap<(Instant, u64), Waker>>,
    next_timer: AtomicU64,
    sleeping: AtomicBool,
    wake: WakeFd,
    stop: AtomicBool,
    next_generation: AtomicU32,
    spin: Duration,
    pub counters: EngineCounters,
}

impl Shared {
    pub fn new(nic: Arc<Nic>, spin: Duration) -> Result<Arc<Shared>> {
        let wake = WakeFd::new("the RDMA completion thread's eventfd")?;
        Ok(Arc::new(Shared {
            nic,
            slab: Mutex::default(),
            timers: Mutex::default(),
            next_timer: AtomicU64::new(1),
            sleeping: AtomicBool::new(false),
            wake,
            stop: AtomicBool::new(false),
            next_generation: AtomicU32::new(1),
            spin,
            counters: EngineCounters::default(),
        }))
    }

    pub fn next_generation(&self) -> u32 {
        self.next_generation.fetch_add(1, Ordering::Relaxed)
    }

    fn kick(&self) {
        self.wake.signal();
    }

    /// Asks the completion thread to wake `waker` at `at`; returns the key to cancel it.
    pub fn add_timer(&self, at: Instant, waker: Waker) -> (Instant, u64) {
        let key = (at, self.next_timer.fetch_add(1, Ordering::Relaxed));
        let earliest = {
            let mut t = self.timers.lock();
            t.insert(key, waker);
            t.first_key_value().map(|(k, _)| *k) == Some(key)
        };
        if earliest && self.sleeping.load(Ordering::SeqCst) {
            self.kick();
        }
        key
    }

    pub fn cancel_timer(&self, key: (Instant, u64)) {
        self.timers.lock().remove(&key);
    }

    fn fire_timers(&self) {
        let now = Instant::now();
        let mut t = self.timers.lock();
        while let Some(entry) = t.first_entry() {
            if entry.key().0 > now {
                break;
            }
            entry.remove().wake();
        }
    }

    /// Records a chain of `wrs` WRs of `batch` on `link` (whose generation is
    /// `generation`) and returns its slot.
    pub fn insert(&self, generation: u32, batch: &Arc<Batch>, link: &Arc<Link>, wrs: u32) -> u32 {
        let mut slab = self.slab.lock();
        let entry = Entry {
            generation,
            batch: batch.clone(),
            link: link.clone(),
            wrs,
        };
        self.counters.chains.fetch_add(1, Ordering::Relaxed);
        match slab.free.pop() {
            Some(slot) => {
                slab.entries[slot as usize] = Some(entry);
                slot
            }
            None => {
                slab.entries.push(Some(entry));
                (slab.entries.len() - 1) as u32
            }
        }
    }

    /// Forgets a chain that was never posted (post_send refused it).
    pub fn remove(&self, slot: u32) {
        let mut slab = self.slab.lock();
        slab.entries[slot as usize] = None;
        slab.free.push(slot);
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.kick();
    }

    fn handle(&self, wc: &ibv_wc) {
        let (generation, slot, last) = wr_id::unpack(wc.wr_id);
        let (batch, link, wrs) = {
            let mut slab = self.slab.lock();
            let live = slab
                .entries
                .get(slot as usize)
                .and_then(|e| e.as_ref())
                .is_some_and(|e| e.generation == generation);
            if !live {
                tracing::debug!(wr_id = wc.wr_id, "completion of a finished chain ignored");
                return;
            }
            let e = slab.entries[slot as usize].as_ref().expect("checked");
            let found = (e.batch.clone(), e.link.clone(), e.wrs);
            if last {
                slab.entries[slot as usize] = None;
                slab.free.push(slot);
            }
            found
        };
        self.counters.completions.fetch_add(1, Ordering::Relaxed);
        let mut failure = None;
        let mut flushed = false;
        {
            let mut li = link.inner.lock();
            if wc.status != IBV_WC_SUCCESS {
                match (&li.state, wc.status) {
                    (LinkState::Dead(reason), _) => {
                        failure = Some(Error::peer(&link.peer, reason.clone()));
                    }
                    (_, IBV_WC_WR_FLUSH_ERR) => flushed = true,
                    _ => {
                        li.state = LinkState::Broken;
                        failure = Some(self.map_status(wc, &link.peer));
                    }
                }
            }
            if last {
                li.outstanding = li.outstanding.saturating_sub(wrs);
                Link::wake_all(&mut li);
            }
        }
        let mut b = batch.state.lock();
        if let Some(e) = failure {
            tracing::debug!(error = %e, "work request failed");
            b.error.get_or_insert(e);
        }
        b.retry |= flushed;
        if last {
            b.outstanding -= 1;
            if b.outstanding == 0 {
                if let Some(w) = b.waker.take() {
                    w.wake();
                }
                batch.cv.notify_all();
            }
        }
    }

    fn map_status(&self, wc: &ibv_wc, peer: &str) -> Error {
        let text = self.nic.verbs.status_str(wc.status);
        match wc.status {
            IBV_WC_REM_ACCESS_ERR => Error::InvalidKey(format!(
                "the target's NIC refused the remote key ({text}): the region was \
                 deregistered, or the key is forged or lacks the right"
            )),
            IBV_WC_RETRY_EXC_ERR | IBV_WC_RNR_RETRY_EXC_ERR => Error::peer(
                peer,
                format!(
                    "the peer's NIC does not answer ({text}): the peer process or its NIC is gone"
                ),
            ),
            IBV_WC_LOC_LEN_ERR | IBV_WC_REM_INV_REQ_ERR => Error::InvalidArgument(format!(
                "a work request was refused as too long ({text}): a port's max_msg_sz is \
                 smaller than announced; set RdmaConfig::max_msg_size lower"
            )),
            IBV_WC_LOC_PROT_ERR => Error::InvalidArgument(format!(
                "local protection error ({text}): the local registration no longer covers \
                 the bytes"
            )),
            _ => Error::device(
                hmc_core::DeviceErrorKind::Other,
                "libibverbs.so.1",
                "ibv_poll_cq",
                wc.status as i64,
                format!("{text} (vendor error {:#x})", wc.vendor_err),
            ),
        }
    }

    fn poll(&self, wcs: &mut [ibv_wc]) -> usize {
        // SAFETY: the CQ lives as long as the NIC; `wcs` has room for its length.
        let n = unsafe {
            self.nic
                .verbs
                .poll_cq(self.nic.cq, wcs.len() as c_int, wcs.as_mut_ptr())
        };
        if n < 0 {
            tracing::error!(n, "ibv_poll_cq failed");
            return 0;
        }
        for wc in &wcs[..n as usize] {
            self.handle(wc);
        }
        n as usize
    }

    /// The completion thread's body.
    pub fn run(self: Arc<Self>) {
        let mut wcs = [ibv_wc::default(); 32];
        let mut last_work = Instant::now();
        let mut unacked: u32 = 0;
        let fd = self.nic.channel_fd();
        while !self.stop.load(Ordering::SeqCst) {
            if self.poll(&mut wcs) > 0 {
                last_work = Instant::now();
                continue;
            }
            self.fire_timers();
            if last_work.elapsed() < self.spin {
                std::hint::spin_loop();
                continue;
            }
            // Arm, then look once more: a completion that landed before arming raises no event.
            // SAFETY: the CQ was created with a completion channel.
            let rc = unsafe { self.nic.verbs.req_notify_cq(self.nic.cq, 0) };
            if rc != 0 {
                tracing::error!(rc, "ibv_req_notify_cq failed; polling every millisecond");
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            if self.poll(&mut wcs) > 0 {
                last_work = Instant::now();
                continue;
            }
            self.sleeping.store(true, Ordering::SeqCst);
            let wait = self
                .timers
                .lock()
                .first_key_value()
                .map(|(k, _)| k.0.saturating_duration_since(Instant::now()));
            self.counters.sleeps.fetch_add(1, Ordering::Relaxed);
            let mut ready = [0; 2];
            if !self.stop.load(Ordering::SeqCst) {
                ready = poll_in([fd, self.wake.as_raw_fd()], wait).unwrap_or_else(|e| {
                    tracing::error!("poll on the completion channel failed: {e}");
                    std::thread::sleep(Duration::from_millis(1));
                    [0; 2]
                });
            }
            self.sleeping.store(false, Ordering::SeqCst);
            if ready[0] & libc::POLLIN != 0 {
                loop {
                    let mut cq: *mut ibv_cq = std::ptr::null_mut();
                    let mut ctx: *mut std::ffi::c_void = std::ptr::null_mut();
                    // SAFETY: the channel's fd is non-blocking: EAGAIN ends the loop.
                    if unsafe {
                        (self.nic.verbs.ibv_get_cq_event)(self.nic.channel, &mut cq, &mut ctx)
                    } != 0
                    {
                        break;
                    }
                    unacked += 1;
                }
                if unacked >= 64 {
                    // SAFETY: acknowledging events returned by ibv_get_cq_event for our CQ.
                    unsafe { (self.nic.verbs.ibv_ack_cq_events)(self.nic.cq, unacked) };
                    unacked = 0;
                }
            }
            if ready[1] & libc::POLLIN != 0 {
                self.wake.drain();
            }
            self.fire_timers();
            last_work = Instant::now();
        }
        if unacked > 0 {
            // SAFETY: as above; ibv_destroy_cq waits for every event to be acknowledged.
            unsafe { (self.nic.verbs.ibv_ack_cq_events)(self.nic.cq, unacked) };
        }
    }
}

/// A timer of the completion thread held by a waiting future: set once, cancelled when
/// the future ends or is dropped.
pub(crate) struct TimerSlot<'a> {
    shared: &'a Shared,
    key: Option<(Instant, u64)>,
}

impl<'a> TimerSlot<'a> {
    pub fn new(shared: &'a Shared) -> Self {
        TimerSlot { shared, key: None }
    }

    /// Arms the timer for `at` with `waker`, unless it is armed already.
    pub fn arm(&mut self, at: Instant, waker: &Waker) {
        if self.key.is_none() {
            self.key = Some(self.shared.add_timer(at, waker.clone()));
        }
    }
}

impl Drop for TimerSlot<'_> {
    fn drop(&mut self) {
        if let Some(k) = self.key.take() {
            self.shared.cancel_timer(k);
        }
    }
}
