//! Test-only helper for the HMC device backends: builds the C *ABI shims* at test time.
//!
//! # What this is
//!
//! `hmc-backend-rocm`, `hmc-backend-mlu` and `hmc-backend-musa` open their vendor runtime
//! (`libamdhip64`, `libcnrt`, `libmusart`) with `libloading` at run time, and
//! `hmc-backend-cuda` opens `libcuda` through cudarc. On machines without that hardware,
//! their tests load instead a small C shared library that exports the
//! **same symbols with the same C signatures** over host memory: "device" allocations are
//! `memfd`-backed host mappings recorded in a table, copy-direction enums are checked
//! against that table, the current device is per thread (as in the real runtimes) and is
//! checked on every call that touches device memory, IPC handles are real cross-process
//! handles (`/proc/<pid>/fd/<fd>`), and any function can be made to fail once with a chosen
//! vendor error code so the error mapping is tested.
//!
//! # What it verifies, and what it does not
//!
//! The shim checks our **binding layer**: library discovery and loading, symbol
//! resolution, argument order and types, the direction enum values we pass, that every call
//! runs in the right device context, and how vendor error codes and strings become
//! `hmc_core::Error`. It is **not** a hardware verification: it cannot tell whether a real
//! driver behaves as its header promises, and it measures nothing about performance.
//!
//! The shims are compiled by `hmc_testshim::shim`, the public builder an
//! out-of-tree backend uses for its own (docs/backend-guide.md, "Testing your backend
//! without the hardware"); this crate adds the in-tree shims' shared C and test bodies.
//!
//! The shared part of the shims (allocation table, checks, failure injection, IPC) is
//! `shim/devshim_core.h` of this crate; `shim/devshim_cudart.h` adds every function of a
//! runtime that mirrors the CUDA runtime name for name (HIP, MUSA) from its symbol prefix.
//! Each backend keeps its own vendor source in `tests/shim/` (error codes and texts, and
//! the functions whose shape is its own).
//!
//! # The libibverbs stand-in
//!
//! [`build_ibverbs_standin`] compiles `shim/ibverbs_standin.c`, a user-space
//! `libibverbs.so.1` for `hmc-transport-rdma`'s tests: a per-process NIC that moves bytes
//! between real processes, with the RC state machine, MR rights and fault injection (the
//! file's opening comment lists them). Like the device shims it checks the binding and
//! its use, not hardware.
//!
//! # Binding layout checks
//!
//! [`layout::c_values`] compiles a C program against a library's header and reads back the
//! size, offset or value of every item a hand-written binding declares (the UCX and RDMA
//! transports' `tests/layout.rs`).
//!
//! # Shared test bodies
//!
//! [`ShimControl`] drives a loaded shim (failure injection, live allocation count, current
//! device) and [`run_child_test`] runs one `#[ignore]`d test in a child process. The
//! [`runtime`] module holds the test bodies of the backends built on
//! `hmc-backend-runtime`, generic over their vendor API and declared in each backend by
//! [`runtime_abi_shim_tests!`] and [`runtime_device_tests!`].
//!
//! # Safety
//!
//! `unsafe` is confined to [`ShimControl`]: resolving the shim's control functions with the
//! signatures `devshim_core.h` declares (cited beside each call).

mod control;
pub mod layout;
pub mod pair;
pub mod runtime;
pub mod shim;
pub mod wire_doc;

pub use control::{ShimControl, from_hex, run_child_test, test_name, to_hex};
/// Re-exported for the test macros, so a backend need not name it.
pub use hmc_backend_runtime;

use std::path::{Path, PathBuf};

use shim::ShimSpec;

/// The folder holding `devshim_core.h` and `devshim_cudart.h`, passed to the compiler with
/// `-I`.
pub fn core_include_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("shim")
}

/// Compiles `source` (a shim's C file, which includes the shared headers of
/// [`core_include_dir`]) into a shared library named `lib<name>.so` under `out_dir`, and
/// returns its path.
///
/// A thin use of [`shim::build_shim`], the shim builder (also for backends outside the
/// workspace): the
/// compiler is `$CC` when set, else `cc`; the library is rebuilt only when `source` or a
/// shared header changed, and written under a temporary name and renamed into place, so a
/// concurrent test never loads a half-written file.
pub fn build_shim(source: &Path, name: &str, out_dir: &Path) -> Result<PathBuf, String> {
    let mut spec = ShimSpec::new(name, source)
        .include_dir(core_include_dir())
        .out_dir(out_dir);
    for header in ["devshim_core.h", "devshim_cudart.h"] {
        spec = spec.depends_on(core_include_dir().join(header));
    }
    shim::build_shim(&spec).map_err(|e| e.to_string())
}

/// Compiles the user-space stand-in for `libibverbs.so.1` (`shim/ibverbs_standin.c`,
/// written against the installed `<infiniband/verbs.h>`, so `libibverbs-dev` must be
/// installed) into `out_dir` and returns its path, for `HMC_IBVERBS_LIB`.
///
/// The stand-in is a per-process fake NIC that moves bytes between real processes over
/// abstract Unix sockets (see the file's opening comment for what it enforces and its
/// fault injection variables). It checks the RDMA transport's use of verbs, not a NIC.
pub fn build_ibverbs_standin(out_dir: &Path) -> Result<PathBuf, String> {
    build_shim(
        &core_include_dir().join("ibverbs_standin.c"),
        "ibverbs",
        out_dir,
    )
}

/// The C compiler the shims and layout checks use: `$CC` when set, else `cc`.
pub use shim::c_compiler;

/// CPU time (clock ticks, `USER_HZ`) used so far by this process's threads whose name
/// starts with `prefix` (from `/proc/self/task/*/stat`): how the transports' idle tests
/// show that a progress or completion thread sleeps instead of spinning.
pub fn thread_cpu_ticks(prefix: &str) -> u64 {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task")
        .expect("/proc")
        .flatten()
    {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.starts_with(prefix) {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // Fields after the parenthesised name: state is field 3, utime 14, stime 15.
        let rest = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or_default();
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |i: usize| {
            fields
                .get(i)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        total += field(11) + field(12);
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_source_reports_the_compiler_output() {
        let dir = std::env::temp_dir().join(format!("hmc-testshim-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("broken.c");
        std::fs::write(&src, "int f( {").unwrap();
        let err = build_shim(&src, "broken", &dir).unwrap_err();
        assert!(err.contains("failed to build"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_shared_headers_exist() {
        assert!(core_include_dir().join("devshim_core.h").is_file());
        assert!(core_include_dir().join("devshim_cudart.h").is_file());
    }
}
