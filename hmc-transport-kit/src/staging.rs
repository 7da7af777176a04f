//! The pool of host chunks a transport stages device memory through: a peer's READ of a
//! device region is copied from the device into a chunk and sent from there, a WRITE is
//! received into one and copied to the device. The TCP transport serves its device
//! regions this way, and UCX those of a device its loaded library cannot move.
//!
//! One [`StagingPool`] per communicator holds at most `max_bytes` in chunks of `chunk`
//! bytes (at least one chunk). A request takes its chunks at once ([`StagingPool::take`]
//! in a task, [`StagingPool::take_blocking`] on a thread), first come first served, and
//! waits at most the time it is given: then it is refused with
//! `LimitExceeded { limit: "max_staging_bytes" }` ([`refusal`]), so no peer makes the
//! target hold more. A chunk is page-locked memory of the device's driver where its
//! backend has an allocator for it ([`hmc_core::Memory::pinned_host`]), else plain host
//! memory; it is allocated when first needed, kept for reuse, and back in the pool when
//! its [`Lease`] drops (a request's end, or its task aborted with the connection).
//! [`StagingStats`] says what the pool has done.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hmc_core::{AnyBuffer, AnyMemory, Device, DeviceBuffer, Error, Memory, Region, Result};
use parking_lot::{Condvar, Mutex};
use tokio::sync::Notify;

/// The name of the limit a pool's refusal reports (`Error::LimitExceeded::limit`).
pub const LIMIT: &str = "max_staging_bytes";

/// The refusal of a request that found no chunks free in time: it would have made the
/// pool hold `value` bytes of its `max`; `setting` names where the target raises it
/// (`TcpConfig::max_staging_bytes`, …).
pub fn refusal(value: u64, max: u64, setting: &str) -> Error {
    Error::LimitExceeded {
        limit: LIMIT,
        value,
        max,
        hint: format!(
            "the target's bounce chunks for device memory are all in use by other \
             requests; retry, or raise max_staging_bytes at the target (the engine option, \
             or {setting})"
        ),
    }
}

/// What a staging pool has done, from the communicator's `staging_stats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StagingStats {
    /// Chunks held by requests being served now.
    pub chunks_held: usize,
    /// Chunks allocated so far (kept for reuse; at most `max_staging_bytes / chunk`).
    pub chunks_allocated: usize,
    /// Bytes copied out of device regions for peers' READs.
    pub bytes_to_peers: u64,
    /// Bytes copied into device regions from peers' WRITEs.
    pub bytes_from_peers: u64,
}

/// A host chunk: page-locked memory of a device's backend, or plain host memory.
enum ChunkBuf {
    Pinned { buf: AnyBuffer, device: Device },
    Plain(Box<[u8]>),
}

impl ChunkBuf {
    fn addr(&self) -> u64 {
        match self {
            ChunkBuf::Pinned { buf, .. } => buf.region().addr,
            ChunkBuf::Plain(b) => b.as_ptr() as u64,
        }
    }

    fn pinned_for(&self) -> Option<Device> {
        match self {
            ChunkBuf::Pinned { device, .. } => Some(*device),
            ChunkBuf::Plain(_) => None,
        }
    }
}

/// A communicator's bounce chunks for device regions. Cheap to clone: clones share the
/// chunks and the counters.
#[derive(Clone)]
pub struct StagingPool {
    shared: Arc<Shared>,
}

struct Shared {
    chunk: usize,
    max_bytes: usize,
    max_chunks: usize,
    /// Where the target raises the limit, for the refusal's hint.
    setting: &'static str,
    state: Mutex<State>,
    /// Wakes threads in `take_blocking`.
    freed: Condvar,
    /// Wakes tasks in `take`.
    returned: Notify,
    allocated: AtomicUsize,
    to_peers: AtomicU64,
    from_peers: AtomicU64,
}

#[derive(Default)]
struct State {
    free: Vec<ChunkBuf>,
    held: usize,
    /// Tickets of the requests waiting, oldest first: only the first may take chunks.
    queue: VecDeque<u64>,
    next_ticket: u64,
}

