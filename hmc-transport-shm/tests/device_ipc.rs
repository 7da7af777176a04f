//! Device memory through vendor IPC between two real processes, against the ABI shims of
//! the runtime-shaped backends (HIP for `hmc-backend-rocm`, MUSA, MLU's CNRT: the vendor's
//! symbols over host memory; their IPC handles open the exporter's memfd through
//! `/proc/<pid>/fd`, so they cross processes for real). This test binary runs itself as the
//! peer (`HMC_SHM_DEVICE_CHILD=<vendor>`), which registers a shim device buffer with
//! `register_device` and answers checksums, rekeys and drops on its standard input. What it checks is the transport's use of IPC (keys, the per-region
//! cache, revocation, which engine copies), not a GPU.
//!
//! The last tests need no peer: a backend without IPC (the ACL shim built without its
//! `aclrtIpcMem*` functions) and the refusals that point at `register_device` and
//! `add_memory`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hmc_backend_ascend::AscendMemory;
use hmc_backend_cpu::HostMemory;
use hmc_backend_mlu::MluMemory;
use hmc_backend_musa::MusaMemory;
use hmc_backend_rocm::RocmMemory;
use hmc_core::testing::pattern;
use hmc_core::{
    Access, AnyMemory, Communicator, ConnBuffer, Deadline, Device, DeviceBuffer, DeviceKind, Error,
    MemSpan, MemSpanMut, Memory, Op, Region, RegisteredBuffer, RemoteRegion, TransferDesc,
};
use hmc_testshim::ShimControl;
use hmc_transport_shm::{ShmCommunicator, ShmConfig, ShmEndpoint, ShmRemoteKey};

mod support;
use support::{Peer, checksum, contents, fill, host_buffer, unhex};

/// The peer's device buffer: 8 chunks of the initiator's 512 KiB `chunk_len`.
const LEN: usize = 4 << 20;
/// The shim device the peer allocates on.
const PEER_DEVICE: u32 = 2;

/// The tests run one at a time: they count the shim's live allocations per device, which
/// every test's buffers and mappings change.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A runtime-shaped vendor whose ABI shim the tests load: its name, device kind and the
/// shim's C source in its backend crate.
struct Vendor {
    name: &'static str,
    kind: DeviceKind,
    source: &'static str,
    stem: &'static str,
}

const HIP: Vendor = Vendor {
    name: "HIP",
    kind: DeviceKind::ROCM,
    source: "../hmc-backend-rocm/tests/shim/hip_shim.c",
    stem: "hip_shim",
};
const MUSA: Vendor = Vendor {
    name: "MUSA",
    kind: DeviceKind::MUSA,
    source: "../hmc-backend-musa/tests/shim/musa_shim.c",
    stem: "musa_shim",
};
const MLU: Vendor = Vendor {
    name: "MLU",
    kind: DeviceKind::MLU,
    source: "../hmc-backend-mlu/tests/shim/cnrt_shim.c",
    stem: "cnrt_shim",
};

