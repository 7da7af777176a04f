//! Device memory through vendor IPC: registration by buffer
//! ([`ShmCommunicator::register_device`]), the memory backends a communicator opens peers'
//! handles and copies with ([`ShmCommunicator::add_memory`]), and the initiator's cache of
//! the IPC mappings it opened, one per peer region and local device, closed when the lease
//! ends.
//!
//! A vendor IPC handle belongs to an allocation, not to a `Region`: device memory enters by
//! buffer ([`Memory::export_ipc`] of the backend's `Buffer`), or as a region with its backend
//! ([`Communicator::register_memory`](hmc_core::Communicator::register_memory), through
//! [`Memory::export_ipc_span`], which finds the allocation holding the region, for memory a
//! framework allocated); [`Communicator::register`](hmc_core::Communicator::register) alone
//! refuses it. The key a peer imports is the same registration id and token as for host
//! memory; the IPC descriptor travels only in the target's `Granted` answer, after the
//! token was checked.

use std::sync::atomic::{AtomicU64, Ordering};

use hmc_core::{
    Access, AnyMemory, Device, DeviceBuffer, DeviceKind, Error, IpcDescriptor, MemSpan, MemSpanMut,
    Memory, Op, Region, Result,
};
use parking_lot::{Mutex, RwLock};

use crate::{SHM_TRANSPORT, ShmCommunicator, ShmEndpoint, ShmRegistration};

/// The memory backends a communicator knows, one per device, in the order they were
/// added: what opens peers' IPC handles and copies between them and local memory.
#[derive(Default)]
pub(crate) struct Devices(RwLock<Vec<AnyMemory>>);

impl Devices {
    /// Adds `memory` unless a backend of its device is known already (the first stays).
    pub(crate) fn add(&self, memory: AnyMemory) {
        let mut known = self.0.write();
        let device = memory.device();
        if !known.iter().any(|m| m.device() == device) {
            known.push(memory);
        }
    }

    /// The first backend added for a device of `kind`.
    pub(crate) fn of_kind(&self, kind: DeviceKind) -> Option<AnyMemory> {
        self.0
            .read()
            .iter()
            .find(|m| m.device().kind == kind)
            .cloned()
    }

    /// The device kinds of the known backends.
    pub(crate) fn kinds(&self) -> Vec<DeviceKind> {
        let mut kinds: Vec<DeviceKind> = self.0.read().iter().map(|m| m.device().kind).collect();
        kinds.dedup();
        kinds
    }

    /// Refuses a peer region of `device` when no backend of its kind is known (before a
    /// transfer asks the peer for anything).
    pub(crate) fn check_reachable(&self, device: Device) -> Result<()> {
        if device.is_host() || self.of_kind(device.kind).is_some() {
            return Ok(());
        }
        Err(no_backend(device))
    }

    /// The backend that copies a descriptor between local memory on `local` (`memory` is
    /// the registration's backend when it is device memory) and peer memory of
    /// `remote` (`None`: host memory). `None` for host to host, which needs no backend.
    pub(crate) fn engine(
        &self,
        local: Device,
        memory: Option<&AnyMemory>,
        remote: Option<DeviceKind>,
    ) -> Result<Option<AnyMemory>> {
        match (memory, remote) {
            (None, None) => Ok(None),
            (Some(m), None) => Ok(Some(m.clone())),
            (Some(m), Some(kind)) if kind == local.kind => Ok(Some(m.clone())),
            (Some(_), Some(kind)) => Err(Error::UnsupportedMemory {
                transport: SHM_TRANSPORT,
                device: local,
                reason: format!(
                    "the peer's region is {kind} memory: a copy between {local} here and {kind} \
                     memory needs one engine for both; use a local buffer of {kind} or host \
                     memory"
                ),
            }),
            (None, Some(kind)) => self
                .of_kind(kind)
                .map(Some)
                .ok_or_else(|| no_backend(Device::new(kind, 0))),
        }
    }
}

