//! Tear-down while a peer still streams emulated GETs: a communicator closed mid-transfer
//! and then dropped must destroy its UCX worker without crashing and without leaking it.
//! Its own test binary, so the process-wide progress-thread count is this test's alone.
//!
//! Over shared memory UCX 1.13 emulates a GET of user memory with messages: the target's
//! worker answers each request with GET replies, which wait in the worker while the
//! initiator's queue is full. `ucp_worker_destroy` crashes purging such a reply (CI saw a
//! SIGSEGV in `ucp_mem_rereg_mds` under `ucp_worker_destroy` after the conformance kit's
//! peer-gone case). The engine therefore keeps progressing a closed worker, while its
//! memory is still registered, until it is quiet, and leaks rather than destroys a worker
//! it could not settle (`UcxProcessStats::leaked_workers`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use hmc_backend_cpu::HostMemory;
use hmc_core::{Access, Communicator, ConnBuffer, Deadline, Op, RegisteredBuffer, TransferDesc};
use hmc_transport_ucx::{UcxCommunicator, UcxConfig};

const ROUNDS: usize = 12;
const PAIRS: usize = 4;
const LEN: usize = 16 << 20;

fn comm() -> Arc<UcxCommunicator> {
    Arc::new(UcxCommunicator::new(UcxConfig::with_tls("posix,cma,self")).expect("UCX available"))
}

/// Waits until at most `want` progress threads are alive; returns how many are.
async fn threads_down_to(want: usize) -> usize {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let now = UcxCommunicator::process_stats().progress_threads;
        if now <= want || Instant::now() > until {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// One initiator/target pair: the initiator streams GETs, the target is closed mid-stream
/// after `delay`, its memory deregistered, then the initiator and the target are dropped.
async fn close_mid_stream(memory: Arc<HostMemory>, delay: Duration) {
    let (a, b) = (comm(), comm());
    let ep = a
        .connect(&b.address(), Deadline::after(Duration::from_secs(10)))
        .await
        .expect("connect");
    let target =
        RegisteredBuffer::new(memory.clone(), b.clone(), LEN, Access::READ_WRITE).expect("t");
    let local = RegisteredBuffer::new(memory, a.clone(), LEN, Access::READ_WRITE).expect("l");
    let key = a.import(&ep, &target.export()).expect("import");
    let reads = async {
        let d = [TransferDesc {
            local: local.registration(),
            local_offset: 0,
            remote: &key,
            remote_offset: 0,
            len: LEN,
        }];
        let mut r = Ok(());
        while r.is_ok() {
            r = a
                .transfer(&ep, Op::Read, &d, Deadline::after(Duration::from_secs(20)))
                .await;
        }
        r
    };
    let closer = async {
        tokio::time::sleep(delay).await;
        b.close();
    };
    let (result, ()) = futures::join!(reads, closer);
    assert!(result.is_err(), "reads from a closed peer must fail");
    // As at the end of the conformance kit's peer-gone case: the target's memory is
    // deregistered after its close, then the initiator goes, then the target.
    drop(target);
    drop((key, ep, local, a));
    tokio::time::sleep(delay).await;
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_target_mid_get_stream_tears_down_cleanly() {
    let memory = Arc::new(HostMemory::new());
    for round in 0..ROUNDS {
        // Several pairs at once, as when the conformance kit's tests run in parallel: the
        // crash needed a loaded machine.
        let pairs = (0..PAIRS).map(|p| {
            let delay = Duration::from_millis(1 + ((round * PAIRS + p) % 9) as u64);
            close_mid_stream(memory.clone(), delay)
        });
        futures::future::join_all(pairs).await;
        assert_eq!(
            threads_down_to(0).await,
            0,
            "round {round}: progress threads left"
        );
    }
    assert_eq!(
        UcxCommunicator::process_stats().leaked_workers,
        0,
        "every closed worker settled and was destroyed"
    );
}
