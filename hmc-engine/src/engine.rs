//! The engine: registrations by raw address, connections to peer engines with their
//! region tables, and transfers translated from addresses to (registration, offset).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hmc_core::{
    Access, Communicator, Deadline, Device, DeviceKind, LocalRegistration, PeerAddr, Region,
};
use hmc_rpc::{Client, ClientConfig, Dispatcher, RpcError, RunningServer, Server};
use parking_lot::{Mutex, RwLock};

use crate::config::EngineConfig;
use crate::error::{EngineError, Result, Side};
use crate::meta::{
    EngineInfo, Hello, METHOD_HELLO, METHOD_INFO, METHOD_LOOKUP, METHOD_NOTIFY, METHOD_RETRACT,
    NotifyMsg, Retract, VERSION,
};
use crate::region_map::{Lookup, RegionMap};
use crate::request::{TransferRequest, TransferStatus};

mod blob;
mod directory;
mod membership;
mod mover;
mod notify;
mod notify_queue;
mod owned_mem;
mod post;
mod prepared;
mod rules;
mod staged;
mod table;

use mover::{LocalMem, ResolvedRun};
use notify_queue::NotifyQueue;
pub use post::{PreparedTransfer, Telemetry};
pub use prepared::{BlockDesc, PreparedList};
use rules::{Holder, check_access, sender_name};

/// Where registered memory lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemType {
    /// Host memory.
    Host,
    /// Memory of one device.
    Device {
        /// The device kind.
        kind: DeviceKind,
        /// Its ordinal.
        ordinal: u32,
    },
}

/// A range of memory by address, as HIXL's `MemDesc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemDesc {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub len: usize,
}

/// A registration, for [`Engine::deregister_mem`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MemHandle(u64);

/// The direction of a transfer, seen from the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransferOp {
    /// Remote memory to local memory.
    Read,
    /// Local memory to remote memory.
    Write,
}

/// One element of a transfer, by address on both sides (HIXL's `TransferOpDesc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransferOpDesc {
    /// Address in this engine's registered memory.
    pub local_addr: u64,
    /// Address in the peer's registered memory.
    pub remote_addr: u64,
    /// Bytes to move.
    pub len: usize,
}

/// A notification received from a peer engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notify {
    /// The sending engine's name.
    pub from: String,
    /// The notification's name.
    pub name: String,
    /// Its message.
    pub msg: Vec<u8>,
    /// `Some(why)` on a failure notice: the transfer this notification was attached to
    /// ([`Engine::make_transfer`]) failed, and will not be retried by that post. `None` on
    /// a standalone notification, and on one delivered after its transfer completed.
    pub failed: Option<String>,
}

/// A registered region of this engine.
struct LocalReg<C: Communicator> {
    reg: C::Registration,
    handle: MemHandle,
    /// What it was registered for: peers' ops and this engine's own (a READ writes local
    /// memory, so it needs WRITE here).
    access: Access,
    exported: Vec<u8>,
    /// Device memory the transport serves to peers by staging
    /// ([`hmc_core::DeviceMemoryPath::Staged`]): this engine's own transfers of it go
    /// through its host bounce buffers, like a local-only staged region's.
    staged: Option<Arc<staged::StagedReg>>,
    /// Memory the engine allocated for it on the heap ([`Engine::alloc_mem`] over a
    /// transport without an allocation of its own): declared after `reg`, so freed only
    /// once the registration is gone.
    _owned: Option<owned_mem::OwnedHostMem>,
}

/// What this engine has registered.
struct LocalTable<C: Communicator> {
    map: RegionMap<Arc<LocalReg<C>>>,
    /// Device memory the transport cannot register: moved through host bounce buffers,
    /// never exported to peers (see [`staged`]).
    staged: RegionMap<Arc<staged::StagedReg>>,
    /// Each handle's start address, and whether it is a staged region.
    by_handle: HashMap<MemHandle, (u64, bool)>,
    generation: u64,
    next_handle: u64,
}

/// A peer's region, imported on this engine's endpoint to it.
struct RemoteEntry<C: Communicator> {
    key: C::RemoteKey,
    /// Where it is in the peer's memory.
    region: Region,
    /// What the peer registered it for.
    access: Access,
    encoded: Vec<u8>,
}

/// A peer's table as last fetched.
struct PeerTable<C: Communicator> {
    generation: u64,
    map: RegionMap<Arc<RemoteEntry<C>>>,
}

