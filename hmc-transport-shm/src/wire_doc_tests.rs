//! docs/wire.md's side-channel example, read and decoded by this crate's framing.

use hmc_testshim::wire_doc::wire_example;

use crate::wire::{self, Msg};

#[test]
fn the_notify_example_is_a_little_endian_frame() {
    let bytes = wire_example("shm-notify");
    let body = wire::read_frame(&mut &bytes[..], wire::MAX_FRAME)
        .unwrap()
        .unwrap();
    let msg = Msg::decode(&body).unwrap();
    let want = Msg::Notify {
        req: 9,
        tag: 42,
        msg: b"hi!!".to_vec(),
    };
    assert_eq!(want.encode(), bytes);
    assert!(
        matches!(msg, Msg::Notify { req: 9, tag: 42, ref msg } if msg == b"hi!!"),
        "{msg:?}"
    );
}
