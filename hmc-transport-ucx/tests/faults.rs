//! Bad input and faults across real processes: forged and stale descriptors, transfers past a region's end, a peer killed mid-transfer, and registrations released exactly once.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmc_backend_cpu::HostMemory;
use hmc_core::{
    Access, Communicator, ConnBuffer, Deadline, Error, MemSpan, Op, PeerAddr, RegisteredBuffer,
    RemoteRegion, TransferDesc,
};
mod common;
use common::{comm, deadline, desc, hex, unhex};
use rstest::rstest;

const CHILD_ENV: &str = "HMC_UCX_TEST_CHILD_TLS";
const CHILD_LEN: usize = 64 << 20;

/// Not a test of its own: the body of the child process the peer-death test kills. It
/// serves a 64 MiB region and waits to be killed.
#[test]
fn child_target() {
    let Ok(tls) = std::env::var(CHILD_ENV) else {
        return;
    };
    let c = comm(&tls);
    let buf = RegisteredBuffer::new(
        Arc::new(HostMemory::new()),
        c.clone(),
        CHILD_LEN,
        Access::READ_WRITE,
    )
    .expect("register");
    println!(
        "READY {} {}",
        c.address(),
        hex(&buf.export().unwrap().encode())
    );
    // Waits to be killed, and exits by itself should the test process die first (an
    // orphan would hold the inherited stderr open, and whatever reads the test output
    // would wait for it).
    let parent = std::os::unix::process::parent_id();
    while std::os::unix::process::parent_id() == parent {
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The child process, killed and reaped however the test ends (a failed assertion too).
struct ReapedChild(std::process::Child);

impl Drop for ReapedChild {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Fails the whole test binary, rather than hanging CI, if a test is still running after
/// `limit` (each step has its own deadline; this catches a hang outside them, such as a
/// teardown that never returns).
fn watchdog(name: &'static str, limit: Duration) {
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        eprintln!("{name}: still running after {limit:?}; aborting the test binary");
        std::process::abort();
    });
}

#[rstest]
#[case::tcp("tcp")]
#[case::shared_memory("posix,cma,self")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_killed_mid_transfer_is_an_error_within_the_deadline(#[case] tls: &str) {
    watchdog("a_peer_killed_mid_transfer", Duration::from_secs(300));
    let mut child = ReapedChild(
        Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", "child_target", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, tls)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn child"),
    );
    let mut lines = BufReader::new(child.0.stdout.take().expect("stdout")).lines();
    let ready = loop {
        let line = lines.next().expect("child output").expect("read child");
        // The harness may print "test child_target ... " on the same line first.
        if let Some(at) = line.find("READY ") {
            break line[at + 6..].to_string();
        }
    };
    let (addr, desc_hex) = ready.split_once(' ').expect("addr and descriptor");
    let addr: PeerAddr = addr.parse().expect("address");
    let remote = RemoteRegion::decode(&unhex(desc_hex)).expect("descriptor");

    let a = comm(tls);
    let ep = a.connect(&addr, deadline()).await.expect("connect");
    let key = a.import(&ep, &remote).expect("import");
    let local = RegisteredBuffer::new(
        Arc::new(HostMemory::new()),
        a.clone(),
        CHILD_LEN,
        Access::READ_WRITE,
    )
    .expect("local buffer");
    a.transfer(
        &ep,
        Op::Write,
        &[desc(&local, &key, 0, CHILD_LEN)],
        deadline(),
    )
    .await
    .expect("a transfer before the kill works");

    let pid = child.0.id();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        // SAFETY: sending SIGKILL to our own child process.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    });
    let limit = Duration::from_secs(20);
    let start = Instant::now();
    let mut result = Ok(());
    for i in 0..10_000 {
        let op = if i % 2 == 0 { Op::Read } else { Op::Write };
        result = a
            .transfer(
                &ep,
                op,
                &[desc(&local, &key, 0, CHILD_LEN)],
                Deadline::after(limit),
            )
            .await;
        if result.is_err() {
            break;
        }
    }
    killer.join().expect("killer");
    let _ = child.0.wait();
    let err = result.expect_err("transfers to a killed peer must fail");
    assert!(
        !matches!(err, Error::DeadlineExceeded { .. }),
        "peer death must be detected, not timed out: {err}"
    );
    assert!(start.elapsed() < limit, "took {:?}", start.elapsed());
    let again = a
        .transfer(
            &ep,
            Op::Read,
            &[desc(&local, &key, 0, 64)],
            Deadline::after(Duration::from_secs(5)),
        )
        .await;
    assert!(again.is_err(), "the dead endpoint must refuse new work");
    let note = a
        .notify(&ep, 1, b"x", Deadline::after(Duration::from_secs(5)))
        .await;
    assert!(
        note.is_err(),
        "notify on a dead endpoint must fail: {note:?}"
    );
}

