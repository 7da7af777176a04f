//! Run-time choice of transport: `DynCommunicator`, an object-safe mirror of `Communicator`, and `AnyCommunicator`, which implements `Communicator` over any of them.
//!
//! Static dispatch stays the default. A program that picks its transport from a flag or a
//! configuration string (`--data-plane ucx|tcp`) wraps the chosen communicator in
//! [`AnyCommunicator`] and passes it wherever a `C: Communicator` is expected, the way
//! `wgpu-hal` pairs its `Api` trait with `Dyn*` adapters. The price is one boxed future and
//! one small descriptor vector per operation.
//!
//! Handles (endpoints, registrations, remote keys) are type-erased; passing a handle made by
//! one communicator to another is refused with [`Error::InvalidArgument`], never a crash.
//! Each registration remembers the communicator that made it, so this holds between two
//! instances of the same transport too.
//!
//! The object-safe methods are named `dyn_*` so that with `use hmc_core::*` a call such as
//! `any.register(..)` has exactly one candidate, [`Communicator::register`].

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::{
    Access, CommCapabilities, Communicator, Deadline, Error, LocalRegistration, Notification, Op,
    PeerAddr, Region, RemoteRegion, RemoteView, Result, TransferDesc, TransportId,
};

/// A boxed, `Send` future: what the object-safe methods return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A type-erased endpoint.
#[derive(Clone)]
pub struct DynEndpoint(Arc<dyn Any + Send + Sync>);

/// A type-erased registration; deregisters when dropped.
pub struct DynRegistration {
    inner: Box<dyn Any + Send + Sync>,
    /// The address of the communicator that made it, checked by every use.
    owner: usize,
    region: Region,
    access: Access,
}

/// A type-erased imported remote key.
pub struct DynRemoteKey(Box<dyn Any + Send + Sync>);

impl DynEndpoint {
    /// The concrete endpoint, if a `C` made it.
    fn of<C: Communicator>(&self) -> Result<&C::Endpoint> {
        self.0
            .downcast_ref::<C::Endpoint>()
            .ok_or_else(|| foreign("endpoint"))
    }
}

impl std::fmt::Debug for DynEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DynEndpoint")
    }
}

impl LocalRegistration for DynRegistration {
    fn region(&self) -> Region {
        self.region
    }
    fn access(&self) -> Access {
        self.access
    }
}

/// The identity of a communicator: its address, unique among live values.
fn identity<C: ?Sized>(comm: &C) -> usize {
    comm as *const C as *const () as usize
}

impl DynRegistration {
    fn wrap<C: Communicator>(comm: &C, reg: C::Registration) -> Self {
        DynRegistration {
            region: reg.region(),
            access: reg.access(),
            owner: identity(comm),
            inner: Box::new(reg),
        }
    }

    /// The concrete registration, if `comm` made it.
    fn of<C: Communicator>(&self, comm: &C) -> Result<&C::Registration> {
        if self.owner != identity(comm) {
            return Err(foreign("registration"));
        }
        self.inner
            .downcast_ref::<C::Registration>()
            .ok_or_else(|| foreign("registration"))
    }
}

fn foreign(what: &str) -> Error {
    Error::InvalidArgument(format!(
        "this {what} was made by a different communicator; use handles with the communicator that made them"
    ))
}

/// The object-safe form of [`Communicator`]. Implemented for every `Communicator`; its
/// methods carry a `dyn_` prefix so they never shadow the generic ones.
pub trait DynCommunicator: Send + Sync + 'static {
    /// See [`Communicator::transport`].
    fn dyn_transport(&self) -> TransportId;
    /// See [`Communicator::capabilities`].
    fn dyn_capabilities(&self) -> CommCapabilities;
    /// See [`Communicator::address`].
    fn dyn_address(&self) -> PeerAddr;
    /// See [`Communicator::connect`].
    fn dyn_connect<'a>(
        &'a self,
        peer: &'a PeerAddr,
        deadline: Deadline,
    ) -> BoxFuture<'a, Result<DynEndpoint>>;
    /// See [`Communicator::register`].
    ///
    /// # Safety
    /// As for [`Communicator::register`].
    unsafe fn dyn_register(&self, region: Region, access: Access) -> Result<DynRegistration>;
    /// See [`Communicator::register_memory`].
    ///
    /// # Safety
    /// As for [`Communicator::register_memory`].
    unsafe fn dyn_register_memory(
        &self,
        region: Region,
        access: Access,
        memory: &crate::AnyMemory,
    ) -> Result<DynRegistration>;
    /// See [`Communicator::alloc_registered`].
    fn dyn_alloc_registered(&self, len: usize, access: Access) -> Result<Option<DynRegistration>>;
    /// See [`Communicator::export`]; refuses another communicator's registration.
    fn dyn_export(&self, reg: &DynRegistration) -> Result<RemoteRegion>;
    /// [`Communicator::rekey`]; a registration of another communicator is refused.
    fn dyn_rekey(&self, reg: &DynRegistration) -> Result<bool>;
    /// See [`Communicator::import`].
    fn dyn_import(&self, ep: &DynEndpoint, remote: &RemoteRegion) -> Result<DynRemoteKey>;
    /// See [`Communicator::view`].
    fn dyn_view(
        &self,
        ep: &DynEndpoint,
        remote: &DynRemoteKey,
        offset: u64,
        len: usize,
        access: Access,
    ) -> Result<Option<RemoteView>>;
    /// See [`Communicator::moves_device_memory`]; `false` for another communicator's
    /// endpoint, registration or key.
    fn dyn_moves_device_memory(
        &self,
        ep: &DynEndpoint,
        local: &DynRegistration,
        remote: &DynRemoteKey,
    ) -> bool;
    /// See [`Communicator::transfer`].
    fn dyn_transfer<'a>(
        &'a self,
        ep: &'a DynEndpoint,
        op: Op,
        batch: &'a [TransferDesc<'a, AnyCommunicator>],
        deadline: Deadline,
    ) -> BoxFuture<'a, Result<()>>;
    /// See [`Communicator::settle`].
    fn dyn_settle<'a>(
        &'a self,
        ep: &'a DynEndpoint,
        deadline: Deadline,
    ) -> BoxFuture<'a, Result<()>>;
    /// See [`Communicator::notify`].
    fn dyn_notify<'a>(
        &'a self,
        ep: &'a DynEndpoint,
        tag: u64,
        msg: &'a [u8],
        deadline: Deadline,
    ) -> BoxFuture<'a, Result<()>>;
    /// See [`Communicator::recv_notification`].
    fn dyn_recv_notification(&self, deadline: Deadline) -> BoxFuture<'_, Result<Notification>>;
    /// See [`Communicator::close`].
    fn dyn_close(&self);
}

