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
use hmc_core::{Access, Communicator, Deadline, Op, RegisteredBuffer};
use hmc_transport_ucx::UcxCommunicator;

mod common;
use common::{desc, hex, unhex};

const ROUNDS: usize = 12;
const PAIRS: usize = 4;
const LEN: usize = 16 << 20;

fn comm() -> Arc<UcxCommunicator> {
    common::comm("posix,cma,self")
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
    let key = a.import(&ep, &target.export().unwrap()).expect("import");
    let reads = async {
        let d = [desc(&local, &key, 0, LEN)];
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

/// The tests of this binary count process-wide progress threads: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_target_mid_get_stream_tears_down_cleanly() {
    let _serial = SERIAL.lock().await;
    let leaked_before = UcxCommunicator::process_stats().leaked_workers;
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
        leaked_before,
        "every closed worker settled and was destroyed"
    );
}

const CHILD_ENV: &str = "HMC_UCX_TEARDOWN_CHILD";

/// Not a test of its own: the body of the child process the next test kills. It streams
/// GETs of the parent's region (`$HMC_UCX_TEARDOWN_CHILD` = "address descriptor") until
/// it is killed, saying `STARTED` after the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_initiator() {
    let Ok(peer) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (addr, region) = peer.split_once(' ').expect("address and descriptor");
    let addr: hmc_core::PeerAddr = addr.parse().expect("address");
    let remote = hmc_core::RemoteRegion::decode(&unhex(region)).expect("descriptor");
    let a = comm();
    let ep = a
        .connect(&addr, Deadline::after(Duration::from_secs(10)))
        .await
        .expect("connect");
    let key = a.import(&ep, &remote).expect("import");
    let local = RegisteredBuffer::new(Arc::new(HostMemory::new()), a.clone(), LEN, Access::WRITE)
        .expect("local");
    let d = [desc(&local, &key, 0, LEN)];
    let parent = std::os::unix::process::parent_id();
    for i in 0.. {
        a.transfer(&ep, Op::Read, &d, Deadline::after(Duration::from_secs(20)))
            .await
            .expect("read");
        if i == 0 {
            println!("STARTED");
        }
        if std::os::unix::process::parent_id() != parent {
            return; // orphaned: the test process is gone
        }
    }
}

/// The other way round: the initiator is SIGKILLed while this process serves its GETs,
/// then this side's registration and communicator are dropped. UCX's GET replies to the
/// dead process may still wait in the worker; tear-down must not crash on them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_initiator_killed_mid_get_stream_does_not_crash_the_targets_teardown() {
    let _serial = SERIAL.lock().await;
    for round in 0..3 {
        let b = comm();
        let target =
            RegisteredBuffer::new(Arc::new(HostMemory::new()), b.clone(), LEN, Access::READ)
                .expect("target");
        let mut child = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                "child_initiator",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(
                CHILD_ENV,
                format!(
                    "{} {}",
                    b.address(),
                    hex(&target.export().unwrap().encode())
                ),
            )
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("spawn child");
        let out = child.stdout.take().expect("stdout");
        let started = tokio::task::spawn_blocking(move || {
            use std::io::BufRead;
            std::io::BufReader::new(out)
                .lines()
                .map_while(|l| l.ok())
                .any(|l| l.contains("STARTED"))
        });
        let started = tokio::time::timeout(Duration::from_secs(30), started).await;
        tokio::time::sleep(Duration::from_millis(3 + 7 * round)).await;
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            matches!(started, Ok(Ok(true))),
            "round {round}: the child never streamed: {started:?}"
        );
        drop(target);
        drop(b);
        assert_eq!(
            threads_down_to(0).await,
            0,
            "round {round}: progress thread left"
        );
    }
}
