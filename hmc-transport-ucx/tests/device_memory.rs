//! Device memory and the loaded UCX: its kinds are taken only where that UCX says it moves them (`ucp_context_query`); a kind it does not move is refused by plain `register`, before any device pointer reaches UCX as if it were host memory, and staged when registered with its backend (`register_memory`): a peer READs and WRITEs it over the control connection through the target's host chunks. The device is the HIP ABI shim (`hmc-backend-rocm/tests/shim/hip_shim.c`) loaded by the ROCm backend's real loader: host memory behind HIP's C ABI, so this checks the staging path, not a GPU.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hmc_backend_cpu::HostMemory;
use hmc_backend_rocm::{RocmBuffer, RocmMemory};
use hmc_core::{
    Access, AnyMemory, Communicator, ConnBuffer, Device, DeviceBuffer, DeviceKind,
    DeviceMemoryPath, Error, MemSpan, MemSpanMut, Memory, Op, PeerAddr, Region, RegisteredBuffer,
    TransferDesc,
};
use hmc_transport_ucx::{UcxCommunicator, UcxConfig, UcxRegistration};

use common::deadline;

fn comm() -> Arc<UcxCommunicator> {
    Arc::new(UcxCommunicator::new(UcxConfig::with_tls("tcp")).expect("UCX available"))
}

#[test]
fn capabilities_list_the_device_kinds_the_loaded_ucx_moves() {
    let c = comm();
    let kinds = c.memory_kinds();
    eprintln!("UCX {:?} moves {kinds:?}", c.ucx_version());
    assert!(kinds.contains(&DeviceKind::HOST), "{kinds:?}");
    let caps = c.capabilities();
    for kind in [DeviceKind::CUDA, DeviceKind::ROCM] {
        let expected = if kinds.contains(&kind) {
            DeviceMemoryPath::LibraryDependent
        } else {
            DeviceMemoryPath::Staged
        };
        assert_eq!(caps.memory_path(kind), expected, "{kind:?}");
    }
    // Kinds UCX has no memory type for are never handed to it: staged.
    assert_eq!(
        caps.memory_path(DeviceKind::ASCEND),
        DeviceMemoryPath::Staged
    );
    assert_eq!(caps.memory_path(DeviceKind::HOST), DeviceMemoryPath::Direct);
}

