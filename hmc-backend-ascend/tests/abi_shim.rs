//! The binding layer against an ABI shim of `libascendcl` (`tests/shim/acl_shim.c`, built
//! here with the C compiler): loading, symbol resolution, copy kinds and `destMax`, device
//! context, error mapping with `aclGetRecentErrMsg`, pinned memory and IPC keys. The shim
//! exports the ACL symbols over host memory; these tests check our binding layer, they are
//! not a hardware verification.
//!
//! The runtime-shaped test bodies are shared with the other backends
//! (`hmc_testshim::runtime`); ACL's own checks follow them.

mod support;

use std::ffi::c_int;
use std::path::PathBuf;

use hmc_backend_ascend::{AclApi, AscendMemory};
use hmc_core::testing::pattern;
use hmc_core::{DeviceErrorKind, Error, MemSpan, MemSpanMut, Memory};
use hmc_testshim::ShimControl;
use hmc_testshim::hmc_backend_runtime::RuntimeApi;
use hmc_testshim::runtime::{Call, vendor_error_names_library_function_code_and_text};
use rstest::rstest;
use support::VENDOR;

hmc_testshim::runtime_abi_shim_tests!(
    api: AclApi,
    vendor: VENDOR,
    probe: hmc_backend_ascend::probe,
    probe_library: hmc_backend_ascend::probe_library,
);

/// Each runtime call HMC makes, failed once with an `aclError`, surfaces as `Error::Device`
/// naming the library, the function, the code and `aclGetRecentErrMsg`'s text of that call;
/// the allocation codes are out of memory, the others are not.
#[rstest]
#[case::alloc(
    Call::Alloc,
    "aclrtMalloc",
    207_001,
    "[shim] aclrtMalloc: memory allocation error"
)]
#[case::copy(
    Call::Copy,
    "aclrtMemcpy",
    507_899,
    "[shim] aclrtMemcpy: drv internal error"
)]
#[case::bind(
    Call::Bind,
    "aclrtSetDevice",
    107_001,
    "[shim] aclrtSetDevice: invalid device id"
)]
#[case::pinned(
    Call::Pinned,
    "aclrtMallocHost",
    207_001,
    "[shim] aclrtMallocHost: memory allocation error"
)]
#[case::export(
    Call::Export,
    "aclrtIpcMemGetExportKey",
    107_000,
    "[shim] aclrtIpcMemGetExportKey: param invalid"
)]
#[case::info(
    Call::Info,
    "aclrtGetMemInfo",
    999_999,
    "[shim] aclrtGetMemInfo: unknown error"
)]
fn abi_shim_vendor_errors_name_library_function_code_and_text(
    #[case] call: Call,
    #[case] function: &'static str,
    #[case] code: i64,
    #[case] text: &str,
) {
    vendor_error_names_library_function_code_and_text::<AclApi>(
        &VENDOR,
        shim(),
        call,
        function,
        code,
        text,
    );
}

/// Both of ACL's out-of-memory codes (`ACL_ERROR_BAD_ALLOC`,
/// `ACL_ERROR_RT_MEMORY_ALLOCATION`) are `OutOfMemory`; a parameter error is not.
#[rstest]
#[case::bad_alloc(200_000, DeviceErrorKind::OutOfMemory)]
#[case::rt_memory_allocation(207_001, DeviceErrorKind::OutOfMemory)]
#[case::param_invalid(107_000, DeviceErrorKind::Other)]
fn abi_shim_out_of_memory_codes_are_classified(
    #[case] code: i32,
    #[case] expected: DeviceErrorKind,
) {
    let mem = shim_device(1);
    ShimControl::open(shim()).fail_next("aclrtMalloc", code);
    match mem.alloc(64).map(drop).unwrap_err() {
        Error::Device { kind, code: c, .. } => {
            assert_eq!(kind, expected);
            assert_eq!(c, i64::from(code));
        }
        other => panic!("expected Error::Device, got {other:?}"),
    }
}

/// The last `aclrtMemcpy` of this thread in the shim: `(kind, destMax, count)`.
fn last_memcpy() -> (c_int, usize, usize) {
    let control = ShimControl::open(shim());
    // SAFETY: `int hmc_shim_acl_last_memcpy(size_t *, size_t *)` in acl_shim.c.
    unsafe {
        let f = control
            .library()
            .get::<unsafe extern "C" fn(*mut usize, *mut usize) -> c_int>(
                b"hmc_shim_acl_last_memcpy",
            )
            .unwrap();
        let (mut dest_max, mut count) = (0, 0);
        let kind = f(&mut dest_max, &mut count);
        (kind, dest_max, count)
    }
}

