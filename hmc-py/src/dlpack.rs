//! Consuming DLPack tensors (`obj.__dlpack__()`): the legacy `dltensor` capsule, its
//! device mapped to our device kinds, its bytes by address and length while the capsule
//! is held.

use std::ffi::{CStr, c_void};

use hmc_core::DeviceKind;
use pyo3::ffi;
use pyo3::prelude::*;

use crate::errors;

/// DLPack's `DLDevice`.
#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

/// DLPack's `DLDataType`.
#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

/// DLPack's `DLTensor`.
#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

/// DLPack's `DLManagedTensor` (the legacy, unversioned struct).
#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

const DLTENSOR: &CStr = c"dltensor";
const USED_DLTENSOR: &CStr = c"used_dltensor";

/// Where a DLPack tensor lives, in our terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Placement {
    /// Host memory (CPU, or a runtime's pinned host memory).
    Host,
    /// Device memory.
    Device(DeviceKind, u32),
}

/// Maps a DLPack device type (`DLDeviceType`) to a placement, or says why not.
pub(crate) fn placement(device_type: i32, device_id: i32) -> PyResult<Placement> {
    let ordinal = u32::try_from(device_id)
        .map_err(|_| errors::invalid(format!("DLPack device id {device_id} is negative")))?;
    Ok(match device_type {
        // kDLCPU, kDLCUDAHost (pinned host memory), kDLROCMHost.
        1 | 3 | 11 => Placement::Host,
        2 => Placement::Device(DeviceKind::CUDA, ordinal),
        10 => Placement::Device(DeviceKind::ROCM, ordinal),
        13 => {
            return Err(errors::unsupported(
                "DLPack tensors in CUDA managed memory (kDLCUDAManaged) are not supported: copy the tensor to device or host memory first",
            ));
        }
        other => {
            return Err(errors::unsupported(format!(
                "DLPack device type {other} has no HMC memory backend (supported: CPU 1, CUDA 2, CUDA host 3, ROCm 10, ROCm host 11); copy the tensor to one of those, or register its memory as (addr, length)"
            )));
        }
    })
}

/// A consumed DLPack tensor: its memory stays valid until this drops, which calls the
/// producer's deleter.
pub(crate) struct Managed {
    tensor: *mut DLManagedTensor,
    /// The renamed capsule (kept so the address stays tied to a live object).
    _capsule: Py<PyAny>,
}

// SAFETY: the pointer is only dereferenced while the GIL is held (in `consume` and in
// `drop`, which attaches); DLPack producers allow the deleter on any thread.
unsafe impl Send for Managed {}
// SAFETY: `Managed` has no `&self` methods touching the pointer.
unsafe impl Sync for Managed {}

impl Drop for Managed {
    fn drop(&mut self) {
        Python::attach(|_| {
            // SAFETY: `tensor` came from a `dltensor` capsule we renamed to
            // `used_dltensor`, which makes us responsible for calling its deleter, once.
            unsafe {
                if let Some(deleter) = (*self.tensor).deleter {
                    deleter(self.tensor);
                }
            }
        });
    }
}

/// A DLPack tensor's memory: address, length, placement, and what keeps it alive.
pub(crate) struct Tensor {
    pub addr: u64,
    pub len: usize,
    pub placement: Placement,
    pub keep: Managed,
}

/// Takes the tensor of `obj.__dlpack__()`. Only compact (C-contiguous) tensors are
/// accepted: a registration is one address range.
pub(crate) fn consume(obj: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    let capsule = obj.call_method0("__dlpack__")?;
    // SAFETY: the capsule is a live object; `PyCapsule_IsValid` checks its name.
    let valid = unsafe { ffi::PyCapsule_IsValid(capsule.as_ptr(), DLTENSOR.as_ptr()) };
    if valid != 1 {
        return Err(errors::invalid(
            "__dlpack__() did not return an unused 'dltensor' capsule; pass the tensor itself (not a capsule it already gave away)",
        ));
    }
    // SAFETY: valid capsule of that name (checked above).
    let tensor = unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), DLTENSOR.as_ptr()) }
        .cast::<DLManagedTensor>();
    if tensor.is_null() {
        return Err(PyErr::fetch(obj.py()));
    }
    // From here on the deleter is ours to call: rename first so the capsule's own
    // destructor leaves the tensor alone.
    // SAFETY: live capsule; the name is a static C string.
    if unsafe { ffi::PyCapsule_SetName(capsule.as_ptr(), USED_DLTENSOR.as_ptr()) } != 0 {
        return Err(PyErr::fetch(obj.py()));
    }
    let keep = Managed {
        tensor,
        _capsule: capsule.unbind(),
    };
    // SAFETY: the producer keeps the DLTensor and its shape/strides arrays valid until
    // the deleter runs, which `keep` does on drop.
    let t = unsafe { &(*tensor).dl_tensor };
    let placement = placement(t.device.device_type, t.device.device_id)?;
    let ndim = usize::try_from(t.ndim).unwrap_or(0);
    // SAFETY: `shape` has `ndim` elements (DLPack); none when ndim is 0.
    let shape: &[i64] = if ndim == 0 {
        &[]
    } else {
        unsafe { std::slice::from_raw_parts(t.shape, ndim) }
    };
    // SAFETY: `strides` is null (compact) or has `ndim` elements.
    let strides: Option<&[i64]> = if t.strides.is_null() || ndim == 0 {
        None
    } else {
        Some(unsafe { std::slice::from_raw_parts(t.strides, ndim) })
    };
    if let Some(strides) = strides {
        let mut want = 1i64;
        for (&dim, &stride) in shape.iter().zip(strides).rev() {
            if dim != 1 && stride != want {
                return Err(errors::invalid(format!(
                    "the DLPack tensor is not C-contiguous (shape {shape:?}, strides {strides:?}); register a contiguous copy"
                )));
            }
            want *= dim;
        }
    }
    let elems = shape
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(u64::try_from(d).ok()?));
    let bits = u64::from(t.dtype.bits) * u64::from(t.dtype.lanes);
    let len = elems
        .and_then(|n| n.checked_mul(bits))
        .map(|b| b.div_ceil(8))
        .ok_or_else(|| errors::invalid(format!("DLPack tensor shape {shape:?} is too large")))?;
    Ok(Tensor {
        addr: t.data as u64 + t.byte_offset,
        len: len as usize,
        placement,
        keep,
    })
}

