//! Open identifiers: `TransportId` and `DeviceKind`, newtypes over their stable wire numbers, with named constants for HMC's own and a range for third parties.
//!
//! Both travel on the wire (in [`RemoteRegion`](crate::RemoteRegion) descriptors and
//! [`PeerAddr`](crate::PeerAddr) text), so their numbers never change. A backend outside
//! this repository (an EFA or vendor-NIC transport, an NPU allocator) picks a number in
//! [`TransportId::THIRD_PARTY`] / [`DeviceKind::THIRD_PARTY`], documents it in its crate,
//! and needs no change here. Any number decodes; only a transport's `import` refuses a
//! descriptor it does not own ([`RemoteRegion::check_transport`](crate::RemoteRegion::check_transport)).

use std::fmt;
use std::ops::RangeInclusive;

/// Which transport produced a descriptor: a stable wire number.
///
/// Numbers `1..=127` are assigned here ([`TransportId::TCP`], [`TransportId::UCX`],
/// [`TransportId::RDMA`]); `128..=255` ([`TransportId::THIRD_PARTY`]) are for transports
/// outside this repository; `0` ([`TransportId::NONE`]) is the empty communicator's.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TransportId(u8);

impl TransportId {
    /// No transport: [`NoCommunicator`](crate::NoCommunicator), which moves nothing.
    pub const NONE: TransportId = TransportId(0);
    /// `hmc-transport-tcp`.
    pub const TCP: TransportId = TransportId(1);
    /// `hmc-transport-ucx`.
    pub const UCX: TransportId = TransportId(2);
    /// Reserved for an RDMA verbs transport (`hmc-transport-rdma`).
    pub const RDMA: TransportId = TransportId(3);
    /// `hmc-transport-shm`: processes of one host, by cross-memory attach.
    pub const SHM: TransportId = TransportId(4);
    /// `hmc-transport-shm`'s `LocalFirst`: shared memory to peers on the same host, a
    /// network transport to the rest (its descriptors carry both keys).
    pub const LOCAL_FIRST: TransportId = TransportId(5);
    /// Numbers a transport outside this repository may take without a change to
    /// `hmc-core`. Pick one, document it in the crate, and refuse others' descriptors.
    pub const THIRD_PARTY: RangeInclusive<u8> = 128..=255;

    const NAMES: [(TransportId, &'static str); 6] = [
        (Self::NONE, "None"),
        (Self::TCP, "Tcp"),
        (Self::UCX, "Ucx"),
        (Self::RDMA, "Rdma"),
        (Self::SHM, "Shm"),
        (Self::LOCAL_FIRST, "LocalFirst"),
    ];

    /// The transport with wire number `id`. Every number is accepted: an unknown one is
    /// a transport this build does not know, not an error.
    pub const fn from_wire_id(id: u8) -> Self {
        TransportId(id)
    }

    /// Stable wire number.
    pub const fn wire_id(self) -> u8 {
        self.0
    }

    /// The name of a transport of this repository, `None` for any other number.
    pub fn name(self) -> Option<&'static str> {
        Self::NAMES
            .iter()
            .find(|(id, _)| *id == self)
            .map(|(_, n)| *n)
    }
}

impl fmt::Debug for TransportId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "TransportId({})", self.0),
        }
    }
}

impl fmt::Display for TransportId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "transport {}", self.0),
        }
    }
}

/// The family of a device: a stable wire number.
///
/// Numbers `0..=127` are assigned here ([`DeviceKind::HOST`], [`DeviceKind::CUDA`],
/// [`DeviceKind::ROCM`], [`DeviceKind::MLU`], [`DeviceKind::MUSA`], and the reserved
/// [`DeviceKind::ASCEND`]); `128..=255` ([`DeviceKind::THIRD_PARTY`]) are for backends
/// outside this repository.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceKind(u8);

impl DeviceKind {
    /// Host (CPU) memory.
    pub const HOST: DeviceKind = DeviceKind(0);
    /// NVIDIA CUDA.
    pub const CUDA: DeviceKind = DeviceKind(1);
    /// AMD ROCm, and HIP-compatible Hygon DCUs.
    pub const ROCM: DeviceKind = DeviceKind(2);
    /// Cambricon MLU (CNRT).
    pub const MLU: DeviceKind = DeviceKind(3);
    /// Moore Threads MUSA.
    pub const MUSA: DeviceKind = DeviceKind(4);
    /// Reserved for Huawei Ascend NPUs (ACL); `hmc-backend-ascend` (ACL loaded at run time).
    pub const ASCEND: DeviceKind = DeviceKind(5);
    /// Numbers a device backend outside this repository may take without a change to
    /// `hmc-core`.
    pub const THIRD_PARTY: RangeInclusive<u8> = 128..=255;

    const NAMES: [(DeviceKind, &'static str); 6] = [
        (Self::HOST, "Host"),
        (Self::CUDA, "Cuda"),
        (Self::ROCM, "Rocm"),
        (Self::MLU, "Mlu"),
        (Self::MUSA, "Musa"),
        (Self::ASCEND, "Ascend"),
    ];

    /// The kind with wire number `id`; every number is accepted.
    pub const fn from_wire_id(id: u8) -> Self {
        DeviceKind(id)
    }

    /// Stable wire number.
    pub const fn wire_id(self) -> u8 {
        self.0
    }

    /// The name of a kind of this repository, `None` for any other number.
    pub fn name(self) -> Option<&'static str> {
        Self::NAMES
            .iter()
            .find(|(k, _)| *k == self)
            .map(|(_, n)| *n)
    }
}

impl fmt::Debug for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "DeviceKind({})", self.0),
        }
    }
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "device kind {}", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case(TransportId::TCP, 1, "Tcp")]
    #[case(TransportId::UCX, 2, "Ucx")]
    #[case(TransportId::RDMA, 3, "Rdma")]
    #[case(TransportId::from_wire_id(200), 200, "TransportId(200)")]
    fn transport_ids_keep_their_numbers_and_names(
        #[case] id: TransportId,
        #[case] wire: u8,
        #[case] debug: &str,
    ) {
        assert_eq!(id.wire_id(), wire);
        assert_eq!(TransportId::from_wire_id(wire), id);
        assert_eq!(format!("{id:?}"), debug);
    }

    #[rstest]
    #[case(DeviceKind::HOST, 0, "Host")]
    #[case(DeviceKind::CUDA, 1, "Cuda")]
    #[case(DeviceKind::ROCM, 2, "Rocm")]
    #[case(DeviceKind::MLU, 3, "Mlu")]
    #[case(DeviceKind::MUSA, 4, "Musa")]
    #[case(DeviceKind::ASCEND, 5, "Ascend")]
    #[case(DeviceKind::from_wire_id(201), 201, "device kind 201")]
    fn device_kinds_keep_their_numbers_and_names(
        #[case] kind: DeviceKind,
        #[case] wire: u8,
        #[case] display: &str,
    ) {
        assert_eq!(kind.wire_id(), wire);
        assert_eq!(DeviceKind::from_wire_id(wire), kind);
        assert_eq!(kind.to_string(), display);
    }

    #[test]
    fn third_party_ranges_do_not_overlap_assigned_numbers() {
        for id in TransportId::NAMES.iter().map(|(id, _)| id.wire_id()) {
            assert!(!TransportId::THIRD_PARTY.contains(&id));
        }
        for id in DeviceKind::NAMES.iter().map(|(k, _)| k.wire_id()) {
            assert!(!DeviceKind::THIRD_PARTY.contains(&id));
        }
    }
}
