//! Pooled registered host buffers for HMC_BUFFER payloads: power-of-two size classes,
//! registered once and reused, with a bounded total (`max_pool_bytes`).
//!
//! A new buffer is first asked of the transport ([`Communicator::alloc_registered`]):
//! memory it allocates itself may be faster (UCX maps it straight into peers on shared
//! memory). When the transport has none, the pool allocates host memory and registers it.
//! Either way, every byte access goes through the registration's region, bounds-checked.
//!
//! Only the free lists are locked, and only to push or pop; a buffer in use is owned by its
//! [`PooledBuffer`], so transfers on different buffers never wait for each other. A buffer
//! whose state is unknown (a peer may still write it) is *discarded* instead of returned:
//! dropping its registration revokes the peer's key before the memory is freed.
//!
//! A *key-scoped* pool ([`BufferPool::key_scoped`], the client's) also makes sure a key a
//! peer got for one use of a buffer reaches nothing of a later use: every buffer that was
//! exported is rekeyed ([`Communicator::rekey`]) when it returns. Where the transport
//! cannot rekey (`Ok(false)`), the buffer is *quarantined*: it remembers the peer it was
//! last lent to and is lent again only to that peer; a call for another peer gets a fresh
//! registration (an idle foreign buffer of its class is deregistered to make room, which
//! kills its keys). See `docs/design.md`, "HMC_BUFFER key scope".

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use bytes::Bytes;
use hmc_backend_cpu::HostMemory;
use hmc_core::{
    Access, Communicator, ConnBuffer, Error, LocalRegistration, Region, RegisteredBuffer,
    RemoteRegion, Result,
};
use parking_lot::Mutex;

/// Limits of a [`BufferPool`]. Every limit has a default and a name used in errors.
#[derive(Clone, Copy, Debug)]
pub struct PoolConfig {
    /// Smallest buffer (`pool_min_len`, default 64 KiB); smaller requests get this size.
    pub min_len: usize,
    /// Bytes registered at once, in use and idle together (`max_pool_bytes`, default
    /// 1 GiB). When a new buffer would pass it, the caller falls back (client) or answers
    /// DATA_PLANE (server).
    pub max_total_bytes: usize,
    /// Idle bytes kept registered for reuse (`max_pool_idle_bytes`, default 256 MiB); a
    /// buffer returned beyond it is deregistered and freed.
    pub max_idle_bytes: usize,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            min_len: 64 << 10,
            max_total_bytes: 1 << 30,
            max_idle_bytes: 256 << 20,
        }
    }
}

/// Counters of a pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes registered now (in use plus idle).
    pub registered_bytes: usize,
    /// Bytes handed out and not yet returned.
    pub in_use_bytes: usize,
    /// Registrations made since the pool was created.
    pub registrations: u64,
    /// Of `registrations`, those of memory the transport allocated itself
    /// ([`Communicator::alloc_registered`]).
    pub transport_allocations: u64,
    /// Registrations released since the pool was created.
    pub deregistrations: u64,
    /// Key-scoped pools: keys revoked by [`Communicator::rekey`] (a buffer's call ended).
    pub rekeys: u64,
    /// Key-scoped pools: idle buffers deregistered because they were last lent to another
    /// peer and the transport cannot rekey (quarantine).
    pub quarantine_drops: u64,
}

impl PoolStats {
    /// The sums of two pools' counters.
    pub fn plus(self, o: PoolStats) -> PoolStats {
        PoolStats {
            registered_bytes: self.registered_bytes + o.registered_bytes,
            in_use_bytes: self.in_use_bytes + o.in_use_bytes,
            registrations: self.registrations + o.registrations,
            transport_allocations: self.transport_allocations + o.transport_allocations,
            deregistrations: self.deregistrations + o.deregistrations,
            rekeys: self.rekeys + o.rekeys,
            quarantine_drops: self.quarantine_drops + o.quarantine_drops,
        }
    }
}

