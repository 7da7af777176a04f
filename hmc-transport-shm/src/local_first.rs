//! `LocalFirst<C>`: one communicator that moves bytes by cross-memory attach to peers on
//! this host and through a network transport `C` to every other peer, chosen per
//! endpoint without configuration. What the engine's `transport = auto` and the RPC data
//! plane's `auto` use.
//!
//! Every registration is registered with both (shared memory only takes host memory;
//! device memory stays on `C` alone). An export carries both descriptors plus this
//! process's [`HostId`] and shared-memory address. An importer on the same host (same boot
//! id, network and mount namespaces) remembers the peer's shared-memory address on the
//! endpoint; the first batch whose every descriptor has both halves in shared memory
//! connects the shared-memory side channel (once per endpoint) and goes that way. Any other
//! batch, a peer on another host, or a side channel that cannot be opened (a refused
//! `process_vm_*` permission, a socket path this process cannot see) goes through `C`.
//! Notifications always go through `C`, so a notification sent after a WRITE returns
//! still arrives after its bytes: cross-memory attach has copied them when `transfer`
//! returns.

use std::mem::ManuallyDrop;
use std::sync::{Arc, OnceLock};

use hmc_core::{
    Access, CommCapabilities, Communicator, Deadline, Error, LocalRegistration, Notification, Op,
    PeerAddr, Region, RemoteRegion, Result, TransferDesc, TransportId,
};
use parking_lot::Mutex;

use crate::host::HostId;
use crate::{ShmCommunicator, ShmEndpoint, ShmRegistration, ShmRemoteKey};

/// Wire version of the descriptor key [`LocalFirst`] exports.
const KEY_VERSION: u8 = 1;

/// Longest connect to a same-host peer's side channel before the endpoint settles on the
/// network transport: a local Unix socket answers at once or not at all.
const SHM_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Shared memory to peers on this host, `C` to the rest, chosen per endpoint.
///
/// Every registration is registered with both (shared memory takes host memory only;
/// device memory stays on `C`). An export carries both descriptors, this host's identity
/// (boot id, network and mount namespaces) and the shared-memory address. A batch whose
/// every descriptor has both halves on this host goes through shared memory (the side
/// channel is connected once per endpoint, only to a socket of this process's user); any
/// other batch, and every batch after a side channel could not be opened, goes through
/// `C`. Notifications always go through `C`: a notification sent after a WRITE returns
/// arrives after its bytes.
///
/// Both sides of a connection must use `LocalFirst` (its descriptors carry both keys and
/// are refused by a plain `C`).
pub struct LocalFirst<C: Communicator> {
    net: C,
    shm: Option<ShmCommunicator>,
    host: Option<HostId>,
}

impl<C: Communicator + std::fmt::Debug> std::fmt::Debug for LocalFirst<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalFirst")
            .field("net", &self.net)
            .field("shm", &self.shm)
            .finish_non_exhaustive()
    }
}

impl<C: Communicator> LocalFirst<C> {
    /// `net` for every peer, and `shm` for peers on this host.
    pub fn new(net: C, shm: ShmCommunicator) -> Self {
        LocalFirst {
            net,
            shm: Some(shm),
            host: HostId::current(),
        }
    }

    /// `net` for every peer: what [`LocalFirst::new`] degrades to where the shared-memory
    /// transport cannot start. Peers' shared-memory halves are ignored.
    pub fn net_only(net: C) -> Self {
        LocalFirst {
            net,
            shm: None,
            host: HostId::current(),
        }
    }

    /// The network transport.
    pub fn net(&self) -> &C {
        &self.net
    }

    /// The shared-memory transport, when running.
    pub fn shm(&self) -> Option<&ShmCommunicator> {
        self.shm.as_ref()
    }
}

/// An endpoint of [`LocalFirst`]: the network endpoint, and the shared-memory one once a
/// same-host batch needed it.
pub struct LocalFirstEndpoint<C: Communicator> {
    net: C::Endpoint,
    side: Arc<SideChannel>,
}