/// A connected peer engine.
struct Peer<C: Communicator> {
    name: String,
    rpc: Client,
    ep: C::Endpoint,
    instance: u64,
    table: RwLock<PeerTable<C>>,
    /// Serialises table refreshes.
    refreshing: tokio::sync::Mutex<()>,
    /// Set (with the reason) when the peer left the metadata namespace: its transfers in
    /// flight end with [`EngineError::PeerGone`].
    gone: tokio::sync::watch::Sender<Option<String>>,
}

/// State the metadata service's handlers share with the engine.
struct Shared<C: Communicator> {
    comm: Arc<C>,
    /// The most runs in one batch the transport takes (its `max_batch_len`, clamped to
    /// 1..=65,536), read once: a transfer with more runs goes in several batches.
    max_batch: usize,
    config: EngineConfig,
    instance: u64,
    local: RwLock<LocalTable<C>>,
    notifies: Mutex<NotifyQueue>,
    /// Called after a notification is queued ([`Engine::on_notify`]).
    notify_hook: RwLock<Option<notify::NotifyHook>>,
    /// Values published for peers to look up by name ([`Engine::publish`]).
    directory: RwLock<HashMap<String, Vec<u8>>>,
}

struct Inner<C: Communicator> {
    shared: Arc<Shared<C>>,
    /// Host bounce buffers for staged device memory, made on first use.
    stager: tokio::sync::Mutex<Option<staged::EngineStager<C>>>,
    name: String,
    /// Where this engine is registered and peers are found (`hmc_meta`).
    meta: Arc<dyn hmc_meta::MetadataStore>,
    server: RunningServer,
    peers: RwLock<HashMap<String, Arc<Peer<C>>>>,
    /// Peers dropped as gone, until connected again (a reconnect, counted).
    lost: membership::LostPeers,
    runtime: tokio::runtime::Handle,
    finalized: std::sync::atomic::AtomicBool,
    /// The next notification's number (`meta::NotifyId`).
    notify_seq: std::sync::atomic::AtomicU64,
}

/// A one-sided transfer engine over the communicator `C` (see the crate documentation).
/// Cheap to clone; every clone is the same engine.
pub struct Engine<C: Communicator> {
    inner: Arc<Inner<C>>,
}

impl<C: Communicator> Clone for Engine<C> {
    fn clone(&self) -> Self {
        Engine {
            inner: self.inner.clone(),
        }
    }
}

/// This engine's side of a planned piece, held until the transfer ends (deregistering
/// waits for it).
enum HeldLocal<C: Communicator> {
    Reg(Arc<LocalReg<C>>),
    /// Device memory the transport cannot register.
    Staged(Arc<staged::StagedReg>),
}

/// A piece of a planned transfer: one contiguous run on both sides.
struct Piece<C: Communicator> {
    local: HeldLocal<C>,
    local_off: u64,
    remote: Arc<RemoteEntry<C>>,
    remote_off: u64,
    len: u64,
}

impl<C: Communicator> Piece<C> {
    /// Holds `run`'s registrations.
    fn hold(run: ResolvedRun<'_, C>) -> Self {
        Piece {
            local: match run.local {
                LocalMem::Reg(l) => HeldLocal::Reg(l.clone()),
                LocalMem::Staged(st) => HeldLocal::Staged(st.clone()),
            },
            local_off: run.local_off,
            remote: run.remote.clone(),
            remote_off: run.remote_off,
            len: run.len,
        }
    }