/// Who may hold live keys of a buffer: [`CLEAN`] (nobody: never exported, or rekeyed), a
/// peer's tag ([`peer_tag`]), or [`MANY`] (several peers: the buffer is not reused unless
/// rekeyed).
pub(crate) type PeerMark = Arc<AtomicU64>;
/// No live keys.
pub(crate) const CLEAN: u64 = 0;
/// Keys live at more than one peer.
pub(crate) const MANY: u64 = u64::MAX;

/// The tag of a peer for quarantine: a 64-bit hash of its address, never [`CLEAN`] or
/// [`MANY`].
pub(crate) fn peer_tag(addr: &hmc_core::PeerAddr) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    addr.to_string().hash(&mut h);
    match h.finish() {
        CLEAN | MANY => 1,
        t => t,
    }
}

/// Records that keys of a buffer went to `peer`.
pub(crate) fn mark_lent(mark: &AtomicU64, peer: u64) {
    let _ = mark.fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| match cur {
        CLEAN => Some(peer),
        c if c == peer || c == MANY => None,
        _ => Some(MANY),
    });
}

/// The memory behind one pooled buffer.
enum Held<C: Communicator> {
    /// Host memory the pool allocated, registered with [`Communicator::register`];
    /// deregistered before it is freed.
    Host(RegisteredBuffer<HostMemory, C>),
    /// Host memory the transport allocated and owns until the registration drops.
    Transport(C::Registration),
}

/// One registered buffer of a size class: its memory and the class size it counts for.
struct Slot<C: Communicator> {
    held: Held<C>,
    /// The class size, as counted in the pool's byte totals.
    size: usize,
    /// Key-scoped pools: who may hold live keys of this buffer.
    mark: PeerMark,
    /// Key-scoped pools: exported since it was registered or last rekeyed.
    exported: std::sync::atomic::AtomicBool,
}

impl<C: Communicator> Slot<C> {
    fn registration(&self) -> &C::Registration {
        match &self.held {
            Held::Host(b) => b.registration(),
            Held::Transport(r) => r,
        }
    }

    /// The buffer's host memory: the registration's region, first `size` bytes.
    fn region(&self) -> Region {
        let r = self.registration().region();
        Region {
            len: r.len.min(self.size),
            ..r
        }
    }
}

struct Inner<C: Communicator> {
    memory: Arc<HostMemory>,
    comm: Arc<C>,
    access: Access,
    config: PoolConfig,
    /// Rekey (or quarantine) buffers on return; see the module doc.
    key_scoped: bool,
    /// The transport's `rekey` may wait on peers ([`hmc_core::CommCapabilities::key_ops_wait`]):
    /// run it through [`blocking`]. Otherwise in place, without handing the worker's other
    /// tasks to another thread for a call that returns at once.
    rekey_waits: bool,
    free: Mutex<Vec<Vec<Slot<C>>>>,
    idle_bytes: AtomicUsize,
    registered_bytes: AtomicUsize,
    in_use_bytes: AtomicUsize,
    registrations: AtomicU64,
    transport_allocations: AtomicU64,
    deregistrations: AtomicU64,
    rekeys: AtomicU64,
    quarantine_drops: AtomicU64,
}

/// Runs `f`, which may block briefly (a registration, a deregistration that waits for
/// peers to confirm a revocation, a key import with a round trip): on a multi-thread tokio
/// worker through `block_in_place`, so other tasks of that worker move elsewhere
/// meanwhile; elsewhere directly.
pub(crate) fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

impl<C: Communicator> Inner<C> {
    /// `size` bytes lent to a call.
    fn lend(&self, size: usize) {
        self.in_use_bytes.fetch_add(size, Ordering::AcqRel);
        crate::metrics::pool_in_use(true, size);
    }

    /// `size` bytes back from a call.
    fn take_back(&self, size: usize) {
        self.in_use_bytes.fetch_sub(size, Ordering::AcqRel);
        crate::metrics::pool_in_use(false, size);
    }

