//! The memory behind a Python object, by address and length, with what keeps it alive:
//! a buffer-protocol object's `Py_buffer`, a DLPack tensor, an object with
//! `__cuda_array_interface__` (Numba, CuPy, PyTorch), or a raw `(addr, length)`.

use hmc_core::DeviceKind;
use pyo3::buffer::PyUntypedBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::dlpack::{self, Placement};
use crate::errors;

/// What keeps registered memory alive.
pub(crate) enum Keep {
    /// A held `Py_buffer` (released, with the object, when this drops).
    Buffer(#[allow(dead_code)] PyUntypedBuffer),
    /// A consumed DLPack tensor (its deleter runs when this drops).
    DlPack(#[allow(dead_code)] dlpack::Managed),
    /// The object whose `__cuda_array_interface__` gave the range (the interface's rule:
    /// the memory lives as long as the object).
    Object(#[allow(dead_code)] Py<PyAny>),
    /// Memory the caller vouches for, given as `(addr, length)`.
    Raw,
}

/// Memory of a Python object, held.
pub(crate) struct Held {
    pub addr: u64,
    pub len: usize,
    pub readonly: bool,
    pub placement: Placement,
    /// The CUDA stream the producer writes the memory on, to synchronise before this
    /// process's copies read it (`1` is the legacy default stream); `None`: nothing to wait.
    pub stream: Option<usize>,
    pub _keep: Keep,
}

/// Parses `cuda:0`, `rocm`, `ascend:1`, ... as a device kind and ordinal.
pub(crate) fn parse_device(s: &str) -> PyResult<(DeviceKind, u32)> {
    let (name, ordinal) = s.split_once(':').unwrap_or((s, "0"));
    let kind = match name {
        "cuda" => DeviceKind::CUDA,
        "rocm" | "hip" => DeviceKind::ROCM,
        "mlu" => DeviceKind::MLU,
        "musa" => DeviceKind::MUSA,
        "ascend" | "npu" => DeviceKind::ASCEND,
        _ => {
            return Err(errors::invalid(format!(
                "device `{s}`: use cuda, rocm, mlu, musa or ascend, with an optional :ordinal (cuda:1)"
            )));
        }
    };
    let ordinal = ordinal
        .parse()
        .map_err(|_| errors::invalid(format!("device `{s}`: the ordinal must be a number")))?;
    Ok((kind, ordinal))
}

/// The memory of `obj`: a 2-tuple `(addr, length)`, a buffer-protocol object (bytearray,
/// memoryview, numpy array, ...), or an object with `__dlpack__`. `device` places a raw
/// range on a device; buffers are host memory and DLPack tensors say where they live.
pub(crate) fn hold(obj: &Bound<'_, PyAny>, device: Option<(DeviceKind, u32)>) -> PyResult<Held> {
    if let Ok(t) = obj.cast::<PyTuple>() {
        let (addr, len): (u64, usize) = t
            .extract()
            .map_err(|_| errors::invalid("a raw range is a tuple (addr: int, length: int)"))?;
        return Ok(Held {
            addr,
            len,
            readonly: false,
            placement: device.map_or(Placement::Host, |(k, o)| Placement::Device(k, o)),
            stream: None,
            _keep: Keep::Raw,
        });
    }
    match PyUntypedBuffer::get(obj) {
        Ok(buf) => {
            if device.is_some() {
                return Err(errors::invalid(
                    "a buffer-protocol object is host memory; pass device tensors through DLPack, or device memory as (addr, length) with device=",
                ));
            }
            if !buf.is_c_contiguous() && !buf.is_fortran_contiguous() {
                return Err(errors::invalid(
                    "the buffer is not contiguous; register a contiguous array (numpy.ascontiguousarray) or its base",
                ));
            }
            return Ok(Held {
                addr: buf.buf_ptr() as u64,
                len: buf.len_bytes(),
                readonly: buf.readonly(),
                placement: Placement::Host,
                stream: None,
                _keep: Keep::Buffer(buf),
            });
        }
        Err(_) if !obj.hasattr("__dlpack__")? && obj.hasattr("__cuda_array_interface__")? => {
            return cuda_array(obj, device);
        }
        Err(e) if !obj.hasattr("__dlpack__")? => {
            return Err(errors::invalid(format!(
                "{} is neither a buffer-protocol object, a DLPack tensor, a __cuda_array_interface__ object nor an (addr, length) tuple ({e})",
                obj.get_type().name()?
            )));
        }
        Err(_) => {}
    }
    let t = dlpack::consume(obj)?;
    if device.is_some_and(|d| Placement::Device(d.0, d.1) != t.placement) {
        return Err(errors::invalid(format!(
            "device= says {device:?} but the DLPack tensor lives on {:?}; leave device= out for DLPack tensors",
            t.placement
        )));
    }
    Ok(Held {
        addr: t.addr,
        len: t.len,
        readonly: false,
        // `__dlpack__()` without a stream asks the producer to order its writes before the
        // default stream: CUDA's legacy one (1), ROCm's (0).
        stream: match t.placement {
            Placement::Device(k, _) if k == DeviceKind::CUDA => Some(1),
            Placement::Device(k, _) if k == DeviceKind::ROCM => Some(0),
            _ => None,
        },
        placement: t.placement,
        _keep: Keep::DlPack(t.keep),
    })
}

/// The memory of an object with `__cuda_array_interface__` (version 2 or 3): `data`'s
/// pointer and `shape` by `typestr`'s item size, C-contiguous only. The interface names no
/// device: `device=` does, else the object's own `device.index` (PyTorch) or `device.id`
/// (CuPy), else device 0.
fn cuda_array(obj: &Bound<'_, PyAny>, device: Option<(DeviceKind, u32)>) -> PyResult<Held> {
    let bad = |what: &str| {
        errors::invalid(format!(
            "__cuda_array_interface__: {what} (see the interface's specification, version 3)"
        ))
    };
    let cai = obj.getattr("__cuda_array_interface__")?;
    let cai = cai
        .cast::<PyDict>()
        .map_err(|_| bad("the attribute is not a dict"))?;
    let get = |key: &str| -> PyResult<Bound<'_, PyAny>> {
        cai.get_item(key)?
            .ok_or_else(|| bad(&format!("no `{key}` entry")))
    };
    let (ptr, readonly): (usize, bool) = get("data")?
        .extract()
        .map_err(|_| bad("`data` must be (pointer: int, read_only: bool)"))?;
    let shape: Vec<u64> = get("shape")?
        .extract()
        .map_err(|_| bad("`shape` must be a tuple of non-negative ints"))?;
    let typestr: String = get("typestr")?
        .extract()
        .map_err(|_| bad("`typestr` must be a string such as '<f4'"))?;
    let item: u64 = typestr
        .get(2..)
        .and_then(|n| n.parse().ok())
        .filter(|&n| n > 0)
        .ok_or_else(|| bad(&format!("typestr {typestr:?} has no item size")))?;
    if let Some(strides) = cai.get_item("strides")?.filter(|s| !s.is_none()) {
        let strides: Vec<i64> = strides
            .extract()
            .map_err(|_| bad("`strides` must be None or a tuple of ints"))?;
        let mut want = item as i64;
        for (&dim, &stride) in shape.iter().zip(&strides).rev() {
            if dim != 1 && stride != want {
                return Err(errors::invalid(format!(
                    "the __cuda_array_interface__ array is not C-contiguous (shape {shape:?}, strides {strides:?}); register a contiguous copy"
                )));
            }
            want *= dim as i64;
        }
    }
    if readonly {
        return Err(errors::invalid(
            "the __cuda_array_interface__ array is read-only; device regions are registered for READ and WRITE, so register a writable array",
        ));
    }
    let len = shape
        .iter()
        .try_fold(item, |a, &d| a.checked_mul(d))
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| bad(&format!("shape {shape:?} is too large")))?;
    // Version 3: an int names the stream to synchronise on (1 legacy default, 2
    // per-thread default, else a CUstream); absent or None, nothing to wait for.
    let stream = match cai.get_item("stream")? {
        Some(s) if !s.is_none() => {
            let s: usize = s
                .extract()
                .map_err(|_| bad("`stream` must be None or an int"))?;
            if s == 0 {
                return Err(bad(
                    "`stream` 0 is disallowed (use 1 for the legacy default stream)",
                ));
            }
            Some(s)
        }
        _ => None,
    };
    let ordinal = match device {
        Some((kind, _)) if kind != DeviceKind::CUDA => {
            return Err(errors::invalid(
                "__cuda_array_interface__ memory is CUDA memory; pass device='cuda:N' or leave device= out",
            ));
        }
        Some((_, ordinal)) => ordinal,
        None => object_ordinal(obj)?.unwrap_or(0),
    };
    Ok(Held {
        addr: ptr as u64,
        len,
        readonly: false,
        placement: Placement::Device(DeviceKind::CUDA, ordinal),
        stream,
        _keep: Keep::Object(obj.clone().unbind()),
    })
}

/// The CUDA ordinal an array object says it lives on: PyTorch's `device.index`, CuPy's
/// `device.id`.
fn object_ordinal(obj: &Bound<'_, PyAny>) -> PyResult<Option<u32>> {
    let Ok(device) = obj.getattr("device") else {
        return Ok(None);
    };
    for attr in ["index", "id"] {
        if let Ok(v) = device.getattr(attr)
            && let Ok(n) = v.extract::<u32>()
        {
            return Ok(Some(n));
        }
    }
    Ok(None)
}

/// Whether memory the library owns and lends to Python (a host cache's tensor, an
/// ``Engine.alloc_mem`` block) is still there, and how many buffer views of it are open:
/// its owner refuses to free it while any is.
pub(crate) struct ViewGate {
    /// False once the memory is freed.
    pub live: std::sync::atomic::AtomicBool,
    /// Open buffer views.
    pub views: std::sync::atomic::AtomicUsize,
}

impl ViewGate {
    /// A gate over live memory.
    pub(crate) fn live() -> ViewGate {
        ViewGate {
            live: std::sync::atomic::AtomicBool::new(true),
            views: Default::default(),
        }
    }

