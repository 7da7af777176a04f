//! Memory from `ShmCommunicator::alloc_registered`: a sealed memfd the initiator maps at its
//! first grant and copies into with `memcpy`. In one process, then between two processes
//! whose kernel check refuses cross-memory attach (a non-dumpable target, an initiator
//! without `CAP_SYS_PTRACE`), where only such memory is reachable.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use hmc_backend_cpu::HostMemory;
use hmc_core::testing::pattern;
use hmc_core::{
    Access, Communicator, ConnBuffer, Deadline, Error, MemSpan, MemSpanMut, Op, PeerAddr,
    RegisteredBuffer, RemoteRegion, TransferDesc,
};
use hmc_transport_shm::{ShmCommunicator, ShmConfig};

mod support;
use support::{contents, fill, hex, unhex};

const LEN: usize = 1 << 20;

fn deadline() -> Deadline {
    Deadline::after(Duration::from_secs(10))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocated_memory_is_mapped_once_and_forgotten_on_drop() {
    let a = Arc::new(ShmCommunicator::bind(ShmConfig::default()).unwrap());
    let b = Arc::new(ShmCommunicator::bind(ShmConfig::default()).unwrap());
    let target = b
        .alloc_registered(LEN, Access::READ_WRITE)
        .unwrap()
        .expect("shared memory");
    fill(&target, &pattern(1, LEN));
    let src = RegisteredBuffer::new(
        Arc::new(HostMemory::new()),
        a.clone(),
        LEN,
        Access::READ_WRITE,
    )
    .unwrap();
    let ep = a.connect(&b.address(), deadline()).await.unwrap();
    let key = a.import(&ep, &b.export(&target).unwrap()).unwrap();
    let d = [TransferDesc {
        local: src.registration(),
        local_offset: 0,
        remote: &key,
        remote_offset: 0,
        len: LEN,
    }];
    a.transfer(&ep, Op::Read, &d, deadline()).await.unwrap();
    let mut got = vec![0u8; LEN];
    src.read_at(0, &mut MemSpanMut::host(&mut got)).unwrap();
    assert_eq!(got, pattern(1, LEN), "read from the mapping");
    assert_eq!(ep.mapped_regions(), 1);
    src.write_at(0, &MemSpan::host(&pattern(2, LEN))).unwrap();
    a.transfer(&ep, Op::Write, &d, deadline()).await.unwrap();
    assert_eq!(
        contents(&target),
        pattern(2, LEN),
        "written through the mapping"
    );
    // A rekey revokes the lease; the next transfer needs the new key and reuses the mapping.
    assert!(b.rekey(&target).unwrap());
    let e = a.transfer(&ep, Op::Read, &d, deadline()).await.unwrap_err();
    assert!(matches!(e, Error::InvalidKey(_)), "{e}");
    let key = a.import(&ep, &b.export(&target).unwrap()).unwrap();
    let d = [TransferDesc {
        local: src.registration(),
        local_offset: 0,
        remote: &key,
        remote_offset: 0,
        len: LEN,
    }];
    a.transfer(&ep, Op::Read, &d, deadline()).await.unwrap();
    assert_eq!(
        ep.mapped_regions(),
        1,
        "the memfd is sent once per connection"
    );
    drop(target);
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while ep.mapped_regions() != 0 && std::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        ep.mapped_regions(),
        0,
        "dropping the registration unmaps it at the peer"
    );
    let e = a.transfer(&ep, Op::Read, &d, deadline()).await.unwrap_err();
    assert!(matches!(e, Error::InvalidKey(_)), "{e}");
}

/// As root, become `nobody` (both children, so the side channel's 0600 socket stays
/// reachable) and so lose `CAP_SYS_PTRACE`; then cross-memory attach to a non-dumpable
/// process is refused by the kernel's ptrace check.
fn drop_privileges() {
    // SAFETY: plain syscalls on this process, before any thread starts.
    unsafe {
        if libc::geteuid() == 0 {
            assert_eq!(libc::setgid(65534), 0, "setgid(nobody)");
            assert_eq!(libc::setuid(65534), 0, "setuid(nobody)");
        }
    }
}