    fn release(&self, buf: Slot<C>) {
        let len = buf.size;
        blocking(|| drop(buf));
        self.registered_bytes.fetch_sub(len, Ordering::AcqRel);
        crate::metrics::pool_registered(false, len);
        self.deregistrations.fetch_add(1, Ordering::Relaxed);
    }

    /// A new registered buffer of `size` bytes: transport-allocated memory when the
    /// transport offers it, else host memory allocated here and registered.
    fn register(&self, size: usize) -> Result<Slot<C>> {
        match self.comm.alloc_registered(size, self.access) {
            Ok(Some(reg)) if reg.region().len >= size => {
                self.transport_allocations.fetch_add(1, Ordering::Relaxed);
                return Ok(Slot {
                    held: Held::Transport(reg),
                    size,
                    mark: PeerMark::default(),
                    exported: Default::default(),
                });
            }
            Ok(Some(reg)) => tracing::warn!(
                asked = size,
                got = reg.region().len,
                "the transport allocated less memory than asked; registering host memory instead"
            ),
            Ok(None) => {}
            Err(e) => tracing::debug!(
                error = %e,
                size,
                "the transport could not allocate registered memory; registering host memory instead"
            ),
        }
        let b = RegisteredBuffer::new(self.memory.clone(), self.comm.clone(), size, self.access)?;
        Ok(Slot {
            held: Held::Host(b),
            size,
            mark: PeerMark::default(),
            exported: Default::default(),
        })
    }
}

impl<C: Communicator> Drop for Inner<C> {
    fn drop(&mut self) {
        // Lent buffers keep the pool alive: what is registered now is idle, and goes with
        // the free lists.
        crate::metrics::pool_registered(false, *self.registered_bytes.get_mut());
    }
}

/// Registered host buffers by size class. Cheap to clone (shared).
pub struct BufferPool<C: Communicator>(Arc<Inner<C>>);

impl<C: Communicator> Clone for BufferPool<C> {
    fn clone(&self) -> Self {
        BufferPool(self.0.clone())
    }
}

impl<C: Communicator> BufferPool<C> {
    /// An empty pool of host buffers registered with `comm` for `access`.
    pub fn new(comm: Arc<C>, access: Access, config: PoolConfig) -> Self {
        Self::build(comm, access, config, false)
    }

    /// An empty pool whose buffers' keys are scoped to one use: a buffer that was exported
    /// is rekeyed when it returns, or, where the transport cannot rekey, lent again only to
    /// the peer it was last lent to (`BufferPool::acquire_for`).
    pub fn key_scoped(comm: Arc<C>, access: Access, config: PoolConfig) -> Self {
        Self::build(comm, access, config, true)
    }

    fn build(comm: Arc<C>, access: Access, config: PoolConfig, key_scoped: bool) -> Self {
        let config = PoolConfig {
            min_len: config.min_len.max(4096).next_power_of_two(),
            ..config
        };
        BufferPool(Arc::new(Inner {
            memory: Arc::new(HostMemory::new()),
            rekey_waits: comm.capabilities().key_ops_wait,
            comm,
            access,
            config,
            key_scoped,
            free: Mutex::new(Vec::new()),
            idle_bytes: AtomicUsize::new(0),
            registered_bytes: AtomicUsize::new(0),
            in_use_bytes: AtomicUsize::new(0),
            registrations: AtomicU64::new(0),
            transport_allocations: AtomicU64::new(0),
            deregistrations: AtomicU64::new(0),
            rekeys: AtomicU64::new(0),
            quarantine_drops: AtomicU64::new(0),
        }))
    }

    /// The communicator buffers are registered with.
    pub fn comm(&self) -> &Arc<C> {
        &self.0.comm
    }

    /// The size class holding `len` bytes: (class index, buffer size).
    fn class_of(&self, len: usize) -> Option<(usize, usize)> {
        let size = len.max(self.0.config.min_len).checked_next_power_of_two()?;
        let class = (size.trailing_zeros() - self.0.config.min_len.trailing_zeros()) as usize;
        Some((class, size))
    }

