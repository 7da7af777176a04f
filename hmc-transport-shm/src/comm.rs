//! `ShmCommunicator`: the initiator side (endpoints, the lease cache, chunked
//! `process_vm_*` copies) and the `Communicator` implementation.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use hmc_core::{
    Access, AnyMemory, CommCapabilities, Communicator, Deadline, Error, IpcDescriptor,
    LocalRegistration, MemoryKinds, Notification, Op, PeerAddr, Region, RemoteRegion, Result,
    TransferDesc, TransportId, check_bounds,
};
use hmc_transport_kit::key_token::{KeyToken, random_token};
use parking_lot::{Mutex, RwLock};
use tokio::sync::oneshot;

use crate::chunk::{self, Chunk};
use crate::cma::{self, PeerCred};
use crate::control::Page;
use crate::device::{Devices, IpcLease};
use crate::key::ShmRemoteKey;
use crate::mapped::{self, FdReader, Mapping, SharedAlloc};
use crate::page_copy;
use crate::target::{RegEntry, Target};
use crate::wire::{self, KEY_LEN, Msg, Refusal, TOKEN_LEN};
use crate::{SHM_TRANSPORT, ShmConfig};

/// A lease the target granted: its whole registration, at `addr` in the target process.
pub(crate) struct Lease {
    id: u64,
    addr: u64,
    len: u64,
    access: Access,
    /// The registration mapped into this process (shared memory from the target's
    /// `alloc_registered`): copies are a `memcpy` there instead of `process_vm_*`.
    map: Option<Arc<Mapping>>,
    /// The registration is device memory: its IPC descriptor and the mappings opened from
    /// it, closed when the lease is revoked or the side channel closes.
    pub(crate) ipc: Option<IpcLease>,
    /// False once revoked (or the side channel closed). Copies hold the read lock for one
    /// chunk; revocation takes the write lock, so it returns after the chunk in progress.
    pub(crate) valid: Arc<RwLock<bool>>,
}

type KeyId = (u64, [u8; TOKEN_LEN]);

enum Reply {
    Lease(Arc<Lease>),
    Done,
    Refused(Refusal, u64, String),
}

/// The leases of one batch, one per distinct key.
struct Leases(Vec<(KeyId, Arc<Lease>)>);

impl Leases {
    /// The lease of `key` (every key of the batch was leased).
    fn of(&self, key: KeyId) -> &Arc<Lease> {
        let at = self.0.iter().position(|(k, _)| *k == key);
        &self.0[at.expect("leased above")].1
    }
}

/// A descriptor's lease, checked, and the device backend that copies it (none: host).
struct Leased<'l> {
    lease: &'l Arc<Lease>,
    engine: Option<AnyMemory>,
}

#[derive(Default)]
pub(crate) struct Cache {
    pub(crate) by_key: HashMap<KeyId, Arc<Lease>>,
    pub(crate) by_id: HashMap<u64, Arc<Lease>>,
}

/// A request awaiting its answer: the key a `Grant` asked for, and where the answer goes.
type Pending = (Option<KeyId>, oneshot::Sender<Reply>);

/// One side-channel connection, shared by the endpoint handles and its reader thread.
pub(crate) struct EpShared {
    id: u64,
    peer: PeerAddr,
    cred: PeerCred,
    writer: Mutex<UnixStream>,
    pending: Mutex<HashMap<u64, Pending>>,
    pub(crate) cache: Mutex<Cache>,
    dead: AtomicBool,
    next_req: AtomicU64,
    /// Shared memory of the target mapped here, by registration id (until `Forget`).
    maps: Mutex<HashMap<u64, Arc<Mapping>>>,
    /// Why cross-memory attach to the peer is refused, when it is (found by the probe at
    /// connect): then only the target's shared memory can be reached.
    cma_refused: Option<String>,
    /// IPC handles of the peer's device memory opened so far.
    pub(crate) ipc_opens: AtomicU64,
    /// Why this side could not open the peer's IPC handle, the first time it could not.
    pub(crate) ipc_refused: Mutex<Option<String>>,
}

impl EpShared {
    /// Why a lease a transfer holds is no longer valid: the peer went, or revoked it.
    fn lease_lost(&self) -> Error {
        if self.dead.load(Ordering::Acquire) {
            self.gone()
        } else {
            Error::InvalidKey("the region was deregistered or rekeyed during the transfer".into())
        }
    }

    fn gone(&self) -> Error {
        Error::peer(
            &self.peer,
            format!(
                "the side channel to pid {} closed (the peer closed or exited)",
                self.cred.pid
            ),
        )
    }

