//! 1,000 connect/transfer/disconnect cycles leave the process's open file descriptor count where it started.
//!
//! Alone in its own test binary, so no other test opens or closes descriptors meanwhile.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hmc_backend_cpu::HostMemory;
use hmc_core::{Access, Communicator, ConnBuffer, Deadline, Op, RegisteredBuffer, TransferDesc};
use hmc_transport_tcp::{TcpCommunicator, TcpConfig};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

/// Waits until the count drops back to `want` (the target closes its side of each
/// connection asynchronously), or returns what it sees after a few seconds.
async fn settle(want: usize) -> usize {
    let start = Instant::now();
    loop {
        let n = open_fds();
        if n <= want || start.elapsed() > Duration::from_secs(5) {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The count once it has stopped changing for 200 ms.
async fn steady() -> usize {
    let mut last = open_fds();
    let mut since = Instant::now();
    while since.elapsed() < Duration::from_millis(200) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let n = open_fds();
        if n != last {
            (last, since) = (n, Instant::now());
        }
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_connect_transfer_disconnect_cycles_leak_no_descriptors() {
    let any = "tcp://127.0.0.1:0".parse().unwrap();
    let target = Arc::new(TcpCommunicator::bind(&any, TcpConfig::default()).unwrap());
    let initiator = Arc::new(TcpCommunicator::bind(&any, TcpConfig::default()).unwrap());
    let memory = Arc::new(HostMemory::new());
    let remote =
        RegisteredBuffer::new(memory.clone(), target.clone(), 4096, Access::READ_WRITE).unwrap();
    let local = RegisteredBuffer::new(memory, initiator.clone(), 4096, Access::READ_WRITE).unwrap();
    let soon = || Deadline::after(Duration::from_secs(10));
    let cycle = || async {
        let ep = initiator.connect(&target.address(), soon()).await.unwrap();
        let key = initiator.import(&ep, &remote.export().unwrap()).unwrap();
        let d = [TransferDesc::<TcpCommunicator> {
            local: local.registration(),
            local_offset: 0,
            remote: &key,
            remote_offset: 0,
            len: 4096,
        }];
        initiator
            .transfer(&ep, Op::Write, &d, soon())
            .await
            .unwrap();
        initiator.transfer(&ep, Op::Read, &d, soon()).await.unwrap();
        initiator.notify(&ep, 1, b"bye", soon()).await.unwrap();
        target.recv_notification(soon()).await.unwrap();
        // Dropping the endpoint (its last clone) closes its connections.
    };
    // Warm-up: the runtime's own descriptors (epoll, wakers) exist before the baseline.
    cycle().await;
    let before = steady().await;
    for _ in 0..1000 {
        cycle().await;
    }
    let after = settle(before).await;
    assert_eq!(
        after, before,
        "open descriptors before {before}, after 1000 cycles {after}"
    );
}
