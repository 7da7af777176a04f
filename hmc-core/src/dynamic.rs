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

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::{
    Access, Communicator, Deadline, Error, LocalRegistration, Notification, Op, PeerAddr, Region,
    RemoteRegion, Result, TransferDesc, TransportId,
};

/// A boxed, `Send` future: what the object-safe methods return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A type-erased endpoint.
#[derive(Clone)]
pub struct DynEndpoint(Arc<dyn Any + Send + Sync>);

/// A type-erased registration; deregisters when dropped.
pub struct DynRegistration {
    inner: Box<dyn Any + Send + Sync>,
    region: Region,
    access: Access,
}

/// A type-erased imported remote key.
pub struct DynRemoteKey(Box<dyn Any + Send + Sync>);

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

fn foreign(what: &str) -> Error {
    Error::InvalidArgument(format!(
        "this {what} was made by a different communicator; use handles with the communicator that made them"
    ))
}

/// The object-safe form of [`Communicator`]. Implemented for every `Communicator`.
pub trait DynCommunicator: Send + Sync + 'static {
    /// See [`Communicator::transport`].
    fn transport(&self) -> TransportId;
    /// See [`Communicator::address`].
    fn address(&self) -> PeerAddr;
    /// See [`Communicator::connect`].
    fn connect<'a>(
        &'a self,
        peer: &'a PeerAddr,
        deadline: Deadline,
    ) -> BoxFuture<'a, Result<DynEndpoint>>;
    /// See [`Communicator::register`].
    ///
    /// # Safety
    /// As for [`Communicator::register`].
    unsafe fn register(&self, region: Region, access: Access) -> Result<DynRegistration>;
    /// See [`Communicator::alloc_registered`].
    fn alloc_registered(&self, len: usize, access: Access) -> Result<Option<DynRegistration>>;
    /// See [`Communicator::export`]; refuses another communicator's registration.
    fn export(&self, reg: &DynRegistration) -> Result<RemoteRegion>;
    /// [`Communicator::rekey`]; a registration of another communicator is refused.
    fn rekey(&self, reg: &DynRegistration) -> Result<bool>;
    /// See [`Communicator::import`].
    fn import(&self, ep: &DynEndpoint, remote: &RemoteRegion) -> Result<DynRemoteKey>;
    /// See [`Communicator::transfer`].
    fn transfer<'a>(
        &'a self,
        ep: &'a DynEndpoint,
        op: Op,
        batch: &'a [TransferDesc<'a, AnyCommunicator>],
        deadline: Deadline,
    ) -> BoxFuture<'a, Result<()>>;
    /// See [`Communicator::notify`].
    fn notify<'a>(
        &'a self,
        ep: &'a DynEndpoint,
        tag: u64,
        msg: &'a [u8],
        deadline: Deadline,
    ) -> BoxFuture<'a, Result<()>>;
    /// See [`Communicator::recv_notification`].
    fn recv_notification(&self, deadline: Deadline) -> BoxFuture<'_, Result<Notification>>;
    /// See [`Communicator::close`].
    fn close(&self);
}

impl<C: Communicator> DynCommunicator for C {
    fn transport(&self) -> TransportId {
        Communicator::transport(self)
    }

    fn address(&self) -> PeerAddr {
        Communicator::address(self)
    }

