//! Direct copies through UCX's mapping of a remote region (`UcxConfig::direct_mapped`): used over shared memory for regions the target got from `alloc_registered`, never for user memory or TCP, and checked, revoked and counted like the progress-thread path.

use std::sync::Arc;
use std::time::Duration;

use hmc_backend_cpu::HostMemory;
use hmc_core::{
    Access, Communicator, ConnBuffer, Deadline, Error, MemSpan, MemSpanMut, Op, RegisteredBuffer,
    TransferDesc, testing::pattern,
};
use hmc_transport_ucx::{UcxCommunicator, UcxConfig, UcxRegistration};
use rstest::rstest;

const SHM: &str = "posix,cma,self";

fn deadline() -> Deadline {
    Deadline::after(Duration::from_secs(20))
}

fn comm(tls: &str, direct: bool) -> Arc<UcxCommunicator> {
    Arc::new(
        UcxCommunicator::new(UcxConfig {
            direct_mapped: direct,
            ..UcxConfig::with_tls(tls)
        })
        .expect("UCX available"),
    )
}

/// The target's memory: UCX-allocated, or user memory registered with `register`.
enum Target {
    Ucx(UcxRegistration),
    User(RegisteredBuffer<HostMemory, UcxCommunicator>),
}

impl Target {
    fn new(b: &Arc<UcxCommunicator>, len: usize, ucx: bool) -> Self {
        if ucx {
            Target::Ucx(b.alloc_registered(len, Access::READ_WRITE).expect("alloc"))
        } else {
            Target::User(user_buf(b, len))
        }
    }
    fn reg(&self) -> &UcxRegistration {
        match self {
            Target::Ucx(r) => r,
            Target::User(b) => b.registration(),
        }
    }
    fn read(&self, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        match self {
            Target::Ucx(r) => r.read_at(0, &mut out).expect("read_at"),
            Target::User(b) => read_user(b, &mut out),
        }
        out
    }
}

type UserBuf = RegisteredBuffer<HostMemory, UcxCommunicator>;

/// Registered user (host) memory of `c`.
fn user_buf(c: &Arc<UcxCommunicator>, len: usize) -> UserBuf {
    RegisteredBuffer::new(
        Arc::new(HostMemory::new()),
        c.clone(),
        len,
        Access::READ_WRITE,
    )
    .expect("register")
}

fn write_user(b: &UserBuf, src: &[u8]) {
    b.write_at(0, &MemSpan::host(src)).expect("write_at");
}

fn read_user(b: &UserBuf, dst: &mut [u8]) {
    b.read_at(0, &mut MemSpanMut::host(dst)).expect("read_at");
}

/// Writes a pattern at an offset into the target and reads it back into cleared local user
/// memory; returns how many of the two transfers went direct.
async fn round_trip(a: &Arc<UcxCommunicator>, b: &Arc<UcxCommunicator>, ucx_target: bool) -> u64 {
    let len = (256 << 10) + 7;
    let off = 4096u64;
    let target = Target::new(b, len + off as usize, ucx_target);
    let local = user_buf(a, len);
    let ep = a.connect(&b.address(), deadline()).await.expect("connect");
    let key = a
        .import(&ep, &b.export(target.reg()).unwrap())
        .expect("import");
    let bytes = pattern(5, len);
    write_user(&local, &bytes);
    let before = a.stats().direct_transfers;
    let d = [TransferDesc {
        local: local.registration(),
        local_offset: 0,
        remote: &key,
        remote_offset: off,
        len,
    }];
    a.transfer(&ep, Op::Write, &d, deadline())
        .await
        .expect("write");
    assert_eq!(
        &target.read(len + off as usize)[off as usize..],
        &bytes[..],
        "bytes at the target"
    );
    write_user(&local, &vec![0u8; len]);
    a.transfer(&ep, Op::Read, &d, deadline())
        .await
        .expect("read");
    let mut back = vec![0u8; len];
    read_user(&local, &mut back);
    assert_eq!(back, bytes, "read back");
    a.stats().direct_transfers - before
}

