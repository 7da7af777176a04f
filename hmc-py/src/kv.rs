//! `hmc.kv`: the KV-cache API of [`hmc_engine::kv`] (LLM-DataDist's calls in snake_case)
//! with caches exposed to Python as buffer objects, zero-copy.

use std::collections::HashMap;
use std::ffi::c_int;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use hmc_core::AnyCommunicator;
use hmc_engine::kv::{self as rkv, DataType as RDataType};
use parking_lot::{Mutex, RwLock};
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::buffer::{self, Held};
use crate::dlpack::Placement;
use crate::engine::{Engine as PyEngine, MemType};
use crate::{errors, millis, wait};

/// A cluster's role in disaggregated serving: ``PROMPT`` (prefill, produces caches) or
/// ``DECODER`` (consumes them).
#[pyclass(module = "hmc.kv", frozen, eq, eq_int, from_py_object)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Role {
    /// Runs prefill.
    #[pyo3(name = "PROMPT")]
    Prompt,
    /// Runs decode.
    #[pyo3(name = "DECODER")]
    Decoder,
}

/// Element type of a cache's tensors (only its size matters to transfers).
#[pyclass(module = "hmc.kv", frozen, eq, eq_int, from_py_object)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DataType {
    /// 8-bit float.
    #[pyo3(name = "FP8")]
    Fp8,
    /// IEEE half.
    #[pyo3(name = "F16")]
    F16,
    /// bfloat16.
    #[pyo3(name = "BF16")]
    Bf16,
    /// IEEE single.
    #[pyo3(name = "F32")]
    F32,
    /// Signed 8-bit integer.
    #[pyo3(name = "I8")]
    I8,
    /// Unsigned 8-bit integer.
    #[pyo3(name = "U8")]
    U8,
    /// Signed 32-bit integer.
    #[pyo3(name = "I32")]
    I32,
}

impl From<DataType> for RDataType {
    fn from(d: DataType) -> Self {
        match d {
            DataType::Fp8 => RDataType::Fp8,
            DataType::F16 => RDataType::F16,
            DataType::Bf16 => RDataType::Bf16,
            DataType::F32 => RDataType::F32,
            DataType::I8 => RDataType::I8,
            DataType::U8 => RDataType::U8,
            DataType::I32 => RDataType::I32,
        }
    }
}

/// What a cache is: ``num_tensors`` tensors (2 per layer for K and V) of ``dtype`` and
/// ``shape`` each; for a paged (blocks) cache ``shape[0]`` is the block count.
#[pyclass(module = "hmc.kv", frozen, from_py_object)]
#[derive(Clone)]
pub struct CacheDesc {
    /// Tensors in the cache.
    #[pyo3(get)]
    pub num_tensors: u32,
    /// Element type.
    #[pyo3(get)]
    pub dtype: DataType,
    /// Shape of every tensor.
    #[pyo3(get)]
    pub shape: Vec<u64>,
    /// Host (the default) or device memory.
    #[pyo3(get)]
    pub placement: MemType,
    /// The device of a device cache (``"cuda:0"``...).
    #[pyo3(get)]
    pub device: Option<String>,
}

#[pymethods]
impl CacheDesc {
    #[new]
    #[pyo3(
        signature = (num_tensors, dtype, shape, placement = MemType::Host, device = None),
        text_signature = "(num_tensors, dtype, shape, placement=MemType.HOST, device=None)"
    )]
    fn new(
        num_tensors: u32,
        dtype: DataType,
        shape: Vec<u64>,
        placement: MemType,
        device: Option<String>,
    ) -> Self {
        CacheDesc {
            num_tensors,
            dtype,
            shape,
            placement,
            device,
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "CacheDesc(num_tensors={}, dtype={:?}, shape={:?}, placement={:?})",
            self.num_tensors, self.dtype, self.shape, self.placement
        )
    }
}