/// One chunk taken from the pool; back in it when dropped.
pub struct Lease {
    /// `None` only while being filled, or when its allocation failed.
    buf: Option<ChunkBuf>,
    pool: Arc<Shared>,
}

impl Lease {
    /// The chunk's size in bytes.
    pub fn size(&self) -> usize {
        self.pool.chunk
    }

    /// `len` bytes of the chunk from `at`, as a host region (for a device copy).
    ///
    /// # Panics
    /// When the range passes the chunk's end.
    pub fn region(&self, at: usize, len: usize) -> Region {
        assert!(
            at.checked_add(len)
                .is_some_and(|end| end <= self.pool.chunk),
            "{len} bytes at {at} pass the end of a {}-byte staging chunk",
            self.pool.chunk
        );
        Region {
            device: Device::HOST,
            addr: self.buf.as_ref().expect("held until drop").addr() + at as u64,
            len,
        }
    }

    /// The first `len` bytes (at most [`Lease::size`]).
    pub fn bytes(&self, len: usize) -> &[u8] {
        let at = self.region(0, len).addr;
        // SAFETY: `region` checked that `len` bytes lie inside the chunk, host memory this
        // lease owns until it drops; `&self` keeps it from being written meanwhile.
        unsafe { std::slice::from_raw_parts(at as *const u8, len) }
    }

    /// The first `len` bytes (at most [`Lease::size`]), writable.
    pub fn bytes_mut(&mut self, len: usize) -> &mut [u8] {
        let at = self.region(0, len).addr;
        // SAFETY: as in `bytes`; `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(at as *mut u8, len) }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut st = self.pool.state.lock();
        if let Some(buf) = self.buf.take() {
            st.free.push(buf);
        }
        st.held -= 1;
        let waiting = !st.queue.is_empty();
        drop(st);
        if waiting {
            self.pool.wake();
        }
    }
}

/// A request's place in line while it waits; leaves the line when dropped (taken, timed
/// out, or its task dropped).
struct Waiter<'a> {
    pool: &'a Shared,
    ticket: Option<u64>,
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let Some(t) = self.ticket else { return };
        let mut st = self.pool.state.lock();
        st.queue.retain(|&q| q != t);
        let waiting = !st.queue.is_empty();
        drop(st);
        if waiting {
            // The next in line may be able to take what this one waited for.
            self.pool.wake();
        }
    }
}

impl Shared {
    fn wake(&self) {
        self.freed.notify_all();
        self.returned.notify_waiters();
    }

    /// Claims `n` chunks for `w` when it is first in line (or none waits) and they are
    /// free; else puts it in line.
    fn claim(&self, st: &mut State, w: &mut Waiter<'_>, n: usize) -> bool {
        let first = match w.ticket {
            None => st.queue.is_empty(),
            Some(t) => st.queue.front() == Some(&t),
        };
        if first && st.held + n <= self.max_chunks {
            if w.ticket.take().is_some() {
                st.queue.pop_front();
                if !st.queue.is_empty() {
                    // Chunks may be left for the next in line.
                    self.wake();
                }
            }
            st.held += n;
            return true;
        }
        if w.ticket.is_none() {
            let t = st.next_ticket;
            st.next_ticket += 1;
            st.queue.push_back(t);
            w.ticket = Some(t);
        }
        false
    }

    fn refusal(&self, st: &State, n: usize) -> Error {
        refusal(
            ((st.held + n) * self.chunk) as u64,
            self.max_bytes as u64,
            self.setting,
        )
    }
}

impl StagingPool {
    /// A pool of at most `max_bytes` (but at least one chunk) in chunks of `chunk` bytes;
    /// `setting` names where the target raises the limit (`TcpConfig::max_staging_bytes`),
    /// for the hint of its refusals.
    pub fn new(chunk: usize, max_bytes: usize, setting: &'static str) -> StagingPool {
        StagingPool {
            shared: Arc::new(Shared {
                chunk,
                max_bytes,
                max_chunks: (max_bytes / chunk.max(1)).max(1),
                setting,
                state: Mutex::new(State::default()),
                freed: Condvar::new(),
                returned: Notify::new(),
                allocated: AtomicUsize::new(0),
                to_peers: AtomicU64::new(0),
                from_peers: AtomicU64::new(0),
            }),
        }
    }