/// DLPack's `DLPackVersion`.
#[repr(C)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

/// DLPack's `DLManagedTensorVersioned` (DLPack 1.0).
#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

const DLTENSOR_VERSIONED: &CStr = c"dltensor_versioned";

/// What an exported tensor keeps: the exporting object (alive while the consumer holds
/// the tensor) and what to run once the consumer is done.
struct Keepalive {
    owner: Option<Py<PyAny>>,
    release: Option<Box<dyn FnOnce() + Send>>,
}

impl Keepalive {
    fn end(mut self) {
        Python::attach(|_| drop(self.owner.take()));
        if let Some(release) = self.release.take() {
            release();
        }
    }
}

/// An exported legacy tensor; the managed struct first, so a pointer to it is a pointer
/// to the whole.
#[repr(C)]
struct Exported {
    managed: DLManagedTensor,
    shape: [i64; 1],
    keep: Keepalive,
}

/// An exported DLPack 1.0 tensor, laid out as [`Exported`].
#[repr(C)]
struct ExportedVersioned {
    managed: DLManagedTensorVersioned,
    shape: [i64; 1],
    keep: Keepalive,
}

unsafe extern "C" fn exported_deleter(m: *mut DLManagedTensor) {
    // SAFETY: `m` is the first field of a boxed `Exported` made by `export`, and DLPack
    // consumers call the deleter once.
    unsafe { Box::from_raw(m.cast::<Exported>()) }.keep.end();
}

unsafe extern "C" fn exported_versioned_deleter(m: *mut DLManagedTensorVersioned) {
    // SAFETY: as `exported_deleter`, for `ExportedVersioned`.
    unsafe { Box::from_raw(m.cast::<ExportedVersioned>()) }
        .keep
        .end();
}

/// The capsules' destructor: a tensor nobody consumed (the capsule keeps its name) is
/// deleted here; a consumed one (renamed `used_...`) is the consumer's to delete.
unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with a live capsule whose pointer is one of ours.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, DLTENSOR.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(capsule, DLTENSOR.as_ptr());
            exported_deleter(m.cast());
        } else if ffi::PyCapsule_IsValid(capsule, DLTENSOR_VERSIONED.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(capsule, DLTENSOR_VERSIONED.as_ptr());
            exported_versioned_deleter(m.cast());
        }
    }
}

fn host_bytes(addr: u64) -> DLTensor {
    DLTensor {
        data: addr as *mut c_void,
        device: DLDevice {
            device_type: 1, // kDLCPU
            device_id: 0,
        },
        ndim: 1,
        dtype: DLDataType {
            code: 1, // kDLUInt
            bits: 8,
            lanes: 1,
        },
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    }
}

/// A DLPack capsule over `len` writable host bytes at `addr`, as a 1-D `uint8` tensor:
/// DLPack 1.0 (`dltensor_versioned`) when `versioned`, the legacy `dltensor` otherwise.
/// `owner` stays alive, and `release` runs, until the consumer deletes the tensor.
pub(crate) fn export<'py>(
    py: Python<'py>,
    owner: Py<PyAny>,
    addr: u64,
    len: usize,
    versioned: bool,
    release: Box<dyn FnOnce() + Send>,
) -> PyResult<Bound<'py, PyAny>> {
    let keep = Keepalive {
        owner: Some(owner),
        release: Some(release),
    };
    let (ptr, name, undo): (*mut c_void, &CStr, Box<dyn FnOnce()>) = if versioned {
        let mut e = Box::new(ExportedVersioned {
            managed: DLManagedTensorVersioned {
                version: DLPackVersion { major: 1, minor: 0 },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(exported_versioned_deleter),
                flags: 0, // writable, not a copy
                dl_tensor: host_bytes(addr),
            },
            shape: [len as i64],
            keep,
        });
        e.managed.dl_tensor.shape = e.shape.as_mut_ptr();
        let p = Box::into_raw(e);
        // SAFETY: run only when no capsule took `p` (then nothing else owns it).
        let undo = Box::new(move || unsafe { exported_versioned_deleter(p.cast()) });
        (p.cast(), DLTENSOR_VERSIONED, undo)
    } else {
        let mut e = Box::new(Exported {
            managed: DLManagedTensor {
                dl_tensor: host_bytes(addr),
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(exported_deleter),
            },
            shape: [len as i64],
            keep,
        });
        e.managed.dl_tensor.shape = e.shape.as_mut_ptr();
        let p = Box::into_raw(e);
        // SAFETY: run only when no capsule took `p` (then nothing else owns it).
        let undo = Box::new(move || unsafe { exported_deleter(p.cast()) });
        (p.cast(), DLTENSOR, undo)
    };
    // SAFETY: `ptr` is a live export whose first field is the managed tensor; the
    // capsule's destructor deletes it unless a consumer took it.
    let capsule = unsafe { ffi::PyCapsule_New(ptr, name.as_ptr(), Some(capsule_destructor)) };
    if capsule.is_null() {
        undo();
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new reference from PyCapsule_New.
    Ok(unsafe { Bound::from_owned_ptr(py, capsule) })
}
