//! `UcxCommunicator`: the `Communicator` implementation over the progress engine and the control connections.

use std::future::Future;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use futures::channel::oneshot;
use hmc_core::{
    Access, CommCapabilities, Communicator, Deadline, Error, LocalRegistration, Notification, Op,
    PeerAddr, Region, RemoteRegion, Result, TransferDesc, TransportId, check_bounds,
};

use crate::config::{TCP_TX_SEG_SIZE, UcxConfig};
use crate::control::{Link, TargetState};
use crate::engine::{Chunk, Command, Engine, EngineConfig, KeyShared};
use crate::staged::{StagedDesc, StagedRegion, UcxStagingStats};
use crate::sys::Ucp;

mod device;

/// Magic at the start of every key this transport exports: `HMCU`, then a format version.
const KEY_MAGIC: &[u8; 4] = b"HMCU";
const KEY_VERSION: u8 = 1;
/// The version byte of a staged device region's key (no UCX rkey follows).
const KEY_STAGED: u8 = 2;
const KEY_HEADER: usize = 4 + 1 + 8;

/// Counters for tests and monitoring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UcxStats {
    /// Registrations made (`ucp_mem_map`).
    pub registered: u64,
    /// Registrations released (`ucp_mem_unmap`).
    pub deregistered: u64,
    /// Endpoints alive (created and not yet dropped).
    pub endpoints: usize,
    /// UCX endpoints held by the progress thread, including ones still closing.
    pub ucx_endpoints: usize,
    /// Transfers done as direct copies through UCX's mapping of the remote region
    /// ([`UcxConfig::direct_mapped`]), without the progress thread.
    pub direct_transfers: u64,
}

/// Process-wide state of the UCX progress threads ([`UcxCommunicator::process_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct UcxProcessStats {
    /// Progress threads alive, including those of dropped communicators still tearing
    /// UCX down.
    pub progress_threads: usize,
    /// Workers left undestroyed at tear-down because they still held sends to peers that
    /// stopped reading (UCX 1.13 crashes purging such sends); each is logged as a warning.
    pub leaked_workers: usize,
}

#[derive(Default)]
struct Counters {
    registered: AtomicU64,
    deregistered: AtomicU64,
    endpoints: AtomicUsize,
    direct_transfers: AtomicU64,
}

/// A UCX [`Communicator`].
///
/// # Thread safety
/// `Send + Sync`; every method may be called from any thread at once. All UCX calls happen
/// on one progress thread per communicator (see the `engine` module): callers hand it
/// commands and wait for replies, so UCX runs in `UCS_THREAD_MODE_SINGLE` with no lock.
/// `register`, `import` and dropping a registration block briefly (a round trip to the
/// progress thread; import and deregistration also one to the peer).
///
/// # Addresses
/// [`Communicator::address`] is `tcp://IP:PORT` of a control listener. `connect` opens a TCP
/// connection there, receives the peer's UCX worker address and creates the endpoint
/// (`UCP_ERR_HANDLING_MODE_PEER`). The TCP connection stays open for the endpoint's life:
/// key confirmation and revocation travel on it, and its EOF tells us the peer is gone.
pub struct UcxCommunicator {
    engine: Engine,
    target: Arc<TargetState>,
    listener: TcpListener,
    address: SocketAddr,
    config: UcxConfig,
    next_op: AtomicU64,
    counters: Arc<Counters>,
}