impl<C: Communicator> Clone for LocalFirstEndpoint<C> {
    fn clone(&self) -> Self {
        LocalFirstEndpoint {
            net: self.net.clone(),
            side: self.side.clone(),
        }
    }
}

impl<C: Communicator> LocalFirstEndpoint<C> {
    /// The network endpoint.
    pub fn net(&self) -> &C::Endpoint {
        &self.net
    }

    /// True once batches to this peer go through shared memory.
    pub fn uses_shm(&self) -> bool {
        matches!(self.side.ep.get(), Some(Some(_)))
    }
}

#[derive(Default)]
struct SideChannel {
    /// The peer's shared-memory address, learned from its first same-host descriptor.
    peer: Mutex<Option<PeerAddr>>,
    /// Connected once: `Some(None)` when it could not be, then `C` carries everything.
    ep: tokio::sync::OnceCell<Option<ShmEndpoint>>,
    /// Set once this side could not open the peer's vendor IPC handles: its device
    /// regions go through `C` (the network transport's staging) from then on.
    ipc_refused: OnceLock<String>,
}

/// Memory registered with [`LocalFirst`]: with `C`, and with shared memory when it is host
/// memory.
pub struct LocalFirstRegistration<C: Communicator> {
    shm: ManuallyDrop<Option<ShmRegistration>>,
    net: ManuallyDrop<C::Registration>,
    /// The memory is the shared-memory transport's (`alloc_registered`): `C` lets go of it
    /// first. Otherwise shared-memory leases are revoked before `C` lets the memory go.
    shm_owns_memory: bool,
}

impl<C: Communicator> LocalFirstRegistration<C> {
    fn new(shm: Option<ShmRegistration>, net: C::Registration, shm_owns_memory: bool) -> Self {
        LocalFirstRegistration {
            shm: ManuallyDrop::new(shm),
            net: ManuallyDrop::new(net),
            shm_owns_memory,
        }
    }
}

impl<C: Communicator> Drop for LocalFirstRegistration<C> {
    fn drop(&mut self) {
        // SAFETY: each field is dropped exactly once, here, and never used after.
        unsafe {
            if self.shm_owns_memory {
                ManuallyDrop::drop(&mut self.net);
                ManuallyDrop::drop(&mut self.shm);
            } else {
                ManuallyDrop::drop(&mut self.shm);
                ManuallyDrop::drop(&mut self.net);
            }
        }
    }
}

impl<C: Communicator> LocalFirstRegistration<C> {
    /// The network transport's registration.
    pub fn net(&self) -> &C::Registration {
        &self.net
    }

    /// True when peers on this host reach it through shared memory.
    pub fn has_shm(&self) -> bool {
        self.shm.is_some()
    }
}

impl<C: Communicator> LocalRegistration for LocalFirstRegistration<C> {
    fn region(&self) -> Region {
        self.net.region()
    }
    fn access(&self) -> Access {
        self.net.access()
    }
}

/// A peer's region imported through [`LocalFirst`].
pub struct LocalFirstKey<C: Communicator> {
    net: C::RemoteKey,
    /// The shared-memory descriptor when the exporter is on this host; imported on the
    /// endpoint's shared-memory side at first use.
    shm: Option<(RemoteRegion, OnceLock<ShmRemoteKey>)>,
}

impl<C: Communicator> LocalFirstKey<C> {
    /// True when the exporter is on this host and offered shared memory.
    pub fn is_local(&self) -> bool {
        self.shm.is_some()
    }
}

/// The two halves of an exported key.
struct Parts {
    net: RemoteRegion,
    shm: Option<(HostId, PeerAddr, RemoteRegion)>,
}

