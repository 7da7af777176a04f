//! Capabilities: what a `Communicator` or a `Memory` can do, asked before trying.
//!
//! Both structs are `#[non_exhaustive]`: a new capability is a new field with a
//! conservative default, not a breaking change. Implementations start from the
//! conservative constructor and set the fields they support.

use crate::{Device, DeviceKind, TransportId};

/// A set of device kinds: which memory a transport accepts.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemoryKinds {
    /// Every kind, including ones this build does not know.
    Any,
    /// Exactly these kinds (none when empty).
    Only(Vec<DeviceKind>),
}

impl MemoryKinds {
    /// Host memory only.
    pub fn host_only() -> Self {
        MemoryKinds::Only(vec![DeviceKind::HOST])
    }

    /// True when `kind` is in the set.
    pub fn contains(&self, kind: DeviceKind) -> bool {
        match self {
            MemoryKinds::Any => true,
            MemoryKinds::Only(kinds) => kinds.contains(&kind),
        }
    }
}

/// How a transport moves device (non-host) memory that it accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeviceMemoryPath {
    /// Device memory is refused at `register` with [`Error::UnsupportedMemory`](crate::Error::UnsupportedMemory).
    Refused,
    /// Device memory is accepted and handed to an underlying library, which moves it
    /// directly where it was built with that device's support and otherwise falls back
    /// without telling (copies through host memory, or fails at transfer time). Stage
    /// through host buffers when you need to know.
    LibraryDependent,
    /// Device memory moves by DMA, with no copy through host memory.
    Direct,
    /// Device memory registered with its backend
    /// ([`Communicator::register_memory`](crate::Communicator::register_memory)) is
    /// reachable by peers like host memory, and moves through host bounce buffers at this
    /// end: the transport copies it with the device's backend, chunk by chunk, overlapping
    /// the copies with the wire.
    Staged,
}

/// What a [`Communicator`](crate::Communicator) can do. From
/// [`Communicator::capabilities`](crate::Communicator::capabilities).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CommCapabilities {
    /// The transport.
    pub transport: TransportId,
    /// Memory kinds `register` accepts.
    pub local_memory: MemoryKinds,
    /// Memory kinds a peer's exported region may live on for this transport to reach it.
    pub remote_memory: MemoryKinds,
    /// How accepted device memory moves.
    pub device_memory: DeviceMemoryPath,
    /// Device kinds [`Communicator::register_memory`](crate::Communicator::register_memory)
    /// accepts by staging (peers reach them; the bytes cross host bounce buffers here).
    /// [`CommCapabilities::memory_path`] combines it with the fields above.
    pub staged_memory: MemoryKinds,
    /// `notify` and `recv_notification` work.
    pub notifications: bool,
    /// Largest `notify` message in bytes (0 without notifications).
    pub max_notification_len: usize,
    /// Largest single descriptor of a `transfer`, in bytes.
    pub max_transfer_len: u64,
    /// Most descriptors in one `transfer` batch.
    pub max_batch_len: usize,
    /// True when every transfer moves bytes straight from and to registered memory, with
    /// no intermediate copy by the CPU.
    pub zero_copy: bool,
    /// `rekey` revokes keys of a live registration (returns `Ok(true)`).
    pub rekey: bool,
    /// `alloc_registered` has a fast path (returns `Ok(Some(_))`).
    pub alloc_registered: bool,
    /// `rekey` and `import` may wait on a peer (a round trip, or peers ending their
    /// copies), so callers on an async runtime run them where blocking is allowed. False:
    /// both return without waiting on a peer in the common case, and may be called in
    /// place.
    pub key_ops_wait: bool,
}

impl CommCapabilities {
    /// The conservative default: host memory only, both ends; notifications of up to
    /// 4 KiB; no declared transfer or batch limit; not zero-copy; no rekey, no
    /// transport-allocated memory; key operations that may wait.
    pub fn new(transport: TransportId) -> Self {
        CommCapabilities {
            transport,
            local_memory: MemoryKinds::host_only(),
            remote_memory: MemoryKinds::host_only(),
            device_memory: DeviceMemoryPath::Refused,
            staged_memory: MemoryKinds::Only(Vec::new()),
            notifications: true,
            max_notification_len: 4096,
            max_transfer_len: u64::MAX,
            max_batch_len: usize::MAX,
            zero_copy: false,
            rekey: false,
            alloc_registered: false,
            key_ops_wait: true,
        }
    }

