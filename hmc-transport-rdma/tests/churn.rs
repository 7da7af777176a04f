//! Connect / transfer / disconnect cycles leave nothing behind (file descriptors, QPs, MRs at the stand-in, accepted QPs at the target), and an idle communicator's completion thread sleeps on the channel fd instead of spinning.

mod common;

use std::sync::Arc;
use std::time::Duration;

use hmc_backend_cpu::HostMemory;
use hmc_core::testing::pattern;
use hmc_core::{Communicator, ConnBuffer, Deadline, MemSpan, MemSpanMut, Op, TransferDesc};
use hmc_testshim::pair::{buffers, reach};

/// The tests of this binary run one at a time: the churn test counts the process's file
/// descriptors and the stand-in's live QPs and MRs, which the other test opens too.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Live objects of the stand-in in this process (`hmc_fake_ibv_live`).
fn live(what: &str) -> i64 {
    // SAFETY: the stand-in's test control, `long hmc_fake_ibv_live(const char *)`; the
    // library is already loaded by the communicators (and stays loaded).
    unsafe {
        let lib = libloading::Library::new(common::standin()).unwrap();
        let f = lib
            .get::<unsafe extern "C" fn(*const std::ffi::c_char) -> std::ffi::c_long>(
                b"hmc_fake_ibv_live",
            )
            .unwrap();
        let name = std::ffi::CString::new(what).unwrap();
        f(name.as_ptr())
    }
}

fn cycles() -> usize {
    if std::env::var_os("HMC_LONG_TESTS").is_some() {
        10_000
    } else {
        1_000
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_transfer_disconnect_cycles_leave_nothing_behind() {
    let _one_at_a_time = SERIAL.lock().await;
    let a = common::comm();
    let b = common::comm();
    let (target, local) = buffers(&Arc::new(HostMemory::new()), &a, &b, 4096);
    let desc = target.export().unwrap();
    let fds = open_fds();
    let counted = !common::hardware();
    let live = |what: &str| if counted { live(what) } else { 0 };
    // The other test of this binary may have ended just before this one took the lock,
    // its target still tearing down the QP of its endpoint (it does so when it sees EOF):
    // the baseline is taken once that is gone, or it would count a QP this test never
    // opened (CI saw a baseline of 1 and an end of 0).
    for _ in 0..100 {
        if live("qps") == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (qps, mrs) = (live("qps"), live("mrs"));
    for i in 0..cycles() {
        let ep = a.connect(&b.address(), Deadline::default()).await.unwrap();
        let key = a.import(&ep, &desc).unwrap();
        let bytes = pattern(i as u64, 64);
        local.write_at(0, &MemSpan::host(&bytes)).unwrap();
        let d = [TransferDesc::new(local.registration(), 0, &key, 0, 64)];
        a.transfer(&ep, Op::Write, &d, Deadline::default())
            .await
            .unwrap();
        let mut got = [0u8; 64];
        target.read_at(0, &mut MemSpanMut::host(&mut got)).unwrap();
        assert_eq!(got[..], bytes[..], "cycle {i}");
    }
    // The target tears its side down when it sees EOF: give it a moment.
    for _ in 0..100 {
        if b.stats().accepted_qps == 0 && live("qps") == qps {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        b.stats().accepted_qps,
        0,
        "the target still holds QPs of closed endpoints"
    );
    assert_eq!(live("qps"), qps, "QPs leaked");
    assert_eq!(live("mrs"), mrs, "MRs leaked");
    let now = open_fds();
    assert!(now <= fds + 4, "file descriptors grew from {fds} to {now}");
}

/// CPU time (clock ticks) used so far by this process's completion threads.
fn completion_thread_ticks() -> u64 {
    hmc_testshim::thread_cpu_ticks("hmc-rdma-cq")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_communicator_sleeps_on_the_completion_channel() {
    let _one_at_a_time = SERIAL.lock().await;
    let a = common::comm();
    let b = common::comm();
    let (target, local) = buffers(&Arc::new(HostMemory::new()), &a, &b, 4096);
    let (ep, key) = reach(&a, &b, &target).await;
    let d = [TransferDesc::new(local.registration(), 0, &key, 0, 4096)];
    a.transfer(&ep, Op::Write, &d, Deadline::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let sleeps = a.stats().sleeps;
    let before = completion_thread_ticks();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let used = completion_thread_ticks() - before;
    // Two spinning threads would use about 400 ticks (2 s x 2 threads x 100 Hz).
    assert!(
        used <= 20,
        "idle completion threads used {used} ticks in 2 s"
    );
    assert!(
        a.stats().sleeps - sleeps <= 2,
        "the thread kept waking up: {:?}",
        a.stats()
    );
    // And it wakes for work: the completion arrives through the channel.
    a.transfer(&ep, Op::Read, &d, Deadline::default())
        .await
        .unwrap();
    assert!(
        a.stats().sleeps > sleeps,
        "the completion thread never armed the CQ"
    );
}
