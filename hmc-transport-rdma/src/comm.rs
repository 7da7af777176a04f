//! `RdmaCommunicator`: configuration, the control listener and its accepted connections (the target's QPs), endpoints (the initiator's QPs), registrations and keys, and the `Communicator` implementation.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Poll, Waker};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use futures::channel::oneshot;
use hmc_core::{
    Access, CommCapabilities, Communicator, Deadline, DeviceKind, DeviceMemoryPath, DmaBuf, Error,
    LocalRegistration, MemSpan, Memory, MemoryKinds, Notification, Op, PeerAddr, Region,
    RemoteRegion, Result, TransferDesc, TransportId,
};
use parking_lot::Mutex;

use crate::control::{self, Stream, write_frame};
use crate::endpoint::{EpInner, RdmaEndpoint, Wr, connect_blocking};
use crate::engine::{Shared, TimerSlot};
use crate::nic::{DeviceMemorySupport, Mr, Nic, NicChoice, QpParams};
use crate::sys::*;
use crate::target::{AnyListener, accept_loop, bind_listener};
use crate::wire::{KeyBytes, mtu_code, split};

/// How an [`RdmaCommunicator`] is set up. Every limit on what a peer can make this side
/// hold has a field here and is named by the error that reports it.
#[derive(Clone, Debug)]
pub struct RdmaConfig {
    /// Where the control listener binds (`tcp://IP:0` picks a port; `unix:///path`).
    pub bind: PeerAddr,
    /// The library to load instead of `$HMC_IBVERBS_LIB` / `libibverbs.so.1`.
    pub library: Option<PathBuf>,
    /// The device by name (`mlx5_0`); the first with an active port when `None`.
    pub device: Option<String>,
    /// The port; the first active one when `None`.
    pub port: Option<u8>,
    /// The GID index; chosen in RoCEv2-first order when `None`.
    pub gid_index: Option<u32>,
    /// QPs per endpoint; large transfers are striped over them.
    pub qps_per_endpoint: usize,
    /// Largest path MTU in bytes (the path gets the smaller of this, the port's active MTU
    /// and the peer's).
    pub max_mtu: u32,
    /// Caps the message size below the port's `max_msg_sz` (descriptors are split at the
    /// smaller of the two).
    pub max_msg_size: Option<u32>,
    /// Bytes per stripe: a descriptor is cut into pieces of this size, spread round-robin
    /// over the endpoint's QPs.
    pub stripe_size: u32,
    /// Send-queue depth per QP (capped by the device's `max_qp_wr`).
    pub max_send_wr: u32,
    /// Most WRs chained into one `post_send`; only the last of a chain is signalled.
    pub max_chain: u32,
    /// Completion queue entries. Every initiator QP reserves `max_send_wr` of them, so
    /// `cq_depth / max_send_wr` QPs can be connected at once.
    pub cq_depth: u32,
    /// How long the completion thread busy-polls after its last completion before it arms
    /// the CQ and sleeps on the channel fd.
    pub spin: Duration,
    /// Control-plane round trips (handshake, key confirmation, re-establishing a QP).
    pub control_timeout: Duration,
    /// How long a cancelled transfer waits for the NIC to flush its WRs.
    pub drain_timeout: Duration,
    /// Local ACK timeout exponent (4.096 µs × 2^timeout) and retry count: together how long
    /// a dead peer takes to be reported.
    pub ack_timeout: u8,
    /// See [`RdmaConfig::ack_timeout`].
    pub retry_cnt: u8,
    /// QPs that peers may make this side create, all connections together
    /// (`max_accepted_qps`).
    pub max_accepted_qps: usize,
    /// Largest notification accepted from a peer and sent (`max_notify_len`).
    pub max_notify_len: usize,
    /// Notifications queued for `recv_notification`; further ones are dropped with a
    /// warning and counted (`max_pending_notifications`; 0 queues none).
    pub max_pending_notifications: usize,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            bind: PeerAddr::Tcp(SocketAddr::from(([127, 0, 0, 1], 0))),
            library: None,
            device: None,
            port: None,
            gid_index: None,
            qps_per_endpoint: 2,
            max_mtu: 4096,
            max_msg_size: None,
            stripe_size: 1 << 20,
            max_send_wr: 256,
            max_chain: 32,
            cq_depth: 16384,
            spin: Duration::from_micros(50),
            control_timeout: Duration::from_secs(5),
            drain_timeout: Duration::from_secs(5),
            ack_timeout: 14,
            retry_cnt: 7,
            max_accepted_qps: 1024,
            max_notify_len: 4096,
            max_pending_notifications: 4096,
        }
    }
}