    /// The piece as the mover takes it.
    fn run(&self) -> ResolvedRun<'_, C> {
        ResolvedRun {
            local: match &self.local {
                HeldLocal::Reg(l) => LocalMem::Reg(l),
                HeldLocal::Staged(st) => LocalMem::Staged(st),
            },
            local_off: self.local_off,
            remote: &self.remote,
            remote_off: self.remote_off,
            len: self.len,
        }
    }

    /// Whether `next` continues this piece on both sides (and the two merge).
    fn continues_into(&self, next: &ResolvedRun<'_, C>) -> bool {
        let same_local = match (&self.local, next.local) {
            (HeldLocal::Reg(a), LocalMem::Reg(b)) => Arc::ptr_eq(a, b),
            (HeldLocal::Staged(a), LocalMem::Staged(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        same_local
            && Arc::ptr_eq(&self.remote, next.remote)
            && self.local_off + self.len == next.local_off
            && self.remote_off + self.len == next.remote_off
    }
}

/// Parses an engine address: `ip:port`, `tcp://ip:port`, `unix:///path` or `/path`; with
/// `default_port`, a bare IP too.
pub(crate) fn parse_engine_addr(s: &str, default_port: Option<u16>) -> Result<PeerAddr> {
    if s.starts_with("tcp://") || s.starts_with("unix://") {
        return s.parse().map_err(EngineError::Transport);
    }
    if s.starts_with('/') {
        return Ok(PeerAddr::Unix(s.into()));
    }
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(PeerAddr::Tcp(a));
    }
    if let (Some(port), Ok(ip)) = (default_port, s.parse::<std::net::IpAddr>()) {
        return Ok(PeerAddr::Tcp(SocketAddr::new(ip, port)));
    }
    Err(EngineError::InvalidArgument(format!(
        "`{s}` is not an engine address; use IP:PORT, tcp://IP:PORT, unix:///path or /path"
    )))
}

/// The key of a peer in the engine's table: its address when `remote` is one (in a
/// canonical spelling), else the name it is registered under.
fn peer_key(remote: &str) -> String {
    parse_engine_addr(remote, None)
        .map(|a| a.to_string())
        .unwrap_or_else(|_| remote.to_string())
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // A failure leaves zeros: the instance id only tells restarts apart.
    let _ = getrandom::fill(&mut b);
    u64::from_ne_bytes(b)
}

/// The most runs the engine puts in one batch over a transport with `caps`.
fn max_batch_of(caps: &hmc_core::CommCapabilities) -> usize {
    caps.max_batch_len.clamp(1, 65_536)
}

impl<C: Communicator> Engine<C> {
    /// Starts an engine whose metadata service listens at `local` (`IP[:PORT]`,
    /// `tcp://IP:PORT`, or a Unix socket path; port 0 or none picks one) and whose bytes
    /// move over `comm`. Must run inside a tokio runtime.
    pub async fn initialize(comm: Arc<C>, local: &str, config: EngineConfig) -> Result<Self> {
        let addr = parse_engine_addr(local, Some(0))?;
        let shared = Arc::new(Shared {
            max_batch: max_batch_of(&comm.capabilities()),
            comm,
            config: config.clone(),
            instance: random_u64(),
            local: RwLock::new(LocalTable {
                map: RegionMap::default(),
                staged: RegionMap::default(),
                by_handle: HashMap::new(),
                generation: 0,
                next_handle: 1,
            }),
            notifies: Mutex::new(NotifyQueue::default()),
            notify_hook: RwLock::new(None),
            directory: RwLock::new(HashMap::new()),
        });
        let server = Server::new(shared.dispatcher(), shared.server_config())
            .bind(&addr)
            .await
            .map_err(EngineError::Transport)?;
        let address = server.local_addr().to_string();
        let (name, meta) =
            membership::open_store(&config, &address, &shared.store_record()).await?;
        tracing::info!(%name, %address, metadata = %meta.describe(), data_plane = %shared.comm.address(), "engine initialized");
        let events = meta.subscribe();
        let engine = Engine {
            inner: Arc::new(Inner {
                shared,
                stager: tokio::sync::Mutex::new(None),
                name,
                meta,
                server,
                peers: RwLock::new(HashMap::new()),
                lost: Default::default(),
                runtime: tokio::runtime::Handle::current(),
                finalized: false.into(),
                notify_seq: 0.into(),
            }),
        };
        if let Some(events) = events {
            membership::watch_members(Arc::downgrade(&engine.inner), events);
        }
        Ok(engine)
    }

    /// This engine's name: the address peers pass to [`Engine::connect`].
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The communicator that moves the bytes.
    pub fn communicator(&self) -> &Arc<C> {
        &self.inner.shared.comm
    }

    fn check_open(&self) -> Result<()> {
        if self
            .inner
            .finalized
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return Err(EngineError::Finalized);
        }
        Ok(())
    }

    /// Registers `desc` for transfers by this engine and its peers, for `access`:
    /// [`Access::READ`] memory (read-only memory, or memory peers must not change) is only
    /// ever read, by peers' READs and this engine's WRITEs; a peer's WRITE to it fails
    /// `AccessDenied` before a byte moves, and so does this engine's READ into it.
    /// [`Access::READ_WRITE`] is what a buffer that receives data needs.
    ///
    /// Host memory is checked against the process's mappings first: a range that is not
    /// mapped, or is mapped read-only while `access` includes WRITE, is refused here.
    ///
    /// # Safety
    /// `desc` must be memory of `mem_type` that stays allocated until
    /// [`Engine::deregister_mem`] of the returned handle has returned; peers may read (and,
    /// with WRITE access, write) it at any time until then, as a DMA engine would.
    pub unsafe fn register_mem(
        &self,
        desc: MemDesc,
        mem_type: MemType,
        access: Access,
    ) -> Result<MemHandle> {
        self.check_open()?;
        if mem_type == MemType::Host && desc.len > 0 {
            crate::mapping::check_host_range(desc.addr, desc.len, access)?;
        }
        let device = match mem_type {
            MemType::Host => Device::HOST,
            MemType::Device { kind, ordinal } => Device::new(kind, ordinal),
        };
        let region = Region {
            device,
            addr: desc.addr,
            len: desc.len,
        };
        // SAFETY: forwarded contract.
        unsafe { self.add_registered(region, access, None, None) }
    }

    /// Allocates `len` zeroed bytes of host memory and registers them for `access`, like
    /// [`Engine::register_mem`], in memory the engine owns: it is freed by
    /// [`Engine::deregister_mem`] of the returned handle (after transfers using it have
    /// ended), or when the engine goes.
    ///
    /// Where the transport has an allocation of its own (`Communicator::alloc_registered`:
    /// shared memory under `shm` and `auto`), the memory is that: a peer on this host then
    /// reaches it with a plain `memcpy` through its own mapping, instead of cross-memory
    /// attach's system call and page pinning per copy. Elsewhere it is page-aligned heap
    /// memory. Caches a process serves to its peers (a prefill's KV cache) are what this is
    /// for; [`crate::kv::DataDist::allocate_cache`] allocates host caches with it.
    pub fn alloc_mem(&self, len: usize, access: Access) -> Result<(MemHandle, MemDesc)> {
        self.check_open()?;
        if len == 0 {
            return Err(EngineError::InvalidArgument(
                "cannot allocate 0 bytes".into(),
            ));
        }
        let s = &self.inner.shared;
        self.region_room(s.local.read().map.len())?;
        let (region, reg, owned) = match s.comm.alloc_registered(len, access)? {
            Some(reg) => (reg.region(), reg, None),
            None => {
                let mem = owned_mem::OwnedHostMem::zeroed(len)?;
                let region = Region {
                    device: Device::HOST,
                    addr: mem.addr(),
                    len,
                };
                // SAFETY: `mem` is a live allocation of `len` bytes that the table entry
                // owns and frees only after dropping this registration.
                let reg = unsafe { s.comm.register(region, access)? };
                (region, reg, Some(mem))
            }
        };
        let handle = self.add_made(region, access, reg, None, owned)?;
        Ok((
            handle,
            MemDesc {
                addr: region.addr,
                len: region.len,
            },
        ))
    }

    /// Registers `region` with the transport (with its device's backend: `memory`, or
    /// `staged`'s when it is device memory the transport stages) and adds it to the table
    /// peers fetch.
    ///
    /// # Safety
    /// As for [`Engine::register_mem`].
    unsafe fn add_registered(
        &self,
        region: Region,
        access: Access,
        memory: Option<&hmc_core::AnyMemory>,
        staged: Option<Arc<staged::StagedReg>>,
    ) -> Result<MemHandle> {
        let s = &self.inner.shared;
        self.region_room(s.local.read().map.len())?;
        if region.len == 0 {
            return Err(EngineError::InvalidArgument(
                "cannot register 0 bytes".into(),
            ));
        }
        // SAFETY: the caller guarantees the memory stays valid until deregistration, which
        // drops the registration only after transfers using it have ended.
        let reg = unsafe {
            match memory.or_else(|| staged.as_deref().map(staged::StagedReg::memory)) {
                Some(m) => s.comm.register_memory(region, access, m)?,
                None => s.comm.register(region, access)?,
            }
        };
        self.add_made(region, access, reg, staged, None)
    }

    /// Refuses one more registration beside `regions` past `max_regions`.
    fn region_room(&self, regions: usize) -> Result<()> {
        let s = &self.inner.shared;
        if regions >= s.config.max_regions {
            return Err(EngineError::Limit {
                limit: "max_regions",
                value: regions as u64 + 1,
                max: s.config.max_regions as u64,
                hint: "deregister memory first, or register fewer, larger regions (raise EngineConfig::max_regions)",
            });
        }
        Ok(())
    }

    /// Adds a registration made by the transport (of `region`) to the table peers fetch.
    /// `owned` is memory the engine allocated for it, freed after the registration.
    fn add_made(
        &self,
        region: Region,
        access: Access,
        reg: C::Registration,
        staged: Option<Arc<staged::StagedReg>>,
        owned: Option<owned_mem::OwnedHostMem>,
    ) -> Result<MemHandle> {
        let desc = MemDesc {
            addr: region.addr,
            len: region.len,
        };
        let s = &self.inner.shared;
        let mut t = s.local.write();
        self.region_room(t.map.len())?;
        let exported = s.comm.export(&reg)?.encode();
        let handle = MemHandle(t.next_handle);
        let entry = Arc::new(LocalReg {
            reg,
            handle,
            access,
            exported,
            staged,
            _owned: owned,
        });
        if let Err((start, region_len)) = t.map.insert(desc.addr, desc.len as u64, entry) {
            // The registration just made drops (deregisters) here.
            return Err(EngineError::Overlaps {
                addr: desc.addr,
                len: desc.len as u64,
                start,
                region_len,
            });
        }
        t.next_handle += 1;
        t.by_handle.insert(handle, (desc.addr, false));
        t.generation += 1;
        drop(t);
        Ok(handle)
    }

    /// Deregisters memory. Peers can no longer reach it once this returns; a transfer
    /// still running on it is waited for (each has its own deadline), so the caller may
    /// free the memory afterwards.
    pub async fn deregister_mem(&self, handle: MemHandle) -> Result<()> {
        let (exported, staged) = {
            let mut t = self.inner.shared.local.write();
            let (addr, is_staged) = t.by_handle.remove(&handle).ok_or_else(|| {
                EngineError::InvalidArgument(format!("{handle:?} is not registered here"))
            })?;
            if is_staged {
                let e = t.staged.remove(addr);
                (
                    None,
                    Some(e.expect("the handle's region is in the staged map")),
                )
            } else {
                t.generation += 1;
                let e = t.map.remove(addr);
                (Some(e.expect("the handle's region is in the map")), None)
            }
        };
        // Transfers planned before the removal hold a reference until they end.
        let in_use = || {
            exported.as_ref().is_some_and(|e| {
                Arc::strong_count(e) > 1
                    || e.staged
                        .as_ref()
                        .is_some_and(|st| Arc::strong_count(st) > 1)
            }) || staged.as_ref().is_some_and(|e| Arc::strong_count(e) > 1)
        };
        while in_use() {
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        if let Some(e) = &exported {
            debug_assert_eq!(e.handle, handle);
        }
        drop((exported, staged));
        Ok(())
    }

    /// Connects to the engine named `remote` (its [`Engine::name`]): fetches its data-plane
    /// address and region table, connects the data plane and imports every region.
    pub async fn connect(&self, remote: &str, timeout: Duration) -> Result<()> {
        self.check_open()?;
        let key = peer_key(remote);
        if self.inner.peers.read().contains_key(&key) {
            return Err(EngineError::AlreadyConnected(key));
        }
        let deadline = Deadline::after(timeout);
        let addr = self.resolve(remote, deadline).await?;
        let timed_out = || EngineError::Timeout {
            what: format!("connecting to `{key}`"),
            after: timeout,
        };
        let meta_err = |why: String| EngineError::Metadata {
            peer: key.clone(),
            why,
        };
        let client_config = ClientConfig {
            auth_secret: self.inner.shared.config.auth_secret.clone(),
            ..ClientConfig::default()
        };
        let rpc = tokio::time::timeout(deadline.remaining(), Client::connect(&addr, client_config))
            .await
            .map_err(|_| timed_out())?
            .map_err(|e| match e {
                // One shape per condition: a refusal keeps its io::Error, a slow connect is
                // a timeout, as from the transport.
                hmc_rpc::CallError::Connect(e) if e.is_deadline() => timed_out(),
                hmc_rpc::CallError::Connect(e) => EngineError::Transport(e),
                other => meta_err(other.to_string()),
            })?;
        let info = self.fetch_info(&rpc, deadline).await.map_err(|e| match e {
            EngineError::Timeout { .. } => timed_out(),
            e => meta_err(e.to_string()),
        })?;
        self.attach(key, &addr, rpc, &info, deadline, timeout).await
    }

    /// Closes the connection to `remote`. Transfers already running finish. A peer this
    /// engine already dropped as gone (it left, or restarted) is disconnected already:
    /// `Ok`, so that a caller's cleanup needs no race with the engine's; a name never
    /// connected is [`EngineError::NotConnected`].
    pub async fn disconnect(&self, remote: &str) -> Result<()> {
        let key = peer_key(remote);
        match self.inner.peers.write().remove(&key) {
            Some(_) => Ok(()),
            None if self.inner.lost.contains(&key) => Ok(()),
            None => Err(EngineError::NotConnected(key)),
        }
    }

    fn peer(&self, remote: &str) -> Result<Arc<Peer<C>>> {
        // Callers mostly pass the spelling the table holds (a name, or the address as
        // `connect` canonicalized it): look that up before paying for canonicalizing,
        // which formats a string per op. Equivalent because `peer_key` is idempotent.
        if let Some(p) = self.inner.peers.read().get(remote) {
            return Ok(p.clone());
        }
        let key = peer_key(remote);
        self.inner
            .peers
            .read()
            .get(&key)
            .cloned()
            .ok_or(EngineError::NotConnected(key))
    }

    /// Translates descriptors to pieces, merging runs contiguous on both sides. Every
    /// descriptor is checked before any byte moves.
    fn plan(
        &self,
        peer: &Peer<C>,
        op: TransferOp,
        descs: &[TransferOpDesc],
    ) -> Result<Vec<Piece<C>>> {
        let cfg = &self.inner.shared.config;
        if descs.len() > cfg.max_descs_per_transfer {
            return Err(EngineError::Limit {
                limit: "max_descs_per_transfer",
                value: descs.len() as u64,
                max: cfg.max_descs_per_transfer as u64,
                hint: "split the batch, or raise EngineConfig::max_descs_per_transfer",
            });
        }
        let local = self.inner.shared.local.read();
        let remote = peer.table.read();
        let mut pieces: Vec<Piece<C>> = Vec::with_capacity(descs.len());
        for d in descs {
            if d.len == 0 {
                return Err(EngineError::InvalidArgument(format!(
                    "a descriptor of 0 bytes ({d:?}); leave it out"
                )));
            }
            let len = d.len as u64;
            let (r, roff) = match remote.map.find(d.remote_addr, len) {
                Lookup::Inside(r, off) => (r, off),
                other => return Err(miss(Side::Remote, &peer.name, d.remote_addr, len, other)),
            };
            check_access(op, Holder::Peer(&peer.name), r.access, || {
                format!("{:#x}+{len}", d.remote_addr)
            })?;
            let (l, loff) = self.plan_local(&local, op, d)?;
            let run = ResolvedRun {
                local: l,
                local_off: loff,
                remote: r,
                remote_off: roff,
                len,
            };
            match pieces.last_mut() {
                Some(p) if p.continues_into(&run) => p.len += len,
                _ => pieces.push(Piece::hold(run)),
            }
        }
        Ok(pieces)
    }

    /// Finds `d`'s local memory: registered (and allowing `op`), or device memory the
    /// transport cannot register (moved through the bounce buffers).
    fn plan_local<'t>(
        &self,
        local: &'t LocalTable<C>,
        op: TransferOp,
        d: &TransferOpDesc,
    ) -> Result<(LocalMem<'t, C>, u64)> {
        let len = d.len as u64;
        match local.map.find(d.local_addr, len) {
            Lookup::Inside(l, off) => {
                check_access(op, Holder::Local, l.access, || {
                    format!("{:#x}+{len}", d.local_addr)
                })?;
                Ok((LocalMem::Reg(l), off))
            }
            other => match local.staged.find(d.local_addr, len) {
                Lookup::Inside(st, off) => Ok((LocalMem::Staged(st), off)),
                _ => Err(miss(
                    Side::Local,
                    &self.inner.name,
                    d.local_addr,
                    len,
                    other,
                )),
            },
        }
    }

    /// Moves the bytes of `descs` between this engine's memory and `remote`'s, and
    /// returns once all of them are done (for a write: visible at the peer) or failed.
    /// A remote address not in the table fetched at connect makes the engine fetch the
    /// peer's table once more (it may have registered memory since). A WRITE that fails or
    /// times out returns its error only once the transport confirmed that no more of it
    /// lands at the target ([`Communicator::settle`]), or after `no_progress_timeout` with
    /// a warning where it could not. Dropping this future instead skips that step.
    pub async fn transfer(
        &self,
        remote: &str,
        op: TransferOp,
        descs: &[TransferOpDesc],
        timeout: Duration,
    ) -> Result<()> {
        let m = membership::TransferMetrics::start(op, descs);
        let r = self
            .transfer_inner(remote, op, descs, m.deadline(timeout))
            .await;
        m.finish(&r);
        r
    }

    /// [`Engine::transfer`] without its metrics: the plan (the peer's table fetched again
    /// once on a remote address it lacks), then the mover ([`mover`]) under the deadline.
    /// (A function returning an `async move` block, not an `async fn`, which would keep
    /// its arguments twice in the state every op's future carries.)
    #[allow(clippy::manual_async_fn)]
    fn transfer_inner(
        &self,
        remote: &str,
        op: TransferOp,
        descs: &[TransferOpDesc],
        (deadline, timeout): (Deadline, Duration),
    ) -> impl Future<Output = Result<()>> {
        async move {
            self.check_open()?;
            let peer = self.peer(remote)?;
            let planned = self.plan(&peer, op, descs);
            let pieces = if matches!(
                planned,
                Err(EngineError::NotRegistered {
                    side: Side::Remote,
                    ..
                } | EngineError::Straddles {
                    side: Side::Remote,
                    ..
                })
            ) {
                // Dropped first: not kept in the op's state across the refresh. Boxed: a
                // refresh is a metadata round trip whose state is several KiB; inline,
                // every op's future would carry (and move) it.
                drop(planned);
                Box::pin(self.refresh(&peer, deadline)).await?;
                self.plan(&peer, op, descs)?
            } else {
                planned?
            };
            let mover = mover::Mover {
                engine: self,
                peer: &peer,
                op,
                bound: mover::Bound::Deadline {
                    deadline,
                    timeout,
                    descs: descs.len(),
                    max_batch: self.inner.shared.max_batch,
                },
            };
            // A key refused while the peer is the same instance: planned again, the
            // transfer names the address the peer deregistered.
            let revoked = || self.plan(&peer, op, descs).err();
            mover
                .run(pieces.iter().map(Piece::run), &mut 0, revoked)
                .await
        }
    }

    /// Starts a transfer and returns at once; see [`TransferRequest`].
    pub fn transfer_async(
        &self,
        remote: &str,
        op: TransferOp,
        descs: Vec<TransferOpDesc>,
        timeout: Duration,
    ) -> Result<TransferRequest> {
        self.check_open()?;
        let (req, done) = TransferRequest::new();
        let engine = self.clone();
        let remote = remote.to_string();
        self.inner.runtime.spawn(async move {
            let cancel = done.cancel.clone();
            // Dropping the transfer future cancels it (the transport's contract).
            let (outcome, cancelled) = tokio::select! {
                r = engine.transfer(&remote, op, &descs, timeout) => (r, false),
                _ = cancel.notified() => (Err(EngineError::Cancelled(format!(
                    "a transfer of {} descriptor(s) with `{remote}`", descs.len()
                ))), true),
            };
            // A cancel dropped the transfer before it could settle its WRITE itself (the
            // mover does on the transfer's own errors and timeouts, so only here).
            if op == TransferOp::Write
                && cancelled
                && let Ok(peer) = engine.peer(&remote)
            {
                engine.settle_write(&peer).await;
            }
            let status = match outcome {
                Ok(()) => TransferStatus::Completed,
                Err(EngineError::Timeout { .. }) => TransferStatus::TimedOut,
                Err(e) => TransferStatus::Failed(Arc::new(e)),
            };
            done.finish(status);
        });
        Ok(req)
    }

    /// Before the early end of a WRITE with `peer` is reported (its transport future
    /// dropped: an error, a timeout, a cancel, a release): waits, up to
    /// `no_progress_timeout`, until the transport confirms that no more of it lands at the
    /// target ([`Communicator::settle`]). A target that does not confirm (stopped, gone,
    /// of an older version) is logged at warn, and the end is reported anyway.
    async fn settle_write(&self, peer: &Peer<C>) {
        let shared = &self.inner.shared;
        let deadline = Deadline::after(shared.config.no_progress_timeout);
        if let Err(e) = shared.comm.settle(&peer.ep, deadline).await {
            tracing::warn!(
                peer = %peer.name,
                error = %e,
                "a WRITE ended early and its target did not confirm that it dropped the rest: \
                 the target may still apply bytes of it that it already holds; do not reuse \
                 that memory at the target before it confirms or restarts"
            );
        }
    }

    /// The engines this one is connected to.
    pub fn peers(&self) -> Vec<String> {
        self.inner.peers.read().keys().cloned().collect()
    }

    /// Cancels every transfer in flight (each ends with [`EngineError::Cancelled`], and
    /// the transport no longer touches its memory: the cancellation contract), disconnects
    /// every peer and stops the metadata service; later calls fail with
    /// [`EngineError::Finalized`]. [`Engine::deregister_mem`] still works afterwards, and
    /// waits for nothing. Registrations end when the last clone drops.
    pub async fn finalize(&self) {
        self.inner
            .finalized
            .store(true, std::sync::atomic::Ordering::Release);
        let peers: Vec<Arc<Peer<C>>> = self.inner.peers.write().drain().map(|(_, p)| p).collect();
        for p in peers {
            // Every transfer in flight with `p` watches this (see `mover`).
            p.gone
                .send_replace(Some("this engine was finalized".into()));
        }
        self.inner.meta.close().await;
        self.inner.server.shutdown().await;
    }

    fn is_finalized(&self) -> bool {
        self.inner
            .finalized
            .load(std::sync::atomic::Ordering::Acquire)
    }
}

