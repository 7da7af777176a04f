//! Device memory through CUDA IPC between two real processes, against the CUDA driver ABI
//! shim of `hmc-backend-cuda` (`cuda.h`'s symbols over host memory, loaded by cudarc as
//! `libcuda.so` through `LD_LIBRARY_PATH`). Like the driver, the shim refuses to open a
//! handle in the process that exported it, so only the two-process path can pass.
//!
//! The launcher test builds the shim and runs this binary again with it on the loader path
//! as the initiator (`initiator`, ignored otherwise), which spawns the peer (`child_peer`).
//! These tests check the transport's use of CUDA IPC, not a GPU.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hmc_backend_cuda::CudaMemory;
use hmc_core::testing::pattern;
use hmc_core::{
    Access, AnyMemory, Communicator, ConnBuffer, Deadline, Device, DeviceKind, Error, MemSpan,
    MemSpanMut, Memory, Op, RemoteRegion, TransferDesc,
};
use hmc_transport_shm::{ShmCommunicator, ShmConfig};

mod support;
use support::{Peer, checksum, host_buffer, unhex};

const LEN: usize = 4 << 20;
/// Set in the initiator, which runs with the shim on the loader path.
const INITIATOR_ENV: &str = "HMC_SHM_CUDA_INITIATOR";
/// Set in the peer.
const PEER_ENV: &str = "HMC_SHM_CUDA_PEER";

fn shim_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("hmc-transport-shm-cuda-shim")
}

#[test]
fn cuda_ipc_moves_device_memory_between_two_processes_against_the_driver_shim() {
    if std::env::var_os(INITIATOR_ENV).is_some() || std::env::var_os(PEER_ENV).is_some() {
        return;
    }
    let src =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../hmc-backend-cuda/tests/shim/cuda_shim.c");
    let lib = hmc_testshim::build_shim(&src, "cuda", &shim_dir()).expect("build the CUDA shim");
    // cudarc tries `libcuda.so` first, then `.so.1`: both are the shim, so a system driver is
    // never picked up.
    std::fs::copy(&lib, shim_dir().join("libcuda.so.1")).unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "initiator",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("LD_LIBRARY_PATH", shim_dir())
        .env(INITIATOR_ENV, "1")
        .output()
        .unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("test result: ok. 1 passed"),
        "the initiator failed:\n{text}"
    );
}

/// The peer: `pattern(41)` in CUDA device memory (ordinal 1 of the shim), by IPC.
#[test]
fn child_peer() {
    let Some(rt) = support::child_runtime(PEER_ENV) else {
        return;
    };
    let _guard = rt.enter();
    let mem = CudaMemory::new(1).expect("the driver shim is on the loader path");
    support::serve_device_peer(mem, LEN, 41);
}

fn deadline() -> Deadline {
    Deadline::after(Duration::from_secs(20))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by cuda_ipc_moves_device_memory_between_two_processes_against_the_driver_shim"]
async fn initiator() {
    // The peer inherits LD_LIBRARY_PATH, so it loads the shim too.
    let mut peer = Peer::spawn(&[(PEER_ENV, "1".as_ref())]);
    assert_eq!(peer.desc.region.device, Device::new(DeviceKind::CUDA, 1));
    let comm = Arc::new(
        ShmCommunicator::bind(ShmConfig {
            chunk_len: 1 << 20,
            ..ShmConfig::default()
        })
        .unwrap(),
    );
    comm.add_memory(AnyMemory::new(CudaMemory::new(0).unwrap()));
    let ep = comm.connect(&peer.addr, deadline()).await.unwrap();
    let key = comm.import(&ep, &peer.desc).unwrap();
    let host = host_buffer(&comm, LEN);
    let whole = |key| [TransferDesc::new(host.registration(), 0, key, 0, LEN)];

    comm.transfer(&ep, Op::Read, &whole(&key), deadline())
        .await
        .unwrap();
    let mut got = vec![0u8; LEN];
    host.read_at(0, &mut MemSpanMut::host(&mut got)).unwrap();
    assert_eq!(checksum(&got), checksum(&pattern(41, LEN)), "READ");
    let mut mine = pattern(42, LEN);
    host.write_at(0, &MemSpan::host(&mine)).unwrap();
    comm.transfer(&ep, Op::Write, &whole(&key), deadline())
        .await
        .unwrap();
    assert_eq!(peer.sum(), checksum(&mine), "WRITE");
    let small = 4096;
    for i in 0..16 {
        let at = i * 3 * small;
        mine[at..at + small].copy_from_slice(&pattern(50 + i as u64, small));
        host.write_at(at, &MemSpan::host(&mine[at..at + small]))
            .unwrap();
        let d = [TransferDesc::new(
            host.registration(),
            at,
            &key,
            at as u64,
            small,
        )];
        comm.transfer(&ep, Op::Write, &d, deadline()).await.unwrap();
    }
    assert_eq!(peer.sum(), checksum(&mine), "small WRITEs");
    assert_eq!((ep.ipc_opens(), ep.ipc_mappings()), (1, 1), "opened once");

    // CUDA device memory here: device to device through the mapping on device 2.
    let dev = CudaMemory::new(2).unwrap();
    let mut local = dev.alloc(LEN).unwrap();
    // SAFETY: `local` outlives `reg` (dropped before it, below).
    let reg = unsafe { comm.register_device(&dev, &local, Access::READ_WRITE) }.unwrap();
    let d = [TransferDesc::new(&reg, 0, &key, 0, LEN)];
    comm.transfer(&ep, Op::Read, &d, deadline()).await.unwrap();
    let mut back = vec![0u8; LEN];
    dev.copy(&mut MemSpanMut::host(&mut back), &MemSpan::of(&local))
        .unwrap();
    assert_eq!(checksum(&back), checksum(&mine), "READ to device");
    dev.copy(
        &mut MemSpanMut::of(&mut local),
        &MemSpan::host(&pattern(43, LEN)),
    )
    .unwrap();
    comm.transfer(&ep, Op::Write, &d, deadline()).await.unwrap();
    assert_eq!(peer.sum(), checksum(&pattern(43, LEN)), "WRITE from device");
    assert_eq!(ep.ipc_opens(), 2, "one per local device");

    // Rekeyed: both mappings closed before the peer's rekey returned; the old key is
    // refused, the new one opens again.
    let fresh = RemoteRegion::decode(&unhex(&peer.ask("rekey", "DESC "))).unwrap();
    assert_eq!(ep.ipc_mappings(), 0);
    let err = comm
        .transfer(&ep, Op::Read, &whole(&key), deadline())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidKey(_)), "{err:?}");
    let key = comm.import(&ep, &fresh).unwrap();
    comm.transfer(&ep, Op::Read, &whole(&key), deadline())
        .await
        .unwrap();
    assert_eq!((ep.ipc_opens(), ep.ipc_mappings()), (3, 1));
    drop(reg);
    drop(local);
}
