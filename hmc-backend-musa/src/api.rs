//! The MUSA runtime as a table of `hmc-backend-runtime`: the library, the functions HMC
//! calls, and the `musaError_t` codes and enum values, resolved and called by
//! [`hmc_backend_runtime::TableRuntime`].
//!
//! Every signature, type and enum value below is taken from the public headers of the Moore
//! Threads MUSA toolkit, `include/musa_runtime_api.h` and `include/driver_types.h`, and is
//! cited beside its entry. The MUSA runtime API mirrors the CUDA runtime API name for name
//! (`cudaMalloc` -> `musaMalloc`), including the numeric values of `musaError_t` and
//! `musaMemcpyKind`. Only the functions HMC needs are named, once, here.

use std::sync::{Arc, OnceLock};

use hmc_backend_runtime::{
    ErrorText, HostAlloc, IpcBytes, LibrarySpec, MemcpyKinds, RuntimeTable, Symbols, TableRuntime,
    Vendor, VersionQuery,
};
use hmc_core::DeviceKind;

/// The environment variable naming the library to load instead of the default search.
pub const LIBRARY_ENV: &str = "HMC_MUSA_LIB";

/// File names tried, in order, when [`LIBRARY_ENV`] is not set: the unversioned development
/// link, the sonames of MUSA toolkits 4 to 1, then the toolkit's default install prefix.
pub const LIBRARY_CANDIDATES: &[&str] = &[
    "libmusart.so",
    "libmusart.so.4",
    "libmusart.so.3",
    "libmusart.so.2",
    "libmusart.so.1",
    "/usr/local/musa/lib/libmusart.so",
];

/// `#define MUSA_IPC_HANDLE_SIZE 64` (musa_runtime_api.h).
pub const MUSA_IPC_HANDLE_SIZE: usize = 64;

/// The MUSA runtime (`libmusart`), as a [`Vendor`] of `hmc-backend-runtime`.
#[derive(Debug)]
pub struct Musa;

/// The resolved MUSA runtime: the [`hmc_backend_runtime::RuntimeApi`] of the generic
/// memory types ([`crate::MusaMemory`] is `RuntimeMemory<MusaApi>`).
pub type MusaApi = TableRuntime<Musa>;

impl Vendor for Musa {
    const NAME: &'static str = "MUSA";
    /// `typedef struct musaIpcMemHandle_st { char reserved[MUSA_IPC_HANDLE_SIZE]; }
    /// musaIpcMemHandle_t;` (musa_runtime_api.h), passed by value to `musaIpcOpenMemHandle`.
    type IpcRaw = IpcBytes<MUSA_IPC_HANDLE_SIZE>;
    type IpcWire = [u8; MUSA_IPC_HANDLE_SIZE + 8];
    const IPC_WIRE_ZERO: Self::IpcWire = [0; MUSA_IPC_HANDLE_SIZE + 8];

    fn default_cell() -> &'static OnceLock<Arc<MusaApi>> {
        static DEFAULT: OnceLock<Arc<MusaApi>> = OnceLock::new();
        &DEFAULT
    }

    const TABLE: RuntimeTable = RuntimeTable {
        api_name: "MusaApi",
        spec: LibrarySpec {
            library: "libmusart",
            runtime: "the MUSA runtime",
            env: LIBRARY_ENV,
            candidates: LIBRARY_CANDIDATES,
            install: "install the MUSA toolkit so that libmusart.so is on the loader path",
            missing_symbol: "it is not a MUSA runtime HMC supports",
        },
        kind: DeviceKind::MUSA,
        memory_type: "MusaMemory",
        ordinal_hint: "use an ordinal below the device count (see hmc_backend_musa::probe), \
            or check MUSA_VISIBLE_DEVICES",
        device: "a Moore Threads MUSA device",
        // `typedef enum musaError_t { musaSuccess = 0, ... } musaError_t;` (driver_types.h):
        // a C enum, passed as `int`.
        status_type: "musaError_t",
        success: 0,
        // `musaErrorMemoryAllocation = 2`.
        out_of_memory: 2,
        // `musaErrorNoDevice = 100`.
        no_device: 100,
        // `musaError_t musaRuntimeGetVersion(int* runtimeVersion);`: any positive version is
        // accepted; the symbols resolved are what HMC actually depends on.
        version: VersionQuery::Runtime {
            symbol: "musaRuntimeGetVersion",
            min: 1,
            min_name: "a positive version",
        },
        // `const char* musaGetErrorName(musaError_t error);`
        // `const char* musaGetErrorString(musaError_t musaError);`
        error_text: ErrorText::NameAndString {
            name: "musaGetErrorName",
            string: "musaGetErrorString",
        },
        // `typedef enum musaMemcpyKind { musaMemcpyHostToHost = 0, musaMemcpyHostToDevice =
        // 1, musaMemcpyDeviceToHost = 2, musaMemcpyDeviceToDevice = 3, musaMemcpyDefault = 4 }`
        // (host to host and default are never used: we always know the direction).
        memcpy_kind: MemcpyKinds {
            host_to_device: 1,
            device_to_host: 2,
            device_to_device: 3,
        },
        // `musaError_t musaHostAlloc(void** ptr, size_t size, unsigned int flags);` with
        // `#define musaHostAllocDefault 0x0`.
        host_alloc: HostAlloc::WithFlags {
            symbol: "musaHostAlloc",
            flags: 0,
        },
        // `#define musaIpcMemLazyEnablePeerAccess 0x01`.
        ipc_open_flags: 1,
        symbols: Symbols {
            // `musaError_t musaGetDeviceCount(int* count);`
            get_device_count: "musaGetDeviceCount",
            // `musaError_t musaSetDevice(int deviceId);`
            set_device: "musaSetDevice",
            // `musaError_t musaMalloc(void** ptr, size_t size);`
            malloc: "musaMalloc",
            // `musaError_t musaFree(void* ptr);`
            free: "musaFree",
            // `musaError_t musaFreeHost(void* ptr);`
            host_free: "musaFreeHost",
            // `musaError_t musaMemcpy(void* dst, const void* src, size_t sizeBytes,
            // musaMemcpyKind kind);`
            memcpy: "musaMemcpy",
            // `musaError_t musaMemGetInfo(size_t* free, size_t* total);`
            mem_get_info: "musaMemGetInfo",
            // `musaError_t musaIpcGetMemHandle(musaIpcMemHandle_t* handle, void* devPtr);`
            ipc_get: "musaIpcGetMemHandle",
            // `musaError_t musaIpcOpenMemHandle(void** devPtr, musaIpcMemHandle_t handle,
            // unsigned int flags);`
            ipc_open: "musaIpcOpenMemHandle",
            // `musaError_t musaIpcCloseMemHandle(void* devPtr);`
            ipc_close: "musaIpcCloseMemHandle",
            // Not bound: HMC has not checked these against a MUSA header, so memory inside
            // an allocation has no IPC export and a tensor's stream is not synchronised by
            // the runtime here (as before this table).
            address_range: None,
            device_synchronize: None,
        },
    };
}