#[rstest::rstest]
#[case::cuda(DeviceKind::CUDA)]
#[case::rocm(DeviceKind::ROCM)]
#[case::ascend(DeviceKind::ASCEND)]
fn memory_of_a_kind_the_ucx_does_not_move_is_refused_before_ucx_sees_it(#[case] kind: DeviceKind) {
    let c = comm();
    if c.memory_kinds().contains(&kind) {
        eprintln!("skipped: this UCX moves {kind:?} memory");
        return;
    }
    // Host bytes under a device label: were they handed to UCX, it would map them as host
    // memory and the registration would succeed.
    let buf = vec![0u8; 4096];
    let region = Region {
        device: Device::new(kind, 0),
        addr: buf.as_ptr() as u64,
        len: buf.len(),
    };
    // SAFETY: `buf` outlives the registration attempt, which fails.
    let e = unsafe { c.register(region, Access::READ_WRITE) }
        .err()
        .expect("refused");
    assert!(matches!(e, Error::UnsupportedMemory { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("does not move this memory type") && text.contains("HMC_UCX_LIB"),
        "{text}"
    );
    assert_eq!(c.stats().registered, 0);
}

/// Several 512 KiB staging chunks and a ragged end.
const LEN: usize = (3 << 20) + 4099;

fn shim() -> PathBuf {
    let src =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../hmc-backend-rocm/tests/shim/hip_shim.c");
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ucx-device-hip");
    hmc_testshim::build_shim(&src, "hip_shim", &out).expect("build the HIP ABI shim")
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}

/// A device region on the target, registered with its backend, holding `pattern(len, 7)`.
struct DeviceRegion {
    mem: RocmMemory,
    reg: Option<UcxRegistration>,
    buf: RocmBuffer,
}

impl DeviceRegion {
    fn new(c: &UcxCommunicator, len: usize, access: Access) -> DeviceRegion {
        let mem = RocmMemory::with_library(shim(), 0).unwrap();
        let mut buf = mem.alloc(len).unwrap();
        mem.copy(
            &mut MemSpanMut::of(&mut buf),
            &MemSpan::host(&pattern(len, 7)),
        )
        .unwrap();
        // SAFETY: `buf` outlives the registration (dropped first, by `Drop` order below).
        let reg = unsafe { c.register_memory(buf.region(), access, &AnyMemory::new(mem.clone())) }
            .expect("staged registration");
        DeviceRegion {
            mem,
            reg: Some(reg),
            buf,
        }
    }

    fn reg(&self) -> &UcxRegistration {
        self.reg.as_ref().unwrap()
    }

    fn download(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.buf.len()];
        self.mem
            .copy(&mut MemSpanMut::host(&mut out), &MemSpan::of(&self.buf))
            .unwrap();
        out
    }
}

impl Drop for DeviceRegion {
    fn drop(&mut self) {
        self.reg.take();
    }
}

type HostBuf = RegisteredBuffer<HostMemory, UcxCommunicator>;

fn host_buf(c: &Arc<UcxCommunicator>, len: usize) -> HostBuf {
    RegisteredBuffer::new(
        Arc::new(HostMemory::new()),
        c.clone(),
        len,
        Access::READ_WRITE,
    )
    .unwrap()
}

fn host_bytes(b: &HostBuf) -> Vec<u8> {
    let mut out = vec![0u8; b.len()];
    b.read_at(0, &mut MemSpanMut::host(&mut out)).unwrap();
    out
}

#[rstest::rstest]
#[case::shared_memory("posix,cma,self")]
#[case::tcp("tcp")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_reads_and_writes_a_staged_device_region(#[case] tls: &str) {
    let (a, b) = (common::comm(tls), common::comm(tls));
    if b.memory_kinds().contains(&DeviceKind::ROCM) {
        eprintln!("skipped: this UCX moves ROCm memory itself");
        return;
    }
    assert_eq!(
        b.capabilities().memory_path(DeviceKind::ROCM),
        DeviceMemoryPath::Staged
    );
    let target = DeviceRegion::new(&b, LEN, Access::READ_WRITE);
    // A host region of the target beside it, moved by UCX in the same batch.
    let host_target = host_buf(&b, 4096);
    host_target
        .write_at(0, &MemSpan::host(&pattern(4096, 3)))
        .unwrap();
    let ep = a.connect(&b.address(), deadline()).await.unwrap();
    let key = a.import(&ep, &b.export(target.reg()).unwrap()).unwrap();
    let host_key = a
        .import(&ep, &b.export(host_target.registration()).unwrap())
        .unwrap();
    let local = host_buf(&a, LEN + 4096);
    let batch = [
        TransferDesc {
            local: local.registration(),
            local_offset: 0,
            remote: &key,
            remote_offset: 0,
            len: LEN,
        },
        TransferDesc {
            local: local.registration(),
            local_offset: LEN,
            remote: &host_key,
            remote_offset: 0,
            len: 4096,
        },
    ];
    a.transfer(&ep, Op::Read, &batch, deadline()).await.unwrap();
    let got = host_bytes(&local);
    assert!(
        got[..LEN] == pattern(LEN, 7)[..],
        "the device region's bytes"
    );
    assert!(
        got[LEN..] == pattern(4096, 3)[..],
        "the host region's bytes"
    );
    // A WRITE of a new pattern, at an odd offset, lands in the device region.
    local
        .write_at(0, &MemSpan::host(&pattern(LEN, 99)))
        .unwrap();
    let off = 513u64;
    let len = LEN - 1000;
    let one = [TransferDesc {
        local: local.registration(),
        local_offset: 0,
        remote: &key,
        remote_offset: off,
        len,
    }];
    a.transfer(&ep, Op::Write, &one, deadline()).await.unwrap();
    let mut want = pattern(LEN, 7);
    want[off as usize..off as usize + len].copy_from_slice(&pattern(LEN, 99)[..len]);
    assert!(
        target.download() == want,
        "the WRITE's bytes in the device region"
    );
    // Every byte crossed the target's chunks once per direction; none is held.
    let s = b.staging_stats();
    assert_eq!(
        (s.bytes_to_peers, s.bytes_from_peers),
        (LEN as u64, len as u64),
        "{s:?}"
    );
    assert_eq!(s.chunks_held, 0, "{s:?}");
    assert_eq!(
        s.chunks_allocated, 1,
        "one READ at a time: one chunk: {s:?}"
    );
    assert_eq!(a.staging_stats().bytes_to_peers, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rights_bounds_and_deregistration_hold_for_staged_regions() {
    let (a, b) = (common::comm("tcp"), common::comm("tcp"));
    if b.memory_kinds().contains(&DeviceKind::ROCM) {
        return;
    }
    let read_only = DeviceRegion::new(&b, 1 << 20, Access::READ);
    let mut rw = DeviceRegion::new(&b, 1 << 20, Access::READ_WRITE);
    let ep = a.connect(&b.address(), deadline()).await.unwrap();
    let ro_key = a.import(&ep, &b.export(read_only.reg()).unwrap()).unwrap();
    let key = a.import(&ep, &b.export(rw.reg()).unwrap()).unwrap();
    let local = host_buf(&a, 2 << 20);
    let d = |key, remote_offset, len| TransferDesc {
        local: local.registration(),
        local_offset: 0,
        remote: key,
        remote_offset,
        len,
    };
    let e = a
        .transfer(&ep, Op::Write, &[d(&ro_key, 0, 4096)], deadline())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::AccessDenied(_)), "{e:?}");
    let e = a
        .transfer(&ep, Op::Read, &[d(&key, (1 << 20) - 10, 4096)], deadline())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { .. }), "{e:?}");
    // The device region is untouched by the refused WRITE.
    assert!(read_only.download() == pattern(1 << 20, 7));
    // A staged registration is no local side of the target's own transfers.
    let back = b.connect(&a.address(), deadline()).await.unwrap();
    let a_key = b
        .import(&back, &a.export(local.registration()).unwrap())
        .unwrap();
    let own = [TransferDesc {
        local: rw.reg(),
        local_offset: 0,
        remote: &a_key,
        remote_offset: 0,
        len: 16,
    }];
    let e = b
        .transfer(&back, Op::Write, &own, deadline())
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("Stager"),
        "{e}"
    );
    // Deregistered: the peer's key is revoked and the target refuses it.
    rw.reg.take();
    let e = a
        .transfer(&ep, Op::Read, &[d(&key, 0, 4096)], deadline())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidKey(_)), "{e:?}");
    assert_eq!(b.staging_stats().chunks_held, 0);
}

