//! Endpoint churn: 1000 connect/import/transfer/notify/disconnect cycles leave file descriptors and endpoints flat. Its own test binary, so no other test's descriptors blur the count.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hmc_backend_cpu::HostMemory;
use hmc_core::{Access, Communicator, Op, RegisteredBuffer};

mod common;
use common::{comm, deadline, desc};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

async fn thousand_cycles(tls: &str) {
    let (a, b) = (comm(tls), comm(tls));
    let memory = Arc::new(HostMemory::new());
    let target =
        RegisteredBuffer::new(memory.clone(), b.clone(), 4096, Access::READ_WRITE).expect("t");
    let local =
        RegisteredBuffer::new(memory.clone(), a.clone(), 4096, Access::READ_WRITE).expect("l");
    let cycle = || async {
        let ep = a.connect(&b.address(), deadline()).await.expect("connect");
        let key = a.import(&ep, &target.export().unwrap()).expect("import");
        a.transfer(&ep, Op::Write, &[desc(&local, &key, 0, 4096)], deadline())
            .await
            .expect("write");
        a.notify(&ep, 9, b"hi", deadline()).await.expect("notify");
        b.recv_notification(deadline()).await.expect("notification");
    };
    for _ in 0..20 {
        cycle().await;
    }
    let settle = |want: usize| async move {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let now = open_fds();
            if now <= want || Instant::now() > until {
                return now;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let baseline = settle(0).await;
    for _ in 0..1000 {
        cycle().await;
    }
    let after = settle(baseline).await;
    if after > baseline + 2 {
        let mut kinds = std::collections::BTreeMap::<String, usize>::new();
        for e in std::fs::read_dir("/proc/self/fd").expect("fds").flatten() {
            let t = std::fs::read_link(e.path())
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            let t = t.split(':').next().unwrap_or_default().to_string();
            *kinds.entry(t).or_default() += 1;
        }
        eprintln!(
            "open descriptors by kind: {kinds:?}; stats: {:?}; threads: {}",
            a.stats(),
            std::fs::read_dir("/proc/self/task")
                .map(|d| d.count())
                .unwrap_or(0)
        );
    }
    assert!(
        after <= baseline + 2,
        "file descriptors grew from {baseline} to {after} over 1000 endpoint cycles"
    );
    assert_eq!(a.stats().endpoints, 0, "endpoints left alive");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_endpoint_cycles_leave_file_descriptors_flat_over_tcp_then_shared_memory() {
    thousand_cycles("tcp").await;
    thousand_cycles("posix,cma,self").await;
}