    /// A buffer of at least `len` bytes: a pooled one of its class, or a new registration
    /// when none is idle and `max_pool_bytes` allows. In a key-scoped pool: a buffer no
    /// peer holds live keys of.
    pub fn acquire(&self, len: usize) -> Result<PooledBuffer<C>> {
        self.acquire_for(len, None)
    }

    /// [`BufferPool::acquire`] for a buffer to be lent to the peer tagged `peer`: in a
    /// key-scoped pool, an idle buffer whose keys may still be live at another peer is not
    /// lent; if one of the class is idle it is deregistered (its keys die) and a fresh one
    /// registered in its place, so the pool's bounds hold.
    pub(crate) fn acquire_for(&self, len: usize, peer: Option<u64>) -> Result<PooledBuffer<C>> {
        let too_large = || Error::LimitExceeded {
            limit: "max_pool_bytes",
            value: len as u64,
            max: self.0.config.max_total_bytes as u64,
            hint: "raise PoolConfig::max_total_bytes or send less".into(),
        };
        let (class, size) = self.class_of(len).ok_or_else(too_large)?;
        let (reused, foreign) = {
            let mut free = self.0.free.lock();
            match free.get_mut(class) {
                None => (None, None),
                Some(list) if !self.0.key_scoped => (list.pop(), None),
                Some(list) => {
                    let fits = |s: &Slot<C>| {
                        let m = s.mark.load(Ordering::Acquire);
                        m == CLEAN || (m != MANY && Some(m) == peer)
                    };
                    match list.iter().rposition(fits) {
                        Some(i) => (Some(list.swap_remove(i)), None),
                        None => (None, list.pop()),
                    }
                }
            }
        };
        if let Some(f) = foreign {
            // Quarantine: its keys may be live at another peer. Deregistering kills them
            // and makes room for a fresh registration of the same class.
            self.0.idle_bytes.fetch_sub(f.size, Ordering::AcqRel);
            self.0.quarantine_drops.fetch_add(1, Ordering::Relaxed);
            self.0.release(f);
        }
        let buf = match reused {
            Some(b) => {
                self.0.idle_bytes.fetch_sub(size, Ordering::AcqRel);
                b
            }
            None => {
                let max = self.0.config.max_total_bytes;
                let reserved = self.0.registered_bytes.fetch_update(
                    Ordering::AcqRel,
                    Ordering::Acquire,
                    |cur| cur.checked_add(size).filter(|n| *n <= max),
                );
                if reserved.is_err() {
                    return Err(Error::LimitExceeded {
                        limit: "max_pool_bytes",
                        value: (self.0.registered_bytes.load(Ordering::Acquire) + size) as u64,
                        max: max as u64,
                        hint: "raise PoolConfig::max_total_bytes; calls fall back to TCP_STREAM meanwhile".into(),
                    });
                }
                match blocking(|| self.0.register(size)) {
                    Ok(b) => {
                        self.0.registrations.fetch_add(1, Ordering::Relaxed);
                        crate::metrics::pool_registered(true, size);
                        b
                    }
                    Err(e) => {
                        self.0.registered_bytes.fetch_sub(size, Ordering::AcqRel);
                        return Err(e);
                    }
                }
            }
        };
        self.0.lend(size);
        Ok(PooledBuffer {
            buf: Some(buf),
            class,
            pool: self.0.clone(),
        })
    }

    /// Counters.
    pub fn stats(&self) -> PoolStats {
        PoolStats {
            registered_bytes: self.0.registered_bytes.load(Ordering::Acquire),
            in_use_bytes: self.0.in_use_bytes.load(Ordering::Acquire),
            registrations: self.0.registrations.load(Ordering::Relaxed),
            transport_allocations: self.0.transport_allocations.load(Ordering::Relaxed),
            deregistrations: self.0.deregistrations.load(Ordering::Relaxed),
            rekeys: self.0.rekeys.load(Ordering::Relaxed),
            quarantine_drops: self.0.quarantine_drops.load(Ordering::Relaxed),
        }
    }

