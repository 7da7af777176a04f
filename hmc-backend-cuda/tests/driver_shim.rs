//! The CUDA binding layer against an ABI shim of the driver (`tests/shim/cuda_shim.c`,
//! built here with the C compiler and loaded as `libcuda.so` through `LD_LIBRARY_PATH` in a
//! child process): context binding per thread, the stream/event/host-function plumbing of
//! asynchronous copies, IPC, DMA-BUF and error mapping, plus the memory conformance kit.
//! The shim exports cuda.h's symbols over host memory: these tests check our binding layer
//! (and cudarc's loading), they are not a hardware verification.
//!
//! The launcher test runs this same binary again with the shim in place; every other test
//! here returns at once unless it runs in that child (`HMC_CUDA_ABI_SHIM=1`).

use std::ffi::c_int;
use std::path::{Path, PathBuf};
use std::task::Context;

use futures::executor::block_on;
use hmc_backend_cuda::{CudaMemory, IpcHandle};
use hmc_core::testing::pattern;
use hmc_core::{
    AnyMemory, DeviceBuffer, DeviceErrorKind, DeviceKind, Error, MemSpan, MemSpanMut, Memory,
};
use hmc_testshim::ShimControl;

const CHILD_ENV: &str = "HMC_CUDA_ABI_SHIM";

fn in_shim_child() -> bool {
    std::env::var_os(CHILD_ENV).is_some()
}

/// Device `ordinal` of the shim, in the child; `None` in the launching process.
fn shim_memory(ordinal: u32) -> Option<CudaMemory> {
    in_shim_child().then(|| CudaMemory::new(ordinal).expect("the driver ABI shim loads"))
}

fn shim_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("hmc-backend-cuda-shim")
}

fn build_shim() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/shim/cuda_shim.c");
    let lib = hmc_testshim::build_shim(&src, "cuda", &shim_dir()).expect("build the shim");
    // cudarc tries `libcuda.so` first; `.so.1` too, so a system driver is never picked up.
    std::fs::copy(&lib, shim_dir().join("libcuda.so.1")).unwrap();
    lib
}