    /// The reader thread: routes answers, serves `Revoke`, and on end of stream fails
    /// everything pending and invalidates every lease.
    fn read_loop(self: Arc<Self>, reader: UnixStream) {
        let mut reader = FdReader::new(reader);
        while let Ok(Some(body)) = wire::read_frame(&mut reader, wire::MAX_FRAME) {
            let Ok(msg) = Msg::decode(&body) else { break };
            let (req, reply) = match msg {
                Msg::Granted {
                    req,
                    lease,
                    addr,
                    len,
                    access,
                    map,
                    ipc,
                } => {
                    let key = self.pending.lock().get(&req).and_then(|p| p.0);
                    let map = match self.mapping(&mut reader, key, map, len) {
                        Ok(m) => m,
                        Err(why) => {
                            tracing::warn!(
                                pid = self.cred.pid,
                                why,
                                "unusable shared memory from the target; closing the side channel"
                            );
                            break;
                        }
                    };
                    let l = Arc::new(Lease {
                        id: lease,
                        addr,
                        len,
                        access,
                        map,
                        ipc: ipc.map(IpcLease::new),
                        valid: Arc::new(RwLock::new(true)),
                    });
                    // Cached here, before any later `Revoke` on the wire is read.
                    let mut c = self.cache.lock();
                    c.by_id.insert(lease, l.clone());
                    if let Some(key) = key {
                        c.by_key.insert(key, l.clone());
                    }
                    (req, Reply::Lease(l))
                }
                Msg::Ok { req } => (req, Reply::Done),
                Msg::Refused {
                    req,
                    why,
                    limit,
                    text,
                } => (req, Reply::Refused(why, limit, text)),
                Msg::Revoke { leases } => {
                    for id in &leases {
                        let l = {
                            let mut c = self.cache.lock();
                            c.by_key.retain(|_, l| l.id != *id);
                            c.by_id.remove(id)
                        };
                        if let Some(l) = l {
                            l.invalidate();
                        }
                    }
                    if wire::write_msg(&mut *self.writer.lock(), &Msg::Released { leases }).is_err()
                    {
                        break;
                    }
                    continue;
                }
                Msg::Forget { regs } => {
                    let mut maps = self.maps.lock();
                    regs.iter().for_each(|r| {
                        maps.remove(r);
                    });
                    continue;
                }
                _ => break,
            };
            if let Some((_, tx)) = self.pending.lock().remove(&req) {
                let _ = tx.send(reply);
            }
        }
        self.dead.store(true, Ordering::Release);
        self.pending.lock().clear();
        let leases: Vec<Arc<Lease>> = {
            let mut c = self.cache.lock();
            c.by_key.clear();
            c.by_id.drain().map(|(_, l)| l).collect()
        };
        leases.iter().for_each(|l| l.invalidate());
        self.maps.lock().clear();
        // Only now may the target consider our leases released.
        reader.shutdown();
    }