impl UcxCommunicator {
    /// Loads UCX, starts the progress thread and the control listener.
    ///
    /// Fails with [`Error::Unavailable`] naming `libucp.so.0` and `HMC_UCX_LIB` when UCX is
    /// not installed.
    pub fn new(config: UcxConfig) -> Result<Self> {
        let ucp = Arc::new(Ucp::load(config.library.as_deref())?);
        let mut ucx_options = Vec::new();
        if let Some(tls) = &config.tls {
            ucx_options.push(("TLS".to_string(), tls.clone()));
        }
        ucx_options.extend(config.ucx_options.iter().cloned());
        // UCX 1.13's shared-memory transports refuse UCP_ERR_HANDLING_MODE_PEER unless told
        // to expose error handling; without it a dead peer's endpoint can never be released
        // (FORCE close needs PEER mode) and its pending requests never complete.
        let mut soft_options = Vec::new();
        let user_set = |name: &str| {
            config
                .ucx_options
                .iter()
                .any(|(k, _)| k.eq_ignore_ascii_case(name))
                || std::env::var_os(format!("UCX_{name}")).is_some()
        };
        // (UCX then warns once per communicator that the key is "invalid" for the transports
        // that lack it; it does apply to posix and sysv.)
        let tls_env = std::env::var("UCX_TLS").ok();
        let tls = config
            .tls
            .as_deref()
            .or(tls_env.as_deref())
            .unwrap_or("all");
        let uses_mm = ["all", "sm", "shm", "posix", "sysv", "mm"].iter().any(|t| {
            tls.split(',')
                .any(|x| x.trim().trim_start_matches('^') == *t)
        });
        if uses_mm && !user_set("MM_ERROR_HANDLING") {
            soft_options.push(("MM_ERROR_HANDLING".to_string(), "y".to_string()));
        }
        // UCX 1.13 moves RMA over tcp in UCX_TCP_TX_SEG_SIZE pieces, 8 KiB by default; with
        // 64 KiB a 1 MiB HMC_BUFFER echo takes about half the time (see the crate docs).
        let uses_tcp = tls_selects_tcp(tls);
        // The name without the TCP_ prefix: UCP hands unknown keys to each transport's own
        // table (only tcp's has TX_SEG_SIZE); `TCP_TX_SEG_SIZE` would match none of them.
        if uses_tcp && !user_set("TCP_TX_SEG_SIZE") && !user_set("TX_SEG_SIZE") {
            soft_options.push(("TX_SEG_SIZE".to_string(), TCP_TX_SEG_SIZE.to_string()));
        }
        let listener = TcpListener::bind(config.bind).map_err(|e| {
            Error::io(
                format!("binding the UCX control listener on {}", config.bind),
                e,
            )
        })?;
        let address = listener
            .local_addr()
            .map_err(|e| Error::io("reading the UCX control listener's address", e))?;
        let target = Arc::new(TargetState::new(config.max_staging_bytes));
        let engine = Engine::start(
            ucp,
            EngineConfig {
                name: address.to_string(),
                ucx_options,
                soft_options,
                tunables: config.floored(),
            },
            target.clone(),
        )?;
        let accept = listener
            .try_clone()
            .map_err(|e| Error::io("cloning the UCX control listener", e))?;
        let (t, e, timeout) = (target.clone(), engine.clone(), config.control_timeout);
        std::thread::Builder::new()
            .name(format!("hmc-ucx-accept-{address}"))
            .spawn(move || accept_loop(accept, t, e, timeout))
            .map_err(|e| Error::io("spawning the UCX control listener thread", e))?;
        tracing::debug!(%address, tls = ?config.tls, "ucx communicator ready");
        Ok(UcxCommunicator {
            engine,
            target,
            listener,
            address,
            config,
            next_op: AtomicU64::new(1),
            counters: Arc::new(Counters::default()),
        })
    }

    /// What serving peers' READs and WRITEs of staged device regions has done.
    pub fn staging_stats(&self) -> UcxStagingStats {
        self.target.pool.stats()
    }

    /// The configuration in use.
    pub fn config(&self) -> &UcxConfig {
        &self.config
    }

    /// The memory kinds the loaded UCX moves (`ucp_context_query`): host, and CUDA or ROCm
    /// where it was built and could start with that support.
    pub fn memory_kinds(&self) -> Vec<hmc_core::DeviceKind> {
        crate::caps::memory_kinds(self.engine.memory_types)
    }

    /// The loaded UCX version `(major, minor, release)`.
    pub fn ucx_version(&self) -> (u32, u32, u32) {
        self.engine.ucp.version
    }

    /// Process-wide counters of every communicator's progress thread.
    pub fn process_stats() -> UcxProcessStats {
        UcxProcessStats {
            progress_threads: crate::engine::live_threads(),
            leaked_workers: crate::engine::LEAKED_WORKERS.load(Ordering::Relaxed),
        }
    }