/// Counters of one communicator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RdmaStats {
    /// Completions polled.
    pub completions: u64,
    /// Times the completion thread armed the CQ and went to sleep.
    pub sleeps: u64,
    /// Chains posted (one `post_send` each).
    pub chains: u64,
    /// QPs re-established after an error or a cancel.
    pub reestablished: u64,
    /// Notifications dropped (`max_pending_notifications` or `max_notify_len`).
    pub notifications_dropped: u64,
    /// QPs that peers have open on this side now.
    pub accepted_qps: u64,
}

#[derive(Default)]
pub(crate) struct Notifications {
    pub(crate) queue: VecDeque<Notification>,
    pub(crate) waiters: Vec<Waker>,
}

/// What the listener, accepted connections, endpoints and registrations share.
pub(crate) struct Inner {
    pub(crate) config: RdmaConfig,
    pub(crate) address: PeerAddr,
    pub(crate) shared: Arc<Shared>,
    pub(crate) params: QpParams,
    pub(crate) local_mtu: u8,
    pub(crate) max_msg: u32,
    /// Live registrations: id → the descriptor bytes as exported.
    pub(crate) regs: Mutex<HashMap<u64, Vec<u8>>>,
    pub(crate) accepted: Mutex<HashMap<u64, Stream>>,
    pub(crate) next_id: AtomicU64,
    pub(crate) accepted_qps: AtomicUsize,
    pub(crate) cq_reserved: AtomicUsize,
    pub(crate) endpoints: Mutex<Vec<Weak<EpInner>>>,
    pub(crate) notifications: Mutex<Notifications>,
    pub(crate) closed: AtomicBool,
    pub(crate) reestablished: AtomicU64,
    pub(crate) dropped: AtomicU64,
}

/// An RDMA verbs [`Communicator`]: RC queue pairs, one-sided READ/WRITE.
pub struct RdmaCommunicator {
    pub(crate) inner: Arc<Inner>,
    listener_fd: RawFd,
    completion: Option<JoinHandle<()>>,
    accept: Option<JoinHandle<()>>,
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).expect("the OS random source works");
    u64::from_ne_bytes(b)
}

pub(crate) fn random_psn() -> u32 {
    (random_u64() & 0xff_ffff) as u32
}

impl RdmaCommunicator {
    /// Opens the device, starts the completion thread and listens for peers at
    /// `config.bind`. No device (or no RDMA stack: `ENOSYS`) is
    /// [`Error::Unavailable`] saying so.
    pub fn new(config: RdmaConfig) -> Result<RdmaCommunicator> {
        if config.qps_per_endpoint == 0 || config.qps_per_endpoint > 64 {
            return Err(Error::InvalidArgument(format!(
                "qps_per_endpoint {} must be 1 to 64",
                config.qps_per_endpoint
            )));
        }
        let nic = Nic::open(&NicChoice {
            library: config.library.as_deref(),
            device: config.device.as_deref(),
            port: config.port,
            gid_index: config.gid_index,
            cq_depth: config.cq_depth,
        })?;
        let local_mtu = mtu_code(config.max_mtu).min(nic.active_mtu as u8).max(1);
        let max_msg = config
            .max_msg_size
            .unwrap_or(u32::MAX)
            .min(nic.max_msg)
            .max(1);
        let shared = Shared::new(nic.clone(), config.spin)?;
        let (listener, address) = bind_listener(&config.bind)?;
        let listener_fd = match &listener {
            AnyListener::Tcp(l) => l.as_raw_fd(),
            AnyListener::Unix(l, _) => l.as_raw_fd(),
        };
        tracing::info!(
            device = %nic.name, port = nic.port, gid_index = nic.gid_index, mtu = local_mtu,
            max_msg, %address, library = %nic.verbs.path, "RDMA communicator up"
        );
        let inner = Arc::new(Inner {
            params: QpParams {
                timeout: config.ack_timeout,
                retry_cnt: config.retry_cnt,
                rnr_retry: 7,
            },
            config,
            address,
            shared: shared.clone(),
            local_mtu,
            max_msg,
            regs: Mutex::default(),
            accepted: Mutex::default(),
            next_id: AtomicU64::new(1),
            accepted_qps: AtomicUsize::new(0),
            cq_reserved: AtomicUsize::new(0),
            endpoints: Mutex::default(),
            notifications: Mutex::default(),
            closed: AtomicBool::new(false),
            reestablished: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        });
        let completion = std::thread::Builder::new()
            .name("hmc-rdma-cq".into())
            .spawn(move || shared.run())
            .map_err(|e| Error::io("spawning the RDMA completion thread", e))?;
        let acceptor = inner.clone();
        let accept = std::thread::Builder::new()
            .name("hmc-rdma-accept".into())
            .spawn(move || accept_loop(listener, acceptor))
            .map_err(|e| Error::io("spawning the RDMA control listener thread", e))?;
        Ok(RdmaCommunicator {
            inner,
            listener_fd,
            completion: Some(completion),
            accept: Some(accept),
        })
    }