/// `vendor`'s shim, built (once per test binary; the child loads it from the same path).
fn shim(vendor: &Vendor) -> PathBuf {
    static BUILT: Mutex<Vec<(&'static str, PathBuf)>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap();
    if let Some((_, path)) = built.iter().find(|(stem, _)| *stem == vendor.stem) {
        return path.clone();
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(vendor.source);
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(vendor.stem);
    let path = hmc_testshim::build_shim(&src, vendor.stem, &out)
        .unwrap_or_else(|e| panic!("build the {} ABI shim: {e}", vendor.name));
    built.push((vendor.stem, path.clone()));
    path
}

fn hip_shim() -> PathBuf {
    shim(&HIP)
}

fn upload<M: Memory>(mem: &M, buf: &mut M::Buffer, bytes: &[u8]) {
    mem.copy(&mut MemSpanMut::of(buf), &MemSpan::host(bytes))
        .unwrap();
}

fn download<M: Memory>(mem: &M, buf: &M::Buffer) -> Vec<u8> {
    let mut out = vec![0u8; buf.len()];
    mem.copy(&mut MemSpanMut::host(&mut out), &MemSpan::of(buf))
        .unwrap();
    out
}

/// The peer process ([`support::serve_device_peer`]): a device buffer of `pattern(21)` of
/// the vendor `HMC_SHM_DEVICE_CHILD` names, its shim at `HMC_SHM_DEVICE_SHIM`, registered
/// by IPC.
#[test]
fn child_peer() {
    let Some(rt) = support::child_runtime("HMC_SHM_DEVICE_CHILD") else {
        return;
    };
    let _guard = rt.enter();
    let vendor = std::env::var("HMC_SHM_DEVICE_CHILD").unwrap();
    let lib = std::env::var_os("HMC_SHM_DEVICE_SHIM").expect("the shim's path");
    match vendor.as_str() {
        "HIP" => {
            support::serve_device_peer(RocmMemory::with_library(lib, PEER_DEVICE).unwrap(), LEN, 21)
        }
        "MUSA" => {
            support::serve_device_peer(MusaMemory::with_library(lib, PEER_DEVICE).unwrap(), LEN, 21)
        }
        "MLU" => {
            support::serve_device_peer(MluMemory::with_library(lib, PEER_DEVICE).unwrap(), LEN, 21)
        }
        other => panic!("no vendor {other}"),
    }
}

fn spawn_peer(vendor: &Vendor) -> Peer {
    Peer::spawn(&[
        ("HMC_SHM_DEVICE_CHILD", vendor.name.as_ref()),
        ("HMC_SHM_DEVICE_SHIM", shim(vendor).as_os_str()),
    ])
}

fn deadline() -> Deadline {
    Deadline::after(Duration::from_secs(20))
}

async fn run(
    comm: &ShmCommunicator,
    ep: &ShmEndpoint,
    op: Op,
    local: &hmc_transport_shm::ShmRegistration,
    key: &ShmRemoteKey,
    offset: usize,
    len: usize,
) -> hmc_core::Result<()> {
    let d = [TransferDesc::new(local, offset, key, offset as u64, len)];
    comm.transfer(ep, op, &d, deadline()).await
}

/// Waits (bounded) until the shim counts `want` live allocations on `device` in this
/// process: mappings are closed by the endpoint's reader thread.
async fn settle(shim: &ShimControl, device: i32, want: i32) -> i32 {
    for _ in 0..500 {
        if shim.live_on_device(device) == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    shim.live_on_device(device)
}

/// Host memory here and the peer's device memory, then device memory on both sides: READ
/// and WRITE of the whole region (8 chunks) with checksums, 64 small transfers more, and
/// one IPC opening per local device for all of them, seen by the endpoint and by the shim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hip_device_memory_moves_between_two_processes_through_one_cached_ipc_mapping() {
    moves_between_two_processes(&HIP, RocmMemory::with_library).await;
}

/// As for HIP, over MUSA's shim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn musa_device_memory_moves_between_two_processes_through_one_cached_ipc_mapping() {
    moves_between_two_processes(&MUSA, MusaMemory::with_library).await;
}

/// As for HIP, over CNRT's shim (MLU).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mlu_device_memory_moves_between_two_processes_through_one_cached_ipc_mapping() {
    moves_between_two_processes(&MLU, MluMemory::with_library).await;
}