    /// The mapping a `Granted` refers to: none, the memfd that came with it (mapped and
    /// checked here), or one mapped earlier. `Err` names what is wrong with it.
    fn mapping(
        &self,
        reader: &mut FdReader,
        key: Option<KeyId>,
        map: u8,
        len: u64,
    ) -> std::result::Result<Option<Arc<Mapping>>, &'static str> {
        let Some((reg, _)) = key else {
            // An answer nobody waits for any more: take its descriptor out of the way.
            if map == wire::MAP_FD {
                reader.take_fd();
            }
            return Ok(None);
        };
        match map {
            wire::MAP_FD => {
                let fd = reader
                    .take_fd()
                    .ok_or("a Granted announced a memfd but none came")?;
                let m = Arc::new(mapped::map_granted(fd, len)?);
                self.maps.lock().insert(reg, m.clone());
                Ok(Some(m))
            }
            wire::MAP_KNOWN => {
                let m = self.maps.lock().get(&reg).cloned();
                let m = m.ok_or("a Granted names a mapping never sent")?;
                if (m.len() as u64) < len {
                    return Err("a Granted is longer than the mapping sent for it");
                }
                Ok(Some(m))
            }
            _ => Ok(None),
        }
    }

    /// Sends a request and waits for its answer by `deadline`.
    /// One lease per distinct key of `batch`, from the cache or a grant round trip.
    async fn leases_for(
        &self,
        batch: &[TransferDesc<'_, ShmCommunicator>],
        op: Op,
        need: Access,
        deadline: Deadline,
    ) -> Result<Leases> {
        let mut leases = Leases(Vec::new());
        for d in batch {
            if leases.0.iter().any(|(k, _)| *k == d.remote.key) {
                continue;
            }
            let cached = self.cache.lock().by_key.get(&d.remote.key).cloned();
            let lease = match cached.filter(|l| *l.valid.read() && l.access.allows(need)) {
                Some(l) => l,
                None => {
                    let (id, token) = d.remote.key;
                    let (offset, len) = (d.remote_offset, d.len as u64);
                    let grant = |req| Msg::Grant {
                        req,
                        id,
                        token,
                        op,
                        offset,
                        len,
                    };
                    match self.request(Some(d.remote.key), deadline, grant).await? {
                        Reply::Lease(l) => l,
                        Reply::Refused(why, limit, text) => {
                            return Err(wire::refused(&self.peer, why, limit, text, offset, len));
                        }
                        Reply::Done => return Err(Error::Protocol("Ok answering Grant".into())),
                    }
                }
            };
            leases.0.push((d.remote.key, lease));
        }
        Ok(leases)
    }

    async fn request(
        &self,
        key: Option<KeyId>,
        deadline: Deadline,
        make: impl FnOnce(u64) -> Msg,
    ) -> Result<Reply> {
        if self.dead.load(Ordering::Acquire) {
            return Err(self.gone());
        }
        let req = self.next_req.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().insert(req, (key, tx));
        struct Forget<'a>(&'a EpShared, u64);
        impl Drop for Forget<'_> {
            fn drop(&mut self) {
                self.0.pending.lock().remove(&self.1);
            }
        }
        let _forget = Forget(self, req);
        if wire::write_msg(&mut *self.writer.lock(), &make(req)).is_err() {
            return Err(self.gone());
        }
        let started = Instant::now();
        match tokio::time::timeout_at(deadline.instant().into(), rx).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(_)) => Err(self.gone()),
            Err(_) => Err(Error::DeadlineExceeded {
                during: "waiting for the target's answer on the side channel",
                elapsed: started.elapsed(),
            }),
        }
    }
}

impl Lease {
    /// Ends the lease: waits for the chunk in progress under it (which holds the read
    /// lock), then closes the IPC mappings opened under it.
    fn invalidate(&self) {
        *self.valid.write() = false;
        if let Some(ipc) = &self.ipc {
            ipc.close();
        }
    }
}

/// The user's handle on a connection; the last clone's drop closes it.
pub(crate) struct EpHandle {
    pub(crate) shared: Arc<EpShared>,
}

impl Drop for EpHandle {
    fn drop(&mut self) {
        let _ = self.shared.writer.lock().shutdown(std::net::Shutdown::Both);
    }
}

/// A connection to one peer. Cheap to clone.
#[derive(Clone)]
pub struct ShmEndpoint {
    pub(crate) inner: Arc<EpHandle>,
}

impl std::fmt::Debug for ShmEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.inner.shared;
        f.debug_struct("ShmEndpoint")
            .field("peer", &s.peer)
            .field("pid", &s.cred.pid)
            .finish_non_exhaustive()
    }
}

impl ShmEndpoint {
    /// The peer's address.
    pub fn peer(&self) -> &PeerAddr {
        &self.inner.shared.peer
    }

    /// The peer's process id, from `SO_PEERCRED`.
    pub fn peer_pid(&self) -> i32 {
        self.inner.shared.cred.pid
    }

    /// Regions of the peer's shared memory mapped into this process now.
    pub fn mapped_regions(&self) -> usize {
        self.inner.shared.maps.lock().len()
    }

    /// False when the kernel refuses cross-memory attach to the peer (found at connect):
    /// then only regions the peer allocated with `alloc_registered` are reachable.
    pub fn cross_memory_attach(&self) -> bool {
        self.inner.shared.cma_refused.is_none()
    }

    /// Leases cached on this endpoint now.
    pub fn cached_leases(&self) -> usize {
        self.inner.shared.cache.lock().by_id.len()
    }
}

/// Local memory registered with a [`ShmCommunicator`]; deregistered (its leases revoked,
/// waiting up to `revoke_timeout` for peers) when dropped.
pub struct ShmRegistration {
    pub(crate) entry: Arc<RegEntry>,
    target: Arc<Target>,
    /// Memory this transport allocated (`alloc_registered`): unmapped after `drop` has
    /// revoked every lease on it (fields drop after `Drop::drop`).
    _alloc: Option<Mapping>,
    /// The backend of device memory registered by buffer: the local side's copy engine.
    memory: Option<AnyMemory>,
}