    /// Counters: registrations made and released, endpoints alive.
    pub fn stats(&self) -> UcxStats {
        UcxStats {
            registered: self.counters.registered.load(Ordering::Acquire),
            deregistered: self.counters.deregistered.load(Ordering::Acquire),
            endpoints: self.counters.endpoints.load(Ordering::Acquire),
            ucx_endpoints: self.engine.ucx_endpoints.load(Ordering::Acquire),
            direct_transfers: self.counters.direct_transfers.load(Ordering::Acquire),
        }
    }
}

/// Whether a `UCX_TLS` value selects UCX's tcp transport (`^a,b` means all but `a,b`).
fn tls_selects_tcp(tls: &str) -> bool {
    let tls = tls.trim();
    match tls.strip_prefix('^') {
        Some(excluded) => !excluded.split(',').any(|x| x.trim() == "tcp"),
        None => tls.split(',').any(|x| matches!(x.trim(), "all" | "tcp")),
    }
}

fn accept_loop(listener: TcpListener, target: Arc<TargetState>, engine: Engine, timeout: Duration) {
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                if target.closed.load(Ordering::Acquire) {
                    break;
                }
                let (t, e) = (target.clone(), engine.clone());
                let spawned = std::thread::Builder::new()
                    .name("hmc-ucx-control".into())
                    .spawn(move || t.serve(stream, &e, timeout));
                if let Err(e) = spawned {
                    tracing::warn!(error = %e, "cannot spawn a UCX control thread; dropping the connection");
                }
            }
            Err(e) => {
                if target.closed.load(Ordering::Acquire) {
                    break;
                }
                tracing::warn!(error = %e, "ucx control listener accept failed");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

impl Drop for UcxCommunicator {
    fn drop(&mut self) {
        self.close();
    }
}

struct EpInner {
    id: u64,
    peer: SocketAddr,
    link: Arc<Link>,
    engine: Engine,
    counters: Arc<Counters>,
}

impl Drop for EpInner {
    fn drop(&mut self) {
        self.link.closing.store(true, Ordering::Release);
        let _ = self.engine.send(Command::CloseEp { ep: self.id });
        let _ = self.link.stream.shutdown(Shutdown::Both);
        self.counters.endpoints.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A connection to one peer. Cheap to clone; closed when the last clone and every key
/// imported on it are dropped.
#[derive(Clone)]
pub struct UcxEndpoint(Arc<EpInner>);

impl UcxEndpoint {
    /// The peer's control address.
    pub fn peer(&self) -> SocketAddr {
        self.0.peer
    }
}

impl std::fmt::Debug for UcxEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UcxEndpoint")
            .field("peer", &self.0.peer)
            .finish_non_exhaustive()
    }
}

/// Local memory mapped with `ucp_mem_map`; unmapped exactly once, on drop, after every peer
/// that imported it has confirmed the key's revocation.
pub struct UcxRegistration {
    id: u64,
    region: Region,
    access: Access,
    /// UCX allocated the memory ([`UcxCommunicator::alloc_registered`]).
    owned: bool,
    export: RemoteRegion,
    engine: Engine,
    target: Arc<TargetState>,
    revoke_timeout: Duration,
    counters: Arc<Counters>,
    /// A device region served through the staging pool, not mapped by UCX.
    staged: Option<Arc<StagedRegion>>,
}

impl LocalRegistration for UcxRegistration {
    fn region(&self) -> Region {
        self.region
    }
    fn access(&self) -> Access {
        self.access
    }
}

impl UcxRegistration {
    /// Copies `src` into memory this registration owns, at `offset`. Only for
    /// [`UcxCommunicator::alloc_registered`] memory (user memory has its own owner).
    pub fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        let dst = self.owned_range(offset, src.len())?;
        // SAFETY: the range lies inside UCX-allocated memory that lives until `self` drops;
        // concurrent peer writes race like DMA (documented on `ConnBuffer`).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }

    /// Copies owned memory at `offset` into `dst`. See [`UcxRegistration::write_at`].
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let src = self.owned_range(offset, dst.len())?;
        // SAFETY: as in `write_at`.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn owned_range(&self, offset: usize, len: usize) -> Result<usize> {
        if !self.owned {
            return Err(Error::Unsupported(
                "read_at/write_at need UCX-allocated memory (alloc_registered); use the owner's buffer".into(),
            ));
        }
        check_bounds(
            "ucx registration",
            offset as u64,
            len as u64,
            self.region.len as u64,
        )?;
        Ok(self.region.addr as usize + offset)
    }
}

