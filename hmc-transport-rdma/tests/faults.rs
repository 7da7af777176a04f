//! Real processes and injected faults over the stand-in: transfers between two processes, a peer killed mid-transfer, forged and inflated descriptors, descriptors split at a small `max_msg_sz`, and the DMA-BUF probe's two answers.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmc_backend_cpu::HostMemory;
use hmc_core::testing::pattern;
use hmc_core::{
    Access, Communicator, ConnBuffer, Deadline, Error, MemSpan, MemSpanMut, Op, PeerAddr,
    RemoteRegion, TransferDesc,
};
use hmc_testshim::pair::{buffers, reach, registered};
use hmc_testshim::{from_hex, run_child_test, test_name, to_hex};
use hmc_transport_rdma::DeviceMemorySupport;

const CHILD_LEN: usize = 64 << 20;
const CHILD_SEED: u64 = 4242;

/// The peer process: a communicator with one registered region of `CHILD_LEN` bytes
/// filled with `pattern(CHILD_SEED)`, announced on stdout; it lives until stdin closes.
#[test]
#[ignore = "the peer process of the two-process tests"]
fn child_peer() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let comm = common::comm();
        let buf = registered(&Arc::new(HostMemory::new()), &comm, CHILD_LEN);
        buf.write_at(0, &MemSpan::host(&pattern(CHILD_SEED, CHILD_LEN)))
            .unwrap();
        let desc = buf.export().unwrap().encode();
        println!("PEER {} {}", comm.address(), to_hex(&desc));
        std::io::stdout().flush().unwrap();
        let mut sink = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut sink);
    });
}

