//! What the process's own mappings allow at an address range (`/proc/self/maps`): checked
//! when host memory is registered, so that a range that is not mapped, or mapped without
//! the rights a registration asks for, is refused there instead of faulting later inside
//! the transport (a peer's WRITE copied into a read-only page kills the process).

use hmc_core::Access;

use crate::error::{EngineError, Result};

/// The rights every byte of `addr..addr + len` is mapped with in this process: the
/// intersection over the mappings that cover it. `Err` when some byte is not mapped at all
/// (the zero page, a freed allocation, an address made up), or mapped with no read right.
pub fn host_range_access(addr: u64, len: usize) -> Result<Access> {
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(|e| {
        EngineError::InvalidArgument(format!(
            "cannot read /proc/self/maps to check {addr:#x}+{len} before registering it: {e}"
        ))
    })?;
    range_access(&maps, addr, len)
}

/// [`host_range_access`] over the text of a maps file.
fn range_access(maps: &str, addr: u64, len: usize) -> Result<Access> {
    let end = addr.checked_add(len as u64).ok_or_else(|| {
        EngineError::InvalidArgument(format!("{addr:#x}+{len} wraps around the address space"))
    })?;
    let unmapped = |at: u64| {
        EngineError::InvalidArgument(format!(
            "{addr:#x}+{len} is not mapped memory of this process (nothing is mapped at {at:#x}); register memory you allocated, and keep it allocated while registered"
        ))
    };
    let mut at = addr;
    let (mut read, mut write) = (true, true);
    // Lines are sorted by address: walk them until the range is covered.
    for line in maps.lines() {
        let Some((range, rest)) = line.split_once(' ') else {
            continue;
        };
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16)) else {
            continue;
        };
        if hi <= at {
            continue;
        }
        if lo > at {
            return Err(unmapped(at));
        }
        let perms = rest.as_bytes();
        read &= perms.first() == Some(&b'r');
        write &= perms.get(1) == Some(&b'w');
        at = hi;
        if at >= end {
            break;
        }
    }
    if at < end {
        return Err(unmapped(at));
    }
    match (read, write) {
        (true, true) => Ok(Access::READ_WRITE),
        (true, false) => Ok(Access::READ),
        _ => Err(EngineError::InvalidArgument(format!(
            "{addr:#x}+{len} is mapped without read access (PROT_NONE or write-only); a transport could not read it"
        ))),
    }
}

/// Refuses to register `addr..addr + len` for `access` unless the mappings allow it.
pub(crate) fn check_host_range(addr: u64, len: usize, access: Access) -> Result<()> {
    let allowed = host_range_access(addr, len)?;
    if !allowed.allows(access) {
        return Err(EngineError::InvalidArgument(format!(
            "{addr:#x}+{len} is mapped read-only, and a registration for {access:?} would let peers WRITE into it (the process would fault); register it with Access::READ, or register writable memory"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    const MAPS: &str = "\
00001000-00003000 rw-p 00000000 00:00 0
00003000-00004000 r--p 00000000 00:00 0 /usr/lib/x
00004000-00005000 rw-p 00000000 00:00 0
00006000-00007000 ---p 00000000 00:00 0
";

    #[rstest]
    #[case::inside_one(0x1000, 0x100, Some(Access::READ_WRITE))]
    #[case::within_one(0x1800, 0x1000, Some(Access::READ_WRITE))]
    #[case::rw_then_ro(0x2800, 0x1000, Some(Access::READ))]
    #[case::read_only(0x3000, 0x10, Some(Access::READ))]
    #[case::three_mappings(0x2000, 0x2800, Some(Access::READ))]
    #[case::gap(0x4800, 0x1000, None)]
    #[case::zero_page(0, 16, None)]
    #[case::past_the_end(0x6800, 16, None)]
    #[case::prot_none(0x6000, 16, None)]
    fn ranges_get_the_rights_of_every_mapping_they_cross(
        #[case] addr: u64,
        #[case] len: usize,
        #[case] want: Option<Access>,
    ) {
        assert_eq!(range_access(MAPS, addr, len).ok(), want);
    }

    #[test]
    fn this_process_s_memory_is_seen_as_it_is_mapped() {
        let v = vec![1u8; 1 << 16];
        assert_eq!(
            host_range_access(v.as_ptr() as u64, v.len()).unwrap(),
            Access::READ_WRITE
        );
        static RODATA: [u8; 64] = [7; 64];
        // A static's bytes are in a read-only segment of the executable.
        let a = host_range_access(RODATA.as_ptr() as u64, RODATA.len()).unwrap();
        assert_eq!(a, Access::READ);
        let e = check_host_range(RODATA.as_ptr() as u64, 64, Access::READ_WRITE).unwrap_err();
        assert!(e.to_string().contains("read-only"), "{e}");
        let e = host_range_access(0, 4096).unwrap_err().to_string();
        assert!(e.contains("not mapped"), "{e}");
    }
}
