//! The CNRT runtime as a table of `hmc-backend-runtime`: the library, the functions HMC
//! calls, and the `cnrtRet_t` codes and enum values, resolved and called by
//! [`hmc_backend_runtime::TableRuntime`].
//!
//! Every signature, type and enum value below is taken from the public header `cnrt.h` of
//! Cambricon's CNToolkit/Neuware (CNRT 5 and later, the generation with `cnrtSetDevice`),
//! and is cited beside its entry. CNRT differs from the CUDA-runtime shape in ways the table
//! names: the version is a `major, minor, patch` triple, pinned allocation takes no flags,
//! errors have a text and no name, and the IPC handle is a pointer-sized value. Where its
//! signatures differ only in ways the C ABI does not see (`unsigned int*` for the device
//! count, a non-`const` copy source CNRT does not write through, `int` map flags), the
//! entry says so. Only the functions HMC needs are named, once, here.

use std::sync::{Arc, OnceLock};

use hmc_backend_runtime::{
    ErrorText, HostAlloc, IpcPointer, LibrarySpec, MemcpyKinds, RawIpcHandle, RuntimeTable,
    Symbols, TableRuntime, Vendor, VersionQuery,
};
use hmc_core::DeviceKind;

/// The environment variable naming the library to load instead of the default search.
pub const LIBRARY_ENV: &str = "HMC_CNRT_LIB";

/// File names tried, in order, when [`LIBRARY_ENV`] is not set: the soname CNToolkit
/// installs, then its default install prefix (`NEUWARE_HOME` is usually `/usr/local/neuware`).
pub const LIBRARY_CANDIDATES: &[&str] = &["libcnrt.so", "/usr/local/neuware/lib64/libcnrt.so"];

/// Size of a `cnrtIpcMemHandle` on the wire: the handle is a pointer-sized value.
pub const CNRT_IPC_HANDLE_SIZE: usize = <IpcPointer as RawIpcHandle>::SIZE;

/// The Cambricon runtime (`libcnrt`), as a [`Vendor`] of `hmc-backend-runtime`.
#[derive(Debug)]
pub struct Cnrt;

/// The resolved CNRT runtime: the [`hmc_backend_runtime::RuntimeApi`] of the generic
/// memory types ([`crate::MluMemory`] is `RuntimeMemory<CnrtApi>`).
pub type CnrtApi = TableRuntime<Cnrt>;

impl Vendor for Cnrt {
    const NAME: &'static str = "MLU";
    /// `typedef void *cnrtIpcMemHandle;` (cnrt.h: "The IPC memory handle. Pointer to void
    /// by default."). Its value is what a peer process needs.
    type IpcRaw = IpcPointer;
    type IpcWire = [u8; CNRT_IPC_HANDLE_SIZE + 8];
    const IPC_WIRE_ZERO: Self::IpcWire = [0; CNRT_IPC_HANDLE_SIZE + 8];

    fn default_cell() -> &'static OnceLock<Arc<CnrtApi>> {
        static DEFAULT: OnceLock<Arc<CnrtApi>> = OnceLock::new();
        &DEFAULT
    }

    const TABLE: RuntimeTable = RuntimeTable {
        api_name: "CnrtApi",
        spec: LibrarySpec {
            library: "libcnrt",
            runtime: "the Cambricon runtime",
            env: LIBRARY_ENV,
            candidates: LIBRARY_CANDIDATES,
            install: "install Cambricon CNToolkit (Neuware) so that libcnrt.so is on the \
                      loader path (e.g. add $NEUWARE_HOME/lib64 to LD_LIBRARY_PATH)",
            missing_symbol: "HMC needs CNRT 5 or later (CNToolkit 2 or later)",
        },
        kind: DeviceKind::MLU,
        memory_type: "MluMemory",
        ordinal_hint: "use an ordinal below the device count (see hmc_backend_mlu::probe), \
            or check MLU_VISIBLE_DEVICES",
        device: "a Cambricon MLU device",
        // `typedef enum { cnrtSuccess = 0, ... } cnrtRet_t;` (cnrt.h): a C enum, as `int`.
        status_type: "cnrtRet_t",
        success: 0,
        // `cnrtErrorNoMem = 100100`.
        out_of_memory: 100_100,
        // `cnrtErrorNoDevice = 100004`.
        no_device: 100_004,
        // `void cnrtGetLibVersion(int *major, int *minor, int *patch);`
        version: VersionQuery::LibTriple {
            symbol: "cnrtGetLibVersion",
        },
        // `const char *cnrtGetErrorStr(cnrtRet_t err_code);`
        error_text: ErrorText::String("cnrtGetErrorStr"),
        // `typedef enum { cnrtMemcpyHostToDev = 0, cnrtMemcpyDevToDev, cnrtMemcpyDevToHost,
        // cnrtMemcpyHostToHost, cnrtMemcpyPeerToPeer, cnrtMemcpyNoDirection }
        // cnrtMemTransDir_t;` (the same values as CNRT 4's `CNRT_MEM_TRANS_DIR_HOST2DEV = 0,
        // ...DEV2DEV, ...DEV2HOST`).
        memcpy_kind: MemcpyKinds {
            host_to_device: 0,
            device_to_host: 2,
            device_to_device: 1,
        },
        // `cnrtRet_t cnrtHostMalloc(void **pPtr, size_t bytes);`
        host_alloc: HostAlloc::Plain("cnrtHostMalloc"),
        // `cnrtMapMemHandle`'s `int flags`: "Currently it only supports value 0" (cnrt.h).
        ipc_open_flags: 0,
        symbols: Symbols {
            // `cnrtRet_t cnrtGetDeviceCount(unsigned int *pCount);` (read as `int`: the same
            // width, and a count far below INT_MAX).
            get_device_count: "cnrtGetDeviceCount",
            // `cnrtRet_t cnrtSetDevice(int ordinal);`
            set_device: "cnrtSetDevice",
            // `cnrtRet_t cnrtMalloc(void **pPtr, size_t bytes);`
            malloc: "cnrtMalloc",
            // `cnrtRet_t cnrtFree(void *ptr);`
            free: "cnrtFree",
            // `cnrtRet_t cnrtFreeHost(void *ptr);`
            host_free: "cnrtFreeHost",
            // `cnrtRet_t cnrtMemcpy(void *dst, void *src, size_t bytes, cnrtMemTransDir_t
            // dir);` (`src` is not `const` in the header; CNRT does not write through it).
            memcpy: "cnrtMemcpy",
            // `cnrtRet_t cnrtMemGetInfo(size_t *free, size_t *total);`
            mem_get_info: "cnrtMemGetInfo",
            // `cnrtRet_t cnrtAcquireMemHandle(cnrtIpcMemHandle *handle, void *ptr);`
            ipc_get: "cnrtAcquireMemHandle",
            // `cnrtRet_t cnrtMapMemHandle(void **ptr, cnrtIpcMemHandle handle, int flags);`
            ipc_open: "cnrtMapMemHandle",
            // `cnrtRet_t cnrtUnMapMemHandle(void *ptr);`
            ipc_close: "cnrtUnMapMemHandle",
            // CNRT has no address-range query or device-wide synchronise HMC binds.
            address_range: None,
            device_synchronize: None,
        },
    };
}
