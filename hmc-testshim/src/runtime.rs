//! The ABI-shim and real-device test bodies shared by the backends built on
//! `hmc-backend-runtime` (ROCm, MUSA, MLU): generic over the vendor's
//! [`RuntimeApi`], driven by a [`ShimVendor`] that holds only what differs (names, codes,
//! texts). [`runtime_abi_shim_tests!`](crate::runtime_abi_shim_tests) and
//! [`runtime_device_tests!`](crate::runtime_device_tests) declare the tests in a backend's
//! test file; each body panics (fails the test) on the first broken expectation.

use std::path::{Path, PathBuf};

use hmc_backend_runtime::{IpcFormat, IpcHandle, RuntimeApi, RuntimeMemory};
use hmc_core::testing::pattern;
use hmc_core::{
    AnyMemory, DeviceBuffer, DeviceErrorKind, DeviceKind, Error, MemSpan, MemSpanMut, Memory,
};

use crate::control::{ShimControl, from_hex, run_child_test, to_hex};

/// What the shared tests need to know about one vendor and its shim.
#[derive(Clone, Copy, Debug)]
pub struct ShimVendor {
    /// The library name errors carry (`"libamdhip64"`).
    pub library: &'static str,
    /// The environment variable naming the library (`"HMC_HIP_LIB"`).
    pub env: &'static str,
    /// The device kind the backend reports.
    pub kind: DeviceKind,
    /// The short vendor name in messages (`"HIP"`, as in "HIP device 9").
    pub name: &'static str,
    /// The shim's file stem: `tests/shim/<stem>.c` builds `lib<stem>.so`.
    pub shim_stem: &'static str,
    /// The runtime version the shim reports, as the backend decodes it.
    pub runtime_version: i32,
    /// The vendor's names of the device malloc, free and memcpy functions.
    pub malloc: &'static str,
    /// See [`ShimVendor::malloc`].
    pub free: &'static str,
    /// See [`ShimVendor::malloc`].
    pub memcpy: &'static str,
    /// A vendor error code for "invalid argument", injected where any failure will do.
    pub invalid_value: i32,
    /// C source of a library exporting the version function only.
    pub partial_source: &'static str,
    /// The symbol the backend resolves next, which `partial_source` lacks.
    pub partial_missing: &'static str,
    /// Text the runtime gives for "no device" (found in the `Unavailable` reason).
    pub no_device_text: &'static str,
}

/// One runtime call the backend makes, and the API that makes it: for
/// [`vendor_error_names_library_function_code_and_text`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// Device allocation (`alloc`).
    Alloc,
    /// A host→device copy reaching the runtime's memcpy.
    Copy,
    /// The set-device call that precedes a copy.
    Bind,
    /// A pinned host allocation.
    Pinned,
    /// Exporting an IPC handle.
    Export,
    /// The memory-info call of `info()`.
    Info,
}

/// Builds `<manifest_dir>/tests/shim/<stem>.c` into `<target_tmpdir>/<stem>`, panicking
/// with the compiler's output on failure. Declared tests cache the path per binary.
pub fn build_vendor_shim(vendor: &ShimVendor, manifest_dir: &str, target_tmpdir: &str) -> PathBuf {
    let src = Path::new(manifest_dir).join(format!("tests/shim/{}.c", vendor.shim_stem));
    let out = Path::new(target_tmpdir).join(vendor.shim_stem);
    crate::build_shim(&src, vendor.shim_stem, &out)
        .unwrap_or_else(|e| panic!("build the {} ABI shim: {e}", vendor.name))
}

fn device<A: RuntimeApi>(shim: &Path, ordinal: u32) -> RuntimeMemory<A> {
    RuntimeMemory::with_library(shim, ordinal).expect("the ABI shim loads")
}

fn upload<A: RuntimeApi>(mem: &RuntimeMemory<A>, buf: &mut impl DeviceBuffer, bytes: &[u8]) {
    mem.copy(&mut MemSpanMut::of(buf), &MemSpan::host(bytes))
        .expect("host to device");
}

fn download<A: RuntimeApi>(mem: &RuntimeMemory<A>, buf: &impl DeviceBuffer) -> Vec<u8> {
    let mut out = vec![0u8; buf.len()];
    mem.copy(&mut MemSpanMut::host(&mut out), &MemSpan::of(buf))
        .expect("device to host");
    out
}