    /// The device, port and GID index in use.
    pub fn device(&self) -> (String, u8, u8) {
        let n = &self.inner.shared.nic;
        (n.name.clone(), n.port, n.gid_index)
    }

    /// The largest message one work request carries here (descriptors are split at it).
    pub fn max_msg_size(&self) -> u32 {
        self.inner.max_msg
    }

    /// How device memory can be registered on this host.
    pub fn device_memory(&self) -> DeviceMemorySupport {
        self.inner.shared.nic.device_memory
    }

    /// The configuration.
    pub fn config(&self) -> &RdmaConfig {
        &self.inner.config
    }

    /// Counters.
    pub fn stats(&self) -> RdmaStats {
        let c = &self.inner.shared.counters;
        RdmaStats {
            completions: c.completions.load(Ordering::Relaxed),
            sleeps: c.sleeps.load(Ordering::Relaxed),
            chains: c.chains.load(Ordering::Relaxed),
            reestablished: self.inner.reestablished.load(Ordering::Relaxed),
            notifications_dropped: self.inner.dropped.load(Ordering::Relaxed),
            accepted_qps: self.inner.accepted_qps.load(Ordering::Relaxed) as u64,
        }
    }

    /// Registers device memory through a DMA-BUF the device's [`Memory`] exports
    /// ([`Memory::export_dmabuf`]) and `ibv_reg_dmabuf_mr`: the NIC reaches the device's
    /// pages directly (GPUDirect RDMA). Peers see it at `span`'s address.
    ///
    /// # Safety
    /// As [`Communicator::register`]: the memory stays allocated until the registration
    /// drops, and peers with the key may read or write it at any time.
    pub unsafe fn register_device<M: Memory + ?Sized>(
        &self,
        memory: &M,
        span: &MemSpan<'_>,
        access: Access,
    ) -> Result<RdmaRegistration> {
        let dmabuf = memory.export_dmabuf(span)?;
        // SAFETY: the caller's contract.
        unsafe { self.register_dmabuf(span.region(), &dmabuf, access) }
    }

    /// Registers `region` (device memory) through `dmabuf`, which must cover it.
    ///
    /// # Safety
    /// As [`RdmaCommunicator::register_device`].
    pub unsafe fn register_dmabuf(
        &self,
        region: Region,
        dmabuf: &DmaBuf,
        access: Access,
    ) -> Result<RdmaRegistration> {
        if self.device_memory() != DeviceMemorySupport::DmaBuf {
            return Err(Error::UnsupportedMemory {
                transport: TransportId::RDMA,
                device: region.device,
                reason: format!(
                    "this NIC's provider cannot register DMA-BUFs (probe: {:?})",
                    self.device_memory()
                ),
            });
        }
        if dmabuf.len < region.len {
            return Err(Error::InvalidArgument(format!(
                "the DMA-BUF covers {} bytes, the region {}",
                dmabuf.len, region.len
            )));
        }
        let mr = Mr::register_dmabuf(
            &self.inner.shared.nic,
            dmabuf.fd.as_raw_fd(),
            dmabuf.offset,
            region.len,
            region.addr,
            ibv_access(access),
        )?;
        Ok(self.make_registration(region, access, Some(mr)))
    }

