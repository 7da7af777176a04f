//! What the UCX transport can do, as `Communicator::capabilities` reports it.
//!
//! UCX registers whatever address it is given (`ucp_mem_map`) and picks its own way to
//! move it: a UCX built with CUDA or ROCm support detects device memory and moves it with
//! the GPU's copy engines or GPUDirect RDMA; a UCX without it treats the address as host
//! memory, which works only where the device memory is host-mapped. This transport does
//! not check which UCX it loaded, so device memory is reported as
//! [`DeviceMemoryPath::LibraryDependent`]: accepted, never refused up front, and moved
//! however UCX can. Callers that must know stage device memory through host buffers.

use hmc_core::{CommCapabilities, DeviceMemoryPath, MemoryKinds, TransportId};

use crate::UcxConfig;

/// The capabilities of a communicator built with `config`.
pub(crate) fn capabilities(config: &UcxConfig) -> CommCapabilities {
    let mut caps = CommCapabilities::new(TransportId::UCX);
    caps.local_memory = MemoryKinds::Any;
    caps.remote_memory = MemoryKinds::Any;
    caps.device_memory = DeviceMemoryPath::LibraryDependent;
    caps.max_notification_len = config.max_notify_len;
    // Not every UCX transport is zero-copy (shared memory emulates RMA on user memory),
    // and which one UCX picks is its choice: promise nothing.
    caps.zero_copy = false;
    caps.alloc_registered = true;
    caps
}

#[cfg(test)]
mod tests {
    use super::*;
    use hmc_core::DeviceKind;

    #[test]
    fn device_memory_is_accepted_and_said_to_depend_on_the_ucx_build() {
        let caps = capabilities(&UcxConfig::default());
        assert!(caps.local_memory.contains(DeviceKind::CUDA));
        assert_eq!(caps.device_memory, DeviceMemoryPath::LibraryDependent);
        assert!(caps.alloc_registered && !caps.rekey);
        assert_eq!(caps.max_notification_len, 64 << 10);
    }
}
