//! `NoCommunicator`: the always-built empty communicator, for generic code that runs without a data plane (wgpu-hal's `empty` backend).

use std::future::Future;

use crate::{
    Access, CommCapabilities, Communicator, Deadline, Error, LocalRegistration, Notification, Op,
    PeerAddr, Region, RemoteRegion, Result, TransferDesc, TransportId,
};

/// A [`Communicator`] with no transport behind it: every operation fails with
/// [`Error::Unavailable`], and its [`capabilities`](Communicator::capabilities) say it can
/// do nothing ([`CommCapabilities::none`]). Use it as the default type parameter of code
/// generic over `C: Communicator`, so that the code builds and runs without any transport.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoCommunicator;

/// The registration type of [`NoCommunicator`]; never constructed, since `register`
/// always fails.
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

fn unavailable(what: &str) -> Error {
    Error::Unavailable {
        what: "data plane".into(),
        reason: format!("NoCommunicator has no transport, so it cannot {what}"),
        hint: "construct a real Communicator (hmc-transport-tcp, hmc-transport-ucx) and pass \
               it instead of NoCommunicator"
            .into(),
    }
}

impl Communicator for NoCommunicator {
    type Endpoint = ();
    type Registration = NoRegistration;
    type RemoteKey = ();

    fn transport(&self) -> TransportId {
        TransportId::NONE
    }

    fn capabilities(&self) -> CommCapabilities {
        CommCapabilities::none()
    }

    fn address(&self) -> PeerAddr {
        PeerAddr::Opaque {
            transport: TransportId::NONE,
            bytes: Vec::new(),
        }
    }

    fn connect(&self, _: &PeerAddr, _: Deadline) -> impl Future<Output = Result<()>> + Send {
        std::future::ready(Err(unavailable("connect")))
    }

    /// Always [`Error::Unavailable`]; touches no memory.
    unsafe fn register(&self, _: Region, _: Access) -> Result<NoRegistration> {
        Err(unavailable("register memory"))
    }

    fn export(&self, reg: &NoRegistration) -> Result<RemoteRegion> {
        match *reg {}
    }

    fn import(&self, _: &(), remote: &RemoteRegion) -> Result<()> {
        remote.check_transport(TransportId::NONE)?;
        Err(unavailable("import regions"))
    }

    fn transfer(
        &self,
        _: &(),
        _: Op,
        _: &[TransferDesc<'_, Self>],
        _: Deadline,
    ) -> impl Future<Output = Result<()>> + Send {
        std::future::ready(Err(unavailable("transfer")))
    }

    fn notify(
        &self,
        _: &(),
        _: u64,
        _: &[u8],
        _: Deadline,
    ) -> impl Future<Output = Result<()>> + Send {
        std::future::ready(Err(unavailable("notify")))
    }

    fn recv_notification(&self, _: Deadline) -> impl Future<Output = Result<Notification>> + Send {
        std::future::ready(Err(unavailable("receive notifications")))
    }

    fn close(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Device, DeviceKind};

    #[test]
    fn every_operation_is_unavailable_and_capabilities_say_so() {
        let c = NoCommunicator;
        let caps = c.capabilities();
        assert!(!caps.local_memory.contains(DeviceKind::HOST));
        assert!(!caps.notifications);
        let host = Region {
            device: Device::HOST,
            addr: 0x1000,
            len: 8,
        };
        // SAFETY: NoCommunicator touches no memory.
        let err = unsafe { c.register(host, Access::READ) }.unwrap_err();
        assert!(err.to_string().contains("NoCommunicator"), "{err}");
        let send = futures::executor::block_on(c.notify(&(), 1, b"x", Deadline::default()));
        assert!(matches!(send, Err(Error::Unavailable { .. })));
        assert!(futures::executor::block_on(c.connect(&c.address(), Deadline::default())).is_err());
    }
}