    fn make_registration(
        &self,
        region: Region,
        access: Access,
        mr: Option<Mr>,
    ) -> RdmaRegistration {
        let reg_id = random_u64();
        let key = KeyBytes {
            reg_id,
            rkey: mr.as_ref().map_or(0, Mr::rkey),
        };
        let export = RemoteRegion {
            transport: TransportId::RDMA,
            region,
            access,
            key: key.encode(),
        };
        self.inner.regs.lock().insert(reg_id, export.encode());
        RdmaRegistration {
            region,
            access,
            mr,
            reg_id,
            owner: self.inner.clone(),
            export,
        }
    }

    /// Checks a batch and turns it into work requests per QP, before anything moves.
    fn prepare(
        &self,
        ep: &RdmaEndpoint,
        op: Op,
        batch: &[TransferDesc<'_, Self>],
    ) -> Result<Vec<Wr>> {
        let mut spans = Vec::with_capacity(batch.len());
        let mut keys = Vec::with_capacity(batch.len());
        for d in batch {
            if !Arc::ptr_eq(&d.local.owner, &self.inner) {
                return Err(Error::InvalidArgument(
                    "transfer: a local registration belongs to another RdmaCommunicator".into(),
                ));
            }
            let remote = hmc_core::RemoteFacts {
                len: d.remote.region.len as u64,
                access: d.remote.access,
                on_endpoint: d.remote.ep == ep.0.id,
            };
            hmc_core::check_desc(op, d, remote)?;
            if d.len == 0 {
                continue;
            }
            let lkey = d.local.mr.as_ref().map_or(0, Mr::lkey);
            spans.push((
                d.local.region.addr + d.local_offset as u64,
                d.remote.region.addr + d.remote_offset,
                d.len as u64,
            ));
            keys.push((lkey, d.remote.rkey));
        }
        let pieces = split(
            &spans,
            self.inner.max_msg,
            u64::from(self.inner.config.stripe_size.max(1)),
            ep.0.links.len(),
        );
        Ok(pieces
            .into_iter()
            .map(|p| Wr {
                laddr: p.local,
                lkey: keys[p.desc].0,
                raddr: p.remote,
                rkey: keys[p.desc].1,
                len: p.len,
                qp: p.qp,
            })
            .collect())
    }
}

fn ibv_access(access: Access) -> std::ffi::c_int {
    let mut f = IBV_ACCESS_LOCAL_WRITE;
    if access.allows(Access::READ) {
        f |= IBV_ACCESS_REMOTE_READ;
    }
    if access.allows(Access::WRITE) {
        f |= IBV_ACCESS_REMOTE_WRITE;
    }
    f
}

/// Local memory registered with the NIC (one memory region). Deregistered when dropped.
pub struct RdmaRegistration {
    region: Region,
    access: Access,
    mr: Option<Mr>,
    reg_id: u64,
    owner: Arc<Inner>,
    export: RemoteRegion,
}

impl LocalRegistration for RdmaRegistration {
    fn region(&self) -> Region {
        self.region
    }
    fn access(&self) -> Access {
        self.access
    }
}

impl Drop for RdmaRegistration {
    fn drop(&mut self) {
        // Imports are refused from now on; the MR (and with it the rkey) goes next.
        self.owner.regs.lock().remove(&self.reg_id);
    }
}

/// A peer's region imported on one endpoint: its address, length, rights and rkey, as the
/// peer confirmed them.
pub struct RdmaRemoteKey {
    region: Region,
    access: Access,
    rkey: u32,
    ep: u64,
}

impl RdmaRemoteKey {
    /// The region at the peer.
    pub fn region(&self) -> Region {
        self.region
    }
}

impl Communicator for RdmaCommunicator {
    type Endpoint = RdmaEndpoint;
    type Registration = RdmaRegistration;
    type RemoteKey = RdmaRemoteKey;

    fn transport(&self) -> TransportId {
        TransportId::RDMA
    }