impl std::fmt::Debug for ShmRegistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmRegistration")
            .field("id", &self.entry.id)
            .field("region", &self.entry.region)
            .field("access", &self.entry.access)
            .finish_non_exhaustive()
    }
}

impl ShmRegistration {
    /// The control page of memory this transport allocated.
    fn control(&self) -> Option<&Page> {
        self._alloc.as_ref().and_then(Mapping::control)
    }

    #[cfg(test)]
    pub(crate) fn entry_addr(&self) -> u64 {
        self.entry.region.addr
    }
}

impl LocalRegistration for ShmRegistration {
    fn region(&self) -> Region {
        self.entry.region
    }
    fn access(&self) -> Access {
        self.entry.access
    }
}

impl Drop for ShmRegistration {
    fn drop(&mut self) {
        self.target.regs.remove(self.entry.id);
        let entry = &self.entry;
        let page = self.control();
        self.target.revoke(entry, || {
            entry.live.store(false, Ordering::Release);
            page.inspect(|p| p.set_current(None));
        });
        let until = Instant::now() + self.target.config.revoke_timeout;
        if page.is_some_and(|p| !p.wait_idle(until)) {
            tracing::warn!(
                registration = entry.id,
                "a copy outlived revoke_timeout; unmapping"
            );
        }
        self.target.forget(entry);
        // `alloc`, if any, is unmapped when the fields drop, after this.
    }
}

/// A [`Communicator`] over cross-memory attach. Share it with `Arc`; dropping it closes it.
pub struct ShmCommunicator {
    target: Arc<Target>,
    addr: PeerAddr,
    endpoints: Mutex<Vec<Weak<EpShared>>>,
    next_endpoint: AtomicU64,
    /// Memory backends that open peers' device memory and copy with it.
    pub(crate) devices: Devices,
    /// Threads for cross-memory-attach copies (`ShmConfig::copy_threads`).
    copies: crate::pool::CopyPool,
}

