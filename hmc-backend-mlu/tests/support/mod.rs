//! Helpers shared by this crate's integration tests: building and controlling the ABI shim.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Builds `tests/shim/cnrt_shim.c` once per test binary and returns the library's path.
pub fn shim() -> &'static Path {
    static SHIM: OnceLock<PathBuf> = OnceLock::new();
    SHIM.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/shim/cnrt_shim.c");
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("hmc-backend-mlu-shim");
        hmc_testshim::build_shim(&src, "cnrt_shim", &out).expect("build the CNRT ABI shim")
    })
}

/// The shim's test-control functions.
pub struct ShimControl {
    lib: libloading::Library,
}

impl ShimControl {
    pub fn open() -> Self {
        // SAFETY: the shim is our own C library with no initialisers; loading it again only
        // bumps its reference count, so this handle sees the same state as the backend's.
        let lib = unsafe { libloading::Library::new(shim()) }.expect("load the shim");
        ShimControl { lib }
    }

    /// The next call of `function` on this thread fails with `code`.
    pub fn fail_next(&self, function: &str, code: i32) {
        let name = std::ffi::CString::new(function).unwrap();
        // SAFETY: `int hmc_shim_fail_next(const char*, int)` in devshim_core.h.
        unsafe {
            let f = self
                .lib
                .get::<unsafe extern "C" fn(*const std::ffi::c_char, i32) -> i32>(
                    b"hmc_shim_fail_next",
                )
                .unwrap();
            f(name.as_ptr(), code);
        }
    }

    /// Live shim allocations attributed to `device`.
    pub fn live_on_device(&self, device: i32) -> i32 {
        // SAFETY: `int hmc_shim_live_on_device(int)` in devshim_core.h.
        unsafe {
            let f = self
                .lib
                .get::<unsafe extern "C" fn(i32) -> i32>(b"hmc_shim_live_on_device")
                .unwrap();
            f(device)
        }
    }

    /// The calling thread's current device in the shim.
    pub fn current_device(&self) -> i32 {
        // SAFETY: `int hmc_shim_current_device(void)` in devshim_core.h.
        unsafe {
            let f = self
                .lib
                .get::<unsafe extern "C" fn() -> i32>(b"hmc_shim_current_device")
                .unwrap();
            f()
        }
    }
}

pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn from_hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Runs the `#[ignore]`d test `name` of this test binary in a child process with `env`,
/// and returns whether it passed (its output is shown on failure).
pub fn run_child_test(name: &str, env: &[(&str, &str)]) -> bool {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        name,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("spawn the child test");
    if !out.status.success() {
        eprintln!(
            "child test {name} failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let ran = String::from_utf8_lossy(&out.stdout).contains("1 passed");
    out.status.success() && ran
}