    /// Deregisters every idle buffer.
    pub fn trim(&self) {
        let all: Vec<_> = std::mem::take(&mut *self.0.free.lock());
        for class in all {
            for b in class {
                self.0.idle_bytes.fetch_sub(b.size, Ordering::AcqRel);
                self.0.release(b);
            }
        }
    }
}

/// A registered buffer lent by a [`BufferPool`]; returns to it on drop.
pub struct PooledBuffer<C: Communicator> {
    buf: Option<Slot<C>>,
    class: usize,
    pool: Arc<Inner<C>>,
}

impl<C: Communicator> PooledBuffer<C> {
    fn inner(&self) -> &Slot<C> {
        self.buf.as_ref().expect("present until drop")
    }

    /// The transport registration, for [`hmc_core::TransferDesc::local`].
    pub fn registration(&self) -> &C::Registration {
        self.inner().registration()
    }

    /// Where the buffer's host memory is (`len()` bytes).
    pub fn region(&self) -> Region {
        self.inner().region()
    }

    /// The portable descriptor a peer imports to reach this buffer.
    pub fn export(&self) -> RemoteRegion {
        self.inner().exported.store(true, Ordering::Release);
        // The pool registered this buffer with this communicator, so its export is never
        // refused as another communicator's (hmc-core v2 made `export` fallible for that).
        self.pool
            .comm
            .export(self.registration())
            .expect("a pooled buffer is exported by the communicator that registered it")
    }

    /// Who may hold live keys of this buffer (key-scoped pools; see [`mark_lent`]).
    pub(crate) fn mark(&self) -> &PeerMark {
        &self.inner().mark
    }

    /// Revokes every key exported for this buffer so far ([`Communicator::rekey`]), if it
    /// was exported since its last rekey. `Ok(true)`: no key of it works any more (also
    /// when none was exported); `Ok(false)`: the transport cannot rekey.
    pub(crate) fn revoke_keys(&self) -> Result<bool> {
        let slot = self.inner();
        if !slot.exported.load(Ordering::Acquire) {
            return Ok(true);
        }
        let rekey = || self.pool.comm.rekey(slot.registration());
        let done = if self.pool.rekey_waits {
            blocking(rekey)
        } else {
            rekey()
        }?;
        if done {
            slot.exported.store(false, Ordering::Release);
            slot.mark.store(CLEAN, Ordering::Release);
            self.pool.rekeys.fetch_add(1, Ordering::Relaxed);
        }
        Ok(done)
    }

    /// True when the transport allocated this buffer's memory itself
    /// ([`Communicator::alloc_registered`]); false for host memory the pool registered.
    pub fn is_transport_allocated(&self) -> bool {
        matches!(self.inner().held, Held::Transport(_))
    }

    /// Its length (the size class, at least what was asked for).
    pub fn len(&self) -> usize {
        self.region().len
    }

    /// True for a zero-length buffer (never: classes start at 4 KiB).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies `src` to the start of the buffer.
    pub fn fill(&self, src: &[u8]) -> Result<()> {
        hmc_core::check_bounds("pooled buffer", 0, src.len() as u64, self.len() as u64)?;
        let r = self.region();
        #[allow(unsafe_code)]
        // SAFETY: `r` is host memory (a HostMemory allocation or one the transport made),
        // alive while `self` holds its registration; `src.len()` bytes fit (checked above).
        // `copy` allows `src` to overlap (it may be a view of this very buffer). Concurrent
        // peer transfers race like DMA (the rule of [`ConnBuffer`]); callers fill before
        // lending the buffer.
        unsafe {
            std::ptr::copy(src.as_ptr(), r.addr as *mut u8, src.len());
        }
        Ok(())
    }