impl Drop for UcxRegistration {
    fn drop(&mut self) {
        self.target.revoke(self.id, self.revoke_timeout);
        if let Some(staged) = &self.staged {
            self.target.staged.lock().remove(&self.id);
            staged.retire();
            self.counters.deregistered.fetch_add(1, Ordering::AcqRel);
            return;
        }
        let (tx, rx) = mpsc::sync_channel(1);
        if self
            .engine
            .send(Command::Unregister {
                id: self.id,
                done: tx,
            })
            .is_ok()
        {
            let _ = rx.recv();
        }
        self.counters.deregistered.fetch_add(1, Ordering::AcqRel);
    }
}

/// A peer's region imported on one endpoint; keeps the endpoint alive.
pub struct UcxRemoteKey {
    id: u64,
    region: Region,
    access: Access,
    shared: Arc<KeyShared>,
    ep: UcxEndpoint,
    /// The target stages this region (`staged.rs`): moved over the control connection.
    staged: bool,
    /// The target's id of the region.
    reg_id: u64,
}

impl UcxRemoteKey {
    /// The remote region, as the target confirmed it.
    pub fn region(&self) -> Region {
        self.region
    }
    /// What the target allows.
    pub fn access(&self) -> Access {
        self.access
    }
}

impl Drop for UcxRemoteKey {
    fn drop(&mut self) {
        if !self.staged {
            let _ = self.ep.0.engine.send(Command::DropKey { key: self.id });
        }
    }
}

/// Cancels a submitted transfer when its future is dropped, and waits until UCX no longer
/// touches the batch's memory.
struct CancelGuard<'a> {
    engine: &'a Engine,
    id: u64,
    armed: bool,
}

impl Drop for CancelGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (tx, rx) = mpsc::sync_channel(1);
        if self
            .engine
            .send(Command::Cancel {
                id: self.id,
                done: tx,
            })
            .is_ok()
        {
            // Bounded: the engine answers once in-flight chunks drain, or after
            // `drain_timeout` when it force-closes the endpoint.
            let _ = rx.recv();
        }
    }
}

/// Direct users counted on keys by [`UcxCommunicator::copy_direct`]; uncounted on drop.
struct DirectUse<'a>(Vec<(&'a KeyShared, u64)>);

impl Drop for DirectUse<'_> {
    fn drop(&mut self) {
        for (k, _) in &self.0 {
            k.end_direct();
        }
    }
}

/// A key's region id, UCX rkey, and whether the region is staged.
fn decode_key(key: &[u8]) -> Result<(u64, Vec<u8>, bool)> {
    if key.len() <= KEY_HEADER
        || &key[..4] != KEY_MAGIC
        || ![KEY_VERSION, KEY_STAGED].contains(&key[4])
    {
        return Err(Error::InvalidKey(
            "not a UCX key exported by hmc-transport-ucx (bad magic, version or length)".into(),
        ));
    }
    let reg_id = u64::from_be_bytes(key[5..13].try_into().expect("8 bytes"));
    Ok((reg_id, key[KEY_HEADER..].to_vec(), key[4] == KEY_STAGED))
}

impl Communicator for UcxCommunicator {
    type Endpoint = UcxEndpoint;
    type Registration = UcxRegistration;
    type RemoteKey = UcxRemoteKey;

    fn transport(&self) -> TransportId {
        TransportId::UCX
    }

    /// Host memory, and the device kinds the loaded UCX says it moves (`crate::caps`);
    /// UCX-allocated memory is the fast path.
    fn capabilities(&self) -> CommCapabilities {
        crate::caps::capabilities(&self.config, self.engine.memory_types)
    }