impl CacheDesc {
    fn to_rust(&self) -> PyResult<rkv::CacheDesc> {
        let placement = match (self.placement, &self.device) {
            (MemType::Host, None) => hmc_engine::MemType::Host,
            (MemType::Device, Some(d)) => {
                let (kind, ordinal) = buffer::parse_device(d)?;
                hmc_engine::MemType::Device { kind, ordinal }
            }
            (MemType::Device, None) => {
                return Err(errors::invalid(
                    "a device CacheDesc needs device= (cuda:0, ...)",
                ));
            }
            (MemType::Host, Some(_)) => {
                return Err(errors::invalid(
                    "device= names device memory; pass placement=MemType.DEVICE with it",
                ));
            }
        };
        Ok(rkv::CacheDesc {
            placement,
            num_tensors: self.num_tensors,
            dtype: self.dtype.into(),
            shape: self.shape.clone(),
        })
    }
}

/// A request's whole cache at a prompt cluster.
#[pyclass(module = "hmc.kv", frozen, from_py_object)]
#[derive(Clone)]
pub struct CacheKey {
    /// The cluster that holds the cache.
    #[pyo3(get)]
    pub prompt_cluster_id: u64,
    /// The request.
    #[pyo3(get)]
    pub req_id: u64,
    /// The model.
    #[pyo3(get)]
    pub model_id: u64,
    /// The prefix (0 for none).
    #[pyo3(get)]
    pub prefix_id: u64,
}

#[pymethods]
impl CacheKey {
    #[new]
    #[pyo3(signature = (prompt_cluster_id, req_id, model_id = 0, prefix_id = 0))]
    fn new(prompt_cluster_id: u64, req_id: u64, model_id: u64, prefix_id: u64) -> Self {
        CacheKey {
            prompt_cluster_id,
            req_id,
            model_id,
            prefix_id,
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "CacheKey(prompt_cluster_id={}, req_id={}, model_id={}, prefix_id={})",
            self.prompt_cluster_id, self.req_id, self.model_id, self.prefix_id
        )
    }
}

impl CacheKey {
    fn to_rust(&self) -> rkv::CacheKey {
        rkv::CacheKey {
            prompt_cluster_id: self.prompt_cluster_id,
            req_id: self.req_id,
            model_id: self.model_id,
            prefix_id: self.prefix_id,
        }
    }
}

/// A paged cache's blocks at a cluster.
#[pyclass(module = "hmc.kv", frozen, from_py_object)]
#[derive(Clone)]
pub struct BlocksCacheKey {
    /// The cluster that holds the cache.
    #[pyo3(get)]
    pub prompt_cluster_id: u64,
    /// The model.
    #[pyo3(get)]
    pub model_id: u64,
}

#[pymethods]
impl BlocksCacheKey {
    #[new]
    #[pyo3(signature = (prompt_cluster_id, model_id = 0))]
    fn new(prompt_cluster_id: u64, model_id: u64) -> Self {
        BlocksCacheKey {
            prompt_cluster_id,
            model_id,
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "BlocksCacheKey(prompt_cluster_id={}, model_id={})",
            self.prompt_cluster_id, self.model_id
        )
    }
}

impl BlocksCacheKey {
    fn to_rust(&self) -> rkv::BlocksCacheKey {
        rkv::BlocksCacheKey {
            prompt_cluster_id: self.prompt_cluster_id,
            model_id: self.model_id,
        }
    }
}

/// A cache registered with a ``DataDist``. ``tensors`` are buffer objects over its
/// memory (``numpy.frombuffer(t, dtype)``, ``memoryview(t)``), zero-copy; give the cache
/// back with ``DataDist.deallocate_cache`` once no view of it is alive.
#[pyclass(module = "hmc.kv", frozen)]
pub struct Cache {
    /// The Rust cache (taken by `deallocate_cache`).
    cache: Mutex<Option<rkv::Cache>>,
    /// Python memory the cache lives in (`register_kv_cache`), held until deallocated.
    held: Mutex<Vec<Held>>,
    tensors: Vec<Py<CacheTensor>>,
    desc: CacheDesc,
    addrs: Vec<u64>,
    id: u64,
    dd: Arc<rkv::DataDist<AnyCommunicator>>,
}