/// Sends one control frame.
fn frame(s: &mut TcpStream, kind: u8, payload: &[u8]) {
    let mut out = vec![kind];
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    s.write_all(&out).unwrap();
}

fn read_frame(s: &mut TcpStream) -> (u8, Vec<u8>) {
    let mut head = [0u8; 5];
    s.read_exact(&mut head).unwrap();
    let mut p = vec![0u8; u32::from_be_bytes(head[1..].try_into().unwrap()) as usize];
    s.read_exact(&mut p).unwrap();
    (head[0], p)
}

#[test]
fn a_peer_that_did_not_import_a_staged_region_cannot_read_or_write_it() {
    let b = common::comm("tcp");
    if b.memory_kinds().contains(&DeviceKind::ROCM) {
        return;
    }
    let target = DeviceRegion::new(&b, 1 << 20, Access::READ_WRITE);
    let key = b.export(target.reg()).unwrap().key;
    let region_id = u64::from_be_bytes(key[5..13].try_into().unwrap());
    let PeerAddr::Tcp(addr) = b.address() else {
        panic!()
    };
    // A hand-made client: HELLO, then staged requests naming the region without the
    // VALIDATE an import makes.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    frame(&mut s, 1, &[1]);
    assert_eq!(read_frame(&mut s).0, 2, "HELLO_ACK");
    let mut read = Vec::new();
    for v in [7u64, region_id, 0, 4096] {
        read.extend_from_slice(&v.to_be_bytes());
    }
    frame(&mut s, 7, &read);
    let (kind, done) = read_frame(&mut s);
    assert_eq!(
        (kind, &done[..8], done[8]),
        (9, &7u64.to_be_bytes()[..], 1),
        "refused: unknown key"
    );
    let mut write = Vec::new();
    for v in [8u64, region_id, 0] {
        write.extend_from_slice(&v.to_be_bytes());
    }
    write.push(1);
    write.extend_from_slice(&[0xEE; 4096]);
    frame(&mut s, 10, &write);
    let (kind, done) = read_frame(&mut s);
    assert_eq!((kind, done[8]), (9, 1));
    assert!(target.download() == pattern(1 << 20, 7), "no byte written");
    assert_eq!(b.staging_stats().bytes_to_peers, 0);
}