    fn address(&self) -> PeerAddr {
        PeerAddr::Tcp(self.address)
    }

    fn connect(
        &self,
        peer: &PeerAddr,
        deadline: Deadline,
    ) -> impl Future<Output = Result<UcxEndpoint>> + Send {
        let peer = peer.clone();
        let engine = self.engine.clone();
        let counters = self.counters.clone();
        let closed = self.target.closed.load(Ordering::Acquire);
        async move {
            if closed {
                return Err(Error::Closed("the UCX communicator was closed".into()));
            }
            let PeerAddr::Tcp(addr) = peer else {
                return Err(Error::InvalidArgument(format!(
                    "the UCX transport connects to tcp://IP:PORT control addresses, not {peer}"
                )));
            };
            let (tx, rx) = oneshot::channel();
            std::thread::Builder::new()
                .name(format!("hmc-ucx-link-{addr}"))
                .spawn(move || connect_thread(addr, deadline, engine, counters, tx))
                .map_err(|e| Error::io("spawning a UCX control connection thread", e))?;
            rx.await
                .map_err(|_| Error::peer(addr, "the connection thread ended without a result"))?
        }
    }

    unsafe fn register(&self, region: Region, access: Access) -> Result<UcxRegistration> {
        self.map(region, access, false)
    }

    /// Memory of a kind the loaded UCX moves is mapped as by `register`; device memory of
    /// another kind is staged: peers READ and WRITE it over the control connection through
    /// this side's host chunks (`crate::staged`).
    unsafe fn register_memory(
        &self,
        region: Region,
        access: Access,
        memory: &hmc_core::AnyMemory,
    ) -> Result<UcxRegistration> {
        self.register_device(region, access, memory)
    }

    /// Always `Some`: memory UCX allocates itself is the fast path on shared memory (see
    /// the inherent [`UcxCommunicator::alloc_registered`]).
    fn alloc_registered(&self, len: usize, access: Access) -> Result<Option<UcxRegistration>> {
        UcxCommunicator::alloc_registered(self, len, access).map(Some)
    }

    fn export(&self, reg: &UcxRegistration) -> Result<RemoteRegion> {
        if !Arc::ptr_eq(&reg.target, &self.target) {
            return Err(Error::InvalidArgument(
                "export: the registration belongs to another UcxCommunicator; export it with \
                 the communicator that registered it"
                    .into(),
            ));
        }
        Ok(reg.export.clone())
    }

    fn import(&self, ep: &UcxEndpoint, remote: &RemoteRegion) -> Result<UcxRemoteKey> {
        remote.check_transport(TransportId::UCX)?;
        let (reg_id, rkey, staged) = decode_key(&remote.key)?;
        let shared = Arc::new(KeyShared::new(remote.region.addr));
        let id = ep.0.link.validate(
            staged,
            ep.0.id,
            reg_id,
            &remote.encode(),
            rkey,
            shared.clone(),
            self.config.control_timeout,
        )?;
        Ok(UcxRemoteKey {
            id,
            region: remote.region,
            access: remote.access,
            shared,
            ep: ep.clone(),
            staged,
            reg_id,
        })
    }