/// `probe_library` lists the shim's 4 devices with memory and the runtime version.
pub fn probe_lists_every_device_with_its_memory(
    vendor: &ShimVendor,
    probe: hmc_core::Result<Vec<hmc_backend_runtime::DeviceInfo>>,
) {
    let devices = probe.unwrap();
    assert_eq!(devices.len(), 4, "the shim has 4 devices by default");
    for (i, d) in devices.iter().enumerate() {
        assert_eq!(d.device.kind, vendor.kind);
        assert_eq!(d.device.ordinal, i as u32);
        assert!(d.total_bytes > 0);
        assert_eq!(d.runtime_version, vendor.runtime_version);
    }
}

/// An ordinal past the device count is `Unavailable`, saying how many there are.
pub fn ordinal_past_the_device_count_is_unavailable<A: RuntimeApi>(shim: &Path) {
    let err = RuntimeMemory::<A>::with_library(shim, 9).unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(err.to_string().contains("4 device"), "{err}");
}

/// Two devices used in turn on one thread each see their own context: the shim refuses
/// device memory of any device but the thread's current one, so this passes only if every
/// call binds its own device first.
pub fn interleaved_devices_each_run_in_their_own_context<A: RuntimeApi>(shim: &Path) {
    let (a, b) = (device::<A>(shim, 1), device::<A>(shim, 2));
    let mut x = a.alloc(4096).unwrap();
    let mut y = b.alloc(4096).unwrap();
    upload(&a, &mut x, &pattern(1, 4096));
    upload(&b, &mut y, &pattern(2, 4096));
    assert_eq!(download(&a, &x), pattern(1, 4096));
    assert_eq!(download(&b, &y), pattern(2, 4096));
    assert_eq!(ShimControl::open(shim).current_device(), 2);
    drop(x);
    drop(y);
}

/// A buffer used and dropped on a fresh thread binds its device there.
pub fn a_buffer_used_and_freed_on_another_thread_binds_its_device_there<A: RuntimeApi>(
    shim: &Path,
) {
    let mem = device::<A>(shim, 2);
    let mut buf = mem.alloc(1000).unwrap();
    upload(&mem, &mut buf, &pattern(3, 1000));
    let shim = shim.to_path_buf();
    std::thread::spawn(move || {
        // A fresh thread starts on device 0.
        assert_eq!(ShimControl::open(&shim).current_device(), 0);
        assert_eq!(download(&mem, &buf), pattern(3, 1000));
        drop(buf);
        assert_eq!(ShimControl::open(&shim).current_device(), 2);
    })
    .join()
    .unwrap();
}

/// A span of another device is refused before any runtime call.
pub fn a_span_of_another_device_is_refused_before_any_call<A: RuntimeApi>(shim: &Path) {
    let (a, b) = (device::<A>(shim, 1), device::<A>(shim, 2));
    let foreign = b.alloc(16).unwrap();
    let mut out = [0u8; 16];
    let err = a
        .copy(&mut MemSpanMut::host(&mut out), &MemSpan::of(&foreign))
        .unwrap_err();
    assert!(matches!(err, Error::Unsupported(_)), "{err:?}");
}

