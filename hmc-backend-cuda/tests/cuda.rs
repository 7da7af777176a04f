//! CUDA-only behaviour on a real device: asynchronous copies and their cancellation, IPC
//! between two processes, DMA-BUF export, driver error mapping. Each test logs a skip and
//! returns where no CUDA device is present (`tests/conformance.rs` then asserts the
//! `Unavailable` error).

use futures::executor::block_on;
use hmc_backend_cuda::{CudaMemory, IpcHandle};
use hmc_core::testing::pattern;
use hmc_core::{DeviceBuffer, Error, MemSpan, MemSpanMut, Memory};
use rstest::rstest;

macro_rules! gpu_or_skip {
    () => {
        match CudaMemory::new(0) {
            Ok(m) => m,
            Err(e) => {
                eprintln!("skipped: no CUDA device here ({e})");
                return;
            }
        }
    };
}

fn download(mem: &CudaMemory, buf: &impl DeviceBuffer) -> Vec<u8> {
    let mut out = vec![0u8; buf.len()];
    mem.copy(&mut MemSpanMut::host(&mut out), &MemSpan::of(buf))
        .unwrap();
    out
}

#[rstest]
#[case::small(1)]
#[case::odd(65_537)]
#[case::large(64 << 20)]
fn async_copies_through_pinned_memory_complete_with_the_bytes(#[case] len: usize) {
    let mem = gpu_or_skip!();
    let pinned = mem.pinned();
    let mut src = pinned.alloc(len).unwrap();
    src.as_mut_slice().copy_from_slice(&pattern(5, len));
    let mut dev = mem.alloc(len).unwrap();
    let mut back = pinned.alloc(len).unwrap();
    block_on(async {
        let mut d = MemSpanMut::of(&mut dev);
        let s = MemSpan::of(&src);
        // SAFETY: the future is awaited to completion here.
        unsafe { mem.copy_async(&mut d, &s) }
            .unwrap()
            .await
            .unwrap();
        let mut b = MemSpanMut::of(&mut back);
        let s = MemSpan::of(&dev);
        // SAFETY: the future is awaited to completion here.
        unsafe { mem.copy_async(&mut b, &s) }
            .unwrap()
            .await
            .unwrap();
    });
    assert_eq!(back.as_slice(), &pattern(5, len)[..]);
}

#[test]
fn dropping_an_async_copy_waits_for_it_so_the_buffers_can_be_reused() {
    let mem = gpu_or_skip!();
    let len = 256 << 20;
    let mut src = mem.pinned().alloc(len).unwrap();
    src.as_mut_slice().fill(0x3C);
    let mut dev = mem.alloc(len).unwrap();
    {
        let mut d = MemSpanMut::of(&mut dev);
        let s = MemSpan::of(&src);
        // SAFETY: the future is dropped (not leaked) right away.
        let fut = unsafe { mem.copy_async(&mut d, &s) }.unwrap();
        drop(fut);
    }
    // The drop returned, so the copy is complete: overwrite the source and check the device
    // got the old bytes.
    src.as_mut_slice().fill(0);
    let mut tail = vec![0u8; 4096];
    mem.copy(
        &mut MemSpanMut::host(&mut tail),
        &MemSpan::of(&dev).slice(len - 4096, 4096).unwrap(),
    )
    .unwrap();
    assert_eq!(tail, vec![0x3C; 4096]);
}

#[test]
fn many_async_copies_in_flight_all_complete() {
    let mem = gpu_or_skip!();
    let n = 32;
    let len = 1 << 20;
    let srcs: Vec<Vec<u8>> = (0..n).map(|i| pattern(i as u64, len)).collect();
    let mut devs: Vec<_> = (0..n).map(|_| mem.alloc(len).unwrap()).collect();
    let spans_src: Vec<MemSpan<'_>> = srcs.iter().map(|s| MemSpan::host(s)).collect();
    let mut spans_dst: Vec<MemSpanMut<'_>> = devs.iter_mut().map(MemSpanMut::of).collect();
    // SAFETY: every future is awaited by join_all below.
    let futs: Vec<_> = spans_dst
        .iter_mut()
        .zip(&spans_src)
        .map(|(d, s)| unsafe { mem.copy_async(d, s) }.unwrap())
        .collect();
    for r in block_on(futures::future::join_all(futs)) {
        r.unwrap();
    }
    drop(spans_dst);
    for (i, d) in devs.iter().enumerate() {
        assert_eq!(download(&mem, d), srcs[i]);
    }
}

