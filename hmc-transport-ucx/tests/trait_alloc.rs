//! `Communicator::alloc_registered` on UCX, generically and through `AnyCommunicator`: it returns transport-owned host memory that round-trips one-sided writes and reads over TCP and shared memory.

use std::sync::Arc;
use std::time::Duration;

use hmc_core::{
    Access, AnyCommunicator, Communicator, Deadline, LocalRegistration, MemSpan, MemSpanMut, Op,
    Region, TransferDesc,
};
use hmc_transport_ucx::{UcxCommunicator, UcxConfig};
use rstest::rstest;

fn deadline() -> Deadline {
    Deadline::after(Duration::from_secs(20))
}

/// Copies `src` into the host memory at `region` (bounds-checked against it).
fn put(region: Region, src: &[u8]) {
    let r = region.slice(0, src.len()).expect("within the region");
    // SAFETY: `r` lies within live host memory owned by a registration the caller holds;
    // no transfer touches it meanwhile.
    let mut dst = unsafe { MemSpanMut::from_region(r) };
    dst.as_host_slice_mut()
        .expect("alloc_registered memory is host memory")
        .copy_from_slice(src);
}

/// The first `len` bytes of the host memory at `region`.
fn get(region: Region, len: usize) -> Vec<u8> {
    let r = region.slice(0, len).expect("within the region");
    // SAFETY: as in `put`; the span is only read.
    let src = unsafe { MemSpan::from_region(r) };
    src.as_host_slice()
        .expect("alloc_registered memory is host memory")
        .to_vec()
}

/// Writes a pattern from `a`'s transport-allocated memory into `b`'s, then reads it back
/// into cleared local memory, using only the generic trait.
async fn round_trip<C: Communicator>(a: &C, b: &C) {
    let len = (1 << 20) + 13;
    let local = a
        .alloc_registered(len, Access::READ_WRITE)
        .expect("alloc")
        .expect("UCX allocates registered memory itself");
    let target = b
        .alloc_registered(len, Access::READ_WRITE)
        .expect("alloc")
        .expect("UCX allocates registered memory itself");
    assert!(local.region().len >= len && target.region().len >= len);
    assert_eq!(local.access(), Access::READ_WRITE);
    let ep = a.connect(&b.address(), deadline()).await.expect("connect");
    let key = a.import(&ep, &b.export(&target).unwrap()).expect("import");
    let bytes = hmc_core::testing::pattern(9, len);
    put(local.region(), &bytes);
    let d = [TransferDesc {
        local: &local,
        local_offset: 0,
        remote: &key,
        remote_offset: 0,
        len,
    }];
    a.transfer(&ep, Op::Write, &d, deadline())
        .await
        .expect("write");
    assert_eq!(
        get(target.region(), len),
        bytes,
        "written bytes at the target"
    );
    put(local.region(), &vec![0u8; len]);
    a.transfer(&ep, Op::Read, &d, deadline())
        .await
        .expect("read");
    assert_eq!(get(local.region(), len), bytes, "read back");
    drop(key);
}

#[rstest]
#[case::tcp("tcp")]
#[case::shared_memory("posix,cma,self")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trait_alloc_registered_round_trips(#[case] tls: &str) {
    let (a, b) = (
        Arc::new(UcxCommunicator::new(UcxConfig::with_tls(tls)).expect("UCX available")),
        Arc::new(UcxCommunicator::new(UcxConfig::with_tls(tls)).expect("UCX available")),
    );
    round_trip(&*a, &*b).await;
    assert_eq!(a.stats().registered, a.stats().deregistered);
    assert_eq!(b.stats().registered, b.stats().deregistered);

    let (a, b) = (
        AnyCommunicator::new(UcxCommunicator::new(UcxConfig::with_tls(tls)).expect("UCX")),
        AnyCommunicator::new(UcxCommunicator::new(UcxConfig::with_tls(tls)).expect("UCX")),
    );
    round_trip(&a, &b).await;
}