struct Peer {
    child: Child,
    addr: PeerAddr,
    desc: RemoteRegion,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_peer() -> Peer {
    if !common::hardware() {
        common::standin();
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            &test_name(module_path!(), "child_peer"),
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the peer process");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // libtest may have written "test child_peer ... " on the same line.
    let line = lines
        .find_map(|l| {
            l.ok()
                .and_then(|l| l.find("PEER ").map(|at| l[at..].to_string()))
        })
        .expect("the peer announces itself");
    let mut parts = line.split_whitespace().skip(1);
    let addr = parts.next().unwrap().parse().unwrap();
    let desc = RemoteRegion::decode(&from_hex(parts.next().unwrap())).unwrap();
    Peer { child, addr, desc }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_read_and_write_each_others_memory() {
    let peer = spawn_peer();
    let a = common::comm();
    let ep = a.connect(&peer.addr, Deadline::default()).await.unwrap();
    let key = a.import(&ep, &peer.desc).unwrap();
    let mem = Arc::new(HostMemory::new());
    let local = registered(&mem, &a, CHILD_LEN);
    let d = [TransferDesc::new(
        local.registration(),
        0,
        &key,
        0,
        CHILD_LEN,
    )];
    a.transfer(&ep, Op::Read, &d, Deadline::default())
        .await
        .unwrap();
    let mut got = vec![0u8; CHILD_LEN];
    local.read_at(0, &mut MemSpanMut::host(&mut got)).unwrap();
    assert!(
        got == pattern(CHILD_SEED, CHILD_LEN),
        "bytes read from the other process differ"
    );
    let mine = pattern(7, CHILD_LEN);
    local.write_at(0, &MemSpan::host(&mine)).unwrap();
    a.transfer(&ep, Op::Write, &d, Deadline::default())
        .await
        .unwrap();
    local
        .write_at(0, &MemSpan::host(&vec![0u8; CHILD_LEN]))
        .unwrap();
    a.transfer(&ep, Op::Read, &d, Deadline::default())
        .await
        .unwrap();
    local.read_at(0, &mut MemSpanMut::host(&mut got)).unwrap();
    assert!(
        got == mine,
        "bytes written to the other process did not come back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_killed_mid_transfer_fails_fast_and_the_endpoint_stays_dead() {
    let mut peer = spawn_peer();
    let a = common::comm();
    let ep = a.connect(&peer.addr, Deadline::default()).await.unwrap();
    let key = a.import(&ep, &peer.desc).unwrap();
    let local = registered(&Arc::new(HostMemory::new()), &a, CHILD_LEN);
    let d = [TransferDesc::new(
        local.registration(),
        0,
        &key,
        0,
        CHILD_LEN,
    )];
    a.transfer(&ep, Op::Write, &d, Deadline::default())
        .await
        .unwrap();
    let limit = Duration::from_secs(20);
    let start = Instant::now();
    let killer = std::thread::spawn({
        let pid = peer.child.id() as i32;
        move || {
            std::thread::sleep(Duration::from_millis(30));
            // SAFETY: signalling our own child process.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    });
    let mut result = Ok(());
    for i in 0..200 {
        let op = if i % 2 == 0 { Op::Read } else { Op::Write };
        result = a.transfer(&ep, op, &d, Deadline::after(limit)).await;
        if result.is_err() {
            break;
        }
    }
    killer.join().unwrap();
    let _ = peer.child.wait();
    let err = result.expect_err("transfers to a killed peer must fail");
    assert!(
        matches!(err, Error::Peer { .. }),
        "peer loss must be reported as such: {err:?}"
    );
    assert!(start.elapsed() < limit, "the error came after the deadline");
    let again = a
        .transfer(&ep, Op::Read, &d, Deadline::after(Duration::from_secs(5)))
        .await;
    assert!(
        matches!(again, Err(Error::Peer { .. })),
        "the endpoint is dead: {again:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_and_inflated_descriptors_are_refused_at_import() {
    let peer = spawn_peer();
    let a = common::comm();
    let ep = a.connect(&peer.addr, Deadline::default()).await.unwrap();
    // Another rkey under a live registration id.
    let mut rkey = peer.desc.clone();
    let n = rkey.key.len();
    rkey.key[n - 1] ^= 0x40;
    // More bytes, or more rights, than exported.
    let mut longer = peer.desc.clone();
    longer.region.len += 4096;
    let mut unknown = peer.desc.clone();
    unknown.key[6] ^= 0xff; // the registration id
    for (what, d) in [
        ("rkey", rkey),
        ("length", longer),
        ("registration id", unknown),
    ] {
        match a.import(&ep, &d) {
            Err(Error::InvalidKey(m)) => eprintln!("{what}: {m}"),
            other => panic!(
                "a descriptor with another {what} must be refused: {:?}",
                other.map(|_| ())
            ),
        }
    }
    let mut read_only = peer.desc.clone();
    read_only.access = Access::READ;
    assert!(matches!(
        a.import(&ep, &read_only),
        Err(Error::InvalidKey(_))
    ));
    a.import(&ep, &peer.desc)
        .expect("the genuine descriptor imports");
}

#[test]
#[ignore = "run by descriptors_are_split_at_a_small_max_msg_sz in a child process"]
fn child_small_max_msg() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let a = common::comm();
        let b = common::comm();
        assert_eq!(a.max_msg_size(), 4096);
        let len = (1 << 20) + 17;
        let (target, local) = buffers(&Arc::new(HostMemory::new()), &a, &b, len);
        let bytes = pattern(3, len);
        local.write_at(0, &MemSpan::host(&bytes)).unwrap();
        let (ep, key) = reach(&a, &b, &target).await;
        let chains = a.stats().chains;
        a.transfer(
            &ep,
            Op::Write,
            &[TransferDesc::new(local.registration(), 0, &key, 0, len)],
            Deadline::default(),
        )
        .await
        .expect("a 1 MiB write as 4 KiB work requests");
        let mut got = vec![0u8; len];
        target.read_at(0, &mut MemSpanMut::host(&mut got)).unwrap();
        assert!(got == bytes);
        // 257 WRs in chains of at most 32: at least 9 posts.
        assert!(a.stats().chains - chains >= 9, "{:?}", a.stats());
    });
}

#[test]
fn descriptors_are_split_at_a_small_max_msg_sz() {
    standin_only!();
    common::standin();
    run_child_test(
        &test_name(module_path!(), "child_small_max_msg"),
        &[("HMC_FAKE_IBV_MAX_MSG", "4096")],
    )
    .unwrap();
}

#[test]
#[ignore = "run by the dma-buf probe test in a child process"]
fn child_dmabuf_unsupported() {
    let a = common::comm();
    let expected = if std::path::Path::new("/sys/module/nvidia_peermem").exists() {
        DeviceMemorySupport::PeerMem
    } else {
        DeviceMemorySupport::None
    };
    assert_eq!(a.device_memory(), expected);
    assert_eq!(
        a.capabilities().device_memory,
        if expected == DeviceMemorySupport::None {
            hmc_core::DeviceMemoryPath::Refused
        } else {
            hmc_core::DeviceMemoryPath::Direct
        }
    );
}

#[test]
fn the_dma_buf_probe_tells_ebadf_from_eopnotsupp() {
    standin_only!();
    assert_eq!(common::comm().device_memory(), DeviceMemorySupport::DmaBuf);
    run_child_test(
        &test_name(module_path!(), "child_dmabuf_unsupported"),
        &[("HMC_FAKE_IBV_DMABUF", "eopnotsupp")],
    )
    .unwrap();
}

/// A cancel moves the QPs it used to ERR: other transfers on the same endpoint that were
/// flushed with it are posted again and still complete, with the right bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_one_transfer_does_not_fail_the_others_on_its_endpoint() {
    let a = common::comm();
    let b = common::comm();
    let mem = Arc::new(HostMemory::new());
    let slice = 1 << 20;
    let tasks = 3;
    let big = 16 << 20;
    let target = registered(&mem, &b, slice * tasks + big);
    let ep = a.connect(&b.address(), Deadline::default()).await.unwrap();
    let key = a.import(&ep, &target.export().unwrap()).unwrap();
    let victim = registered(&mem, &a, big);
    let done = std::sync::atomic::AtomicBool::new(false);
    let workers = (0..tasks).map(|t| {
        let (a, ep, key, mem) = (&a, &ep, &key, mem.clone());
        async move {
            let src = registered(&mem, a, slice);
            let dst = registered(&mem, a, slice);
            for r in 0..10 {
                let bytes = pattern((t * 100 + r) as u64, slice);
                src.write_at(0, &MemSpan::host(&bytes)).unwrap();
                let off = (t * slice) as u64;
                let w = [TransferDesc {
                    local: src.registration(),
                    local_offset: 0,
                    remote: key,
                    remote_offset: off,
                    len: slice,
                }];
                a.transfer(ep, Op::Write, &w, Deadline::default())
                    .await
                    .expect("write beside cancels");
                let rd = [TransferDesc {
                    local: dst.registration(),
                    local_offset: 0,
                    remote: key,
                    remote_offset: off,
                    len: slice,
                }];
                a.transfer(ep, Op::Read, &rd, Deadline::default())
                    .await
                    .expect("read beside cancels");
                let mut got = vec![0u8; slice];
                dst.read_at(0, &mut MemSpanMut::host(&mut got)).unwrap();
                assert!(got == bytes, "task {t} round {r}: wrong bytes");
            }
        }
    });
    let canceller = async {
        let d = [TransferDesc {
            local: victim.registration(),
            local_offset: 0,
            remote: &key,
            remote_offset: (slice * tasks) as u64,
            len: big,
        }];
        while !done.load(std::sync::atomic::Ordering::Relaxed) {
            let mut f = Box::pin(a.transfer(&ep, Op::Read, &d, Deadline::default()));
            let _ = futures::poll!(f.as_mut());
            drop(f);
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    let work = async {
        futures::future::join_all(workers).await;
        done.store(true, std::sync::atomic::Ordering::Relaxed);
    };
    futures::join!(work, canceller);
    assert!(
        a.stats().reestablished > 0,
        "no QP was re-established: {:?}",
        a.stats()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_memory_registered_through_a_dma_buf_is_reachable_by_peers() {
    standin_only!();
    use std::os::fd::{FromRawFd, OwnedFd};
    let a = common::comm();
    let b = common::comm();
    assert_eq!(b.device_memory(), DeviceMemorySupport::DmaBuf);
    // A memfd stands in for the GPU driver's DMA-BUF: the stand-in maps it, as a NIC
    // would reach the device's pages.
    let len = 1 << 20;
    // SAFETY: memfd_create with a static name; the fd is owned below.
    let fd = unsafe { libc::memfd_create(c"hmc-fake-dmabuf".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: a fresh descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let bytes = pattern(77, len);
    let mut f = std::fs::File::from(fd.try_clone().unwrap());
    f.write_all(&bytes).unwrap();
    let region = hmc_core::Region {
        device: hmc_core::Device::new(hmc_core::DeviceKind::CUDA, 0),
        addr: 0x7000_0000_0000, // the device address peers see (iova)
        len,
    };
    let dmabuf = hmc_core::DmaBuf::new(fd, 0, len);
    // SAFETY: the memfd outlives the registration.
    let reg = unsafe { b.register_dmabuf(region, &dmabuf, Access::READ) }.unwrap();
    // Plain `register` of device memory is refused, pointing at register_device.
    // SAFETY: refused before anything is registered.
    let refused = unsafe { b.register(region, Access::READ) };
    assert!(
        matches!(&refused, Err(Error::UnsupportedMemory { reason, .. }) if reason.contains("register_device")),
        "{:?}",
        refused.map(|_| ())
    );
    let ep = a.connect(&b.address(), Deadline::default()).await.unwrap();
    let key = a.import(&ep, &b.export(&reg).unwrap()).unwrap();
    let local = registered(&Arc::new(HostMemory::new()), &a, len);
    a.transfer(
        &ep,
        Op::Read,
        &[TransferDesc::new(local.registration(), 0, &key, 0, len)],
        Deadline::default(),
    )
    .await
    .unwrap();
    let mut got = vec![0u8; len];
    local.read_at(0, &mut MemSpanMut::host(&mut got)).unwrap();
    assert!(
        got == bytes,
        "bytes read through the DMA-BUF registration differ"
    );
}

/// A deadline that passes while a batch is still being posted (a send queue of two WRs,
/// two thousand descriptors) ends the transfer with `DeadlineExceeded`: never `Ok` with
/// bytes left unmoved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_passing_while_posting_is_deadline_exceeded_not_success() {
    let small_queue = || hmc_transport_rdma::RdmaConfig {
        max_send_wr: 2,
        max_chain: 1,
        ..common::config()
    };
    let a = common::comm_with(small_queue());
    let b = common::comm();
    let (count, size) = (2000, 4096);
    let (target, local) = buffers(&Arc::new(HostMemory::new()), &a, &b, count * size);
    let bytes = pattern(5, count * size);
    local.write_at(0, &MemSpan::host(&bytes)).unwrap();
    let (ep, key) = reach(&a, &b, &target).await;
    let batch: Vec<_> = (0..count)
        .map(|i| TransferDesc {
            local: local.registration(),
            local_offset: i * size,
            remote: &key,
            remote_offset: (i * size) as u64,
            len: size,
        })
        .collect();
    let r = a
        .transfer(
            &ep,
            Op::Write,
            &batch,
            Deadline::after(Duration::from_millis(5)),
        )
        .await;
    match r {
        Err(Error::DeadlineExceeded { .. }) => {}
        Ok(()) => {
            let mut got = vec![0u8; count * size];
            target.read_at(0, &mut MemSpanMut::host(&mut got)).unwrap();
            assert!(got == bytes, "Ok, but not every byte arrived");
        }
        Err(e) => panic!("expected DeadlineExceeded: {e:?}"),
    }
    // The endpoint recovers and moves the whole batch.
    a.transfer(&ep, Op::Write, &batch, Deadline::default())
        .await
        .unwrap();
    let mut got = vec![0u8; count * size];
    target.read_at(0, &mut MemSpanMut::host(&mut got)).unwrap();
    assert!(got == bytes);
}

/// The control plane over a Unix socket: the handshake, key confirmation and a transfer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_runs_over_a_unix_socket_too() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rdma.sock");
    let b = common::comm_with(hmc_transport_rdma::RdmaConfig {
        bind: PeerAddr::Unix(path.clone()),
        ..common::config()
    });
    assert_eq!(b.address(), PeerAddr::Unix(path));
    let a = common::comm();
    let (target, local) = buffers(&Arc::new(HostMemory::new()), &a, &b, 4096);
    let bytes = pattern(9, 4096);
    local.write_at(0, &MemSpan::host(&bytes)).unwrap();
    let (ep, key) = reach(&a, &b, &target).await;
    a.transfer(
        &ep,
        Op::Write,
        &[TransferDesc::new(local.registration(), 0, &key, 0, 4096)],
        Deadline::default(),
    )
    .await
    .unwrap();
    let mut got = vec![0u8; 4096];
    target.read_at(0, &mut MemSpanMut::host(&mut got)).unwrap();
    assert!(got == bytes);
}