impl std::fmt::Debug for ShmCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmCommunicator")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl ShmCommunicator {
    /// Listens on `config.path` (or a fresh random path in the system temp dir) and starts
    /// serving peers. Must be called inside a tokio runtime (the socket is bound through
    /// `hmc-transport-kit`, and transfers wait with tokio timers).
    pub fn bind(config: ShmConfig) -> Result<ShmCommunicator> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::InvalidArgument(
                "ShmCommunicator::bind must be called inside a tokio runtime".into(),
            ));
        }
        if config.allow_any_ptracer {
            // SAFETY: prctl with PR_SET_PTRACER takes plain integer arguments.
            let rc =
                unsafe { libc::prctl(libc::PR_SET_PTRACER, libc::PR_SET_PTRACER_ANY, 0, 0, 0) };
            if rc != 0 {
                tracing::debug!(error = %std::io::Error::last_os_error(), "PR_SET_PTRACER_ANY refused (no Yama?)");
            }
        }
        let path = match &config.path {
            Some(p) => p.clone(),
            None => {
                let t = random_token()?;
                let name: String = t[..8].iter().map(|b| format!("{b:02x}")).collect();
                crate::socket_files::default_path(&std::env::temp_dir(), &name)
            }
        };
        let listener = hmc_transport_kit::bind_unix_listener(&path)?
            .into_std()
            .and_then(|l| l.set_nonblocking(false).map(|()| l))
            .map_err(|e| {
                Error::io(
                    format!("preparing the listener unix://{}", path.display()),
                    e,
                )
            })?;
        // Only this user (and root) may dial the side channel.
        if let Err(e) = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)) {
            tracing::debug!(error = %e, "could not restrict the socket file's permissions");
        }
        let copy_threads = config.copy_threads;
        let target = Target::start(config, path.clone(), listener)
            .map_err(|e| Error::io("starting the side-channel thread", e))?;
        Ok(ShmCommunicator {
            target,
            addr: PeerAddr::Unix(path),
            endpoints: Mutex::new(Vec::new()),
            next_endpoint: AtomicU64::new(1),
            devices: Devices::default(),
            copies: crate::pool::CopyPool::new(copy_threads),
        })
    }

    /// Leases this communicator granted to peers and that are not yet released.
    pub fn outstanding_leases(&self) -> usize {
        self.target.lease_count()
    }

    /// A registration of `region`, served by the target from now on.
    pub(crate) fn new_registration(
        &self,
        region: Region,
        access: Access,
        shared: Option<SharedAlloc>,
        ipc: Option<IpcDescriptor>,
        memory: Option<AnyMemory>,
    ) -> Result<ShmRegistration> {
        let (memfd, alloc) = shared.map(|s| (s.fd, s.map)).unzip();
        let entry = self.target.regs.insert(|id| {
            Ok(RegEntry {
                id,
                region,
                access,
                token: KeyToken::new()?,
                live: AtomicBool::new(true),
                memfd,
                ipc,
            })
        })?;
        Ok(ShmRegistration {
            entry,
            target: self.target.clone(),
            _alloc: alloc,
            memory,
        })
    }

    /// Checks each descriptor against its lease: the target's answer is authoritative (a
    /// descriptor's length could be forged), and so is the memory kind its grant names;
    /// picks the device backend for each.
    fn check_leases<'l>(
        &self,
        ep: &EpShared,
        batch: &[TransferDesc<'_, Self>],
        leases: &'l Leases,
        op: Op,
        need: Access,
    ) -> Result<Vec<Leased<'l>>> {
        let mut leased = Vec::with_capacity(batch.len());
        for d in batch {
            let l = leases.of(d.remote.key);
            check_bounds("remote region", d.remote_offset, d.len as u64, l.len)?;
            let remote = l.ipc.as_ref().map(IpcLease::kind);
            let granted = remote.unwrap_or(hmc_core::DeviceKind::HOST);
            if granted != d.remote.device.kind {
                return Err(Error::Protocol(format!(
                    "the peer granted {granted} memory for a region exported as {}",
                    d.remote.device
                )));
            }
            let local = &d.local.entry.region;
            let engine = self
                .devices
                .engine(local.device, d.local.memory.as_ref(), remote)?;
            if l.map.is_none()
                && l.ipc.is_none()
                && let Some(why) = &ep.cma_refused
            {
                return Err(Error::Unavailable {
                    what: "this region of the peer".into(),
                    reason: why.clone(),
                    hint: "or have the peer allocate the region with \
                           Communicator::alloc_registered (shared memory, which needs no \
                           cross-memory attach)"
                        .into(),
                });
            }
            if !l.access.allows(need) {
                return Err(Error::AccessDenied(format!(
                    "the target grants {:?} but {op:?} needs {need:?}",
                    l.access
                )));
            }
            leased.push(Leased { lease: l, engine });
        }
        Ok(leased)
    }

    /// Moves a checked batch: host-to-host pieces by cross-memory attach in rounds of up
    /// to a chunk over the copy threads (the deadline and the yield checked between
    /// rounds; each group holds its lease), mapped and device pieces a chunk at a time.
    async fn copy_leased(
        &self,
        ep: &EpShared,
        op: Op,
        batch: &[TransferDesc<'_, Self>],
        leased: &[Leased<'_>],
        deadline: Deadline,
        started: Instant,
    ) -> Result<()> {
        let expired = || Error::DeadlineExceeded {
            during: "transfer",
            elapsed: started.elapsed(),
        };
        let chunk = self.target.config.chunk_len.max(1);
        let mut since_yield = 0usize;
        let pool = &self.copies;
        let mut round = chunk::Round::new((chunk / pool.threads()).max(64 << 10));
        let run = |r: &mut chunk::Round| {
            // SAFETY: the pieces' local ranges were bounds-checked against registrations the
            // batch borrows, which the caller keeps allocated; remote ones against the lease.
            unsafe { r.run(pool, op, &ep.peer, ep.cred, || ep.lease_lost()) }
        };
        for (d, Leased { lease: l, engine }) in batch.iter().zip(leased) {
            let attach = engine.is_none() && l.map.is_none() && l.ipc.is_none();
            if !attach {
                since_yield += run(&mut round)?;
            }
            let step = if attach { round.piece_cap() } else { chunk };
            let mut off = 0usize;
            while off < d.len {
                if deadline.is_expired() {
                    return Err(expired());
                }
                let n = step.min(d.len - off);
                let local = d.local.entry.region.slice(d.local_offset + off, n)?;
                let at = d.remote_offset + off as u64;
                off += n;
                if attach {
                    round.push(&l.valid, local.addr as *mut u8, l.addr + at, n);
                    if round.bytes() >= chunk {
                        since_yield += run(&mut round)?;
                    }
                } else {
                    let peer = chunk::Peer {
                        addr: &ep.peer,
                        cred: ep.cred,
                        base: l.addr,
                        len: l.len,
                        map: l.map.as_deref(),
                        ipc: l.ipc.as_ref(),
                        opens: &ep.ipc_opens,
                        refused: &ep.ipc_refused,
                    };
                    let valid = l.valid.read();
                    if !*valid {
                        return Err(ep.lease_lost());
                    }
                    let c = Chunk {
                        op,
                        local,
                        at,
                        engine: engine.as_ref(),
                    };
                    // SAFETY: the local range lies inside a registration the batch borrows
                    // (bounds checked above), which the caller keeps allocated; the lease
                    // cannot be revoked while `valid` is held for reading.
                    unsafe { chunk::copy(&c, &peer) }?;
                    since_yield += n;
                }
                if since_yield >= chunk {
                    since_yield = 0;
                    tokio::task::yield_now().await;
                }
            }
        }
        run(&mut round)?;
        Ok(())
    }

    pub(crate) fn check_open(&self) -> Result<()> {
        if self.target.closed.load(Ordering::Acquire) {
            return Err(Error::Closed(format!(
                "the ShmCommunicator at {} was closed",
                self.addr
            )));
        }
        Ok(())
    }

    fn own(&self, reg: &ShmRegistration, what: &str) -> Result<()> {
        if Arc::ptr_eq(&reg.target, &self.target) {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "{what}: the registration belongs to another ShmCommunicator; use the one that \
                 registered it"
            )))
        }
    }
}

