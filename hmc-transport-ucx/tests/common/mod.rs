//! Helpers shared by the UCX integration tests: communicators, descriptors, and the hex
//! encoding test processes use to pass descriptors to each other.
// Each test binary compiles this module and uses only part of it.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use hmc_backend_cpu::HostMemory;
use hmc_core::{ConnBuffer, Deadline, RegisteredBuffer, TransferDesc};
use hmc_transport_ucx::{UcxCommunicator, UcxConfig, UcxRemoteKey};

/// A communicator over `UCX_TLS=tls` (set per communicator, not in the environment).
pub fn comm(tls: &str) -> Arc<UcxCommunicator> {
    Arc::new(UcxCommunicator::new(UcxConfig::with_tls(tls)).expect("UCX available"))
}

/// The deadline of one step of a test.
pub fn deadline() -> Deadline {
    Deadline::after(Duration::from_secs(20))
}

/// One descriptor: `len` bytes from the start of `local` to or from `remote_offset`.
pub fn desc<'a>(
    local: &'a RegisteredBuffer<HostMemory, UcxCommunicator>,
    key: &'a UcxRemoteKey,
    remote_offset: u64,
    len: usize,
) -> TransferDesc<'a, UcxCommunicator> {
    TransferDesc {
        local: local.registration(),
        local_offset: 0,
        remote: key,
        remote_offset,
        len,
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}