    /// The first `len` bytes, read in place.
    ///
    /// The bytes are only meaningful once every transfer into the buffer has completed;
    /// callers hand out views only after that (the DMA rule of [`ConnBuffer`]).
    pub fn as_slice(&self, len: usize) -> Result<&[u8]> {
        hmc_core::check_bounds("pooled buffer", 0, len as u64, self.len() as u64)?;
        let r = self.inner().region();
        #[allow(unsafe_code)]
        // SAFETY: `r` is this buffer's host memory (a HostMemory allocation or one the
        // transport made), alive while `self` holds its registration; `len` is within it
        // (checked above). Peers write it only during transfers the owner awaits
        // before reading, so no write races the returned shared borrow in correct use.
        let s = unsafe { std::slice::from_raw_parts(r.addr as *const u8, len) };
        Ok(s)
    }

    /// Deregisters and frees the buffer instead of returning it: for buffers a peer may
    /// still be writing (a call abandoned mid-transfer).
    pub fn discard(mut self) {
        if let Some(b) = self.buf.take() {
            self.pool.take_back(b.size);
            self.pool.release(b);
        }
    }

    /// The first `len` bytes as [`Bytes`] that keep the buffer until dropped (no copy).
    pub fn into_bytes(self, len: usize) -> Result<Bytes> {
        self.as_slice(len)?;
        Ok(Bytes::from_owner(View { buf: self, len }))
    }
}

impl<C: Communicator> std::fmt::Debug for PooledBuffer<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledBuffer")
            .field("len", &self.buf.as_ref().map(|b| b.size))
            .field(
                "transport_allocated",
                &self
                    .buf
                    .as_ref()
                    .map(|b| matches!(b.held, Held::Transport(_))),
            )
            .field("class", &self.class)
            .finish()
    }
}

impl<C: Communicator> Drop for PooledBuffer<C> {
    fn drop(&mut self) {
        if self.pool.key_scoped && self.buf.is_some() {
            // The use ended: its keys must reach nothing of the next one.
            let keep = match self.revoke_keys() {
                Ok(true) => true,
                // Quarantine: lent again only to the one peer that may hold live keys.
                Ok(false) => self.mark().load(Ordering::Acquire) != MANY,
                Err(e) => {
                    tracing::debug!(error = %e, "rekey failed; deregistering the buffer");
                    false
                }
            };
            if !keep {
                let b = self.buf.take().expect("checked");
                self.pool.take_back(b.size);
                self.pool.release(b);
                return;
            }
        }
        let Some(b) = self.buf.take() else { return };
        let len = b.size;
        self.pool.take_back(len);
        let keep = self
            .pool
            .idle_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                cur.checked_add(len)
                    .filter(|n| *n <= self.pool.config.max_idle_bytes)
            })
            .is_ok();
        if keep {
            let mut free = self.pool.free.lock();
            if free.len() <= self.class {
                free.resize_with(self.class + 1, Vec::new);
            }
            free[self.class].push(b);
        } else {
            self.pool.release(b);
        }
    }
}

/// `Bytes` owner over the first `len` bytes of a pooled buffer.
pub(crate) struct View<C: Communicator> {
    pub(crate) buf: PooledBuffer<C>,
    pub(crate) len: usize,
}

impl<C: Communicator> AsRef<[u8]> for View<C> {
    fn as_ref(&self) -> &[u8] {
        self.buf.as_slice(self.len).unwrap_or(&[])
    }
}

/// Pooled buffers lent to callers as request payloads ([`RequestBuffer::freeze`]), by start
/// address, so that the client data plane finds a payload that already lies in one.
#[derive(Default)]
pub(crate) struct LentBuffers(Mutex<std::collections::HashMap<u64, Lent>>);