impl Drop for ShmCommunicator {
    fn drop(&mut self) {
        self.close();
    }
}

impl Communicator for ShmCommunicator {
    type Endpoint = ShmEndpoint;
    type Registration = ShmRegistration;
    type RemoteKey = ShmRemoteKey;

    fn transport(&self) -> TransportId {
        SHM_TRANSPORT
    }

    /// `register` takes host memory only (device memory is registered by buffer with
    /// [`ShmCommunicator::register_device`]); peers' regions may be host memory or device
    /// memory of a kind this communicator has a backend for ([`ShmCommunicator::add_memory`],
    /// `register_device`). Zero-copy (the kernel copies once, between the two address
    /// spaces, or the initiator once into memory both map, or the device's engine once
    /// between an IPC mapping and local memory); notifications up to `max_notify_len`;
    /// `rekey` revokes keys; `alloc_registered` gives shared memory.
    fn capabilities(&self) -> CommCapabilities {
        let mut caps = CommCapabilities::new(SHM_TRANSPORT);
        caps.max_notification_len = self.target.config.max_notify_len;
        caps.zero_copy = true;
        caps.rekey = true;
        // `import` parses the key; `rekey` waits only for leases and copies in progress.
        caps.key_ops_wait = false;
        caps.alloc_registered = true;
        // Device memory of any kind whose backend exports it by vendor IPC
        // (`register_memory`), copied by that backend; refused at registration otherwise.
        caps.local_memory = MemoryKinds::Any;
        caps.device_memory = hmc_core::DeviceMemoryPath::Direct;
        let mut remote = vec![hmc_core::DeviceKind::HOST];
        remote.extend(self.devices.kinds());
        remote.dedup();
        caps.remote_memory = MemoryKinds::Only(remote);
        caps
    }

    fn address(&self) -> PeerAddr {
        self.addr.clone()
    }

    async fn connect(&self, peer: &PeerAddr, deadline: Deadline) -> Result<ShmEndpoint> {
        self.check_open()?;
        let PeerAddr::Unix(path) = peer else {
            return Err(Error::InvalidArgument(format!(
                "the shm transport dials unix:///path addresses, not {peer}"
            )));
        };
        let started = Instant::now();
        let (path, me, p) = (path.clone(), self.addr.to_string(), peer.clone());
        let dial = tokio::task::spawn_blocking(move || cma::dial(path, me, p, deadline));
        let (s, cred, cma_refused) =
            match tokio::time::timeout_at(deadline.instant().into(), dial).await {
                Err(_) => {
                    return Err(Error::DeadlineExceeded {
                        during: "connect",
                        elapsed: started.elapsed(),
                    });
                }
                Ok(Err(e)) => return Err(Error::io("the connect task", std::io::Error::other(e))),
                Ok(Ok(r)) => r?,
            };
        let reader = s
            .try_clone()
            .map_err(|e| Error::io("cloning the side channel", e))?;
        let shared = Arc::new(EpShared {
            id: self.next_endpoint.fetch_add(1, Ordering::Relaxed),
            peer: peer.clone(),
            cred,
            writer: Mutex::new(s),
            pending: Mutex::new(HashMap::new()),
            cache: Mutex::new(Cache::default()),
            dead: AtomicBool::new(false),
            next_req: AtomicU64::new(1),
            maps: Mutex::new(HashMap::new()),
            cma_refused,
            ipc_opens: AtomicU64::new(0),
            ipc_refused: Mutex::new(None),
        });
        let s2 = shared.clone();
        std::thread::Builder::new()
            .name("hmc-shm-ep".into())
            .spawn(move || s2.read_loop(reader))
            .map_err(|e| Error::io("starting the endpoint's reader thread", e))?;
        {
            let mut eps = self.endpoints.lock();
            eps.retain(|w| w.strong_count() > 0);
            eps.push(Arc::downgrade(&shared));
        }
        Ok(ShmEndpoint {
            inner: Arc::new(EpHandle { shared }),
        })
    }