impl Parts {
    fn encode(&self) -> Vec<u8> {
        let net = self.net.encode();
        let mut out = Vec::with_capacity(net.len() + 128);
        out.push(KEY_VERSION);
        out.extend_from_slice(&(net.len() as u32).to_be_bytes());
        out.extend_from_slice(&net);
        if let Some((host, addr, shm)) = &self.shm {
            let addr = addr.to_string();
            let shm = shm.encode();
            out.extend_from_slice(host.bytes());
            out.extend_from_slice(&(addr.len() as u16).to_be_bytes());
            out.extend_from_slice(addr.as_bytes());
            out.extend_from_slice(&(shm.len() as u32).to_be_bytes());
            out.extend_from_slice(&shm);
        }
        let sum = checksum(&out);
        out.extend_from_slice(&sum.to_be_bytes());
        out
    }

    fn decode(key: &[u8]) -> Result<Parts> {
        let bad = |why: &str| {
            Error::InvalidArgument(format!(
                "a LocalFirst descriptor key is malformed ({why}); export it with LocalFirst \
                 on both sides"
            ))
        };
        // The halves travel as one: a key damaged anywhere is refused whole, so neither
        // path can be taken with the other half's bytes changed.
        let Some(body_len) = key.len().checked_sub(8) else {
            return Err(bad("truncated"));
        };
        let (body, sum) = key.split_at(body_len);
        if checksum(body).to_be_bytes() != sum {
            return Err(bad("checksum mismatch"));
        }
        let mut r = Reader(body);
        if r.take(1).ok_or_else(|| bad("empty"))?[0] != KEY_VERSION {
            return Err(bad("unknown version"));
        }
        let net_len = r.u32().ok_or_else(|| bad("truncated"))? as usize;
        let net = RemoteRegion::decode(r.take(net_len).ok_or_else(|| bad("truncated"))?)?;
        if r.0.is_empty() {
            return Ok(Parts { net, shm: None });
        }
        let host: [u8; HostId::LEN] = r
            .take(HostId::LEN)
            .ok_or_else(|| bad("truncated host id"))?
            .try_into()
            .expect("taken to length");
        let addr_len = r.u16().ok_or_else(|| bad("truncated"))? as usize;
        let addr = std::str::from_utf8(r.take(addr_len).ok_or_else(|| bad("truncated"))?)
            .map_err(|_| bad("address is not UTF-8"))?
            .parse::<PeerAddr>()?;
        let shm_len = r.u32().ok_or_else(|| bad("truncated"))? as usize;
        let shm = RemoteRegion::decode(r.take(shm_len).ok_or_else(|| bad("truncated"))?)?;
        if !r.0.is_empty() {
            return Err(bad("trailing bytes"));
        }
        Ok(Parts {
            net,
            shm: Some((HostId::from_bytes(host), addr, shm)),
        })
    }
}

/// FNV-1a over `b`: catches a damaged or spliced key (each half's secret is checked by its
/// own transport).
fn checksum(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
        (h ^ u64::from(*x)).wrapping_mul(0x100_0000_01b3)
    })
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
}