#[rstest]
#[case::tcp("tcp")]
#[case::shared_memory("posix,cma,self")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_inflated_and_stale_descriptors_are_refused_at_import(#[case] tls: &str) {
    let (a, b) = (comm(tls), comm(tls));
    let memory = Arc::new(HostMemory::new());
    let ep = a.connect(&b.address(), deadline()).await.expect("connect");
    let ro = RegisteredBuffer::new(memory.clone(), b.clone(), 4096, Access::READ).expect("ro");
    let good = ro.export().unwrap();

    let mut inflated_rights = good.clone();
    inflated_rights.access = Access::READ_WRITE;
    let mut inflated_len = good.clone();
    inflated_len.region.len *= 2;
    let mut other_addr = good.clone();
    other_addr.region.addr += 4096;
    let mut truncated = good.clone();
    truncated.key.truncate(10);
    let mut unknown_id = good.clone();
    unknown_id.key[5..13].copy_from_slice(&u64::MAX.to_be_bytes());
    let mut flipped_rkey = good.clone();
    let last = flipped_rkey.key.len() - 1;
    flipped_rkey.key[last] ^= 0xff;
    for (what, d) in [
        ("inflated rights", inflated_rights),
        ("inflated length", inflated_len),
        ("moved address", other_addr),
        ("truncated key", truncated),
        ("unknown region id", unknown_id),
        ("damaged rkey", flipped_rkey),
    ] {
        let r = a.import(&ep, &d);
        assert!(
            matches!(r, Err(Error::InvalidKey(_))),
            "{what}: {:?}",
            r.err()
        );
    }
    // The genuine descriptor still imports and works: refusals left the endpoint usable.
    let key = a.import(&ep, &good).expect("genuine import");
    let local =
        RegisteredBuffer::new(memory.clone(), a.clone(), 4096, Access::READ_WRITE).expect("local");
    a.transfer(&ep, Op::Read, &[desc(&local, &key, 0, 4096)], deadline())
        .await
        .expect("read through the genuine key");
    drop(key);
    drop(ro);
    assert!(
        matches!(a.import(&ep, &good), Err(Error::InvalidKey(_))),
        "a deregistered region's descriptor must be refused"
    );
}

#[rstest]
#[case::tcp("tcp")]
#[case::shared_memory("posix,cma,self")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_past_the_end_are_refused_and_move_nothing(#[case] tls: &str) {
    let (a, b) = (comm(tls), comm(tls));
    let memory = Arc::new(HostMemory::new());
    let ep = a.connect(&b.address(), deadline()).await.expect("connect");
    let target =
        RegisteredBuffer::new(memory.clone(), b.clone(), 1000, Access::READ_WRITE).expect("t");
    target
        .write_at(0, &MemSpan::host(&[7u8; 1000]))
        .expect("fill");
    let key = a.import(&ep, &target.export().unwrap()).expect("import");
    let local =
        RegisteredBuffer::new(memory.clone(), a.clone(), 2000, Access::READ_WRITE).expect("l");
    for (off, len) in [(0u64, 1001usize), (999, 2), (1000, 1), (u64::MAX, 1)] {
        let r = a
            .transfer(&ep, Op::Write, &[desc(&local, &key, off, len)], deadline())
            .await;
        assert!(
            matches!(r, Err(Error::OutOfBounds { .. })),
            "{off}+{len}: {r:?}"
        );
    }
    let mut after = vec![0u8; 1000];
    target
        .read_at(0, &mut hmc_core::MemSpanMut::host(&mut after))
        .expect("read");
    assert_eq!(after, vec![7u8; 1000]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_are_released_exactly_once() {
    let (a, b) = (comm("tcp"), comm("tcp"));
    let memory = Arc::new(HostMemory::new());
    let ep = a.connect(&b.address(), deadline()).await.expect("connect");
    {
        let bufs: Vec<_> = (0..10)
            .map(|i| {
                RegisteredBuffer::new(memory.clone(), b.clone(), 4096 * (i + 1), Access::READ)
                    .expect("register")
            })
            .collect();
        let keys: Vec<_> = bufs
            .iter()
            .map(|buf| a.import(&ep, &buf.export().unwrap()).expect("import"))
            .collect();
        assert_eq!(b.stats().registered, 10);
        assert_eq!(b.stats().deregistered, 0);
        drop(bufs);
        drop(keys);
    }
    assert_eq!(b.stats().registered, 10);
    assert_eq!(b.stats().deregistered, 10);
}

#[rstest]
#[case::tcp("tcp")]
#[case::shared_memory("posix,cma,self")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ucx_allocated_registrations_move_bytes_and_refuse_misuse(#[case] tls: &str) {
    let (a, b) = (comm(tls), comm(tls));
    let ep = a.connect(&b.address(), deadline()).await.expect("connect");
    let len = (1 << 20) + 7;
    let target = b.alloc_registered(len, Access::READ_WRITE).expect("target");
    let local = a.alloc_registered(len, Access::READ_WRITE).expect("local");
    let bytes = hmc_core::testing::pattern(5, len);
    local.write_at(0, &bytes).expect("fill local");
    let key = a.import(&ep, &b.export(&target).unwrap()).expect("import");
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
    let mut seen = vec![0u8; len];
    target.read_at(0, &mut seen).expect("read target");
    assert_eq!(seen, bytes, "written bytes at the target");
    local.write_at(0, &vec![0u8; len]).expect("clear");
    a.transfer(&ep, Op::Read, &d, deadline())
        .await
        .expect("read");
    local.read_at(0, &mut seen).expect("read local");
    assert_eq!(seen, bytes, "read back");
    assert!(matches!(
        local.read_at(len - 1, &mut [0u8; 2]),
        Err(Error::OutOfBounds { .. })
    ));
    let user = RegisteredBuffer::new(Arc::new(HostMemory::new()), a.clone(), 64, Access::READ)
        .expect("user memory");
    assert!(matches!(
        user.registration().write_at(0, &[1]),
        Err(Error::Unsupported(_))
    ));
    drop(key);
    drop(target);
    assert_eq!(b.stats().registered, b.stats().deregistered);
}