async fn moves_between_two_processes<M: Memory + Clone>(
    vendor: &Vendor,
    open: fn(PathBuf, u32) -> hmc_core::Result<M>,
) {
    let _one_at_a_time = SERIAL.lock().await;
    let mut peer = spawn_peer(vendor);
    let lib = shim(vendor);
    let shim = ShimControl::open(&lib);
    let comm = Arc::new(
        ShmCommunicator::bind(ShmConfig {
            chunk_len: 512 << 10,
            ..ShmConfig::default()
        })
        .unwrap(),
    );
    let host_engine = open(lib.clone(), 0).unwrap();
    comm.add_memory(AnyMemory::new(host_engine));
    let ep = comm.connect(&peer.addr, deadline()).await.unwrap();
    let key = comm.import(&ep, &peer.desc).unwrap();
    assert_eq!(
        peer.desc.region.device,
        Device::new(vendor.kind, PEER_DEVICE)
    );
    assert_eq!(
        peer.desc.key.len(),
        24,
        "id and token only: no handle, no pointer"
    );

    // Host memory here: the device-0 backend opens the handle and copies.
    let host = host_buffer(&comm, LEN);
    run(&comm, &ep, Op::Read, host.registration(), &key, 0, LEN)
        .await
        .unwrap();
    let mut got = vec![0u8; LEN];
    host.read_at(0, &mut MemSpanMut::host(&mut got)).unwrap();
    assert_eq!(checksum(&got), checksum(&pattern(21, LEN)), "READ to host");
    let mut mine = pattern(22, LEN);
    host.write_at(0, &MemSpan::host(&mine)).unwrap();
    run(&comm, &ep, Op::Write, host.registration(), &key, 0, LEN)
        .await
        .unwrap();
    assert_eq!(peer.sum(), checksum(&mine), "WRITE from host");
    assert_eq!((ep.ipc_opens(), ep.ipc_mappings()), (1, 1));
    assert_eq!(shim.live_on_device(0), 1, "the mapping, opened on device 0");

    // 32 small WRITEs and 32 small READs through the same mapping.
    let small = 64 << 10;
    for i in 0..32 {
        let at = i * 2 * small;
        let bytes = pattern(100 + i as u64, small);
        mine[at..at + small].copy_from_slice(&bytes);
        host.write_at(at, &MemSpan::host(&bytes)).unwrap();
        run(&comm, &ep, Op::Write, host.registration(), &key, at, small)
            .await
            .unwrap();
    }
    assert_eq!(peer.sum(), checksum(&mine), "64 KiB WRITEs landed");
    host.write_at(0, &MemSpan::host(&vec![0u8; LEN])).unwrap();
    for i in 0..32 {
        let at = (i * 2 + 1) * small;
        run(&comm, &ep, Op::Read, host.registration(), &key, at, small)
            .await
            .unwrap();
        let mut got = vec![0u8; small];
        host.read_at(at, &mut MemSpanMut::host(&mut got)).unwrap();
        assert_eq!(got, mine[at..at + small], "64 KiB READ {i}");
    }
    assert_eq!(ep.ipc_opens(), 1, "66 transfers, one opening");

    // Device memory here (device 1): that device's backend opens the handle on it and
    // copies device to device.
    let dev = open(lib.clone(), 1).unwrap();
    let mut local = dev.alloc(LEN).unwrap();
    // SAFETY: `local` outlives `reg` (dropped at the end of this test, after it).
    let reg = unsafe { comm.register_device(&dev, &local, Access::READ_WRITE) }.unwrap();
    run(&comm, &ep, Op::Read, &reg, &key, 0, LEN).await.unwrap();
    assert_eq!(
        checksum(&download(&dev, &local)),
        checksum(&mine),
        "READ to device"
    );
    let theirs = pattern(23, LEN);
    upload(&dev, &mut local, &theirs);
    run(&comm, &ep, Op::Write, &reg, &key, 0, LEN)
        .await
        .unwrap();
    assert_eq!(peer.sum(), checksum(&theirs), "WRITE from device");
    assert_eq!(
        (ep.ipc_opens(), ep.ipc_mappings()),
        (2, 2),
        "one per local device"
    );
    assert_eq!(
        shim.live_on_device(1),
        2,
        "the buffer and the mapping on device 1"
    );

    // The peer closing the side channel (exiting) closes every mapping.
    drop(peer);
    assert_eq!(settle(&shim, 0, 0).await, 0, "device 0's mapping closed");
    assert_eq!(settle(&shim, 1, 1).await, 1, "device 1's mapping closed");
    let err = run(&comm, &ep, Op::Read, &reg, &key, 0, 4096)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Peer { .. }), "{err:?}");
    drop(reg);
    drop(local);
}

