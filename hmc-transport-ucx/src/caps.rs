//! What the UCX transport can do, as `Communicator::capabilities` reports it.
//!
//! UCX registers whatever address it is given (`ucp_mem_map`) and picks its own way to
//! move it, but only a UCX built with a device's support (and able to start it: its CUDA
//! module needs the driver) detects that device's memory; another treats a device pointer
//! as host memory, which faults or moves garbage. So device kinds are listed by what the
//! loaded UCX says it moves (`ucp_context_query`'s memory types): CUDA and ROCm memory are
//! [`DeviceMemoryPath::LibraryDependent`] where it moves them (UCX picks CUDA IPC,
//! GPUDirect RDMA or its own pipelined copies). Device memory of every other kind is
//! [`DeviceMemoryPath::Staged`]: registered with its backend (`register_memory`), it is
//! never handed to UCX; peers READ and WRITE it over the control connection through this
//! side's host chunks (`crate::staged`), and plain `register` refuses it.

use std::path::Path;

use hmc_core::{
    CommCapabilities, DeviceKind, DeviceMemoryPath, Error, MemoryKinds, Region, Result, TransportId,
};

use crate::UcxConfig;
use crate::sys::{LIB_ENV, UCS_MEMORY_TYPE_CUDA, UCS_MEMORY_TYPE_HOST, UCS_MEMORY_TYPE_ROCM};

/// The device kinds whose memory a UCX context with `memory_types` (`ucs_memory_type_t`
/// bits) moves.
pub(crate) fn memory_kinds(memory_types: u64) -> Vec<DeviceKind> {
    [
        (UCS_MEMORY_TYPE_HOST, DeviceKind::HOST),
        (UCS_MEMORY_TYPE_CUDA, DeviceKind::CUDA),
        (UCS_MEMORY_TYPE_ROCM, DeviceKind::ROCM),
    ]
    .into_iter()
    .filter(|(bit, _)| memory_types & (1 << bit) != 0)
    .map(|(_, kind)| kind)
    .collect()
}

/// Refuses `region` unless the loaded UCX (at `library`, moving `memory_types`) moves its
/// memory kind: a device pointer must never reach UCX as if it were host memory.
pub(crate) fn check_kind(memory_types: u64, region: Region, library: &Path) -> Result<()> {
    let kind = region.device.kind;
    if kind == DeviceKind::HOST || memory_kinds(memory_types).contains(&kind) {
        return Ok(());
    }
    Err(Error::UnsupportedMemory {
        transport: TransportId::UCX,
        device: region.device,
        reason: format!(
            "the loaded UCX ({}) does not move this memory type (not built or not started \
             with its support; a CUDA-enabled UCX goes in {LIB_ENV}); register it with \
             register_memory and its backend to have it staged for peers",
            library.display()
        ),
    })
}

/// The capabilities of a communicator built with `config` over a UCX context that moves
/// `memory_types`.
pub(crate) fn capabilities(config: &UcxConfig, memory_types: u64) -> CommCapabilities {
    let mut caps = CommCapabilities::new(TransportId::UCX);
    let mut local = memory_kinds(memory_types);
    if !local.contains(&DeviceKind::HOST) {
        // Host memory is what UCX moves without any module; a context that omits it
        // misreports.
        local.insert(0, DeviceKind::HOST);
    }
    caps.device_memory = if local.len() > 1 {
        DeviceMemoryPath::LibraryDependent
    } else {
        DeviceMemoryPath::Refused
    };
    caps.local_memory = MemoryKinds::Only(local);
    // The rest is served through host chunks (`crate::staged`).
    caps.staged_memory = MemoryKinds::Any;
    // A peer's region is moved by the peer's UCX at its end of the RMA: what it exported
    // is what it could register.
    caps.remote_memory = MemoryKinds::Any;
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

    const HOST: u64 = 1 << UCS_MEMORY_TYPE_HOST;
    const CUDA: u64 = 1 << UCS_MEMORY_TYPE_CUDA;
    const CUDA_MANAGED: u64 = 1 << 2;
    const ROCM: u64 = 1 << UCS_MEMORY_TYPE_ROCM;

    #[rstest::rstest]
    #[case::host_only_ucx(HOST, DeviceMemoryPath::Staged, DeviceMemoryPath::Staged)]
    #[case::cuda_ucx(HOST | CUDA | CUDA_MANAGED, DeviceMemoryPath::LibraryDependent, DeviceMemoryPath::Staged)]
    #[case::rocm_ucx(HOST | ROCM, DeviceMemoryPath::Staged, DeviceMemoryPath::LibraryDependent)]
    #[case::host_bit_missing(CUDA, DeviceMemoryPath::LibraryDependent, DeviceMemoryPath::Staged)]
    fn device_memory_is_direct_where_the_loaded_ucx_moves_it_and_staged_elsewhere(
        #[case] memory_types: u64,
        #[case] cuda: DeviceMemoryPath,
        #[case] rocm: DeviceMemoryPath,
    ) {
        let caps = capabilities(&UcxConfig::default(), memory_types);
        assert_eq!(caps.memory_path(DeviceKind::HOST), DeviceMemoryPath::Direct);
        assert_eq!(caps.memory_path(DeviceKind::CUDA), cuda);
        assert_eq!(caps.memory_path(DeviceKind::ROCM), rocm);
        assert_eq!(
            caps.memory_path(DeviceKind::ASCEND),
            DeviceMemoryPath::Staged
        );
        assert!(caps.remote_memory.contains(DeviceKind::CUDA));
        assert!(caps.alloc_registered && !caps.rekey);
        assert_eq!(caps.max_notification_len, 64 << 10);
    }
}