fn no_backend(device: Device) -> Error {
    let kind = device.kind;
    Error::UnsupportedMemory {
        transport: SHM_TRANSPORT,
        device,
        reason: format!(
            "the peer's region is {kind} memory and this communicator knows no {kind} memory \
             backend to open its IPC handle with; add one with ShmCommunicator::add_memory (or \
             register a {kind} buffer with ShmCommunicator::register_device)"
        ),
    }
}

/// A peer's device registration as this initiator reaches it: the IPC descriptor the
/// target granted and the mappings opened from it, one per local device that copied with
/// it. Closed (unmapped) by [`IpcLease::close`] when the target revokes the lease or the
/// side channel closes; never reopened under the same lease.
pub(crate) struct IpcLease {
    ipc: IpcDescriptor,
    maps: Mutex<Vec<(Device, Box<dyn DeviceBuffer>)>>,
}

impl IpcLease {
    pub(crate) fn new(ipc: IpcDescriptor) -> IpcLease {
        IpcLease {
            ipc,
            maps: Mutex::new(Vec::new()),
        }
    }

    /// The device kind of the peer's memory.
    pub(crate) fn kind(&self) -> DeviceKind {
        self.ipc.kind
    }

    /// Where the peer's memory is mapped for `engine`'s device, opening it (and counting
    /// the opening in `opens`) on first use. Refuses a mapping shorter than the lease's
    /// `len`.
    ///
    /// # Safety
    /// The lease must be live (its validity lock held for reading by the caller), so that
    /// the target still holds the exported buffer, and [`IpcLease::close`] has not run.
    pub(crate) unsafe fn region(
        &self,
        engine: &AnyMemory,
        len: u64,
        opens: &AtomicU64,
    ) -> Result<Region> {
        let device = engine.device();
        let mut maps = self.maps.lock();
        if let Some((_, m)) = maps.iter().find(|(d, _)| *d == device) {
            return Ok(m.region());
        }
        // SAFETY: the descriptor came from the target's `export_ipc` of the registered
        // buffer, which the target keeps allocated until every lease on it is released;
        // the caller holds this lease, and it is released only after `close`.
        let m = unsafe { engine.open_ipc(&self.ipc) }?;
        if (m.len() as u64) < len {
            return Err(Error::Protocol(format!(
                "the peer's IPC mapping is {} bytes, its grant {len}",
                m.len()
            )));
        }
        opens.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(%device, len, "opened a peer's IPC handle");
        let region = m.region();
        maps.push((device, m));
        Ok(region)
    }

    /// Closes every mapping opened under this lease; how many there were.
    pub(crate) fn close(&self) -> usize {
        let closed: Vec<_> = self.maps.lock().drain(..).collect();
        closed.len()
    }

    /// Mappings open now.
    pub(crate) fn open_mappings(&self) -> usize {
        self.maps.lock().len()
    }
}

/// Copies `src` into `dst` (equal lengths; host memory or memory of `engine`'s device) on
/// `engine`.
///
/// # Safety
/// Both regions must be allocated for the call, `dst` not accessed by anything else.
pub(crate) unsafe fn engine_copy(engine: &AnyMemory, dst: Region, src: Region) -> Result<()> {
    // SAFETY: the caller vouches for both ranges for the duration of the call.
    let (mut d, s) = unsafe { (MemSpanMut::from_region(dst), MemSpan::from_region(src)) };
    engine.copy(&mut d, &s)
}

/// [`engine_copy`] in `op`'s direction: READ copies `remote` into `local`, WRITE the
/// other way.
///
/// # Safety
/// As for [`engine_copy`], for both regions.
pub(crate) unsafe fn engine_copy_op(
    engine: &AnyMemory,
    op: Op,
    local: Region,
    remote: Region,
) -> Result<()> {
    let (dst, src) = match op {
        Op::Read => (local, remote),
        Op::Write => (remote, local),
    };
    // SAFETY: forwarded contract.
    unsafe { engine_copy(engine, dst, src) }
}

