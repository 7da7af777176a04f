//! The binding layer against an ABI shim of `libamdhip64` (`tests/shim/hip_shim.c`, built
//! here with the C compiler): loading, symbol resolution, direction enums, device context,
//! error mapping, pinned memory and IPC. The shim exports the HIP symbols over host memory;
//! these tests check our binding layer, they are not a hardware verification.

mod support;

use hmc_backend_rocm::{IpcHandle, RocmMemory, probe_library};
use hmc_core::testing::pattern;
use hmc_core::{DeviceBuffer, DeviceKind, Error, MemSpan, MemSpanMut, Memory};
use rstest::rstest;
use support::{ShimControl, from_hex, run_child_test, shim, to_hex};

fn shim_device(ordinal: u32) -> RocmMemory {
    RocmMemory::with_library(shim(), ordinal).expect("the ABI shim loads")
}

mod shim_device_conformance {
    use super::*;
    hmc_core::memory_conformance!(Some(shim_device(1)));
}

mod shim_pinned_conformance {
    use super::*;
    hmc_core::memory_conformance!(Some(shim_device(1).pinned()));
}

fn upload(mem: &RocmMemory, buf: &mut impl DeviceBuffer, bytes: &[u8]) {
    mem.copy(&mut MemSpanMut::of(buf), &MemSpan::host(bytes))
        .expect("host to device");
}

fn download(mem: &RocmMemory, buf: &impl DeviceBuffer) -> Vec<u8> {
    let mut out = vec![0u8; buf.len()];
    mem.copy(&mut MemSpanMut::host(&mut out), &MemSpan::of(buf))
        .expect("device to host");
    out
}

#[test]
fn abi_shim_probe_lists_every_device_with_its_memory() {
    let devices = probe_library(shim()).unwrap();
    assert_eq!(devices.len(), 4, "the shim has 4 devices by default");
    for (i, d) in devices.iter().enumerate() {
        assert_eq!(d.device.kind, DeviceKind::Rocm);
        assert_eq!(d.device.ordinal, i as u32);
        assert!(d.total_bytes > 0);
        assert_eq!(d.runtime_version, 60_200_000);
    }
}

#[test]
fn abi_shim_ordinal_past_the_device_count_is_unavailable() {
    let err = RocmMemory::with_library(shim(), 9).unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(err.to_string().contains("4 device"), "{err}");
}

#[test]
fn abi_shim_interleaved_devices_each_run_in_their_own_context() {
    // The shim refuses device memory of any device but the thread's current one, so this
    // passes only if every call binds its own device first.
    let (a, b) = (shim_device(1), shim_device(2));
    let mut x = a.alloc(4096).unwrap();
    let mut y = b.alloc(4096).unwrap();
    upload(&a, &mut x, &pattern(1, 4096));
    upload(&b, &mut y, &pattern(2, 4096));
    assert_eq!(download(&a, &x), pattern(1, 4096));
    assert_eq!(download(&b, &y), pattern(2, 4096));
    assert_eq!(ShimControl::open().current_device(), 2);
    drop(x);
    drop(y);
}

#[test]
fn abi_shim_a_buffer_used_and_freed_on_another_thread_binds_its_device_there() {
    let mem = shim_device(2);
    let mut buf = mem.alloc(1000).unwrap();
    upload(&mem, &mut buf, &pattern(3, 1000));
    std::thread::spawn(move || {
        // A fresh thread starts on device 0.
        assert_eq!(ShimControl::open().current_device(), 0);
        assert_eq!(download(&mem, &buf), pattern(3, 1000));
        drop(buf);
        assert_eq!(ShimControl::open().current_device(), 2);
    })
    .join()
    .unwrap();
}

#[test]
fn abi_shim_a_span_of_another_device_is_refused_before_any_call() {
    let (a, b) = (shim_device(1), shim_device(2));
    let foreign = b.alloc(16).unwrap();
    let mut out = [0u8; 16];
    let err = a
        .copy(&mut MemSpanMut::host(&mut out), &MemSpan::of(&foreign))
        .unwrap_err();
    assert!(matches!(err, Error::Unsupported(_)), "{err:?}");
}

#[test]
fn abi_shim_buffers_free_themselves_exactly_once() {
    // Device 3 is used by this test only, so the shim's live count is ours alone.
    let control = ShimControl::open();
    let mem = shim_device(3);
    let before = control.live_on_device(3);
    {
        let _a = mem.alloc(100).unwrap();
        let _b = mem.alloc(1 << 20).unwrap();
        let _zero = mem.alloc(0).unwrap();
        let _p = mem.pinned().alloc(4096).unwrap();
        assert_eq!(
            control.live_on_device(3),
            before + 3,
            "zero-length allocates nothing"
        );
    }
    assert_eq!(control.live_on_device(3), before);
}