    /// The size of one chunk.
    pub fn chunk(&self) -> usize {
        self.shared.chunk
    }

    /// What the pool has done.
    pub fn stats(&self) -> StagingStats {
        let s = &self.shared;
        StagingStats {
            chunks_held: s.state.lock().held,
            chunks_allocated: s.allocated.load(Ordering::Relaxed),
            bytes_to_peers: s.to_peers.load(Ordering::Relaxed),
            bytes_from_peers: s.from_peers.load(Ordering::Relaxed),
        }
    }

    /// Counts `n` bytes copied out of a device region for a peer's READ.
    pub fn add_bytes_to_peers(&self, n: u64) {
        self.shared.to_peers.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts `n` bytes copied into a device region from a peer's WRITE.
    pub fn add_bytes_from_peers(&self, n: u64) {
        self.shared.from_peers.fetch_add(n, Ordering::Relaxed);
    }

    /// `N` chunks at once for a copy from or to `memory`'s device, waiting at most `wait`
    /// (in line behind earlier requests) for them: else the pool's [`refusal`], at once
    /// when the pool can never hold `N`. An error allocating a chunk is returned as the
    /// backend reported it.
    pub async fn take<const N: usize>(
        &self,
        memory: &AnyMemory,
        wait: Duration,
    ) -> Result<[Lease; N]> {
        let s = &*self.shared;
        let deadline = tokio::time::Instant::now().checked_add(wait);
        let mut w = Waiter {
            pool: s,
            ticket: None,
        };
        loop {
            // Registered before looking, so that a return after the look wakes this task.
            let mut returned = std::pin::pin!(s.returned.notified());
            returned.as_mut().enable();
            {
                let mut st = s.state.lock();
                if N > s.max_chunks {
                    return Err(s.refusal(&st, N));
                }
                if s.claim(&mut st, &mut w, N) {
                    break;
                }
            }
            let timed_out = match deadline {
                Some(d) => tokio::time::timeout_at(d, returned).await.is_err(),
                None => {
                    returned.await;
                    false
                }
            };
            if timed_out {
                let mut st = s.state.lock();
                if s.claim(&mut st, &mut w, N) {
                    break;
                }
                return Err(s.refusal(&st, N));
            }
        }
        drop(w);
        self.fill(memory)
    }

    /// [`StagingPool::take`] for a thread outside any runtime: blocks it while it waits.
    pub fn take_blocking<const N: usize>(
        &self,
        memory: &AnyMemory,
        wait: Duration,
    ) -> Result<[Lease; N]> {
        let s = &*self.shared;
        let until = Instant::now().checked_add(wait);
        let mut w = Waiter {
            pool: s,
            ticket: None,
        };
        let mut st = s.state.lock();
        if N > s.max_chunks {
            return Err(s.refusal(&st, N));
        }
        while !s.claim(&mut st, &mut w, N) {
            let timed_out = match until {
                Some(until) => s.freed.wait_until(&mut st, until).timed_out(),
                None => {
                    s.freed.wait(&mut st);
                    false
                }
            };
            if timed_out {
                if s.claim(&mut st, &mut w, N) {
                    break;
                }
                return Err(s.refusal(&st, N));
            }
        }
        // The lock before the waiter: its drop takes it (on the returns above too, which
        // drop `st` first, as declared later).
        drop(st);
        drop(w);
        self.fill(memory)
    }

    /// Leases for `N` chunks claimed: free chunks, one pinned for `memory`'s device first,
    /// else new ones.
    fn fill<const N: usize>(&self, memory: &AnyMemory) -> Result<[Lease; N]> {
        let s = &self.shared;
        // From here each lease owns one chunk of the count: dropping it (on an error too)
        // gives that back.
        let mut leases: [Lease; N] = std::array::from_fn(|_| Lease {
            buf: None,
            pool: s.clone(),
        });
        let device = memory.device();
        {
            let mut st = s.state.lock();
            for lease in &mut leases {
                let at = st
                    .free
                    .iter()
                    .position(|b| b.pinned_for() == Some(device))
                    .or_else(|| st.free.len().checked_sub(1));
                lease.buf = at.map(|i| st.free.swap_remove(i));
            }
        }
        for lease in leases.iter_mut().filter(|l| l.buf.is_none()) {
            lease.buf = Some(match memory.pinned_host() {
                Some(pinned) => ChunkBuf::Pinned {
                    buf: pinned.alloc(s.chunk)?,
                    device,
                },
                None => ChunkBuf::Plain(vec![0u8; s.chunk].into_boxed_slice()),
            });
            s.allocated.fetch_add(1, Ordering::Relaxed);
        }
        Ok(leases)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use hmc_core::{DeviceKind, MemSpan, MemSpanMut};

    use super::*;

    const CHUNK: usize = 1024;
    const SETTING: &str = "TestConfig::max_staging_bytes";
    const SHORT: Duration = Duration::from_millis(20);
    const LONG: Duration = Duration::from_secs(30);

    /// Host memory, or a pretend device whose pinned host allocator may fail.
    #[derive(Clone)]
    struct Fake {
        device: Device,
        pinned: Option<Arc<Pinned>>,
    }

    #[derive(Default)]
    struct Pinned {
        allocs: AtomicUsize,
        fail: AtomicBool,
    }

    struct Buf(Box<[u8]>);

    impl DeviceBuffer for Buf {
        fn region(&self) -> Region {
            Region {
                device: Device::HOST,
                addr: self.0.as_ptr() as u64,
                len: self.0.len(),
            }
        }
    }

    impl Memory for Fake {
        type Buffer = Buf;
        fn device(&self) -> Device {
            self.device
        }
        fn alloc(&self, len: usize) -> Result<Buf> {
            if let Some(p) = &self.pinned {
                if p.fail.load(Ordering::Relaxed) {
                    return Err(Error::Unsupported("no pinned memory left".into()));
                }
                p.allocs.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Buf(vec![0; len].into_boxed_slice()))
        }
        fn copy(&self, _: &mut MemSpanMut<'_>, _: &MemSpan<'_>) -> Result<()> {
            unreachable!("the pool copies nothing")
        }
        fn pinned_host(&self) -> Option<AnyMemory> {
            let pinned = self.pinned.clone()?;
            Some(AnyMemory::new(Fake {
                device: Device::HOST,
                pinned: Some(pinned),
            }))
        }
    }

    fn host() -> AnyMemory {
        AnyMemory::new(Fake {
            device: Device::HOST,
            pinned: None,
        })
    }

    fn device(ordinal: u32, pinned: &Arc<Pinned>) -> AnyMemory {
        AnyMemory::new(Fake {
            device: Device::new(DeviceKind::CUDA, ordinal),
            pinned: Some(pinned.clone()),
        })
    }

    fn pool(chunks: usize) -> StagingPool {
        StagingPool::new(CHUNK, chunks * CHUNK, SETTING)
    }

    #[tokio::test]
    async fn a_take_leases_whole_chunks_that_return_when_dropped_and_are_reused() {
        let pool = pool(4);
        let [mut a, b] = pool.take(&host(), SHORT).await.unwrap();
        assert_eq!((a.size(), pool.chunk()), (CHUNK, CHUNK));
        assert_ne!(a.region(0, CHUNK).addr, b.region(0, CHUNK).addr);
        a.bytes_mut(CHUNK).fill(7);
        assert!(a.bytes(CHUNK).iter().all(|&x| x == 7));
        let s = pool.stats();
        assert_eq!((s.chunks_held, s.chunks_allocated), (2, 2), "{s:?}");
        drop(a);
        assert_eq!(pool.stats().chunks_held, 1);
        drop(b);
        let [c] = pool.take_blocking(&host(), Duration::ZERO).unwrap();
        let s = pool.stats();
        assert_eq!((s.chunks_held, s.chunks_allocated), (1, 2), "reused: {s:?}");
        drop(c);
        assert_eq!(pool.stats().chunks_held, 0);
        pool.add_bytes_to_peers(5);
        pool.add_bytes_from_peers(7);
        let s = pool.stats();
        assert_eq!((s.bytes_to_peers, s.bytes_from_peers), (5, 7), "{s:?}");
    }

    #[test]
    #[should_panic(expected = "pass the end")]
    fn a_lease_gives_no_bytes_past_its_chunk() {
        let [a] = pool(1).take_blocking(&host(), Duration::ZERO).unwrap();
        let _ = a.bytes(CHUNK + 1);
    }

    #[tokio::test]
    async fn the_pool_holds_no_more_than_its_bound_and_its_refusal_names_the_limit() {
        let pool = pool(3);
        let two: [Lease; 2] = pool.take(&host(), SHORT).await.unwrap();
        let err = pool
            .take::<2>(&host(), SHORT)
            .await
            .err()
            .expect("one chunk is left, the request takes two");
        let Error::LimitExceeded {
            limit, value, max, ..
        } = &err
        else {
            panic!("{err:?}")
        };
        assert_eq!(
            (*limit, *value, *max),
            (LIMIT, 4 * CHUNK as u64, 3 * CHUNK as u64)
        );
        assert_eq!(*limit, "max_staging_bytes");
        assert!(err.to_string().contains(SETTING), "{err}");
        // The blocking way is refused alike, and the one chunk left still serves.
        let err = pool.take_blocking::<2>(&host(), SHORT).err().unwrap();
        assert!(
            matches!(err, Error::LimitExceeded { limit: LIMIT, .. }),
            "{err}"
        );
        let [one] = pool.take(&host(), SHORT).await.unwrap();
        let s = pool.stats();
        assert_eq!((s.chunks_held, s.chunks_allocated), (3, 3), "{s:?}");
        drop((two, one));
        assert_eq!(pool.stats().chunks_held, 0);
    }

    #[tokio::test]
    async fn more_chunks_than_the_pool_ever_holds_are_refused_at_once() {
        let pool = pool(1);
        let started = Instant::now();
        let err = pool.take::<2>(&host(), LONG).await.err().unwrap();
        assert!(
            matches!(err, Error::LimitExceeded { limit: LIMIT, .. }),
            "{err}"
        );
        let err = pool.take_blocking::<2>(&host(), LONG).err().unwrap();
        assert!(
            matches!(err, Error::LimitExceeded { limit: LIMIT, .. }),
            "{err}"
        );
        assert!(started.elapsed() < LONG / 2);
        // A bound under one chunk still holds one.
        let small = StagingPool::new(CHUNK, CHUNK / 2, SETTING);
        let [_one] = small.take_blocking(&host(), Duration::ZERO).unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_async_waiter_is_woken_by_a_return() {
        let pool = pool(2);
        let held: [Lease; 2] = pool.take(&host(), SHORT).await.unwrap();
        let waiter = tokio::spawn({
            let pool = pool.clone();
            async move {
                let started = Instant::now();
                let got = pool.take::<2>(&host(), LONG).await.map(|_| ());
                (got, started.elapsed())
            }
        });
        tokio::time::sleep(SHORT).await;
        assert!(!waiter.is_finished(), "no chunk is free yet");
        let [a, b] = held;
        drop(a);
        tokio::time::sleep(SHORT).await;
        assert!(!waiter.is_finished(), "it takes two at once");
        drop(b);
        let (got, waited) = waiter.await.unwrap();
        got.unwrap();
        assert!(waited < LONG / 2, "woken by the return, not the timeout");
        assert_eq!(pool.stats().chunks_held, 0);
    }

    #[test]
    fn a_blocking_waiter_times_out_and_one_is_woken_by_a_return() {
        let pool = pool(1);
        let [held] = pool.take_blocking(&host(), Duration::ZERO).unwrap();
        let started = Instant::now();
        let err = pool
            .take_blocking::<1>(&host(), Duration::from_millis(100))
            .err()
            .expect("the one chunk is held");
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(100) && waited < LONG / 2,
            "{waited:?}"
        );
        let Error::LimitExceeded { value, max, .. } = err else {
            panic!("{err:?}")
        };
        assert_eq!((value, max), (2 * CHUNK as u64, CHUNK as u64));
        assert_eq!(pool.stats().chunks_held, 1);

        let waiter = std::thread::spawn({
            let pool = pool.clone();
            move || {
                let started = Instant::now();
                let got = pool.take_blocking::<1>(&host(), LONG).map(|_| ());
                (got, started.elapsed())
            }
        });
        std::thread::sleep(SHORT);
        drop(held);
        let (got, waited) = waiter.join().unwrap();
        got.unwrap();
        assert!(waited < LONG / 2, "woken by the return, not the timeout");
        assert_eq!(pool.stats().chunks_held, 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiters_are_served_in_order_and_a_dropped_one_leaves_the_line() {
        let pool = pool(2);
        let held: [Lease; 2] = pool.take(&host(), SHORT).await.unwrap();
        // First in line: wants both chunks, then is dropped while it waits.
        let first = tokio::spawn({
            let pool = pool.clone();
            async move { pool.take::<2>(&host(), LONG).await.map(|_| ()) }
        });
        tokio::time::sleep(SHORT).await;
        // Second: one chunk, on a thread.
        let (tx, rx) = std::sync::mpsc::channel();
        let second = std::thread::spawn({
            let pool = pool.clone();
            move || {
                let got = pool.take_blocking::<1>(&host(), LONG);
                tx.send(()).unwrap();
                got.map(|_| ())
            }
        });
        std::thread::sleep(SHORT);
        let [a, b] = held;
        drop(a);
        // One chunk is free, but the first in line wants two: the second waits its turn.
        assert!(
            rx.recv_timeout(SHORT * 5).is_err(),
            "served before the first"
        );
        first.abort();
        assert!(first.await.unwrap_err().is_cancelled());
        // With the first gone from the line, the second takes the free chunk.
        rx.recv_timeout(LONG).expect("served once the first left");
        second.join().unwrap().unwrap();
        drop(b);
        assert_eq!(pool.stats().chunks_held, 0);
    }

    #[tokio::test]
    async fn chunks_are_pinned_for_their_device_and_a_failed_allocation_holds_none() {
        let pinned = Arc::new(Pinned::default());
        let (gpu0, gpu1) = (device(0, &pinned), device(1, &pinned));
        let pool = pool(4);
        let [a] = pool.take(&gpu0, SHORT).await.unwrap();
        let [b] = pool.take(&host(), SHORT).await.unwrap();
        assert_eq!(
            pinned.allocs.load(Ordering::Relaxed),
            1,
            "host memory takes plain chunks"
        );
        let pinned_addr = a.region(0, 1).addr;
        drop((b, a));
        // The chunk pinned for device 0 serves it again, though a plain one is free too.
        let [a] = pool.take(&gpu0, SHORT).await.unwrap();
        assert_eq!(a.region(0, 1).addr, pinned_addr);
        // Another device takes a free chunk before allocating one.
        let [b] = pool.take(&gpu1, SHORT).await.unwrap();
        assert_eq!(pool.stats().chunks_allocated, 2);
        pinned.fail.store(true, Ordering::Relaxed);
        let err = pool.take::<2>(&gpu1, SHORT).await.err().unwrap();
        assert!(matches!(err, Error::Unsupported(_)), "{err}");
        let err = pool.take_blocking::<1>(&gpu1, SHORT).err().unwrap();
        assert!(matches!(err, Error::Unsupported(_)), "{err}");
        assert_eq!(
            pool.stats().chunks_held,
            2,
            "the failed requests hold nothing"
        );
        drop((a, b));
        assert_eq!(pool.stats().chunks_held, 0);
    }
}