    /// Host memory both ends; device memory as the host allows ([`DeviceMemorySupport`]):
    /// CUDA addresses through `ibv_reg_mr` with a peer-memory module, any device through
    /// [`RdmaCommunicator::register_device`] with DMA-BUF. The peer's NIC reaches the
    /// peer's memory, so any remote kind. Zero-copy, no rekey.
    fn capabilities(&self) -> CommCapabilities {
        let mut c = CommCapabilities::new(TransportId::RDMA);
        let dm = self.device_memory();
        if dm != DeviceMemorySupport::None {
            // CUDA memory: by the peer-memory module, or by DMA-BUF through
            // `register_memory` (the CUDA backend exports DMA-BUFs; this workspace's other
            // device backends do not).
            c.local_memory = MemoryKinds::Only(vec![DeviceKind::HOST, DeviceKind::CUDA]);
        }
        c.remote_memory = MemoryKinds::Any;
        c.device_memory = match dm {
            DeviceMemorySupport::None => DeviceMemoryPath::Refused,
            _ => DeviceMemoryPath::Direct,
        };
        c.max_notification_len = self.inner.config.max_notify_len;
        c.zero_copy = true;
        c
    }

    fn address(&self) -> PeerAddr {
        self.inner.address.clone()
    }

    fn connect(
        &self,
        peer: &PeerAddr,
        deadline: Deadline,
    ) -> impl Future<Output = Result<RdmaEndpoint>> + Send {
        let peer = peer.clone();
        let inner = self.inner.clone();
        async move {
            if inner.closed.load(Ordering::Acquire) {
                return Err(Error::Closed("the RDMA communicator was closed".into()));
            }
            let (tx, rx) = oneshot::channel();
            std::thread::Builder::new()
                .name("hmc-rdma-connect".into())
                .spawn(move || {
                    let _ = tx.send(connect_blocking(&inner, &peer, deadline));
                })
                .map_err(|e| Error::io("spawning an RDMA connect thread", e))?;
            rx.await.map_err(|_| {
                Error::Closed("the RDMA connect thread ended without a result".into())
            })?
        }
    }

    unsafe fn register(&self, region: Region, access: Access) -> Result<RdmaRegistration> {
        if !region.device.is_host() {
            let peermem = self.device_memory() == DeviceMemorySupport::PeerMem
                && region.device.kind == DeviceKind::CUDA;
            if !peermem {
                return Err(Error::UnsupportedMemory {
                    transport: TransportId::RDMA,
                    device: region.device,
                    reason: match self.device_memory() {
                        DeviceMemorySupport::DmaBuf => "register device memory with \
                            Communicator::register_memory or \
                            RdmaCommunicator::register_device (DMA-BUF), not register"
                            .into(),
                        _ => "neither DMA-BUF registration nor a peer-memory module \
                              (nvidia_peermem) is available on this host"
                            .into(),
                    },
                });
            }
        }
        let mr = if region.len == 0 {
            None
        } else {
            Some(Mr::register(
                &self.inner.shared.nic,
                region.addr,
                region.len,
                ibv_access(access),
            )?)
        };
        Ok(self.make_registration(region, access, mr))
    }

    /// Device memory through a DMA-BUF of `memory` where the NIC's provider takes DMA-BUFs
    /// ([`RdmaCommunicator::register_device`]); host memory, and device memory under the
    /// peer-memory module, as [`Communicator::register`].
    unsafe fn register_memory(
        &self,
        region: Region,
        access: Access,
        memory: &hmc_core::AnyMemory,
    ) -> Result<RdmaRegistration> {
        if region.device.is_host() || self.device_memory() != DeviceMemorySupport::DmaBuf {
            // SAFETY: the caller's contract.
            return unsafe { self.register(region, access) };
        }
        // SAFETY: the caller guarantees `region` is live memory of `memory`'s device for as
        // long as the registration lives.
        let span = unsafe { MemSpan::from_region(region) };
        // SAFETY: the caller's contract.
        unsafe { self.register_device(memory, &span, access) }
    }

    fn export(&self, reg: &RdmaRegistration) -> Result<RemoteRegion> {
        if !Arc::ptr_eq(&reg.owner, &self.inner) {
            return Err(Error::InvalidArgument(
                "export: the registration belongs to another RdmaCommunicator; export it with \
                 the communicator that registered it"
                    .into(),
            ));
        }
        Ok(reg.export.clone())
    }