#[test]
fn abi_shim_pinned_buffers_are_host_memory_usable_for_staging() {
    let mem = shim_device(1);
    let mut staging = mem.pinned().alloc(8192).unwrap();
    assert!(staging.region().device.is_host());
    staging.as_mut_slice().copy_from_slice(&pattern(9, 8192));
    let mut dev = mem.alloc(8192).unwrap();
    mem.copy(&mut MemSpanMut::of(&mut dev), &MemSpan::of(&staging))
        .unwrap();
    assert_eq!(download(&mem, &dev), pattern(9, 8192));
}

/// Each runtime call HMC makes, failed once with a vendor code, surfaces as
/// `Error::Device` naming the library, the function, the code and the runtime's text.
#[rstest]
#[case::alloc("hipMalloc", 2, "hipErrorOutOfMemory: out of memory")]
#[case::copy(
    "hipMemcpy",
    700,
    "hipErrorIllegalAddress: an illegal memory access was encountered"
)]
#[case::bind("hipSetDevice", 101, "hipErrorInvalidDevice: invalid device ordinal")]
#[case::pinned("hipHostMalloc", 2, "hipErrorOutOfMemory: out of memory")]
#[case::export("hipIpcGetMemHandle", 1, "hipErrorInvalidValue: invalid argument")]
#[case::info("hipMemGetInfo", 999, "hipErrorUnknown: unknown error")]
fn abi_shim_vendor_errors_name_library_function_code_and_text(
    #[case] function: &'static str,
    #[case] code: i64,
    #[case] text: &str,
) {
    let mem = shim_device(1);
    let mut buf = mem.alloc(64).unwrap();
    ShimControl::open().fail_next(function, code as i32);
    let err = match function {
        "hipMalloc" => mem.alloc(64).map(drop).unwrap_err(),
        "hipMemcpy" | "hipSetDevice" => mem
            .copy(&mut MemSpanMut::of(&mut buf), &MemSpan::host(&[0u8; 64]))
            .unwrap_err(),
        "hipHostMalloc" => mem.pinned().alloc(64).map(drop).unwrap_err(),
        "hipIpcGetMemHandle" => mem.export_ipc(&buf).map(drop).unwrap_err(),
        "hipMemGetInfo" => mem.info().map(drop).unwrap_err(),
        other => unreachable!("{other}"),
    };
    match &err {
        Error::Device {
            library,
            function: f,
            code: c,
            message,
        } => {
            assert_eq!(*library, "libamdhip64");
            assert_eq!(*f, function);
            assert_eq!(*c, code);
            assert_eq!(message, text);
        }
        other => panic!("expected Error::Device, got {other:?}"),
    }
    // The failure was injected once: the same call now succeeds.
    mem.copy(&mut MemSpanMut::of(&mut buf), &MemSpan::host(&[1u8; 64]))
        .unwrap();
}

#[test]
fn abi_shim_a_failed_free_is_logged_not_a_panic() {
    let mem = shim_device(1);
    let buf = mem.alloc(64).unwrap();
    ShimControl::open().fail_next("hipFree", 1);
    drop(buf); // leaks one shim allocation by design; must not panic
}

#[test]
fn abi_shim_a_library_missing_a_symbol_is_unavailable_naming_it() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("rocm-partial");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("partial.c");
    std::fs::write(
        &src,
        "int hipRuntimeGetVersion(int *v) { *v = 60000000; return 0; }\n",
    )
    .unwrap();
    let lib = hmc_testshim::build_shim(&src, "partial_hip", &dir).unwrap();
    let err = RocmMemory::with_library(&lib, 0).unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(err.to_string().contains("hipGetDeviceCount"), "{err}");
}