impl<C: Communicator> LocalFirst<C> {
    /// The endpoint's shared-memory side, connected at the first call that needs it.
    async fn shm_endpoint<'e>(
        &self,
        ep: &'e LocalFirstEndpoint<C>,
        deadline: Deadline,
    ) -> Option<&'e ShmEndpoint> {
        let shm = self.shm.as_ref()?;
        let addr = ep.side.peer.lock().clone()?;
        let connected = ep
            .side
            .ep
            .get_or_init(|| async move {
                // The address came from a peer's descriptor: dial only a socket of our own
                // user, as a side channel of this transport always is (mode 0600).
                if let Err(why) = own_socket(&addr) {
                    tracing::warn!(peer = %addr, why, "not dialling a same-host peer's shared-memory address; using the network transport");
                    return None;
                }
                let limit = deadline.min(Deadline::after(SHM_CONNECT_TIMEOUT));
                match shm.connect(&addr, limit).await {
                    Ok(e) => {
                        tracing::debug!(peer = %addr, "same-host peer: transfers go through shared memory");
                        Some(e)
                    }
                    Err(e) => {
                        tracing::warn!(peer = %addr, error = %e, "same-host peer unreachable through shared memory; using the network transport");
                        None
                    }
                }
            })
            .await;
        connected.as_ref()
    }

    /// The shared-memory half of `remote`, imported on `sep` at its first use.
    fn shm_key<'k>(
        shm: &ShmCommunicator,
        sep: &ShmEndpoint,
        remote: &'k LocalFirstKey<C>,
    ) -> Result<&'k ShmRemoteKey> {
        let (desc, cell) = remote.shm.as_ref().expect("checked by the caller");
        if let Some(k) = cell.get() {
            return Ok(k);
        }
        let k = shm.import(sep, desc)?;
        // A racing import of the same key leaves an equal one in the cell.
        let _ = cell.set(k);
        Ok(cell.get().expect("set above"))
    }

    async fn shm_transfer(
        &self,
        shm: &ShmCommunicator,
        sep: &ShmEndpoint,
        op: Op,
        batch: &[TransferDesc<'_, Self>],
        deadline: Deadline,
    ) -> Result<()> {
        let keys = batch
            .iter()
            .map(|d| Self::shm_key(shm, sep, d.remote))
            .collect::<Result<Vec<_>>>()?;
        let descs: Vec<TransferDesc<'_, ShmCommunicator>> = batch
            .iter()
            .zip(&keys)
            .map(|(d, key)| TransferDesc {
                local: d.local.shm.as_ref().expect("checked by the caller"),
                local_offset: d.local_offset,
                remote: *key,
                remote_offset: d.remote_offset,
                len: d.len,
            })
            .collect();
        shm.transfer(sep, op, &descs, deadline).await
    }
}

/// Accepts only `unix://` addresses of a socket file this process's user owns.
fn own_socket(addr: &PeerAddr) -> std::result::Result<(), &'static str> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let PeerAddr::Unix(path) = addr else {
        return Err("not a unix:// address");
    };
    let meta = std::fs::symlink_metadata(path).map_err(|_| "no such socket")?;
    if !meta.file_type().is_socket() {
        return Err("not a socket");
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if meta.uid() != unsafe { libc::geteuid() } {
        return Err("the socket belongs to another user");
    }
    Ok(())
}

impl<C: Communicator> Communicator for LocalFirst<C> {
    type Endpoint = LocalFirstEndpoint<C>;
    type Registration = LocalFirstRegistration<C>;
    type RemoteKey = LocalFirstKey<C>;

    fn transport(&self) -> TransportId {
        TransportId::LOCAL_FIRST
    }

    fn capabilities(&self) -> CommCapabilities {
        let mut caps = self.net.capabilities();
        caps.transport = TransportId::LOCAL_FIRST;
        caps.alloc_registered |= self.shm.is_some();
        // `key_ops_wait` stays the network transport's: the shared-memory half's do not wait.
        caps
    }

    fn address(&self) -> PeerAddr {
        self.net.address()
    }

    async fn connect(&self, peer: &PeerAddr, deadline: Deadline) -> Result<Self::Endpoint> {
        Ok(LocalFirstEndpoint {
            net: self.net.connect(peer, deadline).await?,
            side: Arc::default(),
        })
    }

