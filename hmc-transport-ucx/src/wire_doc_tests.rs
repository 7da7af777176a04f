//! docs/wire.md's UCX control example, read and written by this crate's framing.

use hmc_testshim::wire_doc::wire_example;

use crate::control::{self, STAGED_READ};

#[test]
fn the_staged_read_example_is_a_frame_of_four_numbers() {
    let bytes = wire_example("ucx-staged-read");
    let (kind, payload) = control::read_frame(&mut &bytes[..]).unwrap();
    assert_eq!(kind, STAGED_READ);
    let n: Vec<u64> = payload
        .chunks_exact(8)
        .map(|c| u64::from_be_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(n, [1, 2, 0, 524288], "request, region, offset, length");
    let mut out = Vec::new();
    control::write_frame(&mut out, STAGED_READ, &payload).unwrap();
    assert_eq!(out, bytes);
}