impl Drop for Cache {
    /// A cache dropped without `deallocate_cache` is deallocated here, unless a view of
    /// one of its tensors is still open: then it stays registered (leaked) rather than
    /// freed under the view.
    fn drop(&mut self) {
        let Some(c) = self.cache.get_mut().take() else {
            return;
        };
        let views: usize = self
            .tensors
            .iter()
            .map(|t| t.get().views.load(Ordering::Acquire))
            .sum();
        if views > 0 {
            tracing::warn!(
                cache = c.id(),
                views,
                "a KV cache was dropped with open views of its tensors; it stays registered"
            );
            std::mem::forget(std::mem::take(self.held.get_mut()));
            std::mem::forget(c);
            return;
        }
        for t in &self.tensors {
            t.get().live.store(false, Ordering::Release);
        }
        let dd = self.dd.clone();
        let held = std::mem::take(self.held.get_mut());
        crate::finish(async move {
            if let Err(e) = dd.deallocate_cache(c).await {
                tracing::warn!(error = %e, "deallocating a dropped KV cache failed");
            }
            drop(held);
        });
    }
}

#[pymethods]
impl Cache {
    /// The cache's id.
    #[getter]
    fn id(&self) -> u64 {
        self.id
    }

    /// Its description.
    #[getter]
    fn desc(&self) -> CacheDesc {
        self.desc.clone()
    }

    /// Where each tensor starts.
    #[getter]
    fn tensor_addrs(&self) -> Vec<u64> {
        self.addrs.clone()
    }

    /// One buffer object per tensor (host caches), over the cache's memory in place.
    #[getter]
    fn tensors<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.tensors.iter().map(|t| t.clone_ref(py)))
    }

    fn __repr__(&self) -> String {
        format!("Cache(id={}, desc={})", self.id, self.desc.__repr__())
    }
}

/// One tensor of a host cache as a writable buffer object (format ``B``, one dimension
/// of bytes). Views keep the tensor object alive; the cache refuses deallocation while
/// any view is open.
#[pyclass(module = "hmc.kv", frozen)]
pub struct CacheTensor {
    addr: u64,
    len: usize,
    /// False once the cache is deallocated.
    live: Arc<std::sync::atomic::AtomicBool>,
    /// Open buffer views.
    views: Arc<AtomicUsize>,
    /// Keeps the DataDist (which owns allocated caches' memory) alive while this tensor
    /// object, and so any view of it, exists.
    _owner: Arc<rkv::DataDist<AnyCommunicator>>,
}

#[pymethods]
impl CacheTensor {
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let t = slf.get();
        // SAFETY: `view` is the interpreter's; the range is the tensor's, which stays
        // allocated while a view is open (deallocation refuses while `views` > 0).
        unsafe {
            buffer::export_bytes(
                slf.as_any(),
                view,
                flags,
                t.addr,
                t.len,
                &t.live,
                &t.views,
                "the cache was deallocated; its tensors have no memory any more",
            )
        }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        self.views.fetch_sub(1, Ordering::AcqRel);
    }

    /// A DLPack capsule over the tensor (1-D ``uint8`` on the CPU, zero-copy), for
    /// ``numpy.from_dlpack`` and other DLPack consumers; counts as an open view until the
    /// consumer lets go.
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        slf: &Bound<'py, Self>,
        stream: Option<Py<PyAny>>,
        max_version: Option<Py<PyAny>>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = stream;
        // DLPack 1.0 when the consumer speaks it (numpy >= 2 asks with max_version):
        // only the versioned struct can say "writable".
        let versioned = match max_version {
            Some(v) => v
                .bind(slf.py())
                .extract::<(u32, u32)>()
                .is_ok_and(|(major, _)| major >= 1),
            None => false,
        };
        let t = slf.get();
        if !t.live.load(Ordering::Acquire) {
            return Err(PyBufferError::new_err(
                "the cache was deallocated; its tensors have no memory any more",
            ));
        }
        if dl_device.is_some_and(|d| d != (1, 0)) || copy == Some(true) {
            return Err(PyBufferError::new_err(
                "a cache tensor is exported in place on the CPU only (dl_device=(1, 0), copy=False or None)",
            ));
        }
        t.views.fetch_add(1, Ordering::AcqRel);
        let views = t.views.clone();
        crate::dlpack::export(
            slf.py(),
            slf.clone().into_any().unbind(),
            t.addr,
            t.len,
            versioned,
            Box::new(move || {
                views.fetch_sub(1, Ordering::AcqRel);
            }),
        )
    }

    /// ``(1, 0)``: DLPack's CPU device.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (1, 0)
    }

    /// Bytes in the tensor.
    fn __len__(&self) -> usize {
        self.len
    }

    /// Start address of the tensor.
    #[getter]
    fn addr(&self) -> u64 {
        self.addr
    }
}