    /// Nothing at all: the empty communicator's.
    pub fn none() -> Self {
        CommCapabilities {
            local_memory: MemoryKinds::Only(Vec::new()),
            remote_memory: MemoryKinds::Only(Vec::new()),
            notifications: false,
            max_notification_len: 0,
            max_transfer_len: 0,
            max_batch_len: 0,
            ..CommCapabilities::new(TransportId::NONE)
        }
    }
}

impl CommCapabilities {
    /// How memory of `kind` registered here moves: host memory
    /// [`Direct`](DeviceMemoryPath::Direct)ly; a device kind as
    /// [`CommCapabilities::device_memory`] says where `local_memory` holds it, else
    /// [`Staged`](DeviceMemoryPath::Staged) where `staged_memory` does, else
    /// [`Refused`](DeviceMemoryPath::Refused). The one rule for choosing: direct first,
    /// then staged.
    pub fn memory_path(&self, kind: DeviceKind) -> DeviceMemoryPath {
        if kind == DeviceKind::HOST {
            return if self.local_memory.contains(kind) {
                DeviceMemoryPath::Direct
            } else {
                DeviceMemoryPath::Refused
            };
        }
        if self.local_memory.contains(kind) && self.device_memory != DeviceMemoryPath::Refused {
            return self.device_memory;
        }
        if self.staged_memory.contains(kind) {
            return DeviceMemoryPath::Staged;
        }
        DeviceMemoryPath::Refused
    }
}

/// What a [`Memory`](crate::Memory) backend can do beyond `alloc` and `copy`. From
/// [`Memory::capabilities`](crate::Memory::capabilities).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryCapabilities {
    /// The device the backend allocates on.
    pub device: Device,
    /// The CPU can read and write its buffers directly (host memory).
    pub host_accessible: bool,
    /// [`Memory::copy_async`](crate::Memory::copy_async) works.
    pub async_copy: bool,
    /// [`Memory::export_dmabuf`](crate::Memory::export_dmabuf) may work (the driver can
    /// still refuse a range).
    pub dma_buf: bool,
    /// [`Memory::export_ipc`](crate::Memory::export_ipc) and
    /// [`Memory::open_ipc`](crate::Memory::open_ipc) work.
    pub ipc: bool,
    /// Largest single allocation, in bytes.
    pub max_alloc: usize,
}

impl MemoryCapabilities {
    /// Nothing optional: allocation and synchronous copies only.
    pub fn new(device: Device, max_alloc: usize) -> Self {
        MemoryCapabilities {
            device,
            host_accessible: device.is_host(),
            async_copy: false,
            dma_buf: false,
            ipc: false,
            max_alloc,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_kind_sets_answer_membership() {
        assert!(MemoryKinds::Any.contains(DeviceKind::from_wire_id(200)));
        assert!(MemoryKinds::host_only().contains(DeviceKind::HOST));
        assert!(!MemoryKinds::host_only().contains(DeviceKind::CUDA));
        assert!(
            !CommCapabilities::none()
                .local_memory
                .contains(DeviceKind::HOST)
        );
    }

    #[rstest::rstest]
    #[case::host(DeviceKind::HOST, DeviceMemoryPath::Direct)]
    #[case::direct_device(DeviceKind::CUDA, DeviceMemoryPath::Direct)]
    #[case::staged_device(DeviceKind::ROCM, DeviceMemoryPath::Staged)]
    #[case::refused_device(DeviceKind::MLU, DeviceMemoryPath::Refused)]
    fn the_memory_path_prefers_direct_then_staged(
        #[case] kind: DeviceKind,
        #[case] path: DeviceMemoryPath,
    ) {
        let mut caps = CommCapabilities::new(TransportId::TCP);
        caps.local_memory = MemoryKinds::Only(vec![DeviceKind::HOST, DeviceKind::CUDA]);
        caps.device_memory = DeviceMemoryPath::Direct;
        caps.staged_memory = MemoryKinds::Only(vec![DeviceKind::CUDA, DeviceKind::ROCM]);
        assert_eq!(caps.memory_path(kind), path);
        assert_eq!(
            CommCapabilities::none().memory_path(DeviceKind::HOST),
            DeviceMemoryPath::Refused
        );
    }

    #[test]
    fn host_memory_is_host_accessible_and_device_memory_is_not() {
        let host = MemoryCapabilities::new(Device::HOST, 1);
        assert!(host.host_accessible && !host.async_copy);
        let gpu = MemoryCapabilities::new(Device::new(DeviceKind::CUDA, 0), 1);
        assert!(!gpu.host_accessible);
    }
}
