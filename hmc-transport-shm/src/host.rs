//! Which host and namespaces this process runs in: two processes may use cross-memory
//! attach and each other's Unix sockets only when all of these match.

use std::os::unix::fs::MetadataExt;
use std::sync::OnceLock;

/// This process's host: the kernel's boot id (a new random value at every boot, shared by
/// every container on the machine) and the inodes of the network and mount namespaces
/// (the side channel's socket path must resolve to the same socket on both sides).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HostId([u8; HostId::LEN]);

impl HostId {
    pub(crate) const LEN: usize = 32;

    /// This process's, read once. `None` when `/proc` does not tell (no procfs): then no
    /// peer counts as local.
    pub(crate) fn current() -> Option<HostId> {
        static CURRENT: OnceLock<Option<HostId>> = OnceLock::new();
        *CURRENT.get_or_init(|| {
            let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
            let net = std::fs::metadata("/proc/self/ns/net").ok()?.ino();
            let mnt = std::fs::metadata("/proc/self/ns/mnt").ok()?.ino();
            Some(HostId::new(boot.trim(), net, mnt))
        })
    }

    pub(crate) fn new(boot_id: &str, net_ns: u64, mnt_ns: u64) -> HostId {
        let mut id = [0u8; Self::LEN];
        // The boot id is a UUID: 32 hex digits, 16 bytes. Anything else is hashed into
        // those 16 bytes so that only equal strings give equal ids.
        let hex: Vec<u8> = boot_id.bytes().filter(u8::is_ascii_hexdigit).collect();
        if hex.len() == 32 {
            for (i, pair) in hex.chunks(2).enumerate() {
                let s = std::str::from_utf8(pair).expect("hex digits are ASCII");
                id[i] = u8::from_str_radix(s, 16).expect("checked hex digits");
            }
        } else {
            let h = boot_id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
            });
            id[..8].copy_from_slice(&h.to_be_bytes());
            id[8..16].copy_from_slice(&(boot_id.len() as u64).to_be_bytes());
        }
        id[16..24].copy_from_slice(&net_ns.to_be_bytes());
        id[24..32].copy_from_slice(&mnt_ns.to_be_bytes());
        HostId(id)
    }

    pub(crate) fn bytes(&self) -> &[u8; Self::LEN] {
        &self.0
    }

    pub(crate) fn from_bytes(b: [u8; Self::LEN]) -> HostId {
        HostId(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_host_id_and_namespaces_tell_hosts_apart() {
        let me = HostId::current().expect("procfs is mounted in the test environment");
        assert_eq!(HostId::current(), Some(me), "read once, stable");
        let boot = "0f8fad5b-d9cb-469f-a165-70867728950e";
        let a = HostId::new(boot, 1, 2);
        assert_eq!(a, HostId::new(boot, 1, 2));
        assert_ne!(a, HostId::new(boot, 3, 2), "another network namespace");
        assert_ne!(a, HostId::new(boot, 1, 3), "another mount namespace");
        assert_ne!(
            a,
            HostId::new("1f8fad5b-d9cb-469f-a165-70867728950e", 1, 2),
            "another boot"
        );
        assert_ne!(
            HostId::new("x", 1, 2),
            HostId::new("y", 1, 2),
            "odd boot ids still differ"
        );
        assert_eq!(HostId::from_bytes(*a.bytes()), a);
    }
}