    fn import(&self, ep: &RdmaEndpoint, remote: &RemoteRegion) -> Result<RdmaRemoteKey> {
        remote.check_transport(TransportId::RDMA)?;
        let key = KeyBytes::decode(&remote.key)?;
        let mut payload = key.reg_id.to_be_bytes().to_vec();
        payload.extend_from_slice(&remote.encode());
        let verdict =
            ep.0.round_trip(control::VALIDATE, &payload, control::VALID)?;
        match verdict.first() {
            Some(0) => Ok(RdmaRemoteKey {
                region: remote.region,
                access: remote.access,
                rkey: key.rkey,
                ep: ep.0.id,
            }),
            Some(2) => Err(Error::InvalidKey(
                "the descriptor differs from what the peer exported (damaged, or its rights \
                 or length inflated)"
                    .into(),
            )),
            _ => Err(Error::InvalidKey(
                "the peer has no such registration (deregistered, or never exported)".into(),
            )),
        }
    }

    fn transfer(
        &self,
        ep: &RdmaEndpoint,
        op: Op,
        batch: &[TransferDesc<'_, Self>],
        deadline: Deadline,
    ) -> impl Future<Output = Result<()>> + Send {
        let prepared = self.prepare(ep, op, batch);
        async move {
            let wrs = prepared?;
            if wrs.is_empty() {
                return Ok(());
            }
            if deadline.is_expired() {
                return Err(Error::DeadlineExceeded {
                    during: "rdma transfer",
                    elapsed: Duration::ZERO,
                });
            }
            self.run_batch(ep, op, &wrs, deadline).await
        }
    }

    fn notify(
        &self,
        ep: &RdmaEndpoint,
        tag: u64,
        msg: &[u8],
        deadline: Deadline,
    ) -> impl Future<Output = Result<()>> + Send {
        let max = self.inner.config.max_notify_len;
        let prepared = if msg.len() > max {
            Err(Error::LimitExceeded {
                limit: "max_notify_len",
                value: msg.len() as u64,
                max: max as u64,
                hint: "send large payloads with transfer(), or raise RdmaConfig::max_notify_len \
                       on both sides"
                    .into(),
            })
        } else {
            let mut p = tag.to_be_bytes().to_vec();
            p.extend_from_slice(msg);
            Ok(p)
        };
        let ep = ep.0.clone();
        async move {
            let payload = prepared?;
            if deadline.is_expired() {
                return Err(Error::DeadlineExceeded {
                    during: "rdma notify",
                    elapsed: Duration::ZERO,
                });
            }
            if let Some(e) = ep.dead_error() {
                return Err(e);
            }
            let res = write_frame(&mut *ep.control.lock(), control::NOTIFY, &payload);
            res.map_err(|e| {
                let reason = format!("the control connection failed: {e}");
                ep.kill(&reason);
                Error::peer(&ep.peer, reason)
            })
        }
    }

    fn recv_notification(
        &self,
        deadline: Deadline,
    ) -> impl Future<Output = Result<Notification>> + Send {
        let inner = self.inner.clone();
        async move {
            let start = Instant::now();
            let mut timer = TimerSlot::new(&inner.shared);
            std::future::poll_fn(|cx| {
                let mut q = inner.notifications.lock();
                if let Some(n) = q.queue.pop_front() {
                    return Poll::Ready(Ok(n));
                }
                if inner.closed.load(Ordering::Acquire) {
                    return Poll::Ready(Err(Error::Closed(
                        "the RDMA communicator was closed".into(),
                    )));
                }
                if deadline.is_expired() {
                    return Poll::Ready(Err(Error::DeadlineExceeded {
                        during: "rdma recv_notification",
                        elapsed: start.elapsed(),
                    }));
                }
                q.waiters.push(cx.waker().clone());
                timer.arm(deadline.instant(), cx.waker());
                Poll::Pending
            })
            .await
        }
    }

    fn close(&self) {
        if self.inner.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        // SAFETY: shutting down our own listening socket wakes the blocked accept().
        unsafe { libc::shutdown(self.listener_fd, libc::SHUT_RDWR) };
        for s in self.inner.accepted.lock().values() {
            s.shutdown();
        }
        let eps: Vec<_> = self.inner.endpoints.lock().drain(..).collect();
        for ep in eps.iter().filter_map(Weak::upgrade) {
            ep.kill("the local communicator was closed");
        }
        for w in self.inner.notifications.lock().waiters.drain(..) {
            w.wake();
        }
    }
}

impl Drop for RdmaCommunicator {
    fn drop(&mut self) {
        self.close();
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        self.inner.shared.stop();
        if let Some(t) = self.completion.take() {
            let _ = t.join();
        }
    }
}
