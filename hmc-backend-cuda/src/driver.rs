//! Opening the CUDA driver without panicking, mapping `CUresult` into
//! [`hmc_core::Error`], and the per-device context every call binds first.
//!
//! Functions are called through `cudarc::driver::sys`, which resolves each driver symbol
//! from `libcuda` on first use. cudarc panics when `libcuda` cannot be loaded, so
//! [`ensure_driver`] checks `cudarc::driver::sys::is_culib_present()` before any other call.
//! Names, types and enum values are those of NVIDIA's `cuda.h` (CUDA Driver API), which
//! cudarc's bindings mirror one to one.

use std::ffi::{CStr, c_char, c_int};
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys::{self, CUresult};
use hmc_core::{DeviceErrorKind, Error, Result};

/// The library name used in errors.
pub(crate) const LIBRARY: &str = "libcuda";

/// Oldest driver accepted: CUDA 11.4 (`cuDriverGetVersion` encodes `1000 * major + 10 *
/// minor`), the first with every symbol HMC calls except DMA-BUF export, which checks its
/// own minimum ([`DMA_BUF_MIN_DRIVER`]).
pub(crate) const MIN_DRIVER_VERSION: c_int = 11_040;

/// `cuMemGetHandleForAddressRange` appeared in CUDA 11.7.
pub(crate) const DMA_BUF_MIN_DRIVER: c_int = 11_070;

fn hint() -> String {
    "install the NVIDIA driver (it provides libcuda.so.1), or add the folder holding \
     libcuda.so.1 to LD_LIBRARY_PATH; check CUDA_VISIBLE_DEVICES"
        .into()
}

/// `Ok` for `CUDA_SUCCESS`, else [`Error::Device`] with the driver's own name and text.
pub(crate) fn check(function: &'static str, r: CUresult) -> Result<()> {
    if r == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(device_error(function, r))
    }
}

/// The [`Error::Device`] for a failed driver call: `cuGetErrorName` and `cuGetErrorString`.
pub(crate) fn device_error(function: &'static str, r: CUresult) -> Error {
    let kind = if r == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        DeviceErrorKind::OutOfMemory
    } else {
        DeviceErrorKind::Other
    };
    Error::Device {
        kind,
        library: LIBRARY,
        function,
        code: r as i64,
        message: describe(r),
    }
}