    /// Open views now.
    pub(crate) fn open_views(&self) -> usize {
        self.views.load(std::sync::atomic::Ordering::Acquire)
    }

    /// [`export_bytes`] under this gate.
    ///
    /// # Safety
    /// As for [`export_bytes`].
    pub(crate) unsafe fn export(
        &self,
        exporter: &Bound<'_, PyAny>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: std::ffi::c_int,
        addr: u64,
        len: usize,
        gone: &'static str,
    ) -> PyResult<()> {
        // SAFETY: forwarded contract.
        unsafe {
            export_bytes(
                exporter,
                view,
                flags,
                addr,
                len,
                &self.live,
                &self.views,
                gone,
            )
        }
    }

    /// One view closed.
    pub(crate) fn release(&self) {
        self.views.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Fills `view` with the `len` writable bytes at `addr` (format ``B``, one dimension),
/// exported by `exporter`, and counts it in `views` until the exporter's
/// `__releasebuffer__` takes it off. `gone` is the error once `live` is false (freed).
///
/// # Safety
/// `view` is the Py_buffer the interpreter passed to `__getbuffer__`; `addr..addr+len`
/// stays allocated while `live` holds and a view is open (the owner refuses to free it
/// while `views` > 0).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn export_bytes(
    exporter: &Bound<'_, PyAny>,
    view: *mut pyo3::ffi::Py_buffer,
    flags: std::ffi::c_int,
    addr: u64,
    len: usize,
    live: &std::sync::atomic::AtomicBool,
    views: &std::sync::atomic::AtomicUsize,
    gone: &'static str,
) -> PyResult<()> {
    use std::sync::atomic::Ordering;
    if !live.load(Ordering::Acquire) {
        return Err(pyo3::exceptions::PyBufferError::new_err(gone));
    }
    views.fetch_add(1, Ordering::AcqRel);
    // SAFETY: `view` is the caller's Py_buffer; the range stays allocated while a view is
    // open (the caller's contract).
    let r = unsafe {
        pyo3::ffi::PyBuffer_FillInfo(
            view,
            exporter.as_ptr(),
            addr as *mut std::ffi::c_void,
            len as pyo3::ffi::Py_ssize_t,
            0,
            flags,
        )
    };
    if r != 0 {
        views.fetch_sub(1, Ordering::AcqRel);
        return Err(PyErr::fetch(exporter.py()));
    }
    Ok(())
}
