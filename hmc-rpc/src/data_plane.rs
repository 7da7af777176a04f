//! The large-payload data plane slot: `Server<C>`/`Client<C>` take an optional
//! `C: Communicator` for HMC_BUFFER payloads; [`NoDataPlane`] is the always-built empty one.
//!
//! HMC_BUFFER (one-sided pull/push of payloads from 64 KiB through a registered region) is
//! the next issue. Until then a configured data plane is carried but unused, and payloads
//! travel INLINE or TCP_STREAM.

use std::future::Future;

use hmc_core::{
    Access, Communicator, Deadline, Error, LocalRegistration, Notification, Op, PeerAddr, Region,
    RemoteRegion, Result, TransferDesc, TransportId,
};

/// A `Communicator` that has no data plane: every operation reports
/// [`Error::Unavailable`]. The default type parameter of the server and client, like
/// wgpu-hal's `empty` backend: it keeps the generic code honest without a transport.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoDataPlane;

/// Never constructed: [`NoDataPlane::register`] always fails.
#[derive(Debug)]
pub enum NoRegistration {}

impl LocalRegistration for NoRegistration {
    fn region(&self) -> Region {
        match *self {}
    }
    fn access(&self) -> Access {
        match *self {}
    }
}

fn unavailable() -> Error {
    Error::Unavailable {
        what: "RPC data plane".into(),
        reason: "no Communicator was configured for HMC_BUFFER payloads".into(),
        hint: "build the Server/Client with_data_plane(communicator), or send payloads INLINE/TCP_STREAM".into(),
    }
}

impl Communicator for NoDataPlane {
    type Endpoint = ();
    type Registration = NoRegistration;
    type RemoteKey = ();

    fn transport(&self) -> TransportId {
        TransportId::Tcp
    }
    fn address(&self) -> PeerAddr {
        PeerAddr::Opaque {
            transport: TransportId::Tcp,
            bytes: Vec::new(),
        }
    }
    fn connect(&self, _: &PeerAddr, _: Deadline) -> impl Future<Output = Result<()>> + Send {
        std::future::ready(Err(unavailable()))
    }
    // The trait declares `register` unsafe; this one touches no memory and always fails.
    #[allow(unsafe_code)]
    unsafe fn register(&self, _: Region, _: Access) -> Result<NoRegistration> {
        Err(unavailable())
    }
    fn export(&self, reg: &NoRegistration) -> RemoteRegion {
        match *reg {}
    }
    fn import(&self, _: &(), _: &RemoteRegion) -> Result<()> {
        Err(unavailable())
    }
    fn transfer(
        &self,
        _: &(),
        _: Op,
        _: &[TransferDesc<'_, Self>],
        _: Deadline,
    ) -> impl Future<Output = Result<()>> + Send {
        std::future::ready(Err(unavailable()))
    }
    fn notify(
        &self,
        _: &(),
        _: u64,
        _: &[u8],
        _: Deadline,
    ) -> impl Future<Output = Result<()>> + Send {
        std::future::ready(Err(unavailable()))
    }
    fn recv_notification(&self, _: Deadline) -> impl Future<Output = Result<Notification>> + Send {
        std::future::ready(Err(unavailable()))
    }
    fn close(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_operation_reports_unavailable_with_a_hint() {
        let d = NoDataPlane;
        let e = d
            .connect(&d.address(), Deadline::default())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("with_data_plane"), "{e}");
        assert!(d.recv_notification(Deadline::default()).await.is_err());
    }
}