/// A KV-cache service for one cluster (LLM-DataDist's ``LLMDataDist``): caches by key,
/// pulled and pushed whole or by block lists between linked clusters over an engine.
/// ``DataDist(cluster_id, role)``, then ``initialize(local, options)`` (or pass an
/// initialized ``engine=``).
#[pyclass(module = "hmc.kv", frozen)]
pub struct DataDist {
    cluster_id: u64,
    role: Role,
    dd: RwLock<Option<Arc<rkv::DataDist<AnyCommunicator>>>>,
    /// The engine made by `initialize` (finalized with this DataDist).
    own: Mutex<Option<Py<PyEngine>>>,
}

fn layers(l: Option<(u32, u32)>) -> Option<Range<u32>> {
    l.map(|(a, b)| a..b)
}

impl DataDist {
    fn dd(&self) -> PyResult<Arc<rkv::DataDist<AnyCommunicator>>> {
        self.dd.read().clone().ok_or_else(|| {
            errors::state(
                "the DataDist is not initialized (or was finalized); call initialize(local) first",
            )
        })
    }

    fn cache(c: &Cache) -> PyResult<parking_lot::MappedMutexGuard<'_, rkv::Cache>> {
        parking_lot::MutexGuard::try_map(c.cache.lock(), |o| o.as_mut())
            .map_err(|_| errors::state("the cache was deallocated"))
    }

    fn wrap(
        py: Python<'_>,
        dd: Arc<rkv::DataDist<AnyCommunicator>>,
        cache: rkv::Cache,
        desc: CacheDesc,
        held: Vec<Held>,
    ) -> PyResult<Cache> {
        let live = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let bytes = cache.desc().shape.iter().product::<u64>() * cache.desc().dtype.size();
        let host = cache.desc().placement == hmc_engine::MemType::Host;
        let tensors = if host {
            cache
                .tensor_addrs()
                .iter()
                .map(|&a| {
                    Py::new(
                        py,
                        CacheTensor {
                            addr: a,
                            len: bytes as usize,
                            live: live.clone(),
                            views: Arc::new(AtomicUsize::new(0)),
                            _owner: dd.clone(),
                        },
                    )
                })
                .collect::<PyResult<Vec<_>>>()?
        } else {
            Vec::new()
        };
        Ok(Cache {
            id: cache.id(),
            addrs: cache.tensor_addrs().to_vec(),
            cache: Mutex::new(Some(cache)),
            held: Mutex::new(held),
            tensors,
            desc,
            dd,
        })
    }
}

#[pymethods]
impl DataDist {
    #[new]
    #[pyo3(signature = (cluster_id, role, engine = None))]
    fn new(cluster_id: u64, role: Role, engine: Option<&Bound<'_, PyEngine>>) -> PyResult<Self> {
        let dd = match engine {
            Some(e) => Some(Arc::new(rkv::DataDist::new(
                e.get().rust()?,
                cluster_id,
                rust_role(role),
            ))),
            None => None,
        };
        Ok(DataDist {
            cluster_id,
            role,
            dd: RwLock::new(dd),
            own: Mutex::new(None),
        })
    }

    /// Starts an engine of its own at ``local`` (as ``Engine.initialize``, ``metadata`` and
    /// ``name`` included).
    #[pyo3(signature = (local, options = None, *, metadata = None, name = None))]
    fn initialize(
        &self,
        py: Python<'_>,
        local: &str,
        options: Option<HashMap<String, String>>,
        metadata: Option<String>,
        name: Option<String>,
    ) -> PyResult<()> {
        let options = Some(crate::engine::with_metadata(options, metadata, name)?);
        if self.dd.read().is_some() {
            return Err(errors::state("the DataDist is already initialized"));
        }
        let e = Py::new(py, PyEngine::new_py())?;
        e.get().initialize_py(py, local, options)?;
        let engine = e.get().rust()?;
        *self.dd.write() = Some(Arc::new(rkv::DataDist::new(
            engine,
            self.cluster_id,
            rust_role(self.role),
        )));
        *self.own.lock() = Some(e);
        Ok(())
    }

