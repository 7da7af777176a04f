//! Two real processes: this test binary runs itself as the peer (`HMC_SHM_CHILD=1`), which
//! registers 64 MiB and prints its address and descriptor. The parent reads and writes all
//! of it with checksums, survives the peer being killed mid-transfer, and runs 1,000
//! connect/transfer/disconnect cycles with a flat fd count.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hmc_backend_cpu::HostMemory;
use hmc_core::testing::pattern;
use hmc_core::{
    Access, Communicator, ConnBuffer, Deadline, Error, MemSpan, MemSpanMut, Op, RegisteredBuffer,
    TransferDesc,
};
use hmc_transport_shm::{ShmCommunicator, ShmConfig};

mod support;
use support::{Peer, checksum, hex, host_buffer};

const LEN: usize = 64 << 20;

/// The tests of this binary run one at a time: the churn test counts the process's file
/// descriptors, which the others open and close.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The peer process: registers `LEN` bytes of `pattern(5)`, prints `READY <addr> <desc>`,
/// answers `check` with `SUM <checksum>`, exits at end of input.
#[test]
fn child_peer() {
    let Some(rt) = support::child_runtime("HMC_SHM_CHILD") else {
        return;
    };
    let _guard = rt.enter();
    let comm = Arc::new(ShmCommunicator::bind(ShmConfig::default()).unwrap());
    let buf = host_buffer(&comm, LEN);
    buf.write_at(0, &MemSpan::host(&pattern(5, LEN))).unwrap();
    println!(
        "READY {} {}",
        comm.address(),
        hex(&buf.export().unwrap().encode())
    );
    for line in std::io::stdin().lines() {
        if line.unwrap().trim() == "check" {
            let mut out = vec![0u8; LEN];
            buf.read_at(0, &mut MemSpanMut::host(&mut out)).unwrap();
            println!("SUM {}", checksum(&out));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_mib_each_way_between_two_processes() {
    let _one_at_a_time = SERIAL.lock().await;
    let mut peer = Peer::spawn(&[("HMC_SHM_CHILD", "1".as_ref())]);
    let me = Arc::new(ShmCommunicator::bind(ShmConfig::default()).unwrap());
    let ep = me
        .connect(&peer.addr, Deadline::after(Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(ep.peer_pid() as u32, peer.child.id());
    let key = me.import(&ep, &peer.desc).unwrap();
    let buf = host_buffer(&me, LEN);
    let d = [TransferDesc {
        local: buf.registration(),
        local_offset: 0,
        remote: &key,
        remote_offset: 0,
        len: LEN,
    }];
    let deadline = || Deadline::after(Duration::from_secs(20));
    me.transfer(&ep, Op::Read, &d, deadline()).await.unwrap();
    let mut got = vec![0u8; LEN];
    buf.read_at(0, &mut MemSpanMut::host(&mut got)).unwrap();
    assert_eq!(
        checksum(&got),
        checksum(&pattern(5, LEN)),
        "read 64 MiB from the peer"
    );
    let mine = pattern(7, LEN);
    buf.write_at(0, &MemSpan::host(&mine)).unwrap();
    me.transfer(&ep, Op::Write, &d, deadline()).await.unwrap();
    assert_eq!(peer.sum(), checksum(&mine), "wrote 64 MiB into the peer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_killed_mid_transfer_fails_the_transfer_before_the_deadline() {
    let _one_at_a_time = SERIAL.lock().await;
    let mut peer = Peer::spawn(&[("HMC_SHM_CHILD", "1".as_ref())]);
    let me = Arc::new(
        ShmCommunicator::bind(ShmConfig {
            chunk_len: 1 << 20,
            ..ShmConfig::default()
        })
        .unwrap(),
    );
    let ep = me
        .connect(&peer.addr, Deadline::after(Duration::from_secs(5)))
        .await
        .unwrap();
    let key = me.import(&ep, &peer.desc).unwrap();
    let buf = host_buffer(&me, LEN);
    let d = [TransferDesc {
        local: buf.registration(),
        local_offset: 0,
        remote: &key,
        remote_offset: 0,
        len: LEN,
    }];
    let limit = Duration::from_secs(15);
    let start = Instant::now();
    let transfers = async {
        loop {
            if let Err(e) = me
                .transfer(&ep, Op::Write, &d, Deadline::after(limit))
                .await
            {
                return e;
            }
        }
    };
    let killer = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        peer.child.kill().unwrap();
    };
    let (err, ()) = tokio::join!(transfers, killer);
    assert!(
        matches!(err, Error::Peer { .. }),
        "peer loss must be a Peer error: {err}"
    );
    assert!(start.elapsed() < limit);
    let again = me
        .transfer(&ep, Op::Read, &d, Deadline::after(Duration::from_secs(5)))
        .await;
    assert!(again.is_err(), "a dead endpoint must fail");
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_connect_transfer_disconnect_cycles_keep_the_fd_count_flat() {
    let _one_at_a_time = SERIAL.lock().await;
    let (a, b) = (
        Arc::new(ShmCommunicator::bind(ShmConfig::default()).unwrap()),
        Arc::new(ShmCommunicator::bind(ShmConfig::default()).unwrap()),
    );
    let mem = Arc::new(HostMemory::new());
    let target = RegisteredBuffer::new(mem.clone(), b.clone(), 4096, Access::READ_WRITE).unwrap();
    let src = RegisteredBuffer::new(mem, a.clone(), 4096, Access::READ_WRITE).unwrap();
    let desc = target.export().unwrap();
    let cycle = || async {
        let ep = a
            .connect(&b.address(), Deadline::after(Duration::from_secs(5)))
            .await
            .unwrap();
        let key = a.import(&ep, &desc).unwrap();
        let d = [TransferDesc {
            local: src.registration(),
            local_offset: 0,
            remote: &key,
            remote_offset: 0,
            len: 4096,
        }];
        a.transfer(&ep, Op::Write, &d, Deadline::after(Duration::from_secs(5)))
            .await
            .unwrap();
    };
    for _ in 0..10 {
        cycle().await;
    }
    let settle = |want: usize| async move {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let n = open_fds();
            if n <= want || Instant::now() > until {
                return n;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let before = settle(0).await;
    for _ in 0..1000 {
        cycle().await;
    }
    let after = settle(before).await;
    assert!(after <= before, "fds grew from {before} to {after}");
    assert_eq!(
        b.outstanding_leases(),
        0,
        "closed connections released their leases"
    );
}