/// Moves one chunk between `local` (memory of `engine`'s device) and peer host memory
/// reached by cross-memory attach, through a host bounce buffer: `attach` moves the bytes
/// between the bounce buffer (its argument) and the peer, in `op`'s direction.
///
/// # Safety
/// As for [`engine_copy`] with `local`.
pub(crate) unsafe fn via_host(
    engine: &AnyMemory,
    op: Op,
    local: Region,
    attach: impl FnOnce(*mut u8) -> Result<()>,
) -> Result<()> {
    let mut bounce = vec![0u8; local.len];
    let host = Region {
        device: Device::HOST,
        addr: bounce.as_mut_ptr() as u64,
        len: local.len,
    };
    match op {
        Op::Write => {
            // SAFETY: `host` is the bounce buffer, owned here; `local` per the contract.
            unsafe { engine_copy(engine, host, local) }?;
            attach(bounce.as_mut_ptr())
        }
        Op::Read => {
            attach(bounce.as_mut_ptr())?;
            // SAFETY: as above.
            unsafe { engine_copy(engine, local, host) }
        }
    }
}

/// `export`'s IPC descriptor of `region` for peers, or why the same-host transport cannot
/// reach it (a backend without IPC, `has_ipc` false, or an export it does not support) as
/// `UnsupportedMemory`; the backend's other errors as they are.
fn export_for_peers(
    region: Region,
    has_ipc: bool,
    export: impl FnOnce() -> Result<IpcDescriptor>,
) -> Result<IpcDescriptor> {
    let unsupported = |why: String| Error::UnsupportedMemory {
        transport: SHM_TRANSPORT,
        device: region.device,
        reason: format!(
            "{why}; the same-host transport reaches device memory only by vendor IPC: \
             stage the bytes through host memory registered with Communicator::register, \
             or use a transport that moves device memory"
        ),
    };
    if !has_ipc {
        return Err(unsupported(format!(
            "the memory backend of {} cannot export IPC handles (its capabilities say \
             ipc: false)",
            region.device
        )));
    }
    export().map_err(|e| match e {
        Error::Unsupported(why) => unsupported(why),
        e => e,
    })
}

/// Why `Communicator::register` refuses device memory: it needs its backend.
pub(crate) fn needs_backend(region: Region) -> Error {
    Error::UnsupportedMemory {
        transport: SHM_TRANSPORT,
        device: region.device,
        reason: "a Region of device memory does not carry its vendor IPC handle; register it \
                 with its backend (Communicator::register_memory), or the buffer with \
                 ShmCommunicator::register_device"
            .into(),
    }
}

impl ShmEndpoint {
    /// IPC handles of the peer's device memory opened on this endpoint so far: one per
    /// region (and local device), however many transfers use it, and one more after the
    /// peer revokes (drops or rekeys) a region and it is used again.
    pub fn ipc_opens(&self) -> u64 {
        self.inner.shared.ipc_opens.load(Ordering::Relaxed)
    }

    /// Why this side could not open one of the peer's IPC handles (the first time it
    /// could not: another container, no peer access between the devices), or `None`.
    pub fn ipc_refused(&self) -> Option<String> {
        self.inner.shared.ipc_refused.lock().clone()
    }

    /// Whether the peer's region behind `key` is mapped here by vendor IPC already (an
    /// open of its handle succeeded on this endpoint, and its lease is live).
    pub fn ipc_opened(&self, key: &crate::ShmRemoteKey) -> bool {
        let c = self.inner.shared.cache.lock();
        c.by_key.get(&key.key).is_some_and(|l| {
            *l.valid.read() && l.ipc.as_ref().is_some_and(|i| i.open_mappings() > 0)
        })
    }

    /// IPC mappings of the peer's device memory open on this endpoint now.
    pub fn ipc_mappings(&self) -> usize {
        let c = self.inner.shared.cache.lock();
        c.by_id
            .values()
            .filter_map(|l| l.ipc.as_ref())
            .map(IpcLease::open_mappings)
            .sum()
    }
}

impl ShmCommunicator {
    /// Makes `memory` known to this communicator: it opens peers' IPC handles of its device
    /// kind, and copies between them and this process's host memory, when a transfer's
    /// local side is host memory. Needed only by an initiator that registers no device
    /// buffer of that kind itself ([`ShmCommunicator::register_device`] adds its backend).
    /// The first backend added for a device stays; for a kind, the first added is used.
    pub fn add_memory(&self, memory: AnyMemory) {
        self.devices.add(memory);
    }