fn miss<V>(side: Side, owner: &str, addr: u64, len: u64, l: Lookup<'_, V>) -> EngineError {
    match l {
        Lookup::Straddles { start, len: rl } => EngineError::Straddles {
            side,
            owner: owner.to_string(),
            addr,
            len,
            start,
            region_len: rl,
        },
        _ => EngineError::NotRegistered {
            side,
            owner: owner.to_string(),
            addr,
            len,
        },
    }
}

impl<C: Communicator> Shared<C> {
    /// The metadata service's handlers.
    fn dispatcher(self: &Arc<Self>) -> Dispatcher {
        let mut d = Dispatcher::new();
        let s = self.clone();
        d.register(METHOD_INFO, move |ctx: hmc_rpc::CallContext, hello: Hello| {
            let s = s.clone();
            async move {
                let from = sender_name(&ctx.connection, &hello.from);
                // The connection is this peer's from now on: its notifications carry this
                // name, whatever they claim.
                let _ = ctx.connection.set_label(from.clone());
                tracing::debug!(%from, peer = %ctx.connection.peer(), "engine metadata requested");
                Ok::<_, RpcError>(s.info())
            }
        });
        let s = self.clone();
        d.register(
            METHOD_HELLO,
            move |ctx: hmc_rpc::CallContext, hello: Hello| {
                let s = s.clone();
                async move {
                    // As METHOD_INFO, without the table (a peer that has it from a blob).
                    let from = sender_name(&ctx.connection, &hello.from);
                    let _ = ctx.connection.set_label(from);
                    Ok::<_, RpcError>(crate::meta::Instance {
                        version: VERSION,
                        instance: s.instance,
                    })
                }
            },
        );
        let s = self.clone();
        d.register(
            METHOD_NOTIFY,
            move |ctx: hmc_rpc::CallContext, n: NotifyMsg| {
                let s = s.clone();
                async move { s.receive_notify(&ctx, n).await }
            },
        );
        let s = self.clone();
        d.register(
            METHOD_RETRACT,
            move |ctx: hmc_rpc::CallContext, r: Retract| {
                let s = s.clone();
                async move { s.take_retract(&ctx.connection, r) }
            },
        );
        let s = self.clone();
        d.register(METHOD_LOOKUP, move |_, l: crate::meta::Lookup| {
            let s = s.clone();
            async move { Ok::<_, RpcError>(s.directory.read().get(&l.name).cloned()) }
        });
        d
    }

