//! Fuzzes the 48-byte header decoder: it never panics, and whatever it accepts re-encodes
//! to exactly the same bytes. Every input is tried twice: as is, and with its header CRC
//! fixed up, so the fuzzer explores the checks behind the CRC too.
#![no_main]

use hmc_rpc_proto::frame::{FrameHeader, FrameLimits, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fn check(data: &[u8]) {
    if let Ok(h) = FrameHeader::decode(data, &FrameLimits::default()) {
        assert_eq!(&h.encode()[..], &data[..HEADER_LEN]);
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() >= HEADER_LEN {
        let mut fixed = data[..HEADER_LEN].to_vec();
        let crc = crc32c::crc32c(&fixed[..44]);
        fixed[44..48].copy_from_slice(&crc.to_be_bytes());
        check(&fixed);
    }
});