    /// Whether a peer's memory on `device` can be reached here: host memory, or a kind
    /// this communicator has a backend of (to open the IPC handle with).
    pub(crate) fn reaches(&self, device: Device) -> bool {
        device.is_host() || self.devices.of_kind(device.kind).is_some()
    }

    /// Registers the device buffer `buf` of `memory` for peers, by its vendor IPC handle
    /// ([`Memory::export_ipc`]): a peer's transfer opens the handle once per region (and
    /// per device of its own), caches the mapping, and copies on its device's own engine
    /// ([`Memory::copy`] between the mapping and its local memory). The exported key is
    /// the same id and token as for host memory; the descriptor reaches only a peer that
    /// presents a live token. Dropping (or rekeying) the registration revokes leases as
    /// for host memory, and peers close their mappings before they release them.
    ///
    /// A host buffer is registered as [`Communicator::register`](hmc_core::Communicator::register)
    /// would. As the local side of a transfer, the registration copies with `memory`.
    ///
    /// ```no_run
    /// # async fn demo() -> hmc_core::Result<()> {
    /// use hmc_backend_rocm::RocmMemory;
    /// use hmc_core::{Access, Communicator, Memory};
    /// use hmc_transport_shm::{ShmCommunicator, ShmConfig};
    ///
    /// let comm = ShmCommunicator::bind(ShmConfig::default())?;
    /// let gpu = RocmMemory::new(0)?;
    /// let kv = gpu.alloc(64 << 20)?;
    /// // SAFETY: `kv` outlives `reg` (dropped first, below).
    /// let reg = unsafe { comm.register_device(&gpu, &kv, Access::READ_WRITE)? };
    /// let descriptor = comm.export(&reg)?; // send to a peer on this host
    /// # drop(descriptor);
    /// drop(reg);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::UnsupportedMemory`] naming the reason when the backend cannot export IPC
    /// handles ([`Memory::capabilities`]`.ipc` false, or `export_ipc` unsupported), and
    /// whatever `export_ipc` fails with otherwise; [`Error::InvalidArgument`] for a buffer
    /// of another device than `memory`'s or an empty one.
    ///
    /// # Safety
    /// As for [`Communicator::register`](hmc_core::Communicator::register): `buf` must stay
    /// allocated until the returned registration is dropped, and the caller accepts that
    /// peers with the exported key read or write it at any time.
    pub unsafe fn register_device<M: Memory + Clone>(
        &self,
        memory: &M,
        buf: &M::Buffer,
        access: Access,
    ) -> Result<ShmRegistration> {
        let region = buf.region();
        if region.device.is_host() {
            // SAFETY: the caller's promise about `buf` is `register`'s contract.
            return unsafe { hmc_core::Communicator::register(self, region, access) };
        }
        self.check_open()?;
        if region.device != memory.device() || region.len == 0 {
            return Err(Error::InvalidArgument(format!(
                "register_device: a buffer of {} bytes on {} cannot be registered with the \
                 memory backend of {}; pass a non-empty buffer with the backend that \
                 allocated it",
                region.len,
                region.device,
                memory.device()
            )));
        }
        let ipc = export_for_peers(region, memory.capabilities().ipc, || memory.export_ipc(buf))?;
        let engine = AnyMemory::new(memory.clone());
        self.devices.add(engine.clone());
        self.new_registration(region, access, None, Some(ipc), Some(engine))
    }