/// A "device" whose copies take `delay` each: host memory labelled as an Ascend NPU
/// (a kind no UCX moves), so that a staged transfer is still running when its caller
/// gives up.
#[derive(Clone)]
struct SlowDevice {
    delay: Duration,
}

const SLOW: Device = Device::new(DeviceKind::ASCEND, 0);

impl Memory for SlowDevice {
    type Buffer = hmc_backend_cpu::HostBuffer;

    fn device(&self) -> Device {
        SLOW
    }

    fn alloc(&self, _len: usize) -> hmc_core::Result<Self::Buffer> {
        Err(Error::Unsupported(
            "the test allocates the slow device's memory itself".into(),
        ))
    }

    fn copy(&self, dst: &mut MemSpanMut<'_>, src: &MemSpan<'_>) -> hmc_core::Result<()> {
        std::thread::sleep(self.delay);
        assert_eq!(dst.len(), src.len());
        // SAFETY: both spans are host memory (the slow device's is a Vec of the test) of
        // the same length, valid for the call.
        unsafe {
            std::ptr::copy(
                src.region().addr as *const u8,
                dst.region().addr as *mut u8,
                src.len(),
            )
        };
        Ok(())
    }
}

#[rstest::rstest]
#[case::read_past_its_deadline(Op::Read, false)]
#[case::read_dropped(Op::Read, true)]
#[case::write_past_its_deadline(Op::Write, false)]
#[case::write_dropped(Op::Write, true)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_byte_moves_after_a_staged_transfer_stopped(#[case] op: Op, #[case] drop_it: bool) {
    let (a, b) = (common::comm("tcp"), common::comm("tcp"));
    // 16 chunks, 40 ms of device copy each: the transfer runs for 640 ms.
    let len = 16 * (512 << 10);
    let device_bytes = vec![0x5Au8; len];
    let region = Region {
        device: SLOW,
        addr: device_bytes.as_ptr() as u64,
        len,
    };
    let memory = AnyMemory::new(SlowDevice {
        delay: Duration::from_millis(40),
    });
    // SAFETY: `device_bytes` outlives the registration (dropped at the end of the test).
    let reg = unsafe { b.register_memory(region, Access::READ_WRITE, &memory) }.unwrap();
    assert_eq!(
        b.capabilities().memory_path(DeviceKind::ASCEND),
        DeviceMemoryPath::Staged
    );
    let ep = a.connect(&b.address(), deadline()).await.unwrap();
    let key = a.import(&ep, &b.export(&reg).unwrap()).unwrap();
    let local = host_buf(&a, len);
    local
        .write_at(0, &MemSpan::host(&vec![0xA5u8; len]))
        .unwrap();
    let batch = [TransferDesc {
        local: local.registration(),
        local_offset: 0,
        remote: &key,
        remote_offset: 0,
        len,
    }];
    let started = std::time::Instant::now();
    if drop_it {
        let dropped = tokio::time::timeout(
            Duration::from_millis(150),
            a.transfer(&ep, op, &batch, deadline()),
        )
        .await;
        assert!(
            dropped.is_err(),
            "the transfer should still run: {dropped:?}"
        );
    } else {
        let soon = hmc_core::Deadline::after(Duration::from_millis(150));
        let e = a.transfer(&ep, op, &batch, soon).await.unwrap_err();
        assert!(e.is_deadline(), "{e:?}");
    }
    // What each side holds now stays so: the target goes on sending a stopped READ's
    // chunks, which nobody copies into `local`; a stopped WRITE was drained before the
    // caller heard back.
    let (local_then, device_then) = (host_bytes(&local), device_bytes.clone());
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(
        host_bytes(&local) == local_then,
        "late bytes in the initiator's memory"
    );
    assert!(
        device_bytes == device_then,
        "late bytes in the target's device memory"
    );
    match op {
        // Some of the READ's bytes may have landed, not all.
        Op::Read => assert!(local_then[len - 1] == 0xA5, "the whole READ landed"),
        // The socket may have taken every frame before the stop: then all of them were
        // applied, and the caller heard back only after that.
        Op::Write => assert!(started.elapsed() < Duration::from_secs(10)),
    }
    // The endpoint still works once the target is done.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let small = [TransferDesc {
        len: 4096,
        ..batch[0]
    }];
    a.transfer(&ep, Op::Read, &small, deadline()).await.unwrap();
    assert!(host_bytes(&local)[..4096] == device_bytes[..4096]);
    assert_eq!(b.staging_stats().chunks_held, 0);
    drop(key);
    drop(reg);
}