    fn connect<'a>(
        &'a self,
        peer: &'a PeerAddr,
        deadline: Deadline,
    ) -> BoxFuture<'a, Result<DynEndpoint>> {
        Box::pin(async move {
            let ep = Communicator::connect(self, peer, deadline).await?;
            Ok(DynEndpoint(Arc::new(ep)))
        })
    }

    unsafe fn register(&self, region: Region, access: Access) -> Result<DynRegistration> {
        // SAFETY: the caller upholds `Communicator::register`'s contract, forwarded as is.
        let reg = unsafe { Communicator::register(self, region, access)? };
        Ok(DynRegistration {
            region: reg.region(),
            access: reg.access(),
            inner: Box::new(reg),
        })
    }

    fn alloc_registered(&self, len: usize, access: Access) -> Result<Option<DynRegistration>> {
        Ok(
            Communicator::alloc_registered(self, len, access)?.map(|reg| DynRegistration {
                region: reg.region(),
                access: reg.access(),
                inner: Box::new(reg),
            }),
        )
    }

    fn export(&self, reg: &DynRegistration) -> Result<RemoteRegion> {
        let reg = reg
            .inner
            .downcast_ref::<C::Registration>()
            .ok_or_else(|| foreign("registration"))?;
        Ok(Communicator::export(self, reg))
    }

    fn rekey(&self, reg: &DynRegistration) -> Result<bool> {
        let reg = reg
            .inner
            .downcast_ref::<C::Registration>()
            .ok_or_else(|| foreign("registration"))?;
        Communicator::rekey(self, reg)
    }

    fn import(&self, ep: &DynEndpoint, remote: &RemoteRegion) -> Result<DynRemoteKey> {
        let ep =
            ep.0.downcast_ref::<C::Endpoint>()
                .ok_or_else(|| foreign("endpoint"))?;
        Ok(DynRemoteKey(Box::new(Communicator::import(
            self, ep, remote,
        )?)))
    }

    fn transfer<'a>(
        &'a self,
        ep: &'a DynEndpoint,
        op: Op,
        batch: &'a [TransferDesc<'a, AnyCommunicator>],
        deadline: Deadline,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let ep =
                ep.0.downcast_ref::<C::Endpoint>()
                    .ok_or_else(|| foreign("endpoint"))?;
            let descs = batch
                .iter()
                .map(|d| {
                    Ok(TransferDesc::<C> {
                        local: d
                            .local
                            .inner
                            .downcast_ref()
                            .ok_or_else(|| foreign("registration"))?,
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

    fn notify<'a>(
        &'a self,
        ep: &'a DynEndpoint,
        tag: u64,
        msg: &'a [u8],
        deadline: Deadline,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let ep =
                ep.0.downcast_ref::<C::Endpoint>()
                    .ok_or_else(|| foreign("endpoint"))?;
            Communicator::notify(self, ep, tag, msg, deadline).await
        })
    }

    fn recv_notification(&self, deadline: Deadline) -> BoxFuture<'_, Result<Notification>> {
        Box::pin(Communicator::recv_notification(self, deadline))
    }

    fn close(&self) {
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
            self.0.transport(),
            self.0.address()
        )
    }
}

impl Communicator for AnyCommunicator {
    type Endpoint = DynEndpoint;
    type Registration = DynRegistration;
    type RemoteKey = DynRemoteKey;

    fn transport(&self) -> TransportId {
        self.0.transport()
    }

    fn address(&self) -> PeerAddr {
        self.0.address()
    }

    async fn connect(&self, peer: &PeerAddr, deadline: Deadline) -> Result<DynEndpoint> {
        self.0.connect(peer, deadline).await
    }

    unsafe fn register(&self, region: Region, access: Access) -> Result<DynRegistration> {
        // SAFETY: forwarded contract.
        unsafe { self.0.register(region, access) }
    }

    fn alloc_registered(&self, len: usize, access: Access) -> Result<Option<DynRegistration>> {
        self.0.alloc_registered(len, access)
    }

    fn export(&self, reg: &DynRegistration) -> RemoteRegion {
        // A registration can only come from `register` of this same wrapper (its type is not
        // constructible elsewhere), so a mismatch is a programming error: say so loudly.
        self.0
            .export(reg)
            .expect("AnyCommunicator::export given another communicator's registration")
    }

    fn rekey(&self, reg: &DynRegistration) -> Result<bool> {
        self.0.rekey(reg)
    }

    fn import(&self, ep: &DynEndpoint, remote: &RemoteRegion) -> Result<DynRemoteKey> {
        self.0.import(ep, remote)
    }

    async fn transfer(
        &self,
        ep: &DynEndpoint,
        op: Op,
        batch: &[TransferDesc<'_, Self>],
        deadline: Deadline,
    ) -> Result<()> {
        self.0.transfer(ep, op, batch, deadline).await
    }

    async fn notify(
        &self,
        ep: &DynEndpoint,
        tag: u64,
        msg: &[u8],
        deadline: Deadline,
    ) -> Result<()> {
        self.0.notify(ep, tag, msg, deadline).await
    }

    fn recv_notification(
        &self,
        deadline: Deadline,
    ) -> impl Future<Output = Result<Notification>> + Send {
        self.0.recv_notification(deadline)
    }

    fn close(&self) {
        self.0.close()
    }
}
