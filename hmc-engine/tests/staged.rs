//! Device memory the transport does not move directly (the TCP transport registers host
//! memory only, and stages device memory) goes through host bounce buffers: WRITE from it
//! and READ into it, with every byte checked, and a peer reaches it through the
//! transport's pinned chunks. The "device" is host memory that calls itself a
//! CUDA device and counts its copies: it tests the engine's staging, not a GPU.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{desc, engine_over, host, register_rw};
use hmc_core::{
    AnyMemory, Device, DeviceBuffer, DeviceKind, DeviceMemoryPath, MemSpan, MemSpanMut, Memory,
    Region, Result,
};
use hmc_engine::{
    BlockDesc, Engine, EngineConfig, EngineError, Side, TransferOp, TransferOpDesc, TransferStatus,
};
use hmc_transport_tcp::TcpCommunicator;

const T: Duration = Duration::from_secs(10);

/// Host memory presenting itself as CUDA device 0; copies are memcpy, counted.
struct FakeDevice(Arc<AtomicUsize>);
struct FakeBuffer(Vec<u8>);

impl DeviceBuffer for FakeBuffer {
    fn region(&self) -> Region {
        Region {
            device: Device::new(DeviceKind::CUDA, 0),
            addr: self.0.as_ptr() as u64,
            len: self.0.len(),
        }
    }
}

impl Memory for FakeDevice {
    type Buffer = FakeBuffer;
    fn device(&self) -> Device {
        Device::new(DeviceKind::CUDA, 0)
    }
    fn alloc(&self, len: usize) -> Result<FakeBuffer> {
        Ok(FakeBuffer(vec![0; len]))
    }
    fn copy(&self, dst: &mut MemSpanMut<'_>, src: &MemSpan<'_>) -> Result<()> {
        hmc_core::check_copy(self.device(), dst, src)?;
        self.0.fetch_add(1, Ordering::Relaxed);
        // SAFETY: `check_copy` proved equal lengths; both spans are live borrows of memory
        // this process owns (the fake device is host memory), and they do not overlap (a
        // bounce buffer and a tensor).
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.region().addr as *const u8,
                dst.region().addr as *mut u8,
                src.len(),
            )
        };
        Ok(())
    }
}

