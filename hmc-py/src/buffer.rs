//! The memory behind a Python object, by address and length, with what keeps it alive:
//! a buffer-protocol object's `Py_buffer`, a DLPack tensor, or a raw `(addr, length)`.

use hmc_core::DeviceKind;
use pyo3::buffer::PyUntypedBuffer;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::dlpack::{self, Placement};
use crate::errors;

/// What keeps registered memory alive.
pub(crate) enum Keep {
    /// A held `Py_buffer` (released, with the object, when this drops).
    Buffer(#[allow(dead_code)] PyUntypedBuffer),
    /// A consumed DLPack tensor (its deleter runs when this drops).
    DlPack(#[allow(dead_code)] dlpack::Managed),
    /// Memory the caller vouches for, given as `(addr, length)`.
    Raw,
}

/// Memory of a Python object, held.
pub(crate) struct Held {
    pub addr: u64,
    pub len: usize,
    pub readonly: bool,
    pub placement: Placement,
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
                _keep: Keep::Buffer(buf),
            });
        }
        Err(e) if !obj.hasattr("__dlpack__")? => {
            return Err(errors::invalid(format!(
                "{} is neither a buffer-protocol object, a DLPack tensor nor an (addr, length) tuple ({e})",
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
        placement: t.placement,
        _keep: Keep::DlPack(t.keep),
    })
}