#[test]
fn a_forged_ipc_handle_is_a_device_error_naming_the_driver_call() {
    let mem = gpu_or_skip!();
    let mut bytes = [0u8; IpcHandle::ENCODED_LEN];
    bytes[IpcHandle::ENCODED_LEN - 1] = 64;
    let handle = IpcHandle::from_bytes(&bytes).unwrap();
    // SAFETY: the forged handle is refused by the driver; nothing is mapped.
    let err = unsafe { mem.open_ipc(&handle) }.unwrap_err();
    match err {
        Error::Device {
            library,
            function,
            message,
            ..
        } => {
            assert_eq!(library, "libcuda");
            assert_eq!(function, "cuIpcOpenMemHandle");
            assert!(message.starts_with("CUDA_ERROR_"), "{message}");
        }
        other => panic!("expected Error::Device, got {other:?}"),
    }
}

const IPC_LEN: usize = 4 << 20;

#[test]
fn ipc_shares_device_memory_with_another_process() {
    let mem = gpu_or_skip!();
    let mut buf = mem.alloc(IPC_LEN).unwrap();
    mem.copy(
        &mut MemSpanMut::of(&mut buf),
        &MemSpan::host(&pattern(21, IPC_LEN)),
    )
    .unwrap();
    let handle = mem.export_ipc(&buf).unwrap();
    let hex: String = handle
        .to_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "ipc_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("HMC_TEST_IPC_HANDLE", hex)
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 passed"),
        "child failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(download(&mem, &buf), pattern(22, IPC_LEN));
}

#[test]
#[ignore = "run by ipc_shares_device_memory_with_another_process"]
fn ipc_child() {
    let hex = std::env::var("HMC_TEST_IPC_HANDLE").expect("run by the parent test");
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    let handle = IpcHandle::from_bytes(&bytes).unwrap();
    let mem = CudaMemory::new(0).unwrap();
    // SAFETY: the parent keeps the buffer alive until this process exits.
    let mut mapping = unsafe { mem.open_ipc(&handle) }.unwrap();
    assert_eq!(download(&mem, &mapping), pattern(21, IPC_LEN));
    mem.copy(
        &mut MemSpanMut::of(&mut mapping),
        &MemSpan::host(&pattern(22, IPC_LEN)),
    )
    .unwrap();
}

#[test]
fn dma_buf_export_gives_a_descriptor_or_says_unsupported() {
    let mem = gpu_or_skip!();
    let buf = mem.alloc(4 << 20).unwrap();
    assert!(matches!(
        mem.export_dmabuf(&buf, 1, 4096),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        mem.export_dmabuf(&buf, 0, 8 << 20),
        Err(Error::OutOfBounds { .. })
    ));
    match mem.export_dmabuf(&buf, 0, 2 << 20) {
        Ok(fd) => {
            use std::os::fd::AsRawFd;
            assert!(fd.as_raw_fd() >= 0);
            assert!(mem.dma_buf_supported().unwrap());
        }
        Err(Error::Unsupported(why)) => {
            assert!(!mem.dma_buf_supported().unwrap(), "{why}");
        }
        Err(other) => panic!("unexpected: {other:?}"),
    }
}

#[test]
fn buffers_used_and_dropped_on_other_threads_bind_their_context_there() {
    let mem = gpu_or_skip!();
    let mut buf = mem.alloc(1 << 20).unwrap();
    mem.copy(
        &mut MemSpanMut::of(&mut buf),
        &MemSpan::host(&pattern(8, 1 << 20)),
    )
    .unwrap();
    std::thread::spawn(move || {
        assert_eq!(download(&mem, &buf), pattern(8, 1 << 20));
        drop(buf);
    })
    .join()
    .unwrap();
}

#[test]
fn probe_describes_each_device() {
    let _mem = gpu_or_skip!();
    for info in hmc_backend_cuda::probe().unwrap() {
        assert!(!info.name.is_empty());
        assert!(info.total_bytes > 0);
        assert!(info.driver_version >= 11_040);
    }
}
