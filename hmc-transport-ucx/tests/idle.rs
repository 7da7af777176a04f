//! An idle communicator parks its progress thread on the worker's event fd: connected, with a registered region and an endpoint, it uses (almost) no CPU.

use std::sync::Arc;
use std::time::Duration;

use hmc_backend_cpu::HostMemory;
use hmc_core::{Access, Communicator, ConnBuffer, Deadline, Op, RegisteredBuffer, TransferDesc};
use hmc_transport_ucx::{UcxCommunicator, UcxConfig};
use rstest::rstest;

/// CPU time (clock ticks) used so far by this process's UCX progress threads.
fn progress_thread_ticks() -> u64 {
    hmc_testshim::thread_cpu_ticks("hmc-ucx-127")
}

#[rstest]
#[case::tcp("tcp")]
#[case::shared_memory("posix,cma,self")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connected_communicator_parks_instead_of_spinning(#[case] tls: &str) {
    let a = Arc::new(UcxCommunicator::new(UcxConfig::with_tls(tls)).expect("UCX"));
    let b = Arc::new(UcxCommunicator::new(UcxConfig::with_tls(tls)).expect("UCX"));
    let memory = Arc::new(HostMemory::new());
    let ep = a
        .connect(&b.address(), Deadline::default())
        .await
        .expect("connect");
    let target =
        RegisteredBuffer::new(memory.clone(), b.clone(), 4096, Access::READ_WRITE).expect("target");
    let local = RegisteredBuffer::new(memory, a.clone(), 4096, Access::READ_WRITE).expect("local");
    let key = a.import(&ep, &target.export().unwrap()).expect("import");
    let d = [TransferDesc {
        local: local.registration(),
        local_offset: 0,
        remote: &key,
        remote_offset: 0,
        len: 4096,
    }];
    a.transfer(&ep, Op::Write, &d, Deadline::default())
        .await
        .expect("write");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = progress_thread_ticks();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let used = progress_thread_ticks() - before;
    // Two busy-polling threads would use about 400 ticks (2 s x 2 threads x 100 Hz).
    assert!(
        used <= 20,
        "idle progress threads used {used} ticks in 2 s; they should park on the event fd"
    );
    // And they wake up for work.
    a.transfer(&ep, Op::Read, &d, Deadline::default())
        .await
        .expect("read after idling");
}