impl<C: Communicator> DynCommunicator for C {
    fn dyn_transport(&self) -> TransportId {
        Communicator::transport(self)
    }

    fn dyn_capabilities(&self) -> CommCapabilities {
        Communicator::capabilities(self)
    }

    fn dyn_address(&self) -> PeerAddr {
        Communicator::address(self)
    }

    fn dyn_connect<'a>(
        &'a self,
        peer: &'a PeerAddr,
        deadline: Deadline,
    ) -> BoxFuture<'a, Result<DynEndpoint>> {
        Box::pin(async move {
            let ep = Communicator::connect(self, peer, deadline).await?;
            Ok(DynEndpoint(Arc::new(ep)))
        })
    }

    unsafe fn dyn_register(&self, region: Region, access: Access) -> Result<DynRegistration> {
        // SAFETY: the caller upholds `Communicator::register`'s contract, forwarded as is.
        let reg = unsafe { Communicator::register(self, region, access)? };
        Ok(DynRegistration::wrap(self, reg))
    }

    unsafe fn dyn_register_memory(
        &self,
        region: Region,
        access: Access,
        memory: &crate::AnyMemory,
    ) -> Result<DynRegistration> {
        // SAFETY: the caller upholds `Communicator::register_memory`'s contract, forwarded.
        let reg = unsafe { Communicator::register_memory(self, region, access, memory)? };
        Ok(DynRegistration::wrap(self, reg))
    }

    fn dyn_alloc_registered(&self, len: usize, access: Access) -> Result<Option<DynRegistration>> {
        Ok(Communicator::alloc_registered(self, len, access)?
            .map(|reg| DynRegistration::wrap(self, reg)))
    }

    fn dyn_export(&self, reg: &DynRegistration) -> Result<RemoteRegion> {
        Communicator::export(self, reg.of(self)?)
    }

    fn dyn_rekey(&self, reg: &DynRegistration) -> Result<bool> {
        Communicator::rekey(self, reg.of(self)?)
    }

    fn dyn_import(&self, ep: &DynEndpoint, remote: &RemoteRegion) -> Result<DynRemoteKey> {
        let ep = ep.of::<C>()?;
        Ok(DynRemoteKey(Box::new(Communicator::import(
            self, ep, remote,
        )?)))
    }

    fn dyn_moves_device_memory(
        &self,
        ep: &DynEndpoint,
        local: &DynRegistration,
        remote: &DynRemoteKey,
    ) -> bool {
        match (
            ep.0.downcast_ref::<C::Endpoint>(),
            local.of(self),
            remote.0.downcast_ref::<C::RemoteKey>(),
        ) {
            (Some(ep), Ok(local), Some(key)) => {
                Communicator::moves_device_memory(self, ep, local, key)
            }
            _ => false,
        }
    }

    fn dyn_view(
        &self,
        ep: &DynEndpoint,
        remote: &DynRemoteKey,
        offset: u64,
        len: usize,
        access: Access,
    ) -> Result<Option<RemoteView>> {
        let ep = ep.of::<C>()?;
        let key = remote
            .0
            .downcast_ref::<C::RemoteKey>()
            .ok_or_else(|| foreign("remote key"))?;
        Communicator::view(self, ep, key, offset, len, access)
    }

    fn dyn_transfer<'a>(
        &'a self,
        ep: &'a DynEndpoint,
        op: Op,
        batch: &'a [TransferDesc<'a, AnyCommunicator>],
        deadline: Deadline,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let ep = ep.of::<C>()?;
            let descs = batch
                .iter()
                .map(|d| {
                    Ok(TransferDesc::<C> {
                        local: d.local.of(self)?,
                        local_offset: d.local_offset,
                        remote: d
                            .remote
                            .0
                            .downcast_ref()
                            .ok_or_else(|| foreign("remote key"))?,
                        remote_offset: d.remote_offset,
                        len: d.len,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            Communicator::transfer(self, ep, op, &descs, deadline).await
        })
    }

    fn dyn_settle<'a>(
        &'a self,
        ep: &'a DynEndpoint,
        deadline: Deadline,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let ep = ep.of::<C>()?;
            Communicator::settle(self, ep, deadline).await
        })
    }

    fn dyn_notify<'a>(
        &'a self,
        ep: &'a DynEndpoint,
        tag: u64,
        msg: &'a [u8],
        deadline: Deadline,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let ep = ep.of::<C>()?;
            Communicator::notify(self, ep, tag, msg, deadline).await
        })
    }

    fn dyn_recv_notification(&self, deadline: Deadline) -> BoxFuture<'_, Result<Notification>> {
        Box::pin(Communicator::recv_notification(self, deadline))
    }

    fn dyn_close(&self) {
        Communicator::close(self)
    }
}

