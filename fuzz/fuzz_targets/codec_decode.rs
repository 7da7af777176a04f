//! Fuzzes `RpcCodec` decoding: it never panics or over-allocates; types without maps
//! re-encode to exactly the input, and a nested type with maps (whose entries may arrive
//! in any order) re-encodes to bytes that decode to the same encoding again.
#![no_main]

use std::collections::BTreeMap;

use hmc_rpc_proto::RpcCodec;
use hmc_rpc_proto::demo::ComplexRequest;
use libfuzzer_sys::fuzz_target;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, PartialEq)]
enum Shape {
    Empty,
    Circle(f64),
    Rect { w: u32, h: u32 },
    Tagged(u8, Option<String>),
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Nested {
    id: u64,
    flag: bool,
    ch: char,
    name: String,
    values: Vec<i64>,
    shapes: Vec<Shape>,
    map: BTreeMap<String, Vec<u16>>,
    next: Option<Box<Nested>>,
    complex: ComplexRequest,
}

fn check<'a, T: Serialize + Deserialize<'a>>(data: &'a [u8]) {
    if let Ok(v) = RpcCodec::decode::<T>(data) {
        assert_eq!(RpcCodec::encode(&v).unwrap(), data);
    }
}

fn check_stable<T: Serialize + for<'a> Deserialize<'a>>(data: &[u8]) {
    if let Ok(v) = RpcCodec::decode::<T>(data) {
        let once = RpcCodec::encode(&v).unwrap();
        let again = RpcCodec::encode(&RpcCodec::decode::<T>(&once).unwrap()).unwrap();
        assert_eq!(once, again);
        assert!(once.len() <= data.len());
    }
}

fuzz_target!(|data: &[u8]| {
    check_stable::<Nested>(data);
    check::<ComplexRequest>(data);
    check::<String>(data);
    check::<Vec<Option<bool>>>(data);
});