    /// The engine's address, for peers' ``link_clusters``.
    #[getter]
    fn local_address(&self) -> PyResult<String> {
        Ok(self.dd()?.engine().name().to_string())
    }

    /// This cluster's id.
    #[getter]
    fn cluster_id(&self) -> u64 {
        self.cluster_id
    }

    /// This cluster's role.
    #[getter]
    fn role(&self) -> Role {
        self.role
    }

    /// Links to clusters given as ``[(cluster_id, address), ...]``; returns one entry
    /// per cluster, ``None`` or the exception that link failed with (the others stay).
    #[pyo3(signature = (clusters, timeout_ms = 1000))]
    fn link_clusters(
        &self,
        py: Python<'_>,
        clusters: Vec<(u64, String)>,
        timeout_ms: u64,
    ) -> PyResult<Vec<Option<Py<PyAny>>>> {
        let dd = self.dd()?;
        let out = wait(py, async move {
            dd.link_clusters(&clusters, millis(timeout_ms)).await
        })?;
        Ok(out
            .into_iter()
            .map(|r| r.err().map(|e| errors::engine(e).into_value(py).into_any()))
            .collect())
    }

    /// Unlinks clusters; one entry per cluster as for ``link_clusters``.
    fn unlink_clusters(&self, py: Python<'_>, ids: Vec<u64>) -> PyResult<Vec<Option<Py<PyAny>>>> {
        let dd = self.dd()?;
        let out = wait(py, async move { dd.unlink_clusters(&ids).await })?;
        Ok(out
            .into_iter()
            .map(|r| r.err().map(|e| errors::engine(e).into_value(py).into_any()))
            .collect())
    }

    /// Linked clusters as ``[(cluster_id, address), ...]``.
    fn links(&self) -> PyResult<Vec<(u64, String)>> {
        Ok(self.dd()?.links())
    }

    /// Allocates a zeroed host cache of ``desc``, registers it and publishes it under
    /// ``keys`` (``CacheKey``) and ``blocks_key`` (``BlocksCacheKey``).
    #[pyo3(signature = (desc, keys = Vec::new(), blocks_key = None))]
    fn allocate_cache(
        &self,
        py: Python<'_>,
        desc: CacheDesc,
        keys: Vec<CacheKey>,
        blocks_key: Option<BlocksCacheKey>,
    ) -> PyResult<Cache> {
        let dd = self.dd()?;
        let rdesc = desc.to_rust()?;
        let keys: Vec<rkv::CacheKey> = keys.iter().map(CacheKey::to_rust).collect();
        let bk = blocks_key.map(|k| k.to_rust());
        let d = dd.clone();
        let c = wait(py, async move { d.allocate_cache(rdesc, &keys, bk).await })?
            .map_err(errors::engine)?;
        Self::wrap(py, dd, c, desc, Vec::new())
    }