    /// The metadata service's configuration, from the engine's.
    fn server_config(&self) -> hmc_rpc::ServerConfig {
        let config = &self.config;
        let mut conn = config.rpc.conn.clone();
        // Nothing a peer sends the metadata service is larger than a notification (plus
        // its framing); a larger call is refused from its header instead of decoded.
        conn.limits.max_payload_len = conn
            .limits
            .max_payload_len
            .min(config.max_notify_len as u64 + (64 << 10));
        hmc_rpc::ServerConfig {
            conn,
            auth_secret: config.auth_secret.clone(),
            // Without a secret, this host's other users are kept out (peers elsewhere
            // cannot be told apart: the trust table says so).
            same_user_only: true,
            ..config.rpc.clone()
        }
    }

    /// What the metadata store holds for this engine: its instance and data plane, never
    /// its region table (whose keys only the authenticated metadata exchange hands out:
    /// anyone who can read the store could use them otherwise).
    fn store_record(&self) -> EngineInfo {
        EngineInfo {
            version: VERSION,
            instance: self.instance,
            data_plane: self.comm.address().to_string(),
            generation: 0,
            regions: Vec::new(),
        }
    }

    fn info(&self) -> EngineInfo {
        let t = self.local.read();
        EngineInfo {
            version: VERSION,
            instance: self.instance,
            data_plane: self.comm.address().to_string(),
            generation: t.generation,
            regions: t.map.iter().map(|(_, _, r)| r.exported.clone()).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("127.0.0.1:80", Some("tcp://127.0.0.1:80"))]
    #[case("tcp://[::1]:9", Some("tcp://[::1]:9"))]
    #[case("/run/engine.sock", Some("unix:///run/engine.sock"))]
    #[case("unix:///x", Some("unix:///x"))]
    #[case("127.0.0.1", None)]
    #[case("engine-a", None)]
    fn engine_addresses_parse(#[case] s: &str, #[case] want: Option<&str>) {
        let got = parse_engine_addr(s, None).ok().map(|a| a.to_string());
        assert_eq!(got.as_deref(), want);
    }

    /// `Engine::peer` looks the caller's spelling up before canonicalizing it; that is the
    /// same lookup only if a canonical key canonicalizes to itself.
    #[rstest]
    #[case("127.0.0.1:80")]
    #[case("tcp://127.0.0.1:80")]
    #[case("tcp://[::1]:9")]
    #[case("[::1]:9")]
    #[case("/run/engine.sock")]
    #[case("unix:///x")]
    #[case("127.0.0.1")]
    #[case("engine-a")]
    fn peer_keys_are_idempotent(#[case] s: &str) {
        let once = peer_key(s);
        assert_eq!(peer_key(&once), once, "{s}");
    }
}