    fn transfer(
        &self,
        ep: &UcxEndpoint,
        op: Op,
        batch: &[TransferDesc<'_, Self>],
        deadline: Deadline,
    ) -> impl Future<Output = Result<()>> + Send {
        let prepared = self.prepare(ep, op, batch, deadline);
        async move {
            let (id, chunks, staged) = prepared?;
            if staged.is_empty() {
                return self.ucx_transfer(ep, op, id, chunks, batch, deadline).await;
            }
            // Some remote regions are staged device memory: those move over the control
            // connection, beside the UCX part; both end before we return.
            let ucx_part: Vec<_> = batch.iter().filter(|d| !d.remote.staged).cloned().collect();
            let (a, b) = futures::future::join(
                self.staged_transfer(ep, op, staged, deadline),
                self.ucx_transfer(ep, op, id, chunks, &ucx_part, deadline),
            )
            .await;
            a.and(b)
        }
    }

    fn notify(
        &self,
        ep: &UcxEndpoint,
        tag: u64,
        msg: &[u8],
        deadline: Deadline,
    ) -> impl Future<Output = Result<()>> + Send {
        let prepared = if msg.len() > self.config.max_notify_len {
            Err(Error::LimitExceeded {
                limit: "max_notify_len",
                value: msg.len() as u64,
                max: self.config.max_notify_len as u64,
                hint: "send large payloads with transfer(), or raise UcxConfig::max_notify_len"
                    .into(),
            })
        } else {
            let mut header = tag.to_be_bytes().to_vec();
            header.extend_from_slice(self.address().to_string().as_bytes());
            Ok((header, msg.to_vec()))
        };
        let engine = &self.engine;
        async move {
            let (header, data) = prepared?;
            if deadline.is_expired() {
                return Err(Error::DeadlineExceeded {
                    during: "ucx notify",
                    elapsed: Duration::ZERO,
                });
            }
            let (tx, rx) = oneshot::channel();
            engine.send(Command::Notify {
                ep: ep.0.id,
                header,
                data,
                deadline: deadline.instant(),
                reply: tx,
            })?;
            rx.await.map_err(|_| {
                Error::Closed("the UCX progress thread dropped a notification".into())
            })?
        }
    }

    fn recv_notification(
        &self,
        deadline: Deadline,
    ) -> impl Future<Output = Result<Notification>> + Send {
        let engine = &self.engine;
        async move {
            let (tx, rx) = oneshot::channel();
            engine.send(Command::Recv {
                deadline: deadline.instant(),
                reply: tx,
            })?;
            let raw = rx
                .await
                .map_err(|_| Error::Closed("the UCX progress thread dropped a receive".into()))??;
            let text = String::from_utf8_lossy(&raw.from);
            let from = text.parse::<PeerAddr>().unwrap_or(PeerAddr::Opaque {
                transport: TransportId::UCX,
                bytes: raw.from.clone(),
            });
            Ok(Notification {
                from,
                tag: raw.tag,
                msg: raw.msg,
            })
        }
    }

    fn close(&self) {
        if self
            .target
            .closed
            .swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            return;
        }
        // SAFETY: shutting down our own listening socket wakes the blocked accept().
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        self.target.close();
        let _ = self.engine.send(Command::Close);
    }
}

impl UcxCommunicator {
    /// Registers memory that UCX allocates (`UCP_MEM_MAP_FLAG_ALLOCATE`) and owns until the
    /// registration is dropped. Over shared memory UCX 1.13 maps such memory into peers
    /// directly, so one-sided transfers into it run at memcpy speed, where user memory
    /// from [`Communicator::register`] goes through emulated RMA. Contents start unspecified;
    /// read and write them with [`UcxRegistration::write_at`] / [`UcxRegistration::read_at`].
    pub fn alloc_registered(&self, len: usize, access: Access) -> Result<UcxRegistration> {
        let region = Region {
            device: hmc_core::Device::HOST,
            addr: 0,
            len,
        };
        self.map(region, access, true)
    }

    fn map(&self, region: Region, access: Access, allocate: bool) -> Result<UcxRegistration> {
        crate::caps::check_kind(self.engine.memory_types, region, &self.engine.ucp.path)?;
        let reg = self.engine.call(|reply| Command::Register {
            addr: region.addr,
            len: region.len,
            access,
            allocate,
            reply,
        })?;
        let region = Region {
            addr: reg.addr,
            ..region
        };
        let id = reg.id;
        self.counters.registered.fetch_add(1, Ordering::AcqRel);
        let mut key = Vec::with_capacity(KEY_HEADER + reg.rkey.len());
        key.extend_from_slice(KEY_MAGIC);
        key.push(KEY_VERSION);
        key.extend_from_slice(&id.to_be_bytes());
        key.extend_from_slice(&reg.rkey);
        let export = RemoteRegion {
            transport: TransportId::UCX,
            region,
            access,
            key,
        };
        self.target.regs.lock().insert(id, export.encode());
        Ok(UcxRegistration {
            id,
            region,
            access,
            owned: allocate,
            export,
            engine: self.engine.clone(),
            target: self.target.clone(),
            revoke_timeout: self.config.revoke_timeout,
            counters: self.counters.clone(),
            staged: None,
        })
    }