    /// Registers a cache in memory you own, one object per tensor (buffer-protocol
    /// objects such as numpy arrays, DLPack tensors, or ``(addr, length)``), in place,
    /// and publishes it under ``keys`` and ``blocks_key``. The objects are held until
    /// ``deallocate_cache``.
    #[pyo3(signature = (desc, tensors, keys = Vec::new(), blocks_key = None))]
    fn register_kv_cache(
        &self,
        py: Python<'_>,
        desc: CacheDesc,
        tensors: Vec<Bound<'_, PyAny>>,
        keys: Vec<CacheKey>,
        blocks_key: Option<BlocksCacheKey>,
    ) -> PyResult<Cache> {
        let dd = self.dd()?;
        let rdesc = desc.to_rust()?;
        let device = match rdesc.placement {
            hmc_engine::MemType::Device { kind, ordinal } => Some((kind, ordinal)),
            hmc_engine::MemType::Host => None,
        };
        let mut held = Vec::with_capacity(tensors.len());
        for t in &tensors {
            let h = buffer::hold(
                t,
                if t.cast::<PyTuple>().is_ok() {
                    device
                } else {
                    None
                },
            )?;
            let want = match device {
                Some((k, o)) => Placement::Device(k, o),
                None => Placement::Host,
            };
            if h.placement != want {
                return Err(errors::invalid(format!(
                    "a tensor lives on {:?} but the CacheDesc says {want:?}",
                    h.placement
                )));
            }
            if h.readonly {
                return Err(errors::invalid(
                    "a KV cache tensor is read-only; peers write caches, so register writable arrays",
                ));
            }
            held.push(h);
        }
        let addrs: Vec<u64> = held.iter().map(|h| h.addr).collect();
        let need = desc.shape.iter().product::<u64>() * RDataType::from(desc.dtype).size();
        if let Some(h) = held.iter().find(|h| (h.len as u64) < need) {
            return Err(errors::invalid(format!(
                "a tensor of {} bytes at {:#x} is smaller than the CacheDesc's {need} bytes per tensor",
                h.len, h.addr
            )));
        }
        let keys: Vec<rkv::CacheKey> = keys.iter().map(CacheKey::to_rust).collect();
        let bk = blocks_key.map(|k| k.to_rust());
        // SAFETY: `held` keeps every tensor alive; it moves into the returned Cache and is
        // released only after `deallocate_cache` has deregistered the tensors.
        // Device caches are registered with their backend, so that peers reach them (over
        // tcp through its pinned host chunks); each producer's stream is synchronised once
        // first (see `Engine.register_mem`).
        let memory = match device {
            Some((kind, ordinal)) => {
                let opened = crate::devices::open(kind, ordinal)?;
                for h in &held {
                    if let Some(stream) = h.stream {
                        // SAFETY: the stream came from the tensor's own export.
                        unsafe { opened.synchronize(stream) }?;
                    }
                }
                Some(opened.memory)
            }
            None => None,
        };
        let d = dd.clone();
        let c = wait(py, async move {
            match memory {
                // SAFETY: as above; the tensors are on the backend's device (checked
                // against the CacheDesc's placement).
                Some(m) => unsafe { d.register_device_kv_cache(rdesc, addrs, &keys, bk, m).await },
                // SAFETY: as above.
                None => unsafe { d.register_kv_cache(rdesc, addrs, &keys, bk).await },
            }
        })?
        .map_err(errors::engine)?;
        Self::wrap(py, dd, c, desc, held)
    }

    /// Unpublishes and deregisters a cache (waiting for transfers using it), then frees
    /// it (``allocate_cache``) or lets go of its objects (``register_kv_cache``). Raises
    /// ``StateError`` while a buffer view of one of its tensors is still open.
    fn deallocate_cache(&self, py: Python<'_>, cache: &Bound<'_, Cache>) -> PyResult<()> {
        let dd = self.dd()?;
        let c = cache.get();
        for t in &c.tensors {
            let n = t.get().views.load(Ordering::Acquire);
            if n > 0 {
                return Err(errors::state(format!(
                    "{n} buffer view(s) of this cache's tensors are still open (numpy arrays, memoryviews); delete them before deallocate_cache"
                )));
            }
        }
        let rc = c
            .cache
            .lock()
            .take()
            .ok_or_else(|| errors::state("the cache was already deallocated"))?;
        for t in &c.tensors {
            t.get().live.store(false, Ordering::Release);
        }
        wait(py, async move { dd.deallocate_cache(rc).await })?.map_err(errors::engine)?;
        c.held.lock().clear();
        Ok(())
    }

    /// Pulls the whole cache ``src`` (at its prompt cluster) into ``dst``.
    #[pyo3(signature = (src, dst, timeout_ms = 1000))]
    fn pull_kv_cache(
        &self,
        py: Python<'_>,
        src: CacheKey,
        dst: &Bound<'_, Cache>,
        timeout_ms: u64,
    ) -> PyResult<()> {
        let dd = self.dd()?;
        let dst = Self::cache(dst.get())?;
        let src = src.to_rust();
        wait(py, dd.pull_kv_cache(&src, &dst, millis(timeout_ms)))?.map_err(errors::engine)
    }

    /// Pushes the whole cache ``src`` into the cache published under ``dst`` at
    /// ``dst_cluster``.
    #[pyo3(signature = (src, dst_cluster, dst, timeout_ms = 1000))]
    fn push_kv_cache(
        &self,
        py: Python<'_>,
        src: &Bound<'_, Cache>,
        dst_cluster: u64,
        dst: CacheKey,
        timeout_ms: u64,
    ) -> PyResult<()> {
        let dd = self.dd()?;
        let src = Self::cache(src.get())?;
        let dst = dst.to_rust();
        wait(
            py,
            dd.push_kv_cache(&src, dst_cluster, &dst, millis(timeout_ms)),
        )?
        .map_err(errors::engine)
    }