/// The target child: non-dumpable; registers user memory and shared memory, prints both.
#[test]
fn child_target() {
    if std::env::var("HMC_SHM_CHILD").as_deref() != Ok("target") {
        return;
    }
    drop_privileges();
    // SAFETY: a prctl on this process.
    assert_eq!(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) }, 0);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _guard = rt.enter();
    let comm = Arc::new(
        ShmCommunicator::bind(ShmConfig {
            path: Some(
                std::env::temp_dir().join(format!("hmc-shm-nodump-{}.sock", std::process::id())),
            ),
            ..ShmConfig::default()
        })
        .unwrap(),
    );
    let plain = RegisteredBuffer::new(
        Arc::new(HostMemory::new()),
        comm.clone(),
        4096,
        Access::READ_WRITE,
    )
    .unwrap();
    let shared = comm
        .alloc_registered(LEN, Access::READ_WRITE)
        .unwrap()
        .unwrap();
    fill(&shared, &pattern(9, LEN));
    println!(
        "TARGET {} {} {}",
        comm.address(),
        hex(&plain.export().unwrap().encode()),
        hex(&comm.export(&shared).unwrap().encode())
    );
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

/// The initiator child: connects, reads the shared memory, tries the user memory.
#[test]
fn child_initiator() {
    let Ok(args) = std::env::var("HMC_SHM_INITIATOR") else {
        return;
    };
    drop_privileges();
    let mut it = args.split(' ');
    let addr: PeerAddr = it.next().unwrap().parse().unwrap();
    let plain = RemoteRegion::decode(&unhex(it.next().unwrap())).unwrap();
    let shared = RemoteRegion::decode(&unhex(it.next().unwrap())).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let me = Arc::new(ShmCommunicator::bind(ShmConfig::default()).unwrap());
        let ep = me.connect(&addr, deadline()).await.unwrap();
        println!("CMA {}", ep.cross_memory_attach());
        let buf = RegisteredBuffer::new(
            Arc::new(HostMemory::new()),
            me.clone(),
            LEN,
            Access::READ_WRITE,
        )
        .unwrap();
        let key = me.import(&ep, &shared).unwrap();
        let d = [TransferDesc {
            local: buf.registration(),
            local_offset: 0,
            remote: &key,
            remote_offset: 0,
            len: LEN,
        }];
        me.transfer(&ep, Op::Read, &d, deadline()).await.unwrap();
        let mut got = vec![0u8; LEN];
        buf.read_at(0, &mut MemSpanMut::host(&mut got)).unwrap();
        println!("SHARED {}", got == pattern(9, LEN));
        let key = me.import(&ep, &plain).unwrap();
        let d = [TransferDesc {
            local: buf.registration(),
            local_offset: 0,
            remote: &key,
            remote_offset: 0,
            len: 4096,
        }];
        match me.transfer(&ep, Op::Read, &d, deadline()).await {
            Err(Error::Unavailable { reason, hint, .. }) => {
                println!("PLAIN unavailable {reason} {hint}")
            }
            other => println!("PLAIN {other:?}"),
        }
    });
}

fn spawn(test: &str, env: (&str, &str)) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(env.0, env.1)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn where_cross_memory_attach_is_refused_shared_memory_still_moves() {
    let mut target = spawn("child_target", ("HMC_SHM_CHILD", "target"));
    let mut lines = BufReader::new(target.stdout.take().unwrap()).lines();
    let args = loop {
        let line = lines
            .next()
            .expect("target exited before printing")
            .unwrap();
        // libtest prints "test child_target ... " on the same line.
        if let Some((_, rest)) = line.split_once("TARGET ") {
            break rest.to_string();
        }
    };
    let out = spawn("child_initiator", ("HMC_SHM_INITIATOR", &args))
        .wait_with_output()
        .unwrap();
    // End of its input ends the target normally: it drops its communicator, which
    // removes its socket file (a kill would leave the file behind).
    drop(target.stdin.take());
    let ended = target.wait().unwrap();
    assert!(ended.success(), "the target ended with {ended}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "initiator failed: {text}");
    assert!(
        text.contains("CMA false"),
        "the kernel should refuse cross-memory attach here: {text}"
    );
    assert!(
        text.contains("SHARED true"),
        "shared memory must still move: {text}"
    );
    assert!(
        text.contains("PLAIN unavailable"),
        "user memory is Unavailable: {text}"
    );
    assert!(
        text.contains("alloc_registered"),
        "the error names the way out: {text}"
    );
}