    /// Moves a checked batch with memcpy through UCX's local mappings of the remote
    /// regions, on this thread. `false` (nothing moved): some region is not mapped here,
    /// some key was revoked meanwhile, or some local region is not host memory; the
    /// progress thread then does the transfer (and reports a revoked key).
    fn copy_direct(&self, op: Op, batch: &[TransferDesc<'_, Self>]) -> bool {
        if batch
            .iter()
            .any(|d| d.local.region.device.kind != hmc_core::DeviceKind::HOST)
        {
            return false;
        }
        let mut held = DirectUse(Vec::with_capacity(batch.len()));
        for d in batch {
            match d.remote.shared.begin_direct() {
                Some(base) => held.0.push((&*d.remote.shared, base)),
                None => return false,
            }
        }
        for (d, (_, base)) in batch.iter().zip(&held.0) {
            let local = (d.local.region.addr + d.local_offset as u64) as *mut u8;
            let remote = (base + d.remote_offset) as *mut u8;
            let (src, dst) = match op {
                Op::Write => (local as *const u8, remote),
                Op::Read => (remote as *const u8, local),
            };
            // SAFETY: `prepare` checked both ranges against the registrations: the local
            // one lies in a registration the caller borrows for this call; the remote one in
            // the region UCX mapped at `base` (`ucp_rkey_ptr`), which stays mapped while we
            // count as a direct user (the rkey is destroyed only after `direct_busy` drains).
            // `copy` allows overlap (a region imported from this very process).
            unsafe { std::ptr::copy(src, dst, d.len) };
        }
        // The bytes are visible to the target before the caller hears of completion.
        std::sync::atomic::fence(Ordering::Release);
        drop(held);
        self.counters
            .direct_transfers
            .fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Moves `chunks` of a checked batch (its descriptors with UCX-mapped remote regions)
    /// through UCX.
    async fn ucx_transfer(
        &self,
        ep: &UcxEndpoint,
        op: Op,
        id: u64,
        chunks: Vec<Chunk>,
        batch: &[TransferDesc<'_, Self>],
        deadline: Deadline,
    ) -> Result<()> {
        if chunks.is_empty() {
            return Ok(());
        }
        if self.config.direct_mapped && self.copy_direct(op, batch) {
            return Ok(());
        }
        let engine = &self.engine;
        let (tx, rx) = oneshot::channel();
        engine.send(Command::Transfer {
            id,
            ep: ep.0.id,
            op,
            chunks,
            deadline: deadline.instant(),
            reply: tx,
        })?;
        let mut guard = CancelGuard {
            engine,
            id,
            armed: true,
        };
        let result = rx.await;
        guard.armed = false;
        result.map_err(|_| Error::Closed("the UCX progress thread dropped a transfer".into()))?
    }

    /// Checks a batch against bounds, rights and key state, and splits it into chunks
    /// for UCX and descriptors of staged remote regions.
    fn prepare(
        &self,
        ep: &UcxEndpoint,
        op: Op,
        batch: &[TransferDesc<'_, Self>],
        deadline: Deadline,
    ) -> Result<(u64, Vec<Chunk>, Vec<StagedDesc>)> {
        let mut chunks = Vec::with_capacity(batch.len());
        for d in batch {
            let remote = hmc_core::RemoteFacts {
                len: d.remote.region.len as u64,
                access: d.remote.access,
                on_endpoint: Arc::ptr_eq(&d.remote.ep.0, &ep.0),
            };
            hmc_core::check_desc(op, d, remote)?;
            if d.local.staged.is_some() {
                return Err(Error::InvalidArgument(
                    "a staged device registration (register_memory of memory this UCX cannot \
                     move) was passed as the local side of a transfer; stage it through \
                     registered host memory (hmc_core::Stager) as the engine does"
                        .into(),
                ));
            }
            if d.remote.staged && d.local.region.device.kind != hmc_core::DeviceKind::HOST {
                return Err(Error::UnsupportedMemory {
                    transport: TransportId::UCX,
                    device: d.local.region.device,
                    reason: "the peer's region is device memory it stages through host \
                             memory, which this side moves from and into host memory only"
                        .into(),
                });
            }
            if d.remote.shared.revoked.load(Ordering::Acquire) {
                return Err(Error::InvalidKey(
                    "the target deregistered this region (or the endpoint closed)".into(),
                ));
            }
        }
        if deadline.is_expired() {
            return Err(Error::DeadlineExceeded {
                during: "ucx transfer",
                elapsed: Duration::ZERO,
            });
        }
        let step = self.config.chunk_size.max(1);
        let mut staged = Vec::new();
        for d in batch {
            if d.remote.staged {
                staged.push(StagedDesc {
                    local: d.local.region.addr + d.local_offset as u64,
                    len: d.len,
                    region: d.remote.reg_id,
                    offset: d.remote_offset,
                });
                continue;
            }
            let mut done = 0usize;
            while done < d.len {
                let n = step.min(d.len - done);
                chunks.push(Chunk {
                    local: d.local.region.addr + (d.local_offset + done) as u64,
                    remote: d.remote.region.addr + d.remote_offset + done as u64,
                    len: n,
                    key: d.remote.id,
                });
                done += n;
            }
        }
        Ok((self.next_op.fetch_add(1, Ordering::Relaxed), chunks, staged))
    }
}

fn connect_thread(
    addr: SocketAddr,
    deadline: Deadline,
    engine: Engine,
    counters: Arc<Counters>,
    reply: oneshot::Sender<Result<UcxEndpoint>>,
) {
    let fail = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::TimedOut || e.kind() == std::io::ErrorKind::WouldBlock {
            Error::DeadlineExceeded {
                during: "ucx connect",
                elapsed: Duration::ZERO,
            }
        } else {
            // The OS error stays the source: a refusal is `io::ErrorKind::ConnectionRefused`.
            Error::io(
                format!("connecting to tcp://{addr} (is a UCX peer listening there?)"),
                e,
            )
        }
    };
    let remaining = deadline.remaining();
    if remaining.is_zero() {
        let _ = reply.send(Err(Error::DeadlineExceeded {
            during: "ucx connect",
            elapsed: Duration::ZERO,
        }));
        return;
    }
    let stream = match TcpStream::connect_timeout(&addr, remaining) {
        Ok(s) => s,
        Err(e) => {
            let _ = reply.send(Err(fail(e)));
            return;
        }
    };
    let (link, worker) =
        match Link::handshake(stream, deadline.remaining().max(Duration::from_millis(1))) {
            Ok(x) => x,
            Err(e) => {
                let _ = reply.send(Err(fail(e)));
                return;
            }
        };
    let id = match engine.call(|r| Command::CreateEp {
        worker_addr: worker,
        link: Some(link.clone()),
        reply: r,
    }) {
        Ok(id) => id,
        Err(e) => {
            let _ = link.stream.shutdown(Shutdown::Both);
            let _ = reply.send(Err(e));
            return;
        }
    };
    counters.endpoints.fetch_add(1, Ordering::AcqRel);
    let ep = UcxEndpoint(Arc::new(EpInner {
        id,
        peer: addr,
        link: link.clone(),
        engine: engine.clone(),
        counters,
    }));
    // If the caller gave up, the endpoint is dropped here and closes itself.
    let _ = reply.send(Ok(ep));
    link.read_loop(id, engine);
}

#[cfg(test)]
mod tests {
    use super::tls_selects_tcp;

    #[test]
    fn which_tls_values_select_tcp() {
        for yes in [
            "tcp",
            "all",
            "posix,tcp",
            " tcp , self",
            "^posix",
            "^cma,posix",
        ] {
            assert!(tls_selects_tcp(yes), "{yes}");
        }
        for no in ["posix,cma,self", "sm", "^tcp", "^posix,tcp", "rc,ud"] {
            assert!(!tls_selects_tcp(no), "{no}");
        }
    }
}