/// A region inside a larger allocation, registered as a region with its backend
/// (`register_memory`, as the engine and Python register a framework's tensor): the peer
/// exports the allocation by IPC naming only the region, and a READ and a WRITE of it from
/// device memory here move exactly its bytes, the allocation's head and tail untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_inside_an_allocation_is_shared_by_ipc_of_that_allocation() {
    let _one_at_a_time = SERIAL.lock().await;
    let at = (1usize << 20) + 4096;
    let mut peer = Peer::spawn(&[
        ("HMC_SHM_DEVICE_CHILD", "HIP".as_ref()),
        ("HMC_SHM_DEVICE_SHIM", hip_shim().as_os_str()),
        ("HMC_SHM_DEVICE_SPAN", at.to_string().as_ref()),
    ]);
    assert_eq!(peer.desc.region.len, LEN, "the region, not the allocation");
    let comm = ShmCommunicator::bind(ShmConfig::default()).unwrap();
    let dev = RocmMemory::with_library(hip_shim(), 1).unwrap();
    let any = AnyMemory::new(dev.clone());
    // A region at an offset of a local allocation too, registered the same way.
    let whole = dev.alloc(LEN + 8192).unwrap();
    let region = whole.region().slice(8192, LEN).unwrap();
    // SAFETY: `region` lies in `whole`, which outlives `reg` (dropped first, below).
    let reg = unsafe { comm.register_memory(region, Access::READ_WRITE, &any) }.unwrap();
    let ep = comm.connect(&peer.addr, deadline()).await.unwrap();
    let key = comm.import(&ep, &peer.desc).unwrap();

    run(&comm, &ep, Op::Read, &reg, &key, 0, LEN).await.unwrap();
    let got = download(&dev, &whole);
    assert_eq!(got[..8192], [0u8; 8192], "the local head is untouched");
    assert_eq!(checksum(&got[8192..]), checksum(&pattern(21, LEN)), "READ");
    let theirs = pattern(24, LEN);
    // SAFETY: `region` lies in `whole`, not otherwise accessed meanwhile.
    let mut dst = unsafe { MemSpanMut::from_region(region) };
    dev.copy(&mut dst, &MemSpan::host(&theirs)).unwrap();
    run(&comm, &ep, Op::Write, &reg, &key, 0, LEN)
        .await
        .unwrap();
    assert_eq!(peer.sum(), checksum(&theirs), "WRITE of exactly the region");
    assert_eq!(ep.ipc_opens(), 1);
    let err = run(&comm, &ep, Op::Read, &reg, &key, 4096, LEN)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::OutOfBounds { .. }),
        "past the region: {err:?}"
    );
    drop(peer);
    drop(reg);
    drop(whole);
}

/// `register_memory` refuses what cannot be exported by IPC with the reason: a range that
/// straddles two allocations, memory the runtime did not allocate, and a runtime whose
/// table binds no address-range query (MUSA's), which points at `register_device`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_memory_refuses_ranges_ipc_cannot_name() {
    let _one_at_a_time = SERIAL.lock().await;
    let comm = ShmCommunicator::bind(ShmConfig::default()).unwrap();
    let dev = RocmMemory::with_library(hip_shim(), 1).unwrap();
    let any = AnyMemory::new(dev.clone());
    let a = dev.alloc(1 << 20).unwrap();
    let straddling = Region {
        len: (2 << 20) as usize,
        ..a.region()
    };
    // SAFETY: refused before any registration is made.
    let err = unsafe { comm.register_memory(straddling, Access::READ, &any) }.unwrap_err();
    assert!(
        err.to_string().contains("not inside one allocation"),
        "{err}"
    );
    let host = vec![0u8; 4096];
    let not_device = Region {
        device: dev.device(),
        addr: host.as_ptr() as u64,
        len: host.len(),
    };
    // SAFETY: as above.
    let err = unsafe { comm.register_memory(not_device, Access::READ, &any) }.unwrap_err();
    assert!(err.to_string().contains("hipMemGetAddressRange"), "{err}");

    let musa = MusaMemory::with_library(shim(&MUSA), 0).unwrap();
    let buf = musa.alloc(4096).unwrap();
    // SAFETY: as above.
    let err = unsafe { comm.register_memory(buf.region(), Access::READ, &AnyMemory::new(musa)) }
        .unwrap_err();
    assert!(
        matches!(err, Error::UnsupportedMemory { .. })
            && err.to_string().contains("register_device"),
        "{err}"
    );
    // SAFETY: as above.
    let err = unsafe { comm.register(a.region(), Access::READ) }.unwrap_err();
    assert!(err.to_string().contains("register_memory"), "{err}");
}

