//! The device backends behind Python device memory: one memory backend per (kind,
//! ordinal), opened on the first registration of that device and kept for the process, so
//! every registration of a device shares its context and copy stream. The vendor library
//! is found as the backend crate finds it (`libcuda` by cudarc's loader, `HMC_HIP_LIB`,
//! ...); a missing one is `hmc.UnavailableError` saying which.

use std::collections::HashMap;
use std::sync::OnceLock;

use hmc_backend_cuda::CudaMemory;
use hmc_core::{AnyMemory, DeviceKind};
use parking_lot::Mutex;
use pyo3::PyResult;

use crate::errors;

/// An opened device: its memory backend, and the CUDA handle for stream synchronisation.
#[derive(Clone)]
pub(crate) struct Opened {
    pub(crate) memory: AnyMemory,
    cuda: Option<CudaMemory>,
    rocm: Option<hmc_backend_rocm::RocmMemory>,
}

static OPEN: OnceLock<Mutex<HashMap<(DeviceKind, u32), Opened>>> = OnceLock::new();

/// The backend of device `ordinal` of `kind`, opened on first use.
pub(crate) fn open(kind: DeviceKind, ordinal: u32) -> PyResult<Opened> {
    let mut open = OPEN.get_or_init(Default::default).lock();
    if let Some(o) = open.get(&(kind, ordinal)) {
        return Ok(o.clone());
    }
    let core = |e: hmc_core::Error| errors::engine(e.into());
    let opened = if kind == DeviceKind::CUDA {
        let m = CudaMemory::new(ordinal).map_err(core)?;
        Opened {
            memory: AnyMemory::new(m.clone()),
            cuda: Some(m),
            rocm: None,
        }
    } else if kind == DeviceKind::ROCM {
        let m = hmc_backend_rocm::RocmMemory::new(ordinal).map_err(core)?;
        Opened {
            memory: AnyMemory::new(m.clone()),
            cuda: None,
            rocm: Some(m),
        }
    } else {
        let memory = if kind == DeviceKind::MLU {
            AnyMemory::new(hmc_backend_mlu::MluMemory::new(ordinal).map_err(core)?)
        } else if kind == DeviceKind::MUSA {
            AnyMemory::new(hmc_backend_musa::MusaMemory::new(ordinal).map_err(core)?)
        } else if kind == DeviceKind::ASCEND {
            AnyMemory::new(hmc_backend_ascend::AscendMemory::new(ordinal).map_err(core)?)
        } else {
            return Err(errors::unsupported(format!(
                "no device backend for {kind:?} memory; use cuda, rocm, mlu, musa or ascend"
            )));
        };
        Opened {
            memory,
            cuda: None,
            rocm: None,
        }
    };
    tracing::debug!(
        ?kind,
        ordinal,
        "device backend opened for Python registrations"
    );
    open.insert((kind, ordinal), opened.clone());
    Ok(opened)
}

impl Opened {
    /// Waits for the work queued on `stream` (a producer's CUDA stream, or the default
    /// stream handles 0/1/2), so that this backend's copies, on a stream of their own, see
    /// what the producer wrote. ROCm: the whole device (`hipDeviceSynchronize`; DLPack's
    /// producer orders its writes before the default stream, and a peer copying by IPC
    /// from another process is ordered by nothing else). Other kinds carry no stream here:
    /// nothing to wait.
    ///
    /// # Safety
    /// `stream` must be a default stream handle or a live stream of the device's primary
    /// context (what `__cuda_array_interface__` and DLPack producers hand out).
    pub(crate) unsafe fn synchronize(&self, stream: usize) -> PyResult<()> {
        match &self.cuda {
            // SAFETY: forwarded contract.
            Some(m) => {
                unsafe { m.synchronize_stream(stream) }.map_err(|e| errors::engine(e.into()))
            }
            None => match &self.rocm {
                Some(m) => m
                    .synchronize()
                    .map(|_| ())
                    .map_err(|e| errors::engine(e.into())),
                None => Ok(()),
            },
        }
    }
}