/// A `Communicator` chosen at run time. Cheap to clone.
#[derive(Clone)]
pub struct AnyCommunicator(Arc<dyn DynCommunicator>);

impl AnyCommunicator {
    /// Wraps a concrete communicator.
    pub fn new<C: Communicator>(comm: C) -> Self {
        AnyCommunicator(Arc::new(comm))
    }

    /// Wraps a shared communicator.
    pub fn from_arc(comm: Arc<dyn DynCommunicator>) -> Self {
        AnyCommunicator(comm)
    }
}

impl std::fmt::Debug for AnyCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "AnyCommunicator({:?} at {})",
            self.0.dyn_transport(),
            self.0.dyn_address()
        )
    }
}

impl Communicator for AnyCommunicator {
    type Endpoint = DynEndpoint;
    type Registration = DynRegistration;
    type RemoteKey = DynRemoteKey;

    fn transport(&self) -> TransportId {
        self.0.dyn_transport()
    }

    fn capabilities(&self) -> CommCapabilities {
        self.0.dyn_capabilities()
    }

    fn address(&self) -> PeerAddr {
        self.0.dyn_address()
    }

    async fn connect(&self, peer: &PeerAddr, deadline: Deadline) -> Result<DynEndpoint> {
        self.0.dyn_connect(peer, deadline).await
    }

    unsafe fn register(&self, region: Region, access: Access) -> Result<DynRegistration> {
        // SAFETY: forwarded contract.
        unsafe { self.0.dyn_register(region, access) }
    }

    unsafe fn register_memory(
        &self,
        region: Region,
        access: Access,
        memory: &crate::AnyMemory,
    ) -> Result<DynRegistration> {
        // SAFETY: forwarded contract.
        unsafe { self.0.dyn_register_memory(region, access, memory) }
    }

    fn alloc_registered(&self, len: usize, access: Access) -> Result<Option<DynRegistration>> {
        self.0.dyn_alloc_registered(len, access)
    }

    /// Refuses a registration of any other communicator, wrapped or not.
    fn export(&self, reg: &DynRegistration) -> Result<RemoteRegion> {
        self.0.dyn_export(reg)
    }

    fn rekey(&self, reg: &DynRegistration) -> Result<bool> {
        self.0.dyn_rekey(reg)
    }

    fn import(&self, ep: &DynEndpoint, remote: &RemoteRegion) -> Result<DynRemoteKey> {
        self.0.dyn_import(ep, remote)
    }

    fn moves_device_memory(
        &self,
        ep: &DynEndpoint,
        local: &DynRegistration,
        remote: &DynRemoteKey,
    ) -> bool {
        self.0.dyn_moves_device_memory(ep, local, remote)
    }

    fn view(
        &self,
        ep: &DynEndpoint,
        remote: &DynRemoteKey,
        offset: u64,
        len: usize,
        access: Access,
    ) -> Result<Option<RemoteView>> {
        self.0.dyn_view(ep, remote, offset, len, access)
    }

    async fn transfer(
        &self,
        ep: &DynEndpoint,
        op: Op,
        batch: &[TransferDesc<'_, Self>],
        deadline: Deadline,
    ) -> Result<()> {
        self.0.dyn_transfer(ep, op, batch, deadline).await
    }

    async fn settle(&self, ep: &DynEndpoint, deadline: Deadline) -> Result<()> {
        self.0.dyn_settle(ep, deadline).await
    }

    async fn notify(
        &self,
        ep: &DynEndpoint,
        tag: u64,
        msg: &[u8],
        deadline: Deadline,
    ) -> Result<()> {
        self.0.dyn_notify(ep, tag, msg, deadline).await
    }

    fn recv_notification(
        &self,
        deadline: Deadline,
    ) -> impl Future<Output = Result<Notification>> + Send {
        self.0.dyn_recv_notification(deadline)
    }

    fn close(&self) {
        self.0.dyn_close()
    }
}