    unsafe fn register(&self, region: Region, access: Access) -> Result<ShmRegistration> {
        self.check_open()?;
        if !region.device.is_host() {
            return Err(crate::device::needs_backend(region));
        }
        self.new_registration(region, access, None, None, None)
    }

    /// Device memory by vendor IPC of the allocation holding it
    /// ([`ShmCommunicator::register_span`]); host memory as `register`.
    unsafe fn register_memory(
        &self,
        region: Region,
        access: Access,
        memory: &AnyMemory,
    ) -> Result<ShmRegistration> {
        // SAFETY: forwarded contract.
        unsafe { self.register_span(region, access, memory) }
    }

    /// Shared memory (a sealed memfd) registered for `access`: a peer maps it at its first
    /// grant and copies with `memcpy`, with no system call per transfer and no need for
    /// cross-memory attach (the way to reach this process where the kernel refuses it).
    fn alloc_registered(&self, len: usize, access: Access) -> Result<Option<ShmRegistration>> {
        self.check_open()?;
        let alloc = SharedAlloc::new(len)
            .map_err(|e| Error::io("allocating shared memory (memfd_create)", e))?;
        let region = Region {
            device: hmc_core::Device::HOST,
            addr: alloc.map.ptr() as u64,
            len,
        };
        // No key works until the registration's own token is made current below.
        alloc.control().init(len, access, &[0; TOKEN_LEN]);
        let reg = self.new_registration(region, access, Some(alloc), None, None)?;
        let page = reg.control().expect("the page was just written");
        page.set_current(Some(&reg.entry.token.get()));
        Ok(Some(reg))
    }

    /// Draws a new token and revokes every lease granted under the old one (and copies a
    /// control page announced), waiting up to `revoke_timeout` for peers to stop copying.
    /// Fails when one did not: the old key is dead, but do not reuse the memory.
    fn rekey(&self, reg: &ShmRegistration) -> Result<bool> {
        self.own(reg, "rekey")?;
        let token = random_token()?;
        let page = reg.control();
        let started = Instant::now();
        let given_up = self.target.revoke(&reg.entry, || {
            reg.entry.token.replace(token);
            page.inspect(|p| p.set_current(Some(&token)));
        });
        let until = started + self.target.config.revoke_timeout;
        if given_up > 0 || page.is_some_and(|p| !p.wait_idle(until)) {
            return Err(Error::DeadlineExceeded {
                during: "rekey: waiting for peers to stop copying under the old key \
                         (ShmConfig::revoke_timeout); the memory may still be written, drop \
                         the registration instead of reusing it",
                elapsed: started.elapsed(),
            });
        }
        Ok(true)
    }

    fn export(&self, reg: &ShmRegistration) -> Result<RemoteRegion> {
        self.own(reg, "export")?;
        let mut key = Vec::with_capacity(KEY_LEN);
        key.extend_from_slice(&reg.entry.id.to_be_bytes());
        key.extend_from_slice(&reg.entry.token.get());
        Ok(RemoteRegion {
            transport: SHM_TRANSPORT,
            region: reg.entry.region,
            access: reg.entry.access,
            key,
        })
    }

    fn import(&self, ep: &ShmEndpoint, remote: &RemoteRegion) -> Result<ShmRemoteKey> {
        remote.check_transport(SHM_TRANSPORT)?;
        if remote.key.len() != KEY_LEN {
            return Err(Error::InvalidKey(format!(
                "an shm remote key is {KEY_LEN} bytes, this one is {}",
                remote.key.len()
            )));
        }
        // A device region is imported whatever backends this side has now: a transfer
        // with it needs one of its kind (added by registering such memory), and says so.
        let id = u64::from_be_bytes(remote.key[..8].try_into().expect("8 bytes"));
        let token: [u8; TOKEN_LEN] = remote.key[8..].try_into().expect("16 bytes");
        Ok(ShmRemoteKey {
            endpoint: ep.inner.shared.id,
            device: remote.region.device,
            key: (id, token),
            len: remote.region.len as u64,
            access: remote.access,
        })
    }