/// Runs this test binary again with the shim first on the loader path.
fn run_self(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(args)
        .env("LD_LIBRARY_PATH", shim_dir())
        .env(CHILD_ENV, "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("spawn the child");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn passed(text: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.strip_prefix("test result: ok. "))
        .filter_map(|l| l.split(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[test]
fn cuda_binding_layer_passes_against_the_driver_abi_shim() {
    if in_shim_child() {
        return;
    }
    build_shim();
    let (ok, text) = run_self(&["--test-threads=1"], &[]);
    assert!(ok, "the shim run failed:\n{text}");
    let n = passed(&text);
    assert!(
        n >= 25,
        "expected the whole suite to run against the shim, {n} passed:\n{text}"
    );
}

/// The shim's test controls: the shared ones of every shim (`hmc_testshim::ShimControl`,
/// through `Deref`) and the CUDA shim's own hold on host functions.
struct Control(ShimControl);

impl Control {
    fn open() -> Self {
        // In the child `libcuda.so` is the shim (already loaded by cudarc); opening it again
        // only bumps its reference count.
        Control(ShimControl::open("libcuda.so"))
    }

    fn hold_host_funcs(&self, hold: bool) {
        // SAFETY: `void hmc_cuda_shim_hold_host_funcs(int)` in cuda_shim.c.
        unsafe {
            let f = self
                .0
                .library()
                .get::<unsafe extern "C" fn(c_int)>(b"hmc_cuda_shim_hold_host_funcs")
                .unwrap();
            f(hold as c_int);
        }
    }
}

impl std::ops::Deref for Control {
    type Target = ShimControl;

    fn deref(&self) -> &ShimControl {
        &self.0
    }
}

mod shim_device_conformance {
    use super::*;
    hmc_core::memory_conformance!(shim_memory(1));
}

mod shim_pinned_conformance {
    use super::*;
    hmc_core::memory_conformance!(shim_memory(1).map(|m| m.pinned()));
}

fn download(mem: &CudaMemory, buf: &impl DeviceBuffer) -> Vec<u8> {
    let mut out = vec![0u8; buf.len()];
    mem.copy(&mut MemSpanMut::host(&mut out), &MemSpan::of(buf))
        .unwrap();
    out
}

fn upload(mem: &CudaMemory, buf: &mut impl DeviceBuffer, bytes: &[u8]) {
    mem.copy(&mut MemSpanMut::of(buf), &MemSpan::host(bytes))
        .unwrap();
}

#[test]
fn abi_shim_probe_describes_every_device() {
    if !in_shim_child() {
        return;
    }
    let devices = hmc_backend_cuda::probe().unwrap();
    assert_eq!(devices.len(), 4);
    for (i, d) in devices.iter().enumerate() {
        assert_eq!(d.device.ordinal, i as u32);
        assert_eq!(d.name, format!("HMC ABI shim device {i}"));
        assert_eq!(d.driver_version, 12_080);
        assert!(d.dma_buf);
    }
}

#[test]
fn abi_shim_interleaved_devices_each_bind_their_own_context() {
    let (Some(a), Some(b)) = (shim_memory(1), shim_memory(2)) else {
        return;
    };
    let mut x = a.alloc(4096).unwrap();
    let mut y = b.alloc(4096).unwrap();
    upload(&a, &mut x, &pattern(1, 4096));
    upload(&b, &mut y, &pattern(2, 4096));
    assert_eq!(download(&a, &x), pattern(1, 4096));
    assert_eq!(download(&b, &y), pattern(2, 4096));
}

#[test]
fn abi_shim_a_fresh_thread_without_a_context_gets_one_bound() {
    let Some(mem) = shim_memory(2) else { return };
    let mut buf = mem.alloc(1000).unwrap();
    upload(&mem, &mut buf, &pattern(3, 1000));
    std::thread::spawn(move || {
        assert_eq!(download(&mem, &buf), pattern(3, 1000));
        drop(buf);
    })
    .join()
    .unwrap();
}

#[test]
fn abi_shim_buffers_and_pinned_buffers_free_themselves() {
    let Some(mem) = shim_memory(3) else { return };
    let control = Control::open();
    let before = control.live_on_device(3);
    {
        let _a = mem.alloc(100).unwrap();
        let _p = mem.pinned().alloc(100).unwrap();
        let _zero = mem.alloc(0).unwrap();
        assert_eq!(control.live_on_device(3), before + 2);
    }
    assert_eq!(control.live_on_device(3), before);
}

#[test]
fn abi_shim_an_async_copy_is_pending_until_its_host_function_wakes_it() {
    let Some(mem) = shim_memory(1) else { return };
    let control = Control::open();
    let src = pattern(40, 70_000);
    let mut dev = mem.alloc(70_000).unwrap();
    {
        let mut d = MemSpanMut::of(&mut dev);
        let s = MemSpan::host(&src);
        control.hold_host_funcs(true);
        // SAFETY: the future is polled to completion below.
        let mut fut = Box::pin(unsafe { mem.copy_async(&mut d, &s) }.unwrap());
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(
            fut.as_mut().poll(&mut cx).is_pending(),
            "held: not done yet"
        );
        control.hold_host_funcs(false);
        block_on(fut).unwrap();
    }
    assert_eq!(download(&mem, &dev), src);
}

#[test]
fn abi_shim_dropping_an_unfinished_async_copy_waits_for_the_stream() {
    let Some(mem) = shim_memory(1) else { return };
    let control = Control::open();
    let src = pattern(41, 4096);
    let mut dev = mem.alloc(4096).unwrap();
    let mut d = MemSpanMut::of(&mut dev);
    let s = MemSpan::host(&src);
    control.hold_host_funcs(true);
    // SAFETY: the future is dropped, not leaked.
    let fut = unsafe { mem.copy_async(&mut d, &s) }.unwrap();
    let release = std::thread::spawn(|| {
        std::thread::sleep(std::time::Duration::from_millis(50));
        Control::open().hold_host_funcs(false);
    });
    drop(fut); // returns only once the held host function has run
    let waited = release.is_finished();
    release.join().unwrap();
    assert!(
        waited,
        "drop returned while the copy's host function was still held"
    );
}

#[test]
fn abi_shim_many_async_copies_complete_through_wakeups() {
    let Some(mem) = shim_memory(1) else { return };
    let srcs: Vec<Vec<u8>> = (0..16).map(|i| pattern(i, 10_000)).collect();
    let mut devs: Vec<_> = (0..16).map(|_| mem.alloc(10_000).unwrap()).collect();
    {
        let s: Vec<MemSpan<'_>> = srcs.iter().map(|v| MemSpan::host(v)).collect();
        let mut d: Vec<MemSpanMut<'_>> = devs.iter_mut().map(MemSpanMut::of).collect();
        let futs: Vec<_> = d
            .iter_mut()
            .zip(&s)
            // SAFETY: every future is awaited by join_all below.
            .map(|(d, s)| unsafe { mem.copy_async(d, s) }.unwrap())
            .collect();
        for r in block_on(futures::future::join_all(futs)) {
            r.unwrap();
        }
    }
    for (i, d) in devs.iter().enumerate() {
        assert_eq!(download(&mem, d), srcs[i]);
    }
}

fn assert_driver_error(err: Error, function: &str, code: i64, message: &str) {
    match err {
        Error::Device {
            kind,
            library,
            function: f,
            code: c,
            message: m,
        } => {
            // CUDA_ERROR_OUT_OF_MEMORY (2) is classified; the vendor detail stays.
            assert_eq!(kind == DeviceErrorKind::OutOfMemory, code == 2, "{kind:?}");
            assert_eq!(library, "libcuda");
            assert_eq!(f, function);
            assert_eq!(c, code);
            assert_eq!(m, message);
        }
        other => panic!("expected Error::Device from {function}, got {other:?}"),
    }
}

#[test]
fn abi_shim_driver_errors_name_library_function_code_and_text() {
    let Some(mem) = shim_memory(1) else { return };
    let control = Control::open();
    let mut buf = mem.alloc(64).unwrap();

    control.fail_next("cuMemcpyHtoDAsync", 700);
    let err = mem
        .copy(&mut MemSpanMut::of(&mut buf), &MemSpan::host(&[1u8; 64]))
        .unwrap_err();
    assert_driver_error(
        err,
        "cuMemcpyHtoDAsync",
        700,
        "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered",
    );

    control.fail_next("cuMemAlloc", 2);
    let err = mem.alloc(64).map(drop).unwrap_err();
    assert_driver_error(
        err,
        "cuMemAlloc",
        2,
        "CUDA_ERROR_OUT_OF_MEMORY: out of memory",
    );

    control.fail_next("cuCtxSetCurrent", 201);
    let err = mem.alloc(64).map(drop).unwrap_err();
    assert_driver_error(
        err,
        "cuCtxSetCurrent",
        201,
        "CUDA_ERROR_INVALID_CONTEXT: invalid device context",
    );

    // An error the stream reports after the copy resolves the future with it.
    control.fail_next("cuEventQuery", 700);
    let src = [7u8; 64];
    let err = {
        let mut d = MemSpanMut::of(&mut buf);
        let s = MemSpan::host(&src);
        // SAFETY: the future is awaited to completion.
        block_on(unsafe { mem.copy_async(&mut d, &s) }.unwrap()).unwrap_err()
    };
    assert_driver_error(
        err,
        "cuEventQuery",
        700,
        "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered",
    );

    // A host function that cannot be queued fails the call instead of hanging the future.
    control.fail_next("cuLaunchHostFunc", 2);
    let err = {
        let mut d = MemSpanMut::of(&mut buf);
        let s = MemSpan::host(&src);
        // SAFETY: no future is returned on error.
        unsafe { mem.copy_async(&mut d, &s) }.map(drop).unwrap_err()
    };
    assert_driver_error(
        err,
        "cuLaunchHostFunc",
        2,
        "CUDA_ERROR_OUT_OF_MEMORY: out of memory",
    );

    // Each failure was injected once: the next copy works.
    upload(&mem, &mut buf, &[9u8; 64]);
    assert_eq!(download(&mem, &buf), vec![9u8; 64]);
}

#[test]
fn abi_shim_dma_buf_export_returns_a_descriptor_for_page_aligned_ranges() {
    let Some(mem) = shim_memory(1) else { return };
    let buf = mem.alloc(1 << 20).unwrap();
    assert!(mem.dma_buf_supported().unwrap());
    let fd = mem.export_dmabuf(&buf, 4096, 8192).unwrap();
    let meta = std::fs::File::from(fd).metadata().unwrap();
    assert!(meta.len() >= 1 << 20);
    assert!(matches!(
        mem.export_dmabuf(&buf, 1, 4096),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        mem.export_dmabuf(&buf, 0, 2 << 20),
        Err(Error::OutOfBounds { .. })
    ));
    let other = shim_memory(2).unwrap().alloc(4096).unwrap();
    assert!(matches!(
        mem.export_dmabuf(&other, 0, 4096),
        Err(Error::InvalidArgument(_))
    ));
}

/// The trait methods, reached through `AnyMemory` as a transport would (no dependency on
/// this crate's types): capabilities, an asynchronous copy, a DMA-BUF of an unaligned span
/// (offset inside rounded pages), and IPC export and mapping.
#[test]
fn abi_shim_device_features_work_through_the_memory_trait_and_any_memory() {
    let Some(mem) = shim_memory(1) else { return };
    let mem = AnyMemory::new(mem);
    let caps = mem.capabilities();
    assert!(caps.async_copy && caps.ipc && caps.dma_buf && !caps.host_accessible);
    let src = pattern(41, 20_000);
    let mut dev = mem.alloc(1 << 20).unwrap();
    {
        let mut d = MemSpanMut::of(&mut dev);
        let mut d = d.slice_mut(0, src.len()).unwrap();
        let s = MemSpan::host(&src);
        // SAFETY: the future is polled to completion here.
        block_on(unsafe { mem.copy_async(&mut d, &s) }.unwrap()).unwrap();
    }
    let span = MemSpan::of(&dev).slice(4097, 100).unwrap();
    let dmabuf = mem.export_dmabuf(&span).unwrap();
    assert_eq!((dmabuf.offset, dmabuf.len), (1, 100));
    let ipc = mem.export_ipc(&dev).unwrap();
    assert_eq!(ipc.kind, DeviceKind::CUDA);
    // The descriptor is the typed handle's wire form (CUDA maps it in another process
    // only; the two-process test covers that path).
    let handle = hmc_backend_cuda::IpcHandle::from_bytes(&ipc.bytes).unwrap();
    assert_eq!(handle.len(), 1 << 20);
    let mut foreign = ipc.clone();
    foreign.kind = DeviceKind::ROCM;
    // SAFETY: refused before any mapping is made.
    let err = unsafe { mem.open_ipc(&foreign) }.err().unwrap();
    assert!(err.to_string().contains("Rocm"), "{err}");
}

const IPC_LEN: usize = 1 << 20;

#[test]
fn abi_shim_ipc_shares_device_memory_with_another_process() {
    let Some(mem) = shim_memory(0) else { return };
    let mut buf = mem.alloc(IPC_LEN).unwrap();
    upload(&mem, &mut buf, &pattern(50, IPC_LEN));
    let handle = mem.export_ipc(&buf).unwrap();
    // The driver refuses to open a handle in the process that exported it.
    // SAFETY: refused; nothing is mapped.
    let err = unsafe { mem.open_ipc(&handle) }.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Device {
                function: "cuIpcOpenMemHandle",
                ..
            }
        ),
        "{err:?}"
    );
    let hex: String = handle
        .to_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let (ok, text) = run_self(
        &["ipc_grandchild", "--exact", "--ignored", "--nocapture"],
        &[("HMC_TEST_IPC_HANDLE", &hex)],
    );
    assert!(ok && passed(&text) == 1, "the peer process failed:\n{text}");
    assert_eq!(download(&mem, &buf), pattern(51, IPC_LEN));
}

#[test]
#[ignore = "run by abi_shim_ipc_shares_device_memory_with_another_process"]
fn ipc_grandchild() {
    let hex = std::env::var("HMC_TEST_IPC_HANDLE").expect("run by the parent test");
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    let handle = IpcHandle::from_bytes(&bytes).unwrap();
    let mem = shim_memory(0).expect("runs with the shim");
    // SAFETY: the parent keeps the buffer alive until this process exits.
    let mut mapping = unsafe { mem.open_ipc(&handle) }.unwrap();
    assert_eq!(download(&mem, &mapping), pattern(50, IPC_LEN));
    upload(&mem, &mut mapping, &pattern(51, IPC_LEN));
}

/// A range inside an allocation (`cuMemGetAddressRange` finds the base): the other process
/// maps exactly the range, and its write lands there, the allocation's head and tail kept.
#[test]
fn abi_shim_ipc_of_a_span_maps_exactly_that_span_in_another_process() {
    let Some(mem) = shim_memory(0) else { return };
    let (at, len) = (8192usize, IPC_LEN / 2);
    let mut buf = mem.alloc(IPC_LEN).unwrap();
    upload(&mem, &mut buf, &pattern(52, IPC_LEN));
    let region = buf.region().slice(at, len).unwrap();
    // SAFETY: `region` lies in `buf`, alive for the call.
    let desc = Memory::export_ipc_span(&mem, &unsafe { MemSpan::from_region(region) }).unwrap();
    assert_eq!(desc.kind, DeviceKind::CUDA);
    let outside = hmc_core::Region {
        len: IPC_LEN,
        ..region
    };
    // SAFETY: refused before anything is read.
    let err = Memory::export_ipc_span(&mem, &unsafe { MemSpan::from_region(outside) }).unwrap_err();
    assert!(
        err.to_string().contains("not inside one allocation"),
        "{err}"
    );
    let hex: String = desc.bytes.iter().map(|b| format!("{b:02x}")).collect();
    let (ok, text) = run_self(
        &["ipc_span_grandchild", "--exact", "--ignored", "--nocapture"],
        &[("HMC_TEST_IPC_SPAN", &hex)],
    );
    assert!(ok && passed(&text) == 1, "the peer process failed:\n{text}");
    let mut want = pattern(52, IPC_LEN);
    want[at..at + len].copy_from_slice(&pattern(53, len));
    assert_eq!(download(&mem, &buf), want);
}

#[test]
#[ignore = "run by abi_shim_ipc_of_a_span_maps_exactly_that_span_in_another_process"]
fn ipc_span_grandchild() {
    let hex = std::env::var("HMC_TEST_IPC_SPAN").expect("run by the parent test");
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    let mem = shim_memory(0).expect("runs with the shim");
    let desc = hmc_core::IpcDescriptor::new(DeviceKind::CUDA, bytes);
    // SAFETY: the parent keeps the buffer alive until this process exits.
    let mapping = unsafe { Memory::open_ipc(&mem, &desc) }.unwrap();
    assert_eq!(mapping.len(), IPC_LEN / 2, "the span, not the allocation");
    let mut got = vec![0u8; mapping.len()];
    // SAFETY: the mapping is live.
    let src = unsafe { MemSpan::from_region(mapping.region()) };
    mem.copy(&mut MemSpanMut::host(&mut got), &src).unwrap();
    assert_eq!(got, pattern(52, IPC_LEN)[8192..8192 + IPC_LEN / 2]);
    // SAFETY: the mapping is live and written by nothing else meanwhile.
    let mut dst = unsafe { MemSpanMut::from_region(mapping.region()) };
    mem.copy(&mut dst, &MemSpan::host(&pattern(53, IPC_LEN / 2)))
        .unwrap();
}

#[test]
fn abi_shim_a_driver_without_devices_is_unavailable() {
    if !in_shim_child() {
        return;
    }
    let (ok, text) = run_self(
        &[
            "no_device_grandchild",
            "--exact",
            "--ignored",
            "--nocapture",
        ],
        &[("HMC_SHIM_DEVICE_COUNT", "0")],
    );
    assert!(ok && passed(&text) == 1, "the peer process failed:\n{text}");
}

#[test]
#[ignore = "run by abi_shim_a_driver_without_devices_is_unavailable"]
fn no_device_grandchild() {
    let err = CudaMemory::new(0).unwrap_err();
    let Error::Unavailable { what, reason, .. } = &err else {
        panic!("expected Unavailable, got {err:?}");
    };
    assert!(what.contains("CUDA device"), "{err}");
    assert!(reason.contains("CUDA_ERROR_NO_DEVICE"), "{err}");
    assert!(hmc_backend_cuda::probe().is_err());
}
