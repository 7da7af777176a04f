//! docs/wire.md's RDMA control example, read and written by this crate's framing.

use hmc_testshim::wire_doc::wire_example;

use crate::control::{self, NOTIFY};

#[test]
fn the_notify_example_is_a_tag_and_a_message() {
    let bytes = wire_example("rdma-notify");
    let (kind, payload) = control::read_frame(&mut &bytes[..]).unwrap();
    assert_eq!(kind, NOTIFY);
    assert_eq!(u64::from_be_bytes(payload[..8].try_into().unwrap()), 42);
    assert_eq!(&payload[8..], b"don");
    let mut out = Vec::new();
    control::write_frame(&mut out, NOTIFY, &payload).unwrap();
    assert_eq!(out, bytes);
}