    /// Pulls blocks of the paged cache ``src`` (at its cluster) into blocks of ``dst``:
    /// ``src_blocks[i]`` into ``dst_blocks[i]``, for the tensors of ``layers``
    /// (``(start, end)``, ``tensors_per_layer`` tensors each; all when ``None``).
    #[pyo3(signature = (src, dst, src_blocks, dst_blocks, layers = None, tensors_per_layer = 2, timeout_ms = 1000))]
    #[allow(clippy::too_many_arguments)]
    fn pull_kv_blocks(
        &self,
        py: Python<'_>,
        src: BlocksCacheKey,
        dst: &Bound<'_, Cache>,
        src_blocks: Vec<u64>,
        dst_blocks: Vec<u64>,
        layers: Option<(u32, u32)>,
        tensors_per_layer: u32,
        timeout_ms: u64,
    ) -> PyResult<()> {
        let dd = self.dd()?;
        let dst = Self::cache(dst.get())?;
        let src = src.to_rust();
        wait(
            py,
            dd.pull_kv_blocks(
                &src,
                &dst,
                &src_blocks,
                &dst_blocks,
                self::layers(layers),
                tensors_per_layer,
                millis(timeout_ms),
            ),
        )?
        .map_err(errors::engine)
    }

    /// Pushes blocks of ``src`` into blocks of the paged cache published under ``dst``
    /// at ``dst_cluster`` (arguments as ``pull_kv_blocks``).
    #[pyo3(signature = (src, dst_cluster, dst, src_blocks, dst_blocks, layers = None, tensors_per_layer = 2, timeout_ms = 1000))]
    #[allow(clippy::too_many_arguments)]
    fn push_kv_blocks(
        &self,
        py: Python<'_>,
        src: &Bound<'_, Cache>,
        dst_cluster: u64,
        dst: BlocksCacheKey,
        src_blocks: Vec<u64>,
        dst_blocks: Vec<u64>,
        layers: Option<(u32, u32)>,
        tensors_per_layer: u32,
        timeout_ms: u64,
    ) -> PyResult<()> {
        let dd = self.dd()?;
        let src = Self::cache(src.get())?;
        let dst = dst.to_rust();
        wait(
            py,
            dd.push_kv_blocks(
                &src,
                dst_cluster,
                &dst,
                &src_blocks,
                &dst_blocks,
                self::layers(layers),
                tensors_per_layer,
                millis(timeout_ms),
            ),
        )?
        .map_err(errors::engine)
    }

    /// Copies blocks within one local host cache: ``src_blocks[i]`` to
    /// ``dst_blocks[i]`` in every tensor.
    fn copy_kv_blocks(
        &self,
        cache: &Bound<'_, Cache>,
        src_blocks: Vec<u64>,
        dst_blocks: Vec<u64>,
    ) -> PyResult<()> {
        let dd = self.dd()?;
        let c = Self::cache(cache.get())?;
        dd.copy_kv_blocks(&c, &src_blocks, &dst_blocks)
            .map_err(errors::engine)
    }

    /// Finalizes the engine this DataDist started (an engine passed in stays yours).
    fn finalize(&self, py: Python<'_>) -> PyResult<()> {
        self.dd.write().take();
        if let Some(e) = self.own.lock().take() {
            e.get().finalize_py(py)?;
        }
        Ok(())
    }

    /// The DataDist itself (``with DataDist(...) as dd:``).
    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Finalizes the DataDist; exceptions propagate.
    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.finalize(py)?;
        Ok(false)
    }
}

fn rust_role(r: Role) -> rkv::Role {
    match r {
        Role::Prompt => rkv::Role::Prompt,
        Role::Decoder => rkv::Role::Decoder,
    }
}

/// Adds the KV classes to the module.
pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<DataDist>()?;
    m.add_class::<Role>()?;
    m.add_class::<DataType>()?;
    m.add_class::<CacheDesc>()?;
    m.add_class::<CacheKey>()?;
    m.add_class::<BlocksCacheKey>()?;
    m.add_class::<Cache>()?;
    m.add_class::<CacheTensor>()?;
    Ok(())
}