    fn view(
        &self,
        ep: &ShmEndpoint,
        remote: &ShmRemoteKey,
        offset: u64,
        len: usize,
        access: Access,
    ) -> Result<Option<hmc_core::RemoteView>> {
        self.check_open()?;
        let ep = &*ep.inner.shared;
        crate::key::view(ep.id, &ep.maps.lock(), remote, offset, len, access)
    }

    async fn transfer(
        &self,
        ep: &ShmEndpoint,
        op: Op,
        batch: &[TransferDesc<'_, Self>],
        deadline: Deadline,
    ) -> Result<()> {
        self.check_open()?;
        let ep = &*ep.inner.shared;
        let need = Access::required_by(op);
        for d in batch {
            crate::key::check_desc(ep.id, op, d)?;
            self.devices.check_reachable(d.remote.device)?;
        }
        if batch.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        let expired = || Error::DeadlineExceeded {
            during: "transfer",
            elapsed: started.elapsed(),
        };
        if deadline.is_expired() {
            return Err(expired());
        }
        if ep.dead.load(Ordering::Acquire) {
            return Err(ep.gone());
        }
        // The peer's shared memory with a control page: keys checked there, no lease.
        let wants = batch.iter().map(|d| page_copy::Want {
            key: d.remote.key,
            local: d.local.entry.region,
            local_offset: d.local_offset,
            remote_offset: d.remote_offset,
            len: d.len,
        });
        let spans = page_copy::spans(&ep.maps.lock(), need, wants);
        if let Some(spans) = spans {
            let gone = || ep.dead.load(Ordering::Acquire).then(|| ep.gone());
            let chunk = self.target.config.chunk_len;
            // SAFETY: local ranges were bounds-checked above against registrations the
            // batch borrows; remote ones by `page_copy::spans` against the page.
            return unsafe { page_copy::copy(op, &spans, chunk, deadline, gone) }.await;
        }
        let leases = ep.leases_for(batch, op, need, deadline).await?;
        let leased = self.check_leases(ep, batch, &leases, op, need)?;
        self.copy_leased(ep, op, batch, &leased, deadline, started)
            .await
    }

    async fn notify(
        &self,
        ep: &ShmEndpoint,
        tag: u64,
        msg: &[u8],
        deadline: Deadline,
    ) -> Result<()> {
        self.check_open()?;
        let ep = &*ep.inner.shared;
        let max = self.target.config.max_notify_len;
        if msg.len() > max {
            return Err(Error::LimitExceeded {
                limit: "max_notify_len",
                value: msg.len() as u64,
                max: max as u64,
                hint: "raise ShmConfig::max_notify_len on both peers, or move the bytes with a transfer".into(),
            });
        }
        let make = |req| Msg::Notify {
            req,
            tag,
            msg: msg.to_vec(),
        };
        match ep.request(None, deadline, make).await? {
            Reply::Done => Ok(()),
            Reply::Refused(why, limit, text) => Err(wire::refused(
                &ep.peer,
                why,
                limit,
                text,
                0,
                msg.len() as u64,
            )),
            Reply::Lease(_) => Err(Error::Protocol("Granted answering Notify".into())),
        }
    }

    async fn recv_notification(&self, deadline: Deadline) -> Result<Notification> {
        let started = Instant::now();
        loop {
            let ready = self.target.notes_ready.notified();
            {
                let mut n = self.target.notes.lock();
                if let Some(note) = n.queue.pop_front() {
                    return Ok(note);
                }
                if n.closed {
                    return Err(Error::Closed(format!(
                        "the ShmCommunicator at {} was closed",
                        self.addr
                    )));
                }
            }
            if tokio::time::timeout_at(deadline.instant().into(), ready)
                .await
                .is_err()
            {
                return Err(Error::DeadlineExceeded {
                    during: "waiting for a notification",
                    elapsed: started.elapsed(),
                });
            }
        }
    }

    fn close(&self) {
        self.target.close();
        for ep in self.endpoints.lock().drain(..) {
            if let Some(ep) = ep.upgrade() {
                let _ = ep.writer.lock().shutdown(std::net::Shutdown::Both);
            }
        }
    }
}
