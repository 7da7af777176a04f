//! Driving a loaded ABI shim from a test: its control functions (failure injection, live
//! allocation count, current device) and running one `#[ignore]`d test of the same binary
//! in a child process (for IPC across processes and for environment-driven loading).

use std::ffi::{CString, OsStr, c_char, c_int};

/// The test-control functions every shim exports (`devshim_core.h`), resolved from the
/// shim library. Opening it again only bumps the loader's reference count, so this handle
/// sees the same state as the backend that loaded it.
pub struct ShimControl {
    lib: libloading::Library,
}

impl ShimControl {
    /// Opens the shim at `library` (a path, or a name the loader finds).
    pub fn open(library: impl AsRef<OsStr>) -> Self {
        // SAFETY: the shims are our own C libraries with no initialisers.
        let lib = unsafe { libloading::Library::new(library.as_ref()) }.expect("load the shim");
        ShimControl { lib }
    }

    /// The loaded library, for a vendor shim's own extra controls.
    pub fn library(&self) -> &libloading::Library {
        &self.lib
    }

    /// The next call of `function` on this thread fails with `code`.
    pub fn fail_next(&self, function: &str, code: i32) {
        let name = CString::new(function).unwrap();
        // SAFETY: `int hmc_shim_fail_next(const char*, int)` in devshim_core.h.
        unsafe {
            let f = self
                .lib
                .get::<unsafe extern "C" fn(*const c_char, c_int) -> c_int>(b"hmc_shim_fail_next")
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
                .get::<unsafe extern "C" fn(c_int) -> c_int>(b"hmc_shim_live_on_device")
                .unwrap();
            f(device)
        }
    }

    /// How many times the runtime's `DeviceSynchronize` was called (runtime-shaped shims).
    pub fn device_syncs(&self) -> i32 {
        // SAFETY: `int hmc_shim_device_syncs(void)` in devshim_cudart.h.
        unsafe {
            let f = self
                .lib
                .get::<unsafe extern "C" fn() -> c_int>(b"hmc_shim_device_syncs")
                .unwrap();
            f()
        }
    }

    /// The calling thread's current device in the shim.
    pub fn current_device(&self) -> i32 {
        // SAFETY: `int hmc_shim_current_device(void)` in devshim_core.h.
        unsafe {
            let f = self
                .lib
                .get::<unsafe extern "C" fn() -> c_int>(b"hmc_shim_current_device")
                .unwrap();
            f()
        }
    }
}

/// Lower-case hex of `bytes`, for passing binary data to a child through its environment.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of `s`, written by [`to_hex`]. Panics on anything else (test input).
pub fn from_hex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd-length hex: {s:?}");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// The libtest name of test `name` declared in module `module` (a `module_path!()`): the
/// path without the crate's own name.
pub fn test_name(module: &str, name: &str) -> String {
    match module.split_once("::") {
        Some((_, rest)) => format!("{rest}::{name}"),
        None => name.to_string(),
    }
}

/// Runs the `#[ignore]`d test `name` (its full libtest name, see [`test_name`]) of this
/// test binary in a child process with `env`. `Ok` when it ran and passed; else `Err` with
/// the child's output, for the caller's assertion message.
pub fn run_child_test(name: &str, env: &[(&str, &str)]) -> Result<(), String> {
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
    let stdout = String::from_utf8_lossy(&out.stdout);
    if out.status.success() && stdout.contains("1 passed") {
        Ok(())
    } else {
        Err(format!(
            "child test {name} failed or did not run ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_every_byte() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(from_hex(&to_hex(&all)), all);
        assert_eq!(to_hex(&[0, 0xab]), "00ab");
    }

    #[test]
    fn test_names_drop_the_crate_name() {
        assert_eq!(test_name("abi_shim", "child"), "child");
        assert_eq!(test_name("abi_shim::inner", "child"), "inner::child");
    }

    #[test]
    fn a_child_test_that_does_not_exist_is_reported_as_not_run() {
        let err = run_child_test("no_such_test_anywhere", &[]).unwrap_err();
        assert!(err.contains("did not run"), "{err}");
    }
}
