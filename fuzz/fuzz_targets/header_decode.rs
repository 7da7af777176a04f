//! Fuzzes the 48-byte header decoder: it never panics, and whatever it accepts re-encodes
//! to exactly the same bytes.
#![no_main]

use hmc_rpc::frame::{FrameHeader, FrameLimits, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = FrameHeader::decode(data, &FrameLimits::default()) {
        assert_eq!(&h.encode()[..], &data[..HEADER_LEN]);
    }
});