    unsafe fn register(&self, region: Region, access: Access) -> Result<Self::Registration> {
        // SAFETY: the caller's contract (the region outlives the registration) carries
        // over to both transports; the shared-memory registration drops first.
        let net = unsafe { self.net.register(region, access) }?;
        let shm = match &self.shm {
            // SAFETY: as above.
            Some(shm) if region.device.is_host() => match unsafe { shm.register(region, access) } {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::debug!(error = %e, "not registered for shared memory; peers use the network transport");
                    None
                }
            },
            _ => None,
        };
        Ok(LocalFirstRegistration::new(shm, net, false))
    }

    /// Host memory as [`Communicator::register`]; device memory through the network
    /// transport's own path for it (direct, or staged through its host chunks), so that
    /// every peer reaches it there, and, when the backend exports it by vendor IPC
    /// ([`ShmCommunicator::register_span`]), through shared memory too: a same-host peer
    /// that can open the handle (it has a backend of that kind) then copies it on its own
    /// device with no host bounce; one that cannot uses the network half.
    unsafe fn register_memory(
        &self,
        region: Region,
        access: Access,
        memory: &hmc_core::AnyMemory,
    ) -> Result<Self::Registration> {
        if region.device.is_host() {
            // SAFETY: forwarded contract.
            return unsafe { self.register(region, access) };
        }
        // SAFETY: forwarded contract.
        let net = unsafe { self.net.register_memory(region, access, memory) }?;
        let shm = match &self.shm {
            // SAFETY: as above; the shared-memory registration drops first.
            Some(shm) => match unsafe { shm.register_span(region, access, memory) } {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::debug!(device = %region.device, error = %e, "device memory not shared by vendor IPC; same-host peers use the network transport");
                    None
                }
            },
            None => None,
        };
        Ok(LocalFirstRegistration::new(shm, net, false))
    }

    /// Shared memory when the shared-memory transport runs (a same-host peer maps it and
    /// copies with `memcpy`), registered with `C` too; otherwise `C`'s own fast memory.
    fn alloc_registered(&self, len: usize, access: Access) -> Result<Option<Self::Registration>> {
        if let Some(shm) = &self.shm
            && let Some(r) = shm.alloc_registered(len, access)?
        {
            // SAFETY: the memory is the shared-memory registration's, unmapped when it
            // drops, which the registration's `Drop` does after dropping `net`.
            let net = unsafe { self.net.register(r.region(), access) }?;
            return Ok(Some(LocalFirstRegistration::new(Some(r), net, true)));
        }
        let Some(net) = self.net.alloc_registered(len, access)? else {
            return Ok(None);
        };
        let region = net.region();
        let shm = match &self.shm {
            // SAFETY: the memory is `net`'s, freed when `net` drops, which the
            // registration's `Drop` does after dropping this one.
            Some(shm) if region.device.is_host() => unsafe { shm.register(region, access) }.ok(),
            _ => None,
        };
        Ok(Some(LocalFirstRegistration::new(shm, net, false)))
    }

    fn rekey(&self, reg: &Self::Registration) -> Result<bool> {
        let net = self.net.rekey(&reg.net)?;
        let shm = match (&self.shm, &*reg.shm) {
            (Some(shm), Some(r)) => shm.rekey(r)?,
            _ => true,
        };
        Ok(net && shm)
    }

    fn export(&self, reg: &Self::Registration) -> Result<RemoteRegion> {
        let net = self.net.export(&reg.net)?;
        let shm = match (&self.shm, &*reg.shm, self.host) {
            (Some(shm), Some(r), Some(host)) => Some((host, shm.address(), shm.export(r)?)),
            _ => None,
        };
        let (region, access) = (net.region, net.access);
        Ok(RemoteRegion {
            transport: TransportId::LOCAL_FIRST,
            region,
            access,
            key: Parts { net, shm }.encode(),
        })
    }

    fn import(&self, ep: &Self::Endpoint, remote: &RemoteRegion) -> Result<Self::RemoteKey> {
        remote.check_transport(TransportId::LOCAL_FIRST)?;
        let parts = Parts::decode(&remote.key)?;
        if parts.net.region != remote.region || parts.net.access != remote.access {
            return Err(Error::InvalidArgument(
                "a LocalFirst descriptor's region or access differs from its key's; export it \
                 again"
                    .into(),
            ));
        }
        let net = self.net.import(&ep.net, &parts.net)?;
        let shm = match parts.shm {
            Some((host, addr, desc)) if self.shm.is_some() && Some(host) == self.host => {
                let mut peer = ep.side.peer.lock();
                match &*peer {
                    None => {
                        *peer = Some(addr);
                        Some((desc, OnceLock::new()))
                    }
                    // One peer process has one shared-memory address; a descriptor naming
                    // another came from a third process and goes through `C`.
                    Some(known) if *known == addr => Some((desc, OnceLock::new())),
                    Some(_) => None,
                }
            }
            _ => None,
        };
        Ok(LocalFirstKey { net, shm })
    }

    /// Through shared memory only, once this endpoint's batches go that way and the peer's
    /// region has a shared-memory half; else `Ok(None)`.
    fn view(
        &self,
        ep: &Self::Endpoint,
        remote: &Self::RemoteKey,
        offset: u64,
        len: usize,
        access: Access,
    ) -> Result<Option<hmc_core::RemoteView>> {
        let (Some(shm), Some(Some(sep))) = (&self.shm, ep.side.ep.get()) else {
            return Ok(None);
        };
        if remote.shm.is_none() {
            return Ok(None);
        }
        let key = Self::shm_key(shm, sep, remote)?;
        shm.view(sep, key, offset, len, access)
    }

    /// Device memory registered here on both halves, to a peer region whose IPC handle
    /// this side has opened already (a transfer proved it can), is moved device to device
    /// through shared memory.
    fn moves_device_memory(
        &self,
        ep: &Self::Endpoint,
        local: &Self::Registration,
        remote: &Self::RemoteKey,
    ) -> bool {
        let (Some(_), Some(Some(sep))) = (&self.shm, ep.side.ep.get()) else {
            return false;
        };
        local.shm.is_some()
            && ep.side.ipc_refused.get().is_none()
            && remote
                .shm
                .as_ref()
                .and_then(|(_, k)| k.get())
                .is_some_and(|k| sep.ipc_opened(k))
    }

    async fn transfer(
        &self,
        ep: &Self::Endpoint,
        op: Op,
        batch: &[TransferDesc<'_, Self>],
        deadline: Deadline,
    ) -> Result<()> {
        // Peer device memory goes through shared memory only where this side has a
        // backend of its kind to open the IPC handle with, and has not failed to.
        let ipc_refused = ep.side.ipc_refused.get().is_some();
        let mut device = false;
        let all_local = !batch.is_empty()
            && batch.iter().all(|d| {
                d.local.shm.is_some()
                    && d.remote.shm.as_ref().is_some_and(|(desc, _)| {
                        let dev = !desc.region.device.is_host();
                        device |= dev;
                        !(dev && ipc_refused)
                            && self
                                .shm
                                .as_ref()
                                .is_some_and(|s| s.reaches(desc.region.device))
                    })
            });
        if all_local
            && let Some(shm) = &self.shm
            && let Some(sep) = self.shm_endpoint(ep, deadline).await
        {
            match self.shm_transfer(shm, sep, op, batch, deadline).await {
                Err(e) if device && sep.ipc_refused().is_some() => {
                    // The open failed before that piece's bytes moved. The whole batch
                    // goes again through `C`, which stages the peer's device memory at
                    // the peer (pieces already copied are copied again: the same bytes).
                    let why = sep.ipc_refused().unwrap_or_default();
                    if ep.side.ipc_refused.set(why.clone()).is_ok() {
                        tracing::warn!(peer = %sep.peer(), %why, error = %e, "this side cannot open the same-host peer's device memory by vendor IPC (another container, or no peer access between the devices); its device regions go through the network transport's staging from now on");
                    }
                }
                other => return other,
            }
        }
        let descs: Vec<TransferDesc<'_, C>> = batch
            .iter()
            .map(|d| TransferDesc {
                local: &*d.local.net,
                local_offset: d.local_offset,
                remote: &d.remote.net,
                remote_offset: d.remote_offset,
                len: d.len,
            })
            .collect();
        self.net.transfer(&ep.net, op, &descs, deadline).await
    }

    /// Settles both sides a batch of this endpoint may have gone through: the
    /// shared-memory endpoint, where one is connected, and the network transport's.
    async fn settle(&self, ep: &Self::Endpoint, deadline: Deadline) -> Result<()> {
        if let (Some(shm), Some(Some(sep))) = (&self.shm, ep.side.ep.get()) {
            shm.settle(sep, deadline).await?;
        }
        self.net.settle(&ep.net, deadline).await
    }

    async fn notify(
        &self,
        ep: &Self::Endpoint,
        tag: u64,
        msg: &[u8],
        deadline: Deadline,
    ) -> Result<()> {
        self.net.notify(&ep.net, tag, msg, deadline).await
    }

    async fn recv_notification(&self, deadline: Deadline) -> Result<Notification> {
        self.net.recv_notification(deadline).await
    }

    fn close(&self) {
        self.net.close();
        if let Some(shm) = &self.shm {
            shm.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hmc_core::{Device, DeviceKind};

    fn region(transport: TransportId, key: Vec<u8>) -> RemoteRegion {
        RemoteRegion {
            transport,
            region: Region {
                device: Device::new(DeviceKind::HOST, 0),
                addr: 0x1000,
                len: 4096,
            },
            access: Access::READ_WRITE,
            key,
        }
    }

    #[test]
    fn only_own_unix_sockets_are_dialled() {
        let tcp: PeerAddr = "tcp://127.0.0.1:1".parse().unwrap();
        assert_eq!(own_socket(&tcp), Err("not a unix:// address"));
        let missing: PeerAddr = "unix:///nonexistent/hmc.sock".parse().unwrap();
        assert_eq!(own_socket(&missing), Err("no such socket"));
        let file: PeerAddr = format!("unix://{}", std::env::current_exe().unwrap().display())
            .parse()
            .unwrap();
        assert_eq!(own_socket(&file), Err("not a socket"));
        let dir = std::env::temp_dir().join(format!("hmc-lf-{}.sock", std::process::id()));
        let _l = std::os::unix::net::UnixListener::bind(&dir).unwrap();
        assert_eq!(own_socket(&PeerAddr::Unix(dir.clone())), Ok(()));
        std::fs::remove_file(dir).unwrap();
    }

    #[test]
    fn keys_round_trip_with_and_without_a_shared_memory_half() {
        let net = region(TransportId::TCP, vec![1, 2, 3]);
        let plain = Parts {
            net: net.clone(),
            shm: None,
        };
        let back = Parts::decode(&plain.encode()).unwrap();
        assert_eq!(back.net, net);
        assert!(back.shm.is_none());

        let host = HostId::new("0f8fad5b-d9cb-469f-a165-70867728950e", 7, 9);
        let addr: PeerAddr = "unix:///tmp/x.sock".parse().unwrap();
        let shm = region(TransportId::SHM, vec![9; 24]);
        let both = Parts {
            net: net.clone(),
            shm: Some((host, addr.clone(), shm.clone())),
        };
        let bytes = both.encode();
        let back = Parts::decode(&bytes).unwrap();
        assert_eq!(back.net, net);
        assert_eq!(back.shm, Some((host, addr, shm)));
        for cut in 0..bytes.len() {
            if cut == 5 + net.encode().len() {
                continue; // exactly the net half: a valid key without shared memory
            }
            assert!(
                Parts::decode(&bytes[..cut]).is_err(),
                "a key cut at {cut} must be refused"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(Parts::decode(&longer).is_err(), "trailing bytes");
        let mut v2 = bytes;
        v2[0] = 2;
        assert!(Parts::decode(&v2).is_err(), "unknown version");
    }
}