/// Rekeying closes the mapping before the peer's `rekey` returns; the old key is then
/// refused and the new one opens the handle again. Dropping the registration does the
/// same, and the key is refused for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocation_closes_the_mapping_and_stale_keys_are_refused() {
    let _one_at_a_time = SERIAL.lock().await;
    let mut peer = spawn_peer(&HIP);
    let shim = ShimControl::open(hip_shim());
    let comm = Arc::new(ShmCommunicator::bind(ShmConfig::default()).unwrap());
    comm.add_memory(AnyMemory::new(
        RocmMemory::with_library(hip_shim(), 3).unwrap(),
    ));
    let ep = comm.connect(&peer.addr, deadline()).await.unwrap();
    let key = comm.import(&ep, &peer.desc).unwrap();
    let host = host_buffer(&comm, 4096);
    let reg = host.registration();
    run(&comm, &ep, Op::Read, reg, &key, 0, 4096).await.unwrap();
    assert_eq!(shim.live_on_device(3), 1);

    let fresh = RemoteRegion::decode(&unhex(&peer.ask("rekey", "DESC "))).unwrap();
    // The peer's `rekey` returned: our reader thread released the lease, after closing.
    assert_eq!(
        shim.live_on_device(3),
        0,
        "closed before the rekey returned"
    );
    assert_eq!(ep.ipc_mappings(), 0);
    let err = run(&comm, &ep, Op::Read, reg, &key, 0, 4096)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidKey(_)), "{err:?}");
    let key = comm.import(&ep, &fresh).unwrap();
    run(&comm, &ep, Op::Write, reg, &key, 0, 4096)
        .await
        .unwrap();
    assert_eq!((ep.ipc_opens(), shim.live_on_device(3)), (2, 1), "reopened");

    let left = peer.ask("drop", "DROPPED ");
    assert_eq!(left, "0", "every lease released before the drop returned");
    assert_eq!(shim.live_on_device(3), 0, "closed before the drop returned");
    let err = run(&comm, &ep, Op::Write, reg, &key, 0, 4096)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidKey(_)), "{err:?}");
    assert!(err.to_string().contains("deregistered"), "{err}");
}

/// The ACL shim built without its `aclrtIpcMem*` functions, as an older CANN.
fn acl_shim_without_ipc() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("shm_acl_shim_no_ipc");
    std::fs::create_dir_all(&dir).unwrap();
    let full = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../hmc-backend-ascend/tests/shim/acl_shim.c")
        .canonicalize()
        .unwrap();
    let src = dir.join("acl_shim_no_ipc.c");
    let text = format!(
        "#define SHIM_ACL_NO_IPC 1\n#include \"{}\"\n",
        full.display()
    );
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if std::fs::read_to_string(&src).ok().as_deref() != Some(text.as_str())
        || modified(&full) > modified(&src)
    {
        std::fs::write(&src, text).unwrap();
    }
    hmc_testshim::build_shim(&src, "acl_shim_no_ipc", &dir).expect("build the ACL ABI shim")
}

#[tokio::test]
async fn a_backend_without_ipc_is_refused_at_register_device_with_the_reason() {
    let _one_at_a_time = SERIAL.lock().await;
    let comm = ShmCommunicator::bind(ShmConfig::default()).unwrap();
    let mem = AscendMemory::with_library(acl_shim_without_ipc(), 1).unwrap();
    let buf = mem.alloc(4096).unwrap();
    // SAFETY: refused; nothing is registered.
    let err = unsafe { comm.register_device(&mem, &buf, Access::READ) }.unwrap_err();
    let Error::UnsupportedMemory { device, reason, .. } = &err else {
        panic!("expected UnsupportedMemory, got {err:?}");
    };
    assert_eq!(*device, Device::new(DeviceKind::ASCEND, 1));
    assert!(
        reason.contains("ipc: false") && reason.contains("stage the bytes through host memory"),
        "{err}"
    );
}