#[test]
fn abi_shim_ipc_handles_round_trip_their_wire_form_and_map_in_process() {
    let mem = shim_device(1);
    let mut buf = mem.alloc(10_000).unwrap();
    upload(&mem, &mut buf, &pattern(4, 10_000));
    let handle = mem.export_ipc(&buf).unwrap();
    let decoded = IpcHandle::from_bytes(&handle.to_bytes()).unwrap();
    assert_eq!(decoded, handle);
    assert_eq!(decoded.len(), 10_000);
    assert!(IpcHandle::from_bytes(&[0u8; 3]).is_err());
    // SAFETY: `buf` outlives the mapping and the handle is fresh from export_ipc.
    let mapping = unsafe { mem.open_ipc(&decoded) }.unwrap();
    assert_eq!(mapping.len(), 10_000);
    assert_ne!(mapping.region().addr, buf.region().addr, "a second mapping");
    assert_eq!(download(&mem, &mapping), pattern(4, 10_000));
}

#[test]
fn abi_shim_exporting_an_empty_buffer_is_refused() {
    let mem = shim_device(1);
    let buf = mem.alloc(0).unwrap();
    assert!(matches!(
        mem.export_ipc(&buf),
        Err(Error::InvalidArgument(_))
    ));
}

const IPC_LEN: usize = 1 << 20;

#[test]
fn abi_shim_ipc_shares_device_memory_with_another_process_loaded_via_env_var() {
    let mem = shim_device(0);
    let mut buf = mem.alloc(IPC_LEN).unwrap();
    upload(&mem, &mut buf, &pattern(11, IPC_LEN));
    let handle = mem.export_ipc(&buf).unwrap();
    let ok = run_child_test(
        "ipc_child_reads_then_writes",
        &[
            ("HMC_HIP_LIB", shim().to_str().unwrap()),
            ("HMC_TEST_IPC_HANDLE", &to_hex(&handle.to_bytes())),
        ],
    );
    assert!(ok, "the child process failed; see its output above");
    assert_eq!(
        download(&mem, &buf),
        pattern(12, IPC_LEN),
        "the child's write"
    );
}

#[test]
#[ignore = "run by abi_shim_ipc_shares_device_memory_with_another_process_loaded_via_env_var"]
fn ipc_child_reads_then_writes() {
    let handle = IpcHandle::from_bytes(&from_hex(
        &std::env::var("HMC_TEST_IPC_HANDLE").expect("run by the parent test"),
    ))
    .unwrap();
    // Loaded through $HMC_HIP_LIB, as a deployment would.
    let mem = RocmMemory::new(0).expect("HMC_HIP_LIB points at the shim");
    // SAFETY: the parent keeps the exported buffer alive until this process exits.
    let mut mapping = unsafe { mem.open_ipc(&handle) }.unwrap();
    assert_eq!(download(&mem, &mapping), pattern(11, IPC_LEN));
    upload(&mem, &mut mapping, &pattern(12, IPC_LEN));
}

#[test]
fn abi_shim_a_runtime_without_devices_is_unavailable() {
    let ok = run_child_test(
        "no_device_child",
        &[
            ("HMC_HIP_LIB", shim().to_str().unwrap()),
            ("HMC_SHIM_DEVICE_COUNT", "0"),
        ],
    );
    assert!(ok, "the child process failed; see its output above");
}

#[test]
#[ignore = "run by abi_shim_a_runtime_without_devices_is_unavailable"]
fn no_device_child() {
    let err = RocmMemory::new(0).unwrap_err();
    let Error::Unavailable { what, reason, .. } = &err else {
        panic!("expected Unavailable, got {err:?}");
    };
    assert!(what.contains("HIP device"), "{err}");
    assert!(reason.contains("hipErrorNoDevice"), "{err}");
    assert!(hmc_backend_rocm::probe().is_err());
}

#[test]
fn abi_shim_exporting_another_devices_buffer_is_refused() {
    let (a, b) = (shim_device(1), shim_device(2));
    let buf = b.alloc(64).unwrap();
    assert!(matches!(a.export_ipc(&buf), Err(Error::InvalidArgument(_))));
}

#[test]
fn abi_shim_host_to_host_copies_pass_through_without_calling_the_runtime() {
    let mem = shim_device(1);
    ShimControl::open().fail_next("hipMemcpy", 1);
    let src = pattern(30, 5000);
    let mut dst = vec![0u8; 5000];
    mem.copy(&mut MemSpanMut::host(&mut dst), &MemSpan::host(&src))
        .unwrap();
    assert_eq!(dst, src);
    // The armed failure is still pending, so the runtime was not called; a device copy
    // consumes it.
    let mut buf = mem.alloc(16).unwrap();
    let err = mem
        .copy(&mut MemSpanMut::of(&mut buf), &MemSpan::host(&[0u8; 16]))
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Device {
                function: "hipMemcpy",
                ..
            }
        ),
        "{err:?}"
    );
}