async fn engine() -> Engine<TcpCommunicator> {
    let comm =
        TcpCommunicator::bind(&"tcp://127.0.0.1:0".parse().unwrap(), Default::default()).unwrap();
    engine_over(Arc::new(comm), EngineConfig::default()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_memory_tcp_stages_moves_through_host_buffers_and_peers_reach_it() {
    // This test binary's own recorder (it holds this one test).
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .unwrap();
    let staged = |op: &str| -> f64 {
        let name = format!("hmc_engine_staged_bytes_total{{op=\"{op}\"}}");
        let page = metrics.render();
        page.lines()
            .find(|l| l.split(' ').next() == Some(name.as_str()))
            .and_then(|l| l.split(' ').nth(1))
            .map_or(0.0, |v| v.parse().unwrap())
    };
    let a = engine().await;
    let b = engine().await;
    let caps = a.capabilities();
    assert_eq!(
        caps.device_memory,
        DeviceMemoryPath::Refused,
        "TCP takes host memory only"
    );
    assert_eq!(
        caps.memory_path(DeviceKind::CUDA),
        DeviceMemoryPath::Staged,
        "and stages device memory"
    );
    let copies = Arc::new(AtomicUsize::new(0));
    let dev = AnyMemory::new(FakeDevice(copies.clone()));
    // 9 MiB + 5: more than two 4 MiB bounce chunks, and a ragged end.
    let len = (9 << 20) + 5;
    // Each MiB differs from the others (the prepared transfers below reorder them).
    let src: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(11) ^ 0x3c ^ ((i >> 20) as u8).wrapping_mul(37))
        .collect();
    let back = vec![0u8; len];
    let remote = vec![0u8; len];
    // SAFETY: the buffers outlive their registrations (the engines are dropped first).
    let (hs, hb) = unsafe {
        (
            a.register_device_mem(host(&src), dev.clone()).unwrap(),
            a.register_device_mem(host(&back), dev.clone()).unwrap(),
        )
    };
    register_rw(&b, &remote);
    a.connect(b.name(), T).await.unwrap();
    b.connect(a.name(), T).await.unwrap();
    let w = desc(&src, &remote);
    a.transfer(b.name(), TransferOp::Write, &[w], T)
        .await
        .unwrap();
    assert_eq!(remote, src, "staged WRITE delivered every byte");
    let written = copies.load(Ordering::Relaxed);
    assert_eq!(written, 3, "three device-to-host chunk copies");
    let r = desc(&back, &remote);
    a.transfer(b.name(), TransferOp::Read, &[r], T)
        .await
        .unwrap();
    assert_eq!(back, src, "staged READ delivered every byte");
    assert_eq!(copies.load(Ordering::Relaxed), written + 3);
    assert_eq!(
        (staged("write"), staged("read")),
        (len as f64, len as f64),
        "the engine counts the bytes it staged, per direction"
    );
    // A peer reaches it: its READ is served by the target's device copies into pinned
    // chunks.
    let before = copies.load(Ordering::Relaxed);
    b.transfer(
        a.name(),
        TransferOp::Read,
        &[TransferOpDesc {
            local_addr: remote.as_ptr() as u64,
            remote_addr: src.as_ptr() as u64 + 7,
            len: 4096,
        }],
        T,
    )
    .await
    .unwrap();
    assert_eq!(
        remote[..4096],
        src[7..4103],
        "the peer's READ of staged memory"
    );
    assert!(
        copies.load(Ordering::Relaxed) > before,
        "served through the device's copies"
    );
    // The same staged regions in prepared lists: blocks WRITten out of `src` and READ
    // into `back`, through the bounce buffers, reordered by the index arrays.
    let blk = 1 << 20;
    let blocks = |base: &[u8]| -> Vec<BlockDesc> {
        (0..4)
            .map(|i| BlockDesc::block(base.as_ptr() as u64 + (i * blk) as u64, blk))
            .collect()
    };
    let (ls, lb) = (
        a.prepare_local(&blocks(&src)).unwrap(),
        a.prepare_local(&blocks(&back)).unwrap(),
    );
    let r = a
        .prepare_remote(b.name(), &blocks(&remote), T)
        .await
        .unwrap();
    let (staged_w, staged_r) = (staged("write"), staged("read"));
    let x = a
        .make_transfer(
            TransferOp::Write,
            &ls,
            &[3, 2, 1, 0],
            &r,
            &[0, 1, 2, 3],
            None,
        )
        .unwrap();
    x.post().unwrap();
    let done = tokio::time::timeout(T, x.wait()).await.unwrap();
    assert!(matches!(done, Some(TransferStatus::Completed)), "{done:?}");
    for i in 0..4 {
        assert_eq!(
            remote[i * blk..(i + 1) * blk],
            src[(3 - i) * blk..(4 - i) * blk],
            "block {i} of the prepared WRITE"
        );
    }
    let x = a
        .make_transfer(TransferOp::Read, &lb, &[0, 1], &r, &[2, 3], None)
        .unwrap();
    x.post().unwrap();
    let done = tokio::time::timeout(T, x.wait()).await.unwrap();
    assert!(matches!(done, Some(TransferStatus::Completed)), "{done:?}");
    assert_eq!(
        back[..2 * blk],
        remote[2 * blk..4 * blk],
        "the prepared READ"
    );
    assert_eq!(
        (staged("write") - staged_w, staged("read") - staged_r),
        ((4 * blk) as f64, (2 * blk) as f64),
        "prepared transfers of staged memory go through the bounce buffers"
    );
    drop((ls, lb, r));
    a.deregister_mem(hs).await.unwrap();
    a.deregister_mem(hb).await.unwrap();
    // Gone: the same address is no longer usable.
    let e = a
        .transfer(b.name(), TransferOp::Write, &[w], T)
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            EngineError::NotRegistered {
                side: Side::Local,
                ..
            }
        ),
        "{e}"
    );
}
