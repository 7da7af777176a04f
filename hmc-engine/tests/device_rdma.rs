//! GPUDirect RDMA under the engine, against stand-ins: device memory of the CUDA driver ABI
//! shim (`hmc-backend-cuda/tests/shim/cuda_shim.c`, loaded by cudarc's real loader in a child
//! process; its allocations are memfds and `cuMemGetHandleForAddressRange` hands out their
//! DMA-BUFs) registered by `register_device_mem` with the RDMA transport over the
//! libibverbs stand-in, which maps DMA-BUF registrations as a NIC reaches the device's
//! pages. The transport registers such memory directly (`ibv_reg_dmabuf_mr`); a peer READs
//! and WRITEs it, and this engine moves its own device region, with checksums and with no
//! byte through either engine's host bounce buffers. Both engines are in the child (the
//! stand-in's NIC is per process). Not a NIC and not a GPU.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hmc_backend_cuda::CudaMemory;
use hmc_core::{
    AnyCommunicator, AnyMemory, DeviceBuffer, DeviceKind, DeviceMemoryPath, MemSpan, MemSpanMut,
    Memory,
};
use hmc_engine::{Access, Engine, EngineConfig, MemDesc, MemType, TransferOp, TransferOpDesc};

mod common;

const T: Duration = Duration::from_secs(20);
const CHILD: &str = "HMC_DEVICE_RDMA_CHILD";
/// Two CUDA pages' worth and a ragged tail inside the allocation.
const LEN: usize = (2 << 20) + 4099;

fn shim_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("hmc-engine-cuda-shim")
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn device_memory_is_registered_by_dma_buf_and_moved_by_the_nic_both_ways() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let src =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../hmc-backend-cuda/tests/shim/cuda_shim.c");
    let lib = hmc_testshim::build_shim(&src, "cuda", &shim_dir()).expect("build the CUDA shim");
    // cudarc tries `libcuda.so` first, then `.so.1`: both are the shim.
    std::fs::copy(&lib, shim_dir().join("libcuda.so.1")).unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["child", "--exact", "--ignored", "--nocapture"])
        .env("LD_LIBRARY_PATH", shim_dir())
        .env(CHILD, "1")
        .output()
        .unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("checked"), "the child ran no checks:\n{text}");
}

fn staged_bytes(metrics: &metrics_exporter_prometheus::PrometheusHandle) -> u64 {
    metrics
        .render()
        .lines()
        .filter(|l| l.starts_with("hmc_engine_staged_bytes_total{"))
        .filter_map(|l| l.split(' ').nth(1))
        .map(|v| v.parse::<u64>().unwrap())
        .sum()
}

async fn engine() -> Engine<AnyCommunicator> {
    common::engine_over(
        Arc::new(common::standin::rdma_standin()),
        EngineConfig::default(),
    )
    .await
}

/// Device memory registered with the engine at `addr..addr+len` of `mem`.
fn register_device(
    e: &Engine<AnyCommunicator>,
    mem: &CudaMemory,
    addr: u64,
    len: usize,
) -> hmc_engine::MemHandle {
    // SAFETY: the allocation outlives the engines (dropped after them).
    unsafe { e.register_device_mem(MemDesc { addr, len }, AnyMemory::new(mem.clone())) }.unwrap()
}

fn download(mem: &CudaMemory, addr: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let region = hmc_core::Region {
        device: mem.device(),
        addr,
        len,
    };
    // SAFETY: `region` lies inside a live allocation of `mem`.
    let span = unsafe { MemSpan::from_region(region) };
    mem.copy(&mut MemSpanMut::host(&mut out), &span).unwrap();
    out
}

fn upload(mem: &CudaMemory, addr: u64, bytes: &[u8]) {
    let region = hmc_core::Region {
        device: mem.device(),
        addr,
        len: bytes.len(),
    };
    // SAFETY: `region` lies inside a live allocation of `mem`, and nothing else uses it now.
    let mut span = unsafe { MemSpanMut::from_region(region) };
    mem.copy(&mut span, &MemSpan::host(bytes)).unwrap();
}

/// The child: both engines, the shim's device, the stand-in's NIC.
#[test]
#[ignore = "the child process of the test above"]
fn child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .unwrap();
    let rt = common::runtime();
    rt.block_on(async move {
        let mem = CudaMemory::new(0).expect("the driver ABI shim loads");
        let (a, b) = (engine().await, engine().await);
        assert_eq!(
            b.capabilities().memory_path(DeviceKind::CUDA),
            DeviceMemoryPath::Direct
        );
        // The target's device region, at an offset inside its allocation's first page (the
        // shim's DMA-BUF is the whole allocation, a driver's the pages asked for: the two
        // agree where the range starts in the first page).
        // Whole pages: a DMA-BUF covers the pages around the registered range, which must lie
        // in the allocation.
        let theirs = mem.alloc((LEN + 100).next_multiple_of(4096)).unwrap();
        let t_addr = theirs.region().addr + 100;
        let original = pattern(LEN, 7);
        upload(&mem, t_addr, &original);
        register_device(&b, &mem, t_addr, LEN);
        let peer = a.add_remote(&b.local_metadata().unwrap(), T).await.unwrap();
        // READ into host memory, WRITE from it.
        let mut host = vec![0u8; LEN];
        // SAFETY: `host` outlives the engines.
        unsafe {
            a.register_mem(
                MemDesc {
                    addr: host.as_ptr() as u64,
                    len: LEN,
                },
                MemType::Host,
                Access::READ_WRITE,
            )
        }
        .unwrap();
        let one = |local: u64| TransferOpDesc {
            local_addr: local,
            remote_addr: t_addr,
            len: LEN,
        };
        a.transfer(&peer, TransferOp::Read, &[one(host.as_ptr() as u64)], T)
            .await
            .unwrap();
        assert!(host == original, "READ of the peer's device region");
        // Into this engine's own device region, and back out of it.
        let mine = mem.alloc(LEN.next_multiple_of(4096)).unwrap();
        let m_addr = mine.region().addr;
        register_device(&a, &mem, m_addr, LEN);
        a.transfer(&peer, TransferOp::Read, &[one(m_addr)], T)
            .await
            .unwrap();
        assert!(
            download(&mem, m_addr, LEN) == original,
            "READ device to device"
        );
        let written = pattern(LEN, 99);
        upload(&mem, m_addr, &written);
        a.transfer(&peer, TransferOp::Write, &[one(m_addr)], T)
            .await
            .unwrap();
        assert!(
            download(&mem, t_addr, LEN) == written,
            "WRITE device to device"
        );
        host.copy_from_slice(&pattern(LEN, 3));
        a.transfer(&peer, TransferOp::Write, &[one(host.as_ptr() as u64)], T)
            .await
            .unwrap();
        assert!(
            download(&mem, t_addr, LEN) == pattern(LEN, 3),
            "WRITE from host memory"
        );
        // The bytes around the registered range are the peer's own.
        assert!(download(&mem, theirs.region().addr, 100) == vec![0u8; 100]);
        assert_eq!(
            staged_bytes(&metrics),
            0,
            "no byte through a host bounce buffer"
        );
        a.finalize().await;
        b.finalize().await;
        drop((theirs, mine));
        println!("checked");
    });
}