#[tokio::test]
async fn a_failing_export_is_the_vendors_error_and_registers_nothing() {
    let _one_at_a_time = SERIAL.lock().await;
    let comm = ShmCommunicator::bind(ShmConfig::default()).unwrap();
    let mem = RocmMemory::with_library(hip_shim(), 1).unwrap();
    let buf = mem.alloc(4096).unwrap();
    ShimControl::open(hip_shim()).fail_next("hipIpcGetMemHandle", 1);
    // SAFETY: refused; nothing is registered.
    let err = unsafe { comm.register_device(&mem, &buf, Access::READ) }.unwrap_err();
    assert!(matches!(err, Error::Device { .. }), "{err:?}");
    assert!(err.to_string().contains("hipIpcGetMemHandle"), "{err}");
    let other = RocmMemory::with_library(hip_shim(), 2).unwrap();
    // SAFETY: refused; nothing is registered.
    let err = unsafe { comm.register_device(&other, &buf, Access::READ) }.unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
}

#[tokio::test]
async fn device_regions_point_at_register_device_and_add_memory() {
    let _one_at_a_time = SERIAL.lock().await;
    let comm = ShmCommunicator::bind(ShmConfig::default()).unwrap();
    let device = Device::new(DeviceKind::ROCM, 0);
    let region = Region {
        device,
        addr: 0x1000,
        len: 4096,
    };
    // SAFETY: refused; nothing is registered.
    let err = unsafe { comm.register(region, Access::READ) }.unwrap_err();
    assert!(err.to_string().contains("register_device"), "{err}");

    let peer = ShmCommunicator::bind(ShmConfig::default()).unwrap();
    let ep = comm.connect(&peer.address(), deadline()).await.unwrap();
    let remote = RemoteRegion {
        transport: hmc_core::TransportId::SHM,
        region,
        access: Access::READ,
        key: vec![0; 24],
    };
    // Imported (a peer table may list device regions this side never uses); a transfer
    // with it is refused before the peer is asked, naming what to add.
    let key = comm.import(&ep, &remote).unwrap();
    let mut buf = vec![0u8; 4096];
    let local = Region {
        device: Device::HOST,
        addr: buf.as_mut_ptr() as u64,
        len: buf.len(),
    };
    // SAFETY: `buf` outlives the registration (dropped at the end of the test).
    let reg = unsafe { comm.register(local, Access::READ_WRITE) }.unwrap();
    let desc = [hmc_core::TransferDesc {
        local: &reg,
        local_offset: 0,
        remote: &key,
        remote_offset: 0,
        len: 16,
    }];
    let err = comm
        .transfer(&ep, hmc_core::Op::Read, &desc, deadline())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::UnsupportedMemory { .. }), "{err:?}");
    assert!(err.to_string().contains("add_memory"), "{err}");
    assert!(!comm.capabilities().remote_memory.contains(DeviceKind::ROCM));
    comm.add_memory(AnyMemory::new(
        RocmMemory::with_library(hip_shim(), 0).unwrap(),
    ));
    assert!(comm.capabilities().remote_memory.contains(DeviceKind::ROCM));
    comm.import(&ep, &remote).unwrap();
}

