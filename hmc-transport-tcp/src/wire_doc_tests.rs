//! docs/wire.md's TCP examples, decoded by this crate's own readers and encoded by its
//! writers: the page shows what the transport sends.

use hmc_core::Error;
use hmc_testshim::wire_doc::wire_example;

use crate::wire::{self, WireDesc};

#[tokio::test]
async fn the_hello_example_is_what_a_dialler_sends() {
    let bytes = wire_example("tcp-hello");
    let hello = wire::read_hello_v(&mut &bytes[..], false)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(hello.version, wire::VERSION);
    assert_eq!(hello.text().unwrap(), "127.0.0.1:4000");
    assert_eq!(wire::encode_hello(None, "127.0.0.1:4000"), bytes);
}

#[test]
fn the_read_example_is_one_descriptor() {
    let bytes = wire_example("tcp-read");
    assert_eq!(bytes[0], wire::REQ_READ);
    assert_eq!(u32::from_be_bytes(bytes[1..5].try_into().unwrap()), 1);
    let desc = WireDesc {
        id: 7,
        token: [0x11; 16],
        offset: 4096,
        len: 65536,
    };
    assert_eq!(WireDesc::decode_all(&bytes[5..]), [desc]);
    let mut encoded = vec![wire::REQ_READ, 0, 0, 0, 1];
    desc.encode(&mut encoded);
    assert_eq!(encoded, bytes);
}

#[tokio::test]
async fn the_limit_status_example_names_its_limit() {
    let bytes = wire_example("tcp-limit-status");
    let e = Error::LimitExceeded {
        limit: "max_batch_descs",
        value: 70000,
        max: 65536,
        hint: "raise".into(),
    };
    assert_eq!(wire::encode_error(&e), bytes);
    let got = wire::read_status(&mut &bytes[..], "peer").await.unwrap();
    match got {
        Err(Error::LimitExceeded {
            limit, value, max, ..
        }) => assert_eq!((limit, value, max), ("max_batch_descs", 70000, 65536)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_abandon_example_names_one_connection() {
    let bytes = wire_example("tcp-abandon");
    assert_eq!(bytes[0], wire::REQ_ABANDON);
    let conn: std::net::SocketAddr = "127.0.0.1:51234".parse().unwrap();
    assert_eq!(
        crate::abandon::encode_request(&crate::conn_name::ConnName::tcp(conn)),
        bytes
    );
    let text = std::str::from_utf8(&bytes[2..]).unwrap();
    assert_eq!(bytes[1] as usize, text.len());
    assert_eq!(text.parse::<std::net::SocketAddr>().unwrap(), conn);
}