/// One lent buffer as the data plane sees it.
#[derive(Clone)]
pub(crate) struct Lent {
    /// What a peer needs to READ the buffer.
    pub(crate) export: RemoteRegion,
    /// The payload's length.
    pub(crate) len: usize,
    /// Set when a call that lent this buffer failed: a server that gave up may still READ
    /// it, so it is discarded (its key revoked), not returned to the pool, when released.
    pub(crate) discard: Arc<std::sync::atomic::AtomicBool>,
    /// The peers the buffer's key went to (quarantine where the transport cannot rekey).
    pub(crate) mark: PeerMark,
}

impl LentBuffers {
    /// The lent buffer whose payload is exactly `payload` (same start, same length).
    pub(crate) fn find(&self, payload: &[u8]) -> Option<Lent> {
        let map = self.0.lock();
        let e = map.get(&(payload.as_ptr() as u64))?;
        (e.len == payload.len()).then(|| e.clone())
    }
}

/// A request payload written in place: a pooled registered buffer from
/// [`ClientDataPlane::request_buffer`](crate::ClientDataPlane::request_buffer).
///
/// Fill it through [`RequestBuffer::as_mut_slice`], then [`RequestBuffer::freeze`] it into
/// the `Bytes` to pass to [`Client::call`](crate::Client::call): an HMC_BUFFER call then
/// lends this very buffer to the server instead of copying the payload into a pooled one
/// (one copy less per call). Keep or clone the `Bytes` as long as you like; the buffer goes
/// back to the pool when the last clone is dropped, or is discarded (deregistered, so the
/// server's key dies) if a call that lent it did not end with an answer. A payload below
/// the data-plane threshold, or a call on a connection without a data plane, travels
/// INLINE or TCP_STREAM from the same bytes.
pub struct RequestBuffer<C: Communicator> {
    buf: PooledBuffer<C>,
    len: usize,
    lent: Arc<LentBuffers>,
}

impl<C: Communicator> RequestBuffer<C> {
    pub(crate) fn new(buf: PooledBuffer<C>, len: usize, lent: Arc<LentBuffers>) -> Self {
        RequestBuffer { buf, len, lent }
    }

    /// The payload length (what was asked of `request_buffer`).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The payload bytes, to fill in place. They start with unspecified contents (a reused
    /// buffer holds an earlier payload).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let r = self.buf.region();
        debug_assert!(r.len >= self.len);
        // SAFETY: the region is live host memory of the pooled buffer we own exclusively
        // (it is neither exported nor lent before `freeze`), at least `len` bytes long.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts_mut(r.addr as *mut u8, self.len)
        }
    }

    /// The filled payload as immutable `Bytes` over the same registered memory (no copy).
    pub fn freeze(self) -> Bytes {
        let addr = self.buf.region().addr;
        let discard = Arc::new(std::sync::atomic::AtomicBool::new(false));
        self.lent.0.lock().insert(
            addr,
            Lent {
                export: self.buf.export(),
                len: self.len,
                discard: discard.clone(),
                mark: self.buf.mark().clone(),
            },
        );
        Bytes::from_owner(LentView {
            buf: Some(self.buf),
            len: self.len,
            addr,
            lent: self.lent,
            discard,
        })
    }
}

impl<C: Communicator> std::fmt::Debug for RequestBuffer<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestBuffer")
            .field("len", &self.len)
            .field("buffer", &self.buf)
            .finish()
    }
}

/// `Bytes` owner of a frozen [`RequestBuffer`]: unlists the buffer, then returns or
/// discards it.
struct LentView<C: Communicator> {
    buf: Option<PooledBuffer<C>>,
    len: usize,
    addr: u64,
    lent: Arc<LentBuffers>,
    discard: Arc<std::sync::atomic::AtomicBool>,
}

impl<C: Communicator> AsRef<[u8]> for LentView<C> {
    fn as_ref(&self) -> &[u8] {
        self.buf
            .as_ref()
            .and_then(|b| b.as_slice(self.len).ok())
            .unwrap_or(&[])
    }
}