/// Device memory here against a peer's host memory: reached by cross-memory attach (through
/// a host bounce buffer, as the kernel cannot reach device memory) and by the peer's shared
/// mapping (`alloc_registered`, copied by the device's engine), both ways, with a partial
/// last chunk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_memory_here_reaches_peer_host_memory_by_attach_and_by_mapping() {
    let _one_at_a_time = SERIAL.lock().await;
    let len = (3 << 20) + 5;
    let small_chunks = ShmConfig {
        chunk_len: 1 << 20,
        ..ShmConfig::default()
    };
    let me = ShmCommunicator::bind(small_chunks).unwrap();
    let peer = Arc::new(ShmCommunicator::bind(ShmConfig::default()).unwrap());
    let attach = host_buffer(&peer, len);
    let shared = peer
        .alloc_registered(len, Access::READ_WRITE)
        .unwrap()
        .expect("shared memory");
    fill(attach.registration(), &pattern(31, len));
    fill(&shared, &pattern(32, len));

    let dev = RocmMemory::with_library(hip_shim(), 1).unwrap();
    let mut local = dev.alloc(len).unwrap();
    // SAFETY: `local` outlives `reg` (declared before it, dropped after).
    let reg = unsafe { me.register_device(&dev, &local, Access::READ_WRITE) }.unwrap();
    let ep = me.connect(&peer.address(), deadline()).await.unwrap();
    for (what, remote, seed) in [
        ("attach", attach.registration(), 31),
        ("mapping", &shared, 32),
    ] {
        let key = me.import(&ep, &peer.export(remote).unwrap()).unwrap();
        run(&me, &ep, Op::Read, &reg, &key, 0, len).await.unwrap();
        assert_eq!(download(&dev, &local), pattern(seed, len), "READ by {what}");
        upload(&dev, &mut local, &pattern(seed + 10, len));
        run(&me, &ep, Op::Write, &reg, &key, 0, len).await.unwrap();
        assert_eq!(contents(remote), pattern(seed + 10, len), "WRITE by {what}");
    }
    assert_eq!(ep.mapped_regions(), 1, "the shared memory was mapped");
    assert_eq!(ep.ipc_opens(), 0, "no IPC for host memory");
}

/// Dropping a device registration while a peer copies from it: the drop waits for the
/// chunk in progress, the peer's transfer ends with `InvalidKey`, and the mapping is
/// closed by the time the drop returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_device_registration_mid_transfer_ends_it_and_closes_the_mapping() {
    let _one_at_a_time = SERIAL.lock().await;
    let len = 16 << 20;
    let shim = ShimControl::open(hip_shim());
    let target = ShmCommunicator::bind(ShmConfig::default()).unwrap();
    let me = Arc::new(
        ShmCommunicator::bind(ShmConfig {
            chunk_len: 64 << 10,
            ..ShmConfig::default()
        })
        .unwrap(),
    );
    me.add_memory(AnyMemory::new(
        RocmMemory::with_library(hip_shim(), 3).unwrap(),
    ));
    let dev = RocmMemory::with_library(hip_shim(), 2).unwrap();
    let buf = dev.alloc(len).unwrap();
    // SAFETY: `buf` outlives `reg`, which is dropped in the blocking task joined below.
    let reg = unsafe { target.register_device(&dev, &buf, Access::READ) }.unwrap();
    let host =
        RegisteredBuffer::new(Arc::new(HostMemory::new()), me.clone(), len, Access::WRITE).unwrap();
    let ep = me.connect(&target.address(), deadline()).await.unwrap();
    let key = me.import(&ep, &target.export(&reg).unwrap()).unwrap();
    run(&me, &ep, Op::Read, host.registration(), &key, 0, len)
        .await
        .unwrap();
    assert_eq!(shim.live_on_device(3), 1, "opened");
    let transfers = async {
        loop {
            if let Err(e) = run(&me, &ep, Op::Read, host.registration(), &key, 0, len).await {
                return e;
            }
        }
    };
    let dropper = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        tokio::task::spawn_blocking(move || {
            drop(reg);
            // Counted here, as the drop returns: the reader thread closed the mapping
            // before it answered `Released`.
            ShimControl::open(hip_shim()).live_on_device(3)
        })
        .await
        .unwrap()
    };
    let (err, live_after_drop) = tokio::join!(transfers, dropper);
    assert!(matches!(err, Error::InvalidKey(_)), "{err:?}");
    assert_eq!(
        live_after_drop, 0,
        "the mapping was closed before the drop returned"
    );
    assert_eq!(target.outstanding_leases(), 0);
    drop(buf);
}
