//! The HIP runtime as a table of `hmc-backend-runtime`: the library, the functions HMC
//! calls, and the `hipError_t` codes and enum values, resolved and called by
//! [`hmc_backend_runtime::TableRuntime`].
//!
//! Every signature, type and enum value below is taken from the public HIP header
//! `include/hip/hip_runtime_api.h` of ROCm/HIP (also shipped by Hygon's DTK), and is cited
//! beside its entry. Only the functions HMC needs are named, once, here.

use std::sync::{Arc, OnceLock};

use hmc_backend_runtime::{
    ErrorText, HostAlloc, IpcBytes, LibrarySpec, MemcpyKinds, RuntimeTable, Symbols, TableRuntime,
    Vendor, VersionQuery,
};
use hmc_core::DeviceKind;

/// The environment variable naming the library to load instead of the default search.
pub const LIBRARY_ENV: &str = "HMC_HIP_LIB";

/// File names tried, in order, when [`LIBRARY_ENV`] is not set: the unversioned development
/// link, the ROCm 6 and 5 sonames, then the default install prefixes of ROCm and Hygon DTK.
pub const LIBRARY_CANDIDATES: &[&str] = &[
    "libamdhip64.so",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
    "/opt/rocm/lib/libamdhip64.so",
    "/opt/dtk/lib/libamdhip64.so",
];

/// `#define HIP_IPC_HANDLE_SIZE 64` (hip_runtime_api.h).
pub const HIP_IPC_HANDLE_SIZE: usize = 64;

/// The HIP runtime (`libamdhip64`), as a [`Vendor`] of `hmc-backend-runtime`.
#[derive(Debug)]
pub struct Hip;

/// The resolved HIP runtime: the [`hmc_backend_runtime::RuntimeApi`] of the generic memory
/// types ([`crate::RocmMemory`] is `RuntimeMemory<HipApi>`).
pub type HipApi = TableRuntime<Hip>;

impl Vendor for Hip {
    const NAME: &'static str = "HIP";
    /// `typedef struct hipIpcMemHandle_st { char reserved[HIP_IPC_HANDLE_SIZE]; }
    /// hipIpcMemHandle_t;` (hip_runtime_api.h), passed by value to `hipIpcOpenMemHandle`.
    type IpcRaw = IpcBytes<HIP_IPC_HANDLE_SIZE>;
    type IpcWire = [u8; HIP_IPC_HANDLE_SIZE + 8];
    const IPC_WIRE_ZERO: Self::IpcWire = [0; HIP_IPC_HANDLE_SIZE + 8];

    fn default_cell() -> &'static OnceLock<Arc<HipApi>> {
        static DEFAULT: OnceLock<Arc<HipApi>> = OnceLock::new();
        &DEFAULT
    }

    const TABLE: RuntimeTable = RuntimeTable {
        api_name: "HipApi",
        spec: LibrarySpec {
            library: "libamdhip64",
            runtime: "the HIP runtime",
            env: LIBRARY_ENV,
            candidates: LIBRARY_CANDIDATES,
            install: "install ROCm (or Hygon DTK) so that libamdhip64.so is on the loader path",
            missing_symbol: "it is not a HIP runtime HMC supports",
        },
        kind: DeviceKind::ROCM,
        memory_type: "RocmMemory",
        ordinal_hint: "use an ordinal below the device count (see hmc_backend_rocm::probe), \
            or check HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES",
        device: "an AMD/Hygon HIP device",
        // `typedef enum hipError_t { hipSuccess = 0, ... } hipError_t;`: a C enum, as `int`.
        status_type: "hipError_t",
        success: 0,
        // `hipErrorOutOfMemory = 2`.
        out_of_memory: 2,
        // `hipErrorNoDevice = 100`.
        no_device: 100,
        // `hipError_t hipRuntimeGetVersion(int* runtimeVersion);`, encoding
        // `HIP_VERSION_MAJOR * 10000000 + HIP_VERSION_MINOR * 100000 + HIP_VERSION_PATCH`
        // (hip_version.h); HIP 5.0 is the oldest accepted.
        version: VersionQuery::Runtime {
            symbol: "hipRuntimeGetVersion",
            min: 50_000_000,
            min_name: "HIP 5.0",
        },
        // `const char* hipGetErrorName(hipError_t hip_error);`
        // `const char* hipGetErrorString(hipError_t hipError);`
        error_text: ErrorText::NameAndString {
            name: "hipGetErrorName",
            string: "hipGetErrorString",
        },
        // `typedef enum hipMemcpyKind { hipMemcpyHostToHost = 0, hipMemcpyHostToDevice = 1,
        // hipMemcpyDeviceToHost = 2, hipMemcpyDeviceToDevice = 3, hipMemcpyDefault = 4 }`
        // (host to host and default are never used: we always know the direction).
        memcpy_kind: MemcpyKinds {
            host_to_device: 1,
            device_to_host: 2,
            device_to_device: 3,
        },
        // `hipError_t hipHostMalloc(void** ptr, size_t size, unsigned int flags);` with
        // `#define hipHostMallocDefault 0x0`.
        host_alloc: HostAlloc::WithFlags {
            symbol: "hipHostMalloc",
            flags: 0,
        },
        // `#define hipIpcMemLazyEnablePeerAccess 0x01`.
        ipc_open_flags: 1,
        symbols: Symbols {
            // `hipError_t hipGetDeviceCount(int* count);`
            get_device_count: "hipGetDeviceCount",
            // `hipError_t hipSetDevice(int deviceId);`
            set_device: "hipSetDevice",
            // `hipError_t hipMalloc(void** ptr, size_t size);`
            malloc: "hipMalloc",
            // `hipError_t hipFree(void* ptr);`
            free: "hipFree",
            // `hipError_t hipHostFree(void* ptr);`
            host_free: "hipHostFree",
            // `hipError_t hipMemcpy(void* dst, const void* src, size_t sizeBytes,
            // hipMemcpyKind kind);`
            memcpy: "hipMemcpy",
            // `hipError_t hipMemGetInfo(size_t* free, size_t* total);`
            mem_get_info: "hipMemGetInfo",
            // `hipError_t hipIpcGetMemHandle(hipIpcMemHandle_t* handle, void* devPtr);`
            ipc_get: "hipIpcGetMemHandle",
            // `hipError_t hipIpcOpenMemHandle(void** devPtr, hipIpcMemHandle_t handle,
            // unsigned int flags);`
            ipc_open: "hipIpcOpenMemHandle",
            // `hipError_t hipIpcCloseMemHandle(void* devPtr);`
            ipc_close: "hipIpcCloseMemHandle",
            // `hipError_t hipMemGetAddressRange(hipDeviceptr_t* pbase, size_t* psize,
            // hipDeviceptr_t dptr);`
            address_range: Some("hipMemGetAddressRange"),
            // `hipError_t hipDeviceSynchronize(void);`
            device_synchronize: Some("hipDeviceSynchronize"),
        },
    };
}