/// Each direction passes its `aclrtMemcpyKind` (1, 2, 3) and `destMax` equal to the copied
/// length, for a span inside a larger buffer too.
#[rstest]
#[case::host_to_device(1)]
#[case::device_to_host(2)]
#[case::device_to_device(3)]
fn abi_shim_copies_pass_the_kind_and_dest_max(#[case] kind: c_int) {
    let mem = shim_device(2);
    let mut a = mem.alloc(4096).unwrap();
    let mut b = mem.alloc(4096).unwrap();
    let mut host = pattern(21, 4096);
    mem.copy(&mut MemSpanMut::of(&mut a), &MemSpan::host(&host))
        .unwrap();
    let n = 1000;
    let mut dst_dev = MemSpanMut::of(&mut b);
    let result = match kind {
        1 => mem.copy(
            &mut dst_dev.slice_mut(100, n).unwrap(),
            &MemSpan::host(&host[..n]),
        ),
        2 => mem.copy(
            &mut MemSpanMut::host(&mut host[..n]),
            &MemSpan::of(&a).slice(100, n).unwrap(),
        ),
        _ => mem.copy(
            &mut dst_dev.slice_mut(100, n).unwrap(),
            &MemSpan::of(&a).slice(0, n).unwrap(),
        ),
    };
    result.unwrap();
    assert_eq!(last_memcpy(), (kind, n, n));
}

/// A library that already initialised ACL answers `ACL_ERROR_REPEAT_INITIALIZE` to every
/// later `aclInit`; opening it again is fine.
#[test]
fn abi_shim_a_repeated_acl_init_is_accepted() {
    let _first = shim_device(0);
    let again = AscendMemory::with_library(shim(), 0).expect("second aclInit accepted");
    drop(again);
    let control = ShimControl::open(shim());
    // SAFETY: `int hmc_shim_acl_init_count(void)` in acl_shim.c.
    let inits = unsafe {
        control
            .library()
            .get::<unsafe extern "C" fn() -> c_int>(b"hmc_shim_acl_init_count")
            .unwrap()()
    };
    assert!(inits >= 2, "aclInit ran {inits} times");
}

/// A runtime handle resets each device it bound, once, when its last user is gone.
#[test]
fn abi_shim_a_dropped_runtime_resets_each_device_it_bound_once() {
    let status = hmc_testshim::run_child_test(
        &hmc_testshim::test_name(module_path!(), "reset_child"),
        &[("HMC_ASCEND_LIB", shim().to_str().unwrap())],
    );
    if let Err(out) = status {
        panic!("the child process failed: {out}");
    }
}

#[test]
#[ignore = "run by abi_shim_a_dropped_runtime_resets_each_device_it_bound_once"]
fn reset_child() {
    let lib = std::env::var("HMC_ASCEND_LIB").expect("run by the parent test");
    let control = ShimControl::open(&lib);
    let resets = |d: c_int| {
        // SAFETY: `int hmc_shim_acl_reset_count(int)` in acl_shim.c.
        unsafe {
            control
                .library()
                .get::<unsafe extern "C" fn(c_int) -> c_int>(b"hmc_shim_acl_reset_count")
                .unwrap()(d)
        }
    };
    let mem = AscendMemory::with_library(&lib, 3).unwrap();
    let mut buf = mem.alloc(64).unwrap();
    mem.copy(&mut MemSpanMut::of(&mut buf), &MemSpan::host(&[1u8; 64]))
        .unwrap();
    assert_eq!(resets(3), 0, "not while in use");
    drop(buf);
    drop(mem);
    assert_eq!(resets(3), 1, "one reset per bound device");
    assert_eq!(resets(0), 0, "never bound");
}

/// The shim built without the `aclrtIpcMem*` functions, as an older CANN.
fn shim_without_ipc() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("acl_shim_no_ipc");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("acl_shim_no_ipc.c");
    let full = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/shim/acl_shim.c");
    let text = format!(
        "#define SHIM_ACL_NO_IPC 1\n#include \"{}\"\n",
        full.display()
    );
    // Rewritten when the shim's source is newer, so that `build_shim` rebuilds it.
    let modified = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if std::fs::read_to_string(&src).ok().as_deref() != Some(text.as_str())
        || modified(&full) > modified(&src)
    {
        std::fs::write(&src, text).unwrap();
    }
    hmc_testshim::build_shim(&src, "acl_shim_no_ipc", &dir).unwrap()
}

/// Where ACL lacks the IPC functions, everything else works and IPC is `Unsupported`,
/// naming the missing function and the runtime's version.
#[test]
fn abi_shim_without_the_ipc_functions_ipc_is_unsupported_and_the_rest_works() {
    let lib = shim_without_ipc();
    let api = <AclApi as RuntimeApi>::open_library(&lib).unwrap();
    assert!(!api.supports_ipc());
    let mem = AscendMemory::with_api(api, 1).unwrap();
    assert!(
        !hmc_core::Memory::capabilities(&mem).ipc,
        "capabilities say IPC is unavailable"
    );
    let mut buf = mem.alloc(128).unwrap();
    mem.copy(&mut MemSpanMut::of(&mut buf), &MemSpan::host(&[5u8; 128]))
        .unwrap();
    let err = mem.export_ipc(&buf).unwrap_err();
    assert!(matches!(err, Error::Unsupported(_)), "{err:?}");
    let s = err.to_string();
    assert!(
        s.contains("aclrtIpcMemGetExportKey") && s.contains("8.1.0"),
        "{s}"
    );
}