#[rstest]
#[case::shm_ucx_memory(SHM, true, true, 2)]
#[case::shm_user_memory(SHM, false, true, 0)]
#[case::shm_direct_off(SHM, true, false, 0)]
#[case::tcp("tcp", true, true, 0)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_only_where_ucx_maps_the_region(
    #[case] tls: &str,
    #[case] ucx_target: bool,
    #[case] direct: bool,
    #[case] expect_direct: u64,
) {
    let (a, b) = (comm(tls, direct), comm(tls, direct));
    assert_eq!(round_trip(&a, &b, ucx_target).await, expect_direct);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_transfers_check_bounds_rights_and_revocation() {
    let (a, b) = (comm(SHM, true), comm(SHM, true));
    let len = 64 << 10;
    let target = b.alloc_registered(len, Access::READ).expect("alloc");
    let local = user_buf(&a, len);
    let ep = a.connect(&b.address(), deadline()).await.expect("connect");
    let key = a.import(&ep, &b.export(&target).unwrap()).expect("import");
    let desc = |remote_offset, len| TransferDesc {
        local: local.registration(),
        local_offset: 0,
        remote: &key,
        remote_offset,
        len,
    };
    // Rights: the region is READ only.
    let e = a
        .transfer(&ep, Op::Write, &[desc(0, 16)], deadline())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::AccessDenied(_)), "{e}");
    // Bounds.
    let e = a
        .transfer(&ep, Op::Read, &[desc(len as u64 - 8, 16)], deadline())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
    assert_eq!(a.stats().direct_transfers, 0, "refused before any copy");
    target.write_at(0, &pattern(3, len)).expect("fill");
    a.transfer(&ep, Op::Read, &[desc(0, len)], deadline())
        .await
        .expect("read");
    assert_eq!(a.stats().direct_transfers, 1);
    let mut back = vec![0u8; len];
    read_user(&local, &mut back);
    assert_eq!(back, pattern(3, len));
    // Deregistration revokes the key here first; later transfers are refused.
    drop(target);
    let e = a
        .transfer(&ep, Op::Read, &[desc(0, 16)], deadline())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidKey(_)), "{e}");
    assert_eq!(a.stats().direct_transfers, 1);
}

/// Many tasks copying through one mapped key while the target deregisters it: every
/// transfer either completes with the right bytes or is refused with `InvalidKey`, and
/// deregistration returns (it waits for running copies, not forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deregistration_during_direct_copies() {
    let (a, b) = (comm(SHM, true), comm(SHM, true));
    let len = 1 << 20;
    let target = b.alloc_registered(len, Access::READ_WRITE).expect("alloc");
    target.write_at(0, &pattern(8, len)).expect("fill");
    let ep = a.connect(&b.address(), deadline()).await.expect("connect");
    let key = Arc::new(a.import(&ep, &b.export(&target).unwrap()).expect("import"));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (a, ep, key) = (a.clone(), ep.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            let local = user_buf(&a, len);
            let (mut ok, mut refused) = (0u32, 0u32);
            for _ in 0..200 {
                let d = [TransferDesc {
                    local: local.registration(),
                    local_offset: 0,
                    remote: &*key,
                    remote_offset: 0,
                    len,
                }];
                match a.transfer(&ep, Op::Read, &d, deadline()).await {
                    Ok(()) => {
                        let mut back = vec![0u8; 64];
                        read_user(&local, &mut back);
                        assert_eq!(back, pattern(8, len)[..64]);
                        ok += 1;
                    }
                    Err(Error::InvalidKey(_)) => {
                        refused += 1;
                        break;
                    }
                    Err(e) => panic!("unexpected error {e}"),
                }
                tokio::task::yield_now().await;
            }
            (ok, refused)
        }));
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    tokio::task::spawn_blocking(move || drop(target))
        .await
        .expect("deregistration returns");
    for t in tasks {
        let (ok, refused) = t.await.expect("task");
        assert!(ok + refused > 0);
    }
}