impl<C: Communicator> Drop for LentView<C> {
    fn drop(&mut self) {
        {
            let mut map = self.lent.0.lock();
            if map
                .get(&self.addr)
                .is_some_and(|e| Arc::ptr_eq(&e.discard, &self.discard))
            {
                map.remove(&self.addr);
            }
        }
        // Dropping the buffer returns it to the pool; a discarded one is deregistered.
        if let Some(b) = self.buf.take()
            && self.discard.load(Ordering::Acquire)
        {
            b.discard();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn tcp() -> Arc<hmc_transport_tcp::TcpCommunicator> {
        Arc::new(
            hmc_transport_tcp::TcpCommunicator::bind(
                &"tcp://127.0.0.1:0".parse().unwrap(),
                Default::default(),
            )
            .unwrap(),
        )
    }

    #[tokio::test]
    async fn buffers_are_reused_by_class_and_bounded_in_total() {
        let comm = tcp().await;
        let pool = BufferPool::new(
            comm.clone(),
            Access::READ,
            PoolConfig {
                max_total_bytes: 1 << 20,
                ..PoolConfig::default()
            },
        );
        let a = pool.acquire(100_000).unwrap();
        assert_eq!(a.len(), 128 << 10);
        drop(a);
        let b = pool.acquire(70_000).unwrap();
        assert_eq!(pool.stats().registrations, 1, "the idle buffer is reused");
        let big = pool.acquire(1 << 20).unwrap_err();
        assert!(big.to_string().contains("max_pool_bytes"), "{big}");
        b.discard();
        let s = pool.stats();
        assert_eq!(
            (s.registered_bytes, s.in_use_bytes, s.deregistrations),
            (0, 0, 1)
        );
        assert_eq!(comm.registered_bytes(), 0, "released exactly once");
        let c = pool.acquire(5).unwrap();
        assert!(!c.is_transport_allocated(), "TCP keeps the default: None");
        c.fill(b"hello").unwrap();
        let bytes = c.into_bytes(5).unwrap();
        assert_eq!(&bytes[..], b"hello");
        drop(bytes);
        pool.trim();
        assert_eq!(comm.registered_bytes(), 0);
        assert_eq!(pool.stats().registered_bytes, 0);
        assert_eq!(pool.stats().transport_allocations, 0);
    }

    #[rstest::rstest]
    #[case::tcp("tcp")]
    #[case::shared_memory("posix,cma,self")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ucx_buffers_are_transport_allocated_and_bounds_checked(#[case] tls: &str) {
        let comm = Arc::new(
            hmc_transport_ucx::UcxCommunicator::new(hmc_transport_ucx::UcxConfig::with_tls(tls))
                .expect("UCX available"),
        );
        let pool = BufferPool::new(comm.clone(), Access::READ_WRITE, PoolConfig::default());
        let a = pool.acquire(100_000).unwrap();
        assert!(a.is_transport_allocated());
        assert_eq!(a.len(), 128 << 10);
        assert_eq!(a.region(), a.registration().region());
        assert_eq!(a.export().region, a.region());
        let bytes = hmc_core::testing::pattern(3, a.len());
        a.fill(&bytes).unwrap();
        assert_eq!(a.as_slice(a.len()).unwrap(), &bytes[..]);
        let over = a.fill(&vec![0u8; a.len() + 1]).unwrap_err();
        assert!(matches!(over, Error::OutOfBounds { .. }), "{over}");
        assert!(matches!(
            a.as_slice(a.len() + 1),
            Err(Error::OutOfBounds { .. })
        ));
        let view = a.into_bytes(10).unwrap();
        assert_eq!(&view[..], &bytes[..10]);
        drop(view);
        let s = pool.stats();
        assert_eq!((s.registrations, s.transport_allocations), (1, 1));
        pool.trim();
        let s = pool.stats();
        assert_eq!((s.registered_bytes, s.deregistrations), (0, 1));
        assert_eq!(comm.stats().registered, comm.stats().deregistered);
    }
}