    /// Registers `region`, memory of `memory`'s device inside one of its allocations, for
    /// peers by vendor IPC of that allocation, naming only `region`
    /// ([`Memory::export_ipc_span`]): as [`ShmCommunicator::register_device`] does for a
    /// whole buffer, with the same leases, revocation and copies. Host memory is
    /// registered as `register` would.
    ///
    /// # Errors
    /// [`Error::UnsupportedMemory`] with the backend's reason when it cannot export the
    /// range (no IPC, or no address-range query in its runtime), the driver's error when
    /// the range is not device memory it allocated, [`Error::InvalidArgument`] for memory
    /// of another device than `memory`'s.
    ///
    /// # Safety
    /// As for [`Communicator::register`](hmc_core::Communicator::register), and `region`
    /// must be memory of `memory`'s device.
    pub unsafe fn register_span(
        &self,
        region: Region,
        access: Access,
        memory: &AnyMemory,
    ) -> Result<ShmRegistration> {
        if region.device.is_host() {
            // SAFETY: the caller's promise is `register`'s contract.
            return unsafe { hmc_core::Communicator::register(self, region, access) };
        }
        self.check_open()?;
        if region.device != memory.device() {
            return Err(Error::InvalidArgument(format!(
                "register_memory: {} bytes on {} cannot be registered with the memory backend \
                 of {}; pass the backend of the memory's own device",
                region.len,
                region.device,
                memory.device()
            )));
        }
        // SAFETY: the caller vouches that `region` is live memory of `memory`'s device.
        let span = unsafe { MemSpan::from_region(region) };
        let ipc = export_for_peers(region, memory.capabilities().ipc, || {
            memory.export_ipc_span(&span)
        })?;
        self.devices.add(memory.clone());
        self.new_registration(region, access, None, Some(ipc), Some(memory.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hmc_backend_cpu::HostMemory;

    #[test]
    fn engines_follow_the_local_side_and_refuse_what_no_backend_reaches() {
        let devices = Devices::default();
        let rocm = Device::new(DeviceKind::ROCM, 1);
        assert!(devices.engine(Device::HOST, None, None).unwrap().is_none());
        let err = devices
            .engine(Device::HOST, None, Some(DeviceKind::ROCM))
            .unwrap_err();
        assert!(err.to_string().contains("add_memory"), "{err}");
        let host = AnyMemory::new(HostMemory::new());
        let err = devices
            .engine(rocm, Some(&host), Some(DeviceKind::CUDA))
            .unwrap_err();
        assert!(matches!(err, Error::UnsupportedMemory { .. }), "{err}");
        devices.add(host.clone());
        devices.add(AnyMemory::new(HostMemory::new()));
        assert_eq!(
            devices.kinds(),
            [DeviceKind::HOST],
            "one backend per device"
        );
    }

    /// A "device" whose capabilities claim IPC but which keeps `Memory::export_ipc`'s
    /// default (`Unsupported`): its buffers are host bytes labelled as device memory,
    /// never dereferenced here.
    #[derive(Clone)]
    struct ClaimsIpc;
    struct Labelled(Vec<u8>);

    impl DeviceBuffer for Labelled {
        fn region(&self) -> Region {
            Region {
                device: Device::new(DeviceKind::CUDA, 0),
                addr: self.0.as_ptr() as u64,
                len: self.0.len(),
            }
        }
    }

    impl Memory for ClaimsIpc {
        type Buffer = Labelled;
        fn device(&self) -> Device {
            Device::new(DeviceKind::CUDA, 0)
        }
        fn alloc(&self, len: usize) -> Result<Labelled> {
            Ok(Labelled(vec![0; len]))
        }
        fn copy(&self, _: &mut MemSpanMut<'_>, _: &MemSpan<'_>) -> Result<()> {
            unreachable!("register_device copies nothing")
        }
        fn capabilities(&self) -> hmc_core::MemoryCapabilities {
            let mut caps = hmc_core::MemoryCapabilities::new(self.device(), self.max_alloc());
            caps.ipc = true;
            caps
        }
    }

    #[tokio::test]
    async fn an_unsupported_export_is_unsupported_memory_with_the_backends_reason() {
        let comm = ShmCommunicator::bind(crate::ShmConfig::default()).unwrap();
        let buf = ClaimsIpc.alloc(64).unwrap();
        // SAFETY: refused before anything is registered.
        let err = unsafe { comm.register_device(&ClaimsIpc, &buf, Access::READ) }.unwrap_err();
        let Error::UnsupportedMemory { reason, .. } = &err else {
            panic!("expected UnsupportedMemory, got {err:?}");
        };
        assert!(
            reason.contains("does not support IPC export") && reason.contains("stage the bytes"),
            "{err}"
        );
        assert!(comm.devices.kinds().is_empty(), "no backend was added");
    }
}