fn describe(r: CUresult) -> String {
    let mut name: *const c_char = std::ptr::null();
    let mut text: *const c_char = std::ptr::null();
    // SAFETY: both calls write a pointer to a static NUL-terminated string (or fail and
    // leave NULL); only called after the driver library is known to load.
    unsafe {
        let _ = sys::cuGetErrorName(r, &mut name);
        let _ = sys::cuGetErrorString(r, &mut text);
    }
    let show = |p: *const c_char| {
        if p.is_null() {
            "(unknown)".to_string()
        } else {
            // SAFETY: non-null results point to static NUL-terminated strings.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    format!("{}: {}", show(name), show(text))
}

/// Loads and initialises the driver once per process. `Unavailable` (never a panic) when
/// `libcuda` is missing, too old, or finds no device.
pub(crate) fn ensure_driver() -> Result<c_int> {
    static STATE: OnceLock<std::result::Result<c_int, (String, String)>> = OnceLock::new();
    let state = STATE.get_or_init(|| {
        // SAFETY: is_culib_present only tries to dlopen the candidate names; it is the check
        // cudarc offers so that later calls do not panic.
        if !unsafe { sys::is_culib_present() } {
            return Err((
                "the CUDA driver (libcuda.so)".into(),
                "no libcuda.so or libcuda.so.1 could be loaded".into(),
            ));
        }
        // SAFETY: plain calls with valid out-pointers; the library is present.
        unsafe {
            let mut version: c_int = 0;
            let r = sys::cuDriverGetVersion(&mut version);
            if r != CUresult::CUDA_SUCCESS {
                return Err(("the CUDA driver".into(), describe(r)));
            }
            if version < MIN_DRIVER_VERSION {
                return Err((
                    "the CUDA driver".into(),
                    format!(
                        "driver API version {version} is older than 11.4 ({MIN_DRIVER_VERSION})"
                    ),
                ));
            }
            let r = sys::cuInit(0);
            if r != CUresult::CUDA_SUCCESS {
                return Err((
                    "an NVIDIA CUDA device".into(),
                    format!("cuInit: {}", describe(r)),
                ));
            }
            Ok(version)
        }
    });
    state.clone().map_err(|(what, reason)| Error::Unavailable {
        what,
        reason,
        hint: hint(),
    })
}

/// The number of CUDA devices, or `Unavailable` when the driver or any device is missing.
pub(crate) fn device_count() -> Result<u32> {
    ensure_driver()?;
    let mut count: c_int = 0;
    // SAFETY: valid out-pointer; the driver is initialised.
    check("cuDeviceGetCount", unsafe {
        sys::cuDeviceGetCount(&mut count)
    })?;
    if count <= 0 {
        return Err(Error::Unavailable {
            what: "an NVIDIA CUDA device".into(),
            reason: "the driver reports 0 devices".into(),
            hint: hint(),
        });
    }
    Ok(count as u32)
}

/// One device's retained primary context and the stream HMC's copies run on. Dropping the
/// last `Arc` destroys the stream and releases the primary context.
#[derive(Debug)]
pub(crate) struct DeviceContext {
    pub(crate) ordinal: u32,
    pub(crate) device: sys::CUdevice,
    ctx: sys::CUcontext,
    pub(crate) stream: sys::CUstream,
    pub(crate) driver_version: c_int,
}

// SAFETY: a CUDA context and stream are process-wide driver objects usable from any thread
// once the context is made current there, which every use does through `bind`.
unsafe impl Send for DeviceContext {}
// SAFETY: as above; the driver API is thread-safe for these handles.
unsafe impl Sync for DeviceContext {}

impl DeviceContext {
    pub(crate) fn open(ordinal: u32) -> Result<Arc<DeviceContext>> {
        let driver_version = ensure_driver()?;
        let count = device_count()?;
        if ordinal >= count {
            return Err(Error::Unavailable {
                what: format!("CUDA device {ordinal}"),
                reason: format!("the driver reports {count} device(s)"),
                hint: "use an ordinal below the device count (see hmc_backend_cuda::probe), or \
                       check CUDA_VISIBLE_DEVICES"
                    .into(),
            });
        }
        let mut device: sys::CUdevice = 0;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        let mut stream: sys::CUstream = std::ptr::null_mut();
        // SAFETY: valid out-pointers; the ordinal is in range; the primary context is
        // retained here and released in Drop.
        unsafe {
            check(
                "cuDeviceGet",
                sys::cuDeviceGet(&mut device, ordinal as c_int),
            )?;
            check(
                "cuDevicePrimaryCtxRetain",
                sys::cuDevicePrimaryCtxRetain(&mut ctx, device),
            )?;
            let bound = check("cuCtxSetCurrent", sys::cuCtxSetCurrent(ctx)).and_then(|()| {
                check(
                    "cuStreamCreate",
                    sys::cuStreamCreate(
                        &mut stream,
                        sys::CUstream_flags_enum::CU_STREAM_NON_BLOCKING as u32,
                    ),
                )
            });
            if let Err(e) = bound {
                let _ = sys::cuDevicePrimaryCtxRelease_v2(device);
                return Err(e);
            }
        }
        Ok(Arc::new(DeviceContext {
            ordinal,
            device,
            ctx,
            stream,
            driver_version,
        }))
    }

    /// Makes this device's primary context current on the calling thread
    /// (`cuCtxSetCurrent`). Every driver call that touches device memory follows it.
    pub(crate) fn bind(&self) -> Result<()> {
        // SAFETY: `ctx` is a retained primary context, valid until Drop.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.ctx) })
    }
}

impl Drop for DeviceContext {
    fn drop(&mut self) {
        // SAFETY: the stream and context were created in `open` and are destroyed once.
        unsafe {
            if self.bind().is_ok() {
                let _ = sys::cuStreamSynchronize(self.stream);
                let _ = sys::cuStreamDestroy_v2(self.stream);
            }
            if let Err(e) = check(
                "cuDevicePrimaryCtxRelease",
                sys::cuDevicePrimaryCtxRelease_v2(self.device),
            ) {
                tracing::error!(error = %e, "could not release a CUDA primary context");
            }
        }
    }
}
