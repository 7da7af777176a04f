//! `LocalFirst` over TCP: the conformance kit (peers in one process are on one host, so
//! batches go through shared memory), and the choice of path: shared memory between two
//! `LocalFirst`s on this host, TCP when one side runs without shared memory, device-like
//! registrations the shared-memory transport refuses.

use std::sync::Arc;
use std::time::Duration;

use hmc_backend_cpu::HostMemory;
use hmc_core::testing::{Peers, pattern};
use hmc_core::{
    Access, Communicator, ConnBuffer, Deadline, MemSpan, MemSpanMut, Op, PeerAddr,
    RegisteredBuffer, TransferDesc,
};
use hmc_transport_shm::{LocalFirst, ShmCommunicator, ShmConfig};
use hmc_transport_tcp::{AuthSecret, TcpCommunicator, TcpConfig};

type Lf = LocalFirst<TcpCommunicator>;

fn tcp() -> TcpCommunicator {
    let config = TcpConfig {
        // The kit notifies before importing a region: an authenticated connection.
        auth_secret: Some(AuthSecret::new(*b"local-first-kit-secret").unwrap()),
        ..TcpConfig::default()
    };
    let any: PeerAddr = "tcp://127.0.0.1:0".parse().unwrap();
    TcpCommunicator::bind(&any, config).expect("bind tcp")
}

fn both() -> Arc<Lf> {
    Arc::new(LocalFirst::new(
        tcp(),
        ShmCommunicator::bind(ShmConfig::default()).expect("bind shm"),
    ))
}

async fn peers() -> Option<Peers<Lf, HostMemory>> {
    Some(Peers {
        a: both(),
        b: both(),
        memory: Arc::new(HostMemory::new()),
    })
}

hmc_core::communicator_conformance!(peers);

/// Writes 1 MiB from `a` into `b` and reads it back; returns whether the endpoint went
/// through shared memory.
async fn round_trip(a: Arc<Lf>, b: Arc<Lf>) -> bool {
    const LEN: usize = 1 << 20;
    let mem = Arc::new(HostMemory::new());
    let dst = RegisteredBuffer::new(mem.clone(), b.clone(), LEN, Access::READ_WRITE).unwrap();
    let src = RegisteredBuffer::new(mem, a.clone(), LEN, Access::READ_WRITE).unwrap();
    src.write_at(0, &MemSpan::host(&pattern(3, LEN))).unwrap();
    let deadline = || Deadline::after(Duration::from_secs(10));
    let ep = a.connect(&b.address(), deadline()).await.unwrap();
    let key = a.import(&ep, &dst.export().unwrap()).unwrap();
    let d = [TransferDesc {
        local: src.registration(),
        local_offset: 0,
        remote: &key,
        remote_offset: 0,
        len: LEN,
    }];
    a.transfer(&ep, Op::Write, &d, deadline()).await.unwrap();
    let mut got = vec![0u8; LEN];
    dst.read_at(0, &mut MemSpanMut::host(&mut got)).unwrap();
    assert_eq!(got, pattern(3, LEN), "written bytes arrived");
    src.write_at(0, &MemSpan::host(&vec![0u8; LEN])).unwrap();
    a.transfer(&ep, Op::Read, &d, deadline()).await.unwrap();
    src.read_at(0, &mut MemSpanMut::host(&mut got)).unwrap();
    assert_eq!(got, pattern(3, LEN), "read bytes arrived");
    assert_eq!(key.is_local(), ep.uses_shm());
    ep.uses_shm()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_on_one_host_go_through_shared_memory() {
    assert!(round_trip(both(), both()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_side_without_shared_memory_makes_both_use_the_network() {
    let net_only = || Arc::new(LocalFirst::net_only(tcp()));
    assert!(
        !round_trip(both(), net_only()).await,
        "the target offers no shared-memory half"
    );
    assert!(
        !round_trip(net_only(), both()).await,
        "the initiator ignores the half it cannot use"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_side_channel_falls_back_to_the_network() {
    let target = both();
    // The peer's side channel goes away (its shared-memory half is closed) while TCP stays.
    target.shm().unwrap().close();
    assert!(!round_trip(both(), target).await);
}