/// Device and pinned buffers free themselves exactly once; zero-length allocates nothing.
pub fn buffers_free_themselves_exactly_once<A: RuntimeApi>(shim: &Path) {
    // Device 3 is used by this test only, so the shim's live count is ours alone.
    let control = ShimControl::open(shim);
    let mem = device::<A>(shim, 3);
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

/// Pinned buffers are host memory, usable as the source of a device copy.
pub fn pinned_buffers_are_host_memory_usable_for_staging<A: RuntimeApi>(shim: &Path) {
    let mem = device::<A>(shim, 1);
    let mut staging = mem.pinned().alloc(8192).unwrap();
    assert!(staging.region().device.is_host());
    staging.as_mut_slice().copy_from_slice(&pattern(9, 8192));
    let mut dev = mem.alloc(8192).unwrap();
    mem.copy(&mut MemSpanMut::of(&mut dev), &MemSpan::of(&staging))
        .unwrap();
    assert_eq!(download(&mem, &dev), pattern(9, 8192));
}

/// `call`, failed once with `code` through the shim, surfaces as `Error::Device` naming the
/// library, `function`, the code and the runtime's `text`; the failure was injected once,
/// so the same call then succeeds.
pub fn vendor_error_names_library_function_code_and_text<A: RuntimeApi>(
    vendor: &ShimVendor,
    shim: &Path,
    call: Call,
    function: &'static str,
    code: i64,
    text: &str,
) {
    let mem = device::<A>(shim, 1);
    let mut buf = mem.alloc(64).unwrap();
    ShimControl::open(shim).fail_next(function, code as i32);
    let err = match call {
        Call::Alloc => mem.alloc(64).map(drop).unwrap_err(),
        Call::Copy | Call::Bind => mem
            .copy(&mut MemSpanMut::of(&mut buf), &MemSpan::host(&[0u8; 64]))
            .unwrap_err(),
        Call::Pinned => mem.pinned().alloc(64).map(drop).unwrap_err(),
        Call::Export => mem.export_ipc(&buf).map(drop).unwrap_err(),
        Call::Info => mem.info().map(drop).unwrap_err(),
    };
    match &err {
        Error::Device {
            kind,
            library,
            function: f,
            code: c,
            message,
        } => {
            // Every case of an allocation failing uses the vendor's out-of-memory code.
            let oom = matches!(call, Call::Alloc | Call::Pinned);
            assert_eq!(
                *kind == DeviceErrorKind::OutOfMemory,
                oom,
                "{function} failing with {code}: {kind:?}"
            );
            assert_eq!(*library, vendor.library);
            assert_eq!(*f, function);
            assert_eq!(*c, code);
            assert_eq!(message, text);
        }
        other => panic!("expected Error::Device, got {other:?}"),
    }
    mem.copy(&mut MemSpanMut::of(&mut buf), &MemSpan::host(&[1u8; 64]))
        .unwrap();
}

/// A failed free is logged, not a panic.
pub fn a_failed_free_is_logged_not_a_panic<A: RuntimeApi>(vendor: &ShimVendor, shim: &Path) {
    let mem = device::<A>(shim, 1);
    let buf = mem.alloc(64).unwrap();
    ShimControl::open(shim).fail_next(vendor.free, vendor.invalid_value);
    drop(buf); // leaks one shim allocation by design; must not panic
}

/// A library lacking a symbol the backend needs is `Unavailable`, naming the symbol.
pub fn a_library_missing_a_symbol_is_unavailable_naming_it<A: RuntimeApi>(
    vendor: &ShimVendor,
    target_tmpdir: &str,
) {
    let dir = Path::new(target_tmpdir).join(format!("{}-partial", vendor.shim_stem));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("partial.c");
    std::fs::write(&src, vendor.partial_source).unwrap();
    let lib = crate::build_shim(&src, &format!("partial_{}", vendor.shim_stem), &dir).unwrap();
    let err = RuntimeMemory::<A>::with_library(&lib, 0).unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(err.to_string().contains(vendor.partial_missing), "{err}");
}

/// IPC handles survive their wire form and map in the exporting process too.
pub fn ipc_handles_round_trip_their_wire_form_and_map_in_process<A: RuntimeApi>(shim: &Path) {
    let mem = device::<A>(shim, 1);
    let mut buf = mem.alloc(10_000).unwrap();
    upload(&mem, &mut buf, &pattern(4, 10_000));
    let handle = mem.export_ipc(&buf).unwrap();
    let decoded = IpcHandle::<A>::from_bytes(handle.to_bytes().as_ref()).unwrap();
    assert_eq!(decoded, handle);
    assert_eq!(decoded.len(), 10_000);
    assert!(IpcHandle::<A>::from_bytes(&[0u8; 3]).is_err());
    // SAFETY: `buf` outlives the mapping and the handle is fresh from export_ipc.
    let mapping = unsafe { mem.open_ipc(&decoded) }.unwrap();
    assert_eq!(mapping.len(), 10_000);
    assert_ne!(mapping.region().addr, buf.region().addr, "a second mapping");
    assert_eq!(download(&mem, &mapping), pattern(4, 10_000));
}

/// IPC through the `Memory` trait behind `AnyMemory`, as generic code reaches it: the
/// capabilities say IPC and nothing else, the descriptor carries the device kind, a
/// descriptor of another kind is refused naming it, and DMA-BUF export is `Unsupported`.
pub fn ipc_works_through_the_memory_trait_and_any_memory<A: RuntimeApi>(shim: &Path) {
    let mem = AnyMemory::new(device::<A>(shim, 1));
    let caps = mem.capabilities();
    assert!(caps.ipc && !caps.async_copy && !caps.dma_buf && !caps.host_accessible);
    let mut buf = mem.alloc(4096).unwrap();
    let bytes = pattern(6, 4096);
    mem.copy(&mut MemSpanMut::of(&mut buf), &MemSpan::host(&bytes))
        .unwrap();
    let ipc = mem.export_ipc(&buf).unwrap();
    assert_eq!(ipc.kind, A::KIND);
    // SAFETY: `buf` outlives the mapping (dropped first), and the descriptor is fresh.
    let mapping = unsafe { mem.open_ipc(&ipc) }.unwrap();
    let mut back = vec![0u8; 4096];
    mem.copy(&mut MemSpanMut::host(&mut back), &MemSpan::of(&*mapping))
        .unwrap();
    assert_eq!(back, bytes);
    // Another kind of this repository: Ascend, or ROCm for the Ascend backend itself.
    let other = if A::KIND == DeviceKind::ASCEND {
        DeviceKind::ROCM
    } else {
        DeviceKind::ASCEND
    };
    let mut foreign = ipc.clone();
    foreign.kind = other;
    // SAFETY: refused before any mapping is made.
    let err = unsafe { mem.open_ipc(&foreign) }.err().unwrap();
    assert!(
        matches!(err, Error::InvalidArgument(_)) && err.to_string().contains(other.name().unwrap()),
        "{err}"
    );
    assert!(matches!(
        mem.export_dmabuf(&MemSpan::of(&buf)),
        Err(Error::Unsupported(_))
    ));
}

/// The wire form round-trips any bytes, and other lengths are refused.
pub fn ipc_wire_form_round_trips_and_refuses_other_lengths<A: IpcFormat>() {
    let len = IpcHandle::<A>::ENCODED_LEN;
    assert_eq!(len, A::IPC_HANDLE_SIZE + 8);
    let bytes: Vec<u8> = (0..len).map(|i| i as u8).collect();
    let h = IpcHandle::<A>::from_bytes(&bytes).unwrap();
    assert_eq!(h.to_bytes().as_ref(), &bytes[..]);
    assert_eq!(
        h.len(),
        u64::from_be_bytes(bytes[len - 8..].try_into().unwrap())
    );
    for wrong in [0, len - 1, len + 1] {
        let err = IpcHandle::<A>::from_bytes(&vec![0u8; wrong]).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    }
}

/// Exporting a zero-length buffer is refused.
pub fn exporting_an_empty_buffer_is_refused<A: RuntimeApi>(shim: &Path) {
    let mem = device::<A>(shim, 1);
    let buf = mem.alloc(0).unwrap();
    assert!(matches!(
        mem.export_ipc(&buf),
        Err(Error::InvalidArgument(_))
    ));
}

/// Exporting another device's buffer is refused.
pub fn exporting_another_devices_buffer_is_refused<A: RuntimeApi>(shim: &Path) {
    let (a, b) = (device::<A>(shim, 1), device::<A>(shim, 2));
    let buf = b.alloc(64).unwrap();
    assert!(matches!(a.export_ipc(&buf), Err(Error::InvalidArgument(_))));
}

const IPC_LEN: usize = 1 << 20;
const IPC_HANDLE_ENV: &str = "HMC_TEST_IPC_HANDLE";

/// Exports a buffer to a child process (`child`, the full name of the test that runs
/// [`ipc_child_reads_then_writes`]) which loads the shim through the vendor's variable,
/// reads the buffer and writes it back.
pub fn ipc_shares_device_memory_with_another_process<A: RuntimeApi>(
    vendor: &ShimVendor,
    shim: &Path,
    child: &str,
) {
    let mem = device::<A>(shim, 0);
    let mut buf = mem.alloc(IPC_LEN).unwrap();
    upload(&mem, &mut buf, &pattern(11, IPC_LEN));
    let handle = mem.export_ipc(&buf).unwrap();
    if let Err(out) = run_child_test(
        child,
        &[
            (vendor.env, shim.to_str().unwrap()),
            (IPC_HANDLE_ENV, &to_hex(handle.to_bytes().as_ref())),
        ],
    ) {
        panic!("the child process failed: {out}");
    }
    assert_eq!(
        download(&mem, &buf),
        pattern(12, IPC_LEN),
        "the child's write"
    );
}

/// The child of [`ipc_shares_device_memory_with_another_process`]: loaded through the
/// vendor's variable, as a deployment would.
pub fn ipc_child_reads_then_writes<A: RuntimeApi>(vendor: &ShimVendor) {
    let handle = IpcHandle::<A>::from_bytes(&from_hex(
        &std::env::var(IPC_HANDLE_ENV).expect("run by the parent test"),
    ))
    .unwrap();
    let mem = RuntimeMemory::<A>::new(0)
        .unwrap_or_else(|e| panic!("{} points at the shim: {e}", vendor.env));
    // SAFETY: the parent keeps the exported buffer alive until this process exits.
    let mut mapping = unsafe { mem.open_ipc(&handle) }.unwrap();
    assert_eq!(download(&mem, &mapping), pattern(11, IPC_LEN));
    upload(&mem, &mut mapping, &pattern(12, IPC_LEN));
}

/// Runs `child` (the test running [`no_device_child`]) with a shim reporting no device.
pub fn a_runtime_without_devices_is_unavailable(vendor: &ShimVendor, shim: &Path, child: &str) {
    if let Err(out) = run_child_test(
        child,
        &[
            (vendor.env, shim.to_str().unwrap()),
            ("HMC_SHIM_DEVICE_COUNT", "0"),
        ],
    ) {
        panic!("the child process failed: {out}");
    }
}

/// The child of [`a_runtime_without_devices_is_unavailable`]: `new` and `probe` are
/// `Unavailable`, with the runtime's own "no device" text.
pub fn no_device_child<A: RuntimeApi>(
    vendor: &ShimVendor,
    probe: hmc_core::Result<Vec<hmc_backend_runtime::DeviceInfo>>,
) {
    let err = RuntimeMemory::<A>::new(0).unwrap_err();
    let Error::Unavailable { what, reason, .. } = &err else {
        panic!("expected Unavailable, got {err:?}");
    };
    assert!(what.contains(&format!("{} device", vendor.name)), "{err}");
    assert!(reason.contains(vendor.no_device_text), "{err}");
    assert!(probe.is_err());
}

/// Host→host copies never call the runtime: an armed memcpy failure survives them and is
/// consumed by the next device copy.
pub fn host_to_host_copies_pass_through_without_calling_the_runtime<A: RuntimeApi>(
    vendor: &ShimVendor,
    shim: &Path,
) {
    let mem = device::<A>(shim, 1);
    ShimControl::open(shim).fail_next(vendor.memcpy, vendor.invalid_value);
    let src = pattern(30, 5000);
    let mut dst = vec![0u8; 5000];
    mem.copy(&mut MemSpanMut::host(&mut dst), &MemSpan::host(&src))
        .unwrap();
    assert_eq!(dst, src);
    let mut buf = mem.alloc(16).unwrap();
    let err = mem
        .copy(&mut MemSpanMut::of(&mut buf), &MemSpan::host(&[0u8; 16]))
        .unwrap_err();
    assert!(
        matches!(err, Error::Device { function, .. } if function == vendor.memcpy),
        "{err:?}"
    );
}

/// Asserts `err` is `Unavailable`, naming the library or the vendor and saying how to fix
/// it (the variable, or the ordinal).
pub fn assert_unavailable_names_library_and_variable(vendor: &ShimVendor, err: &Error) {
    match err {
        Error::Unavailable { what, hint, .. } => {
            assert!(
                what.contains(vendor.library) || what.contains(vendor.name),
                "names what was looked for: {err}"
            );
            assert!(
                hint.contains(vendor.env) || hint.contains("ordinal"),
                "says how to fix it: {err}"
            );
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

/// On this machine, `new(0)` and `probe()` agree: both find a device, or both are
/// `Unavailable` with a useful message; nothing panics.
pub fn new_and_probe_agree<A: RuntimeApi>(
    vendor: &ShimVendor,
    probe: hmc_core::Result<Vec<hmc_backend_runtime::DeviceInfo>>,
) {
    match (RuntimeMemory::<A>::new(0), probe) {
        (Ok(_), Ok(devices)) => assert!(!devices.is_empty(), "a device was found"),
        (Err(e), Err(p)) => {
            assert_unavailable_names_library_and_variable(vendor, &e);
            assert_unavailable_names_library_and_variable(vendor, &p);
        }
        (a, b) => panic!("new and probe disagree: {a:?} vs {b:?}"),
    }
}

/// A library path that does not exist is a permanent `Unavailable` naming it and the
/// variable.
pub fn a_missing_library_path_is_unavailable<A: RuntimeApi>(vendor: &ShimVendor) {
    let path = format!("/nonexistent/{}.so", vendor.library);
    let err = RuntimeMemory::<A>::with_library(&path, 0).unwrap_err();
    assert_unavailable_names_library_and_variable(vendor, &err);
    assert!(err.to_string().contains(&path), "{err}");
    assert!(err.is_permanent());
}

/// Declares, at the root of a backend's ABI-shim test file, every shared shim test for
/// vendor API `$api` described by the [`ShimVendor`] `$vendor`: the memory conformance kit
/// against shim devices and pinned memory, context binding, error mapping, IPC in and
/// across processes, and a runtime without devices. `$probe` and `$probe_library` are the
/// backend's own functions. The invoking crate needs `rstest` and `hmc-core` with its
/// `testing` feature as dev-dependencies. Vendor error cases stay in the backend's file
/// (they are vendor data), calling
/// [`vendor_error_names_library_function_code_and_text`](crate::runtime::vendor_error_names_library_function_code_and_text)
/// with `shim()`, the shim path function this macro declares.
#[macro_export]
macro_rules! runtime_abi_shim_tests {
    (api: $api:ty, vendor: $vendor:expr, probe: $probe:path, probe_library: $probe_library:path $(,)?) => {
        /// This binary's build of the vendor's shim (built once).
        fn shim() -> &'static ::std::path::Path {
            static SHIM: ::std::sync::OnceLock<::std::path::PathBuf> =
                ::std::sync::OnceLock::new();
            SHIM.get_or_init(|| {
                $crate::runtime::build_vendor_shim(
                    &$vendor,
                    env!("CARGO_MANIFEST_DIR"),
                    env!("CARGO_TARGET_TMPDIR"),
                )
            })
        }

        fn shim_device(ordinal: u32) -> $crate::hmc_backend_runtime::RuntimeMemory<$api> {
            $crate::hmc_backend_runtime::RuntimeMemory::with_library(shim(), ordinal)
                .expect("the ABI shim loads")
        }

        mod shim_device_conformance {
            use super::*;
            ::hmc_core::memory_conformance!(Some(shim_device(1)));
        }

        mod shim_pinned_conformance {
            use super::*;
            ::hmc_core::memory_conformance!(Some(shim_device(1).pinned()));
        }

        #[test]
        fn abi_shim_probe_lists_every_device_with_its_memory() {
            $crate::runtime::probe_lists_every_device_with_its_memory(
                &$vendor,
                $probe_library(shim()),
            );
        }

        #[test]
        fn abi_shim_ordinal_past_the_device_count_is_unavailable() {
            $crate::runtime::ordinal_past_the_device_count_is_unavailable::<$api>(shim());
        }

        #[test]
        fn abi_shim_interleaved_devices_each_run_in_their_own_context() {
            $crate::runtime::interleaved_devices_each_run_in_their_own_context::<$api>(shim());
        }

        #[test]
        fn abi_shim_a_buffer_used_and_freed_on_another_thread_binds_its_device_there() {
            $crate::runtime::a_buffer_used_and_freed_on_another_thread_binds_its_device_there::<
                $api,
            >(shim());
        }

        #[test]
        fn abi_shim_a_span_of_another_device_is_refused_before_any_call() {
            $crate::runtime::a_span_of_another_device_is_refused_before_any_call::<$api>(shim());
        }

        #[test]
        fn abi_shim_buffers_free_themselves_exactly_once() {
            $crate::runtime::buffers_free_themselves_exactly_once::<$api>(shim());
        }

        #[test]
        fn abi_shim_pinned_buffers_are_host_memory_usable_for_staging() {
            $crate::runtime::pinned_buffers_are_host_memory_usable_for_staging::<$api>(shim());
        }

        #[test]
        fn abi_shim_a_failed_free_is_logged_not_a_panic() {
            $crate::runtime::a_failed_free_is_logged_not_a_panic::<$api>(&$vendor, shim());
        }

        #[test]
        fn abi_shim_a_library_missing_a_symbol_is_unavailable_naming_it() {
            $crate::runtime::a_library_missing_a_symbol_is_unavailable_naming_it::<$api>(
                &$vendor,
                env!("CARGO_TARGET_TMPDIR"),
            );
        }

        #[test]
        fn abi_shim_ipc_handles_round_trip_their_wire_form_and_map_in_process() {
            $crate::runtime::ipc_handles_round_trip_their_wire_form_and_map_in_process::<$api>(
                shim(),
            );
        }

        #[test]
        fn abi_shim_ipc_works_through_the_memory_trait_and_any_memory() {
            $crate::runtime::ipc_works_through_the_memory_trait_and_any_memory::<$api>(shim());
        }

        #[test]
        fn ipc_wire_form_round_trips_and_refuses_other_lengths() {
            $crate::runtime::ipc_wire_form_round_trips_and_refuses_other_lengths::<$api>();
        }

        #[test]
        fn abi_shim_exporting_an_empty_buffer_is_refused() {
            $crate::runtime::exporting_an_empty_buffer_is_refused::<$api>(shim());
        }

        #[test]
        fn abi_shim_exporting_another_devices_buffer_is_refused() {
            $crate::runtime::exporting_another_devices_buffer_is_refused::<$api>(shim());
        }

        #[test]
        fn abi_shim_ipc_shares_device_memory_with_another_process_loaded_via_env_var() {
            $crate::runtime::ipc_shares_device_memory_with_another_process::<$api>(
                &$vendor,
                shim(),
                &$crate::test_name(module_path!(), "ipc_child_reads_then_writes"),
            );
        }

        #[test]
        #[ignore = "run by abi_shim_ipc_shares_device_memory_with_another_process_loaded_via_env_var"]
        fn ipc_child_reads_then_writes() {
            $crate::runtime::ipc_child_reads_then_writes::<$api>(&$vendor);
        }

        #[test]
        fn abi_shim_a_runtime_without_devices_is_unavailable() {
            $crate::runtime::a_runtime_without_devices_is_unavailable(
                &$vendor,
                shim(),
                &$crate::test_name(module_path!(), "no_device_child"),
            );
        }

        #[test]
        #[ignore = "run by abi_shim_a_runtime_without_devices_is_unavailable"]
        fn no_device_child() {
            $crate::runtime::no_device_child::<$api>(&$vendor, $probe());
        }

        #[test]
        fn abi_shim_host_to_host_copies_pass_through_without_calling_the_runtime() {
            $crate::runtime::host_to_host_copies_pass_through_without_calling_the_runtime::<
                $api,
            >(&$vendor, shim());
        }
    };
}

/// Declares, in a backend's real-device test file, the memory conformance kit against
/// device 0 and its pinned memory where this machine has one (skipped elsewhere), and the
/// checks that a missing runtime or device is a clean `Unavailable`.
#[macro_export]
macro_rules! runtime_device_tests {
    (api: $api:ty, vendor: $vendor:expr, probe: $probe:path $(,)?) => {
        fn real_device() -> Option<$crate::hmc_backend_runtime::RuntimeMemory<$api>> {
            $crate::hmc_backend_runtime::RuntimeMemory::new(0).ok()
        }

        mod device {
            use super::*;
            ::hmc_core::memory_conformance!(real_device());
        }

        mod pinned {
            use super::*;
            ::hmc_core::memory_conformance!(real_device().map(|m| m.pinned()));
        }

        #[test]
        fn without_a_runtime_or_device_new_and_probe_are_unavailable_not_a_panic() {
            $crate::runtime::new_and_probe_agree::<$api>(&$vendor, $probe());
        }

        #[test]
        fn a_library_path_that_does_not_exist_is_unavailable_with_the_variable_named() {
            $crate::runtime::a_missing_library_path_is_unavailable::<$api>(&$vendor);
        }
    };
}
