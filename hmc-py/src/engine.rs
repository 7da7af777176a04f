//! `hmc.Engine` and its types: HIXL's calls in snake_case over
//! [`hmc_engine::Engine`], with Python objects registered in place.

use std::collections::HashMap;
use std::sync::Arc;

use hmc_core::AnyCommunicator;
use hmc_engine::{EngineConfig, EngineError, MemDesc};
use parking_lot::{Mutex, RwLock};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

use crate::buffer::{self, Held, ViewGate};
use crate::dlpack::Placement;
use crate::{errors, millis, runtime, wait};

type RustEngine = hmc_engine::Engine<AnyCommunicator>;

/// Where memory lives: ``MemType.HOST`` (host memory, the default) or ``MemType.DEVICE``
/// (device memory: a DLPack device tensor, or ``(addr, length)`` with ``device=``).
#[pyclass(module = "hmc", frozen, eq, eq_int, from_py_object)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum MemType {
    /// Host memory.
    #[pyo3(name = "HOST")]
    Host,
    /// Device memory.
    #[pyo3(name = "DEVICE")]
    Device,
}

/// The direction of a transfer seen from the caller: ``READ`` moves remote memory into
/// local memory, ``WRITE`` local memory into remote memory.
#[pyclass(module = "hmc", frozen, eq, eq_int, from_py_object)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum TransferOp {
    /// Remote to local.
    #[pyo3(name = "READ")]
    Read,
    /// Local to remote.
    #[pyo3(name = "WRITE")]
    Write,
}

impl From<TransferOp> for hmc_engine::TransferOp {
    fn from(op: TransferOp) -> Self {
        match op {
            TransferOp::Read => hmc_engine::TransferOp::Read,
            TransferOp::Write => hmc_engine::TransferOp::Write,
        }
    }
}

/// Where an asynchronous transfer stands: ``WAITING`` (still moving), ``COMPLETED``,
/// ``TIMEOUT`` (its timeout passed; its memory is no longer touched) or ``FAILED``.
#[pyclass(module = "hmc", frozen, eq, eq_int, from_py_object)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum TransferStatus {
    /// Still moving bytes.
    #[pyo3(name = "WAITING")]
    Waiting,
    /// Every descriptor is done.
    #[pyo3(name = "COMPLETED")]
    Completed,
    /// Its timeout passed.
    #[pyo3(name = "TIMEOUT")]
    Timeout,
    /// It failed (``TransferReq.error()`` says why).
    #[pyo3(name = "FAILED")]
    Failed,
}

/// One element of a transfer: ``length`` bytes between ``local_addr`` (this engine's
/// registered memory) and ``remote_addr`` (the peer's).
#[pyclass(module = "hmc", frozen, eq, from_py_object)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TransferOpDesc {
    /// Address in this engine's registered memory.
    #[pyo3(get)]
    pub local_addr: u64,
    /// Address in the peer's registered memory.
    #[pyo3(get)]
    pub remote_addr: u64,
    /// Bytes to move.
    #[pyo3(get)]
    pub length: u64,
}

#[pymethods]
impl TransferOpDesc {
    #[new]
    fn new(local_addr: u64, remote_addr: u64, length: u64) -> Self {
        TransferOpDesc {
            local_addr,
            remote_addr,
            length,
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "TransferOpDesc(local_addr={:#x}, remote_addr={:#x}, length={})",
            self.local_addr, self.remote_addr, self.length
        )
    }
}

/// A registration made by ``Engine.register_mem``: give it to ``Engine.deregister_mem``.
/// ``addr`` and ``length`` are the registered range (use them in ``TransferOpDesc``).
#[pyclass(module = "hmc", frozen, from_py_object)]
#[derive(Clone)]
pub struct MemHandle {
    /// Start address of the registered memory.
    #[pyo3(get)]
    pub addr: u64,
    /// Its length in bytes.
    #[pyo3(get)]
    pub length: u64,
    /// Whether the memory is registered read-only (a read-only object, or a raw range
    /// mapped read-only): peers may READ it and it may be the source of a WRITE, but a
    /// READ into it and a peer's WRITE to it are refused before a byte moves.
    #[pyo3(get)]
    pub readonly: bool,
    pub(crate) handle: hmc_engine::MemHandle,
}

#[pymethods]
impl MemHandle {
    fn __repr__(&self) -> String {
        format!(
            "MemHandle(addr={:#x}, length={}{})",
            self.addr,
            self.length,
            if self.readonly { ", readonly" } else { "" }
        )
    }
}

/// An initialized engine and the Python memory it holds.
pub(crate) struct Live {
    pub(crate) engine: RustEngine,
    /// Registered Python memory, kept alive until deregistered.
    held: Mutex<HashMap<hmc_engine::MemHandle, Held>>,
    /// Memory the engine allocated (`alloc_mem`), with its views: freed by its
    /// deregistration, refused while a view is open.
    allocated: Mutex<HashMap<hmc_engine::MemHandle, Arc<ViewGate>>>,
}

impl Live {
    pub(crate) fn new(engine: RustEngine) -> Self {
        Live {
            engine,
            held: Mutex::new(HashMap::new()),
            allocated: Mutex::new(HashMap::new()),
        }
    }

    /// Refuses to free allocated memory (`h`) while a buffer view of it is open;
    /// otherwise marks it gone, so that no new view opens.
    fn close_allocated(&self, h: &hmc_engine::MemHandle) -> PyResult<()> {
        let mut allocated = self.allocated.lock();
        let Some(gate) = allocated.get(h) else {
            return Ok(());
        };
        let open = gate.open_views();
        if open > 0 {
            return Err(pyo3::exceptions::PyBufferError::new_err(format!(
                "{open} buffer view(s) of this memory are still open (numpy arrays, memoryviews); delete them before deregister_mem"
            )));
        }
        gate.live.store(false, std::sync::atomic::Ordering::Release);
        allocated.remove(h);
        Ok(())
    }

    /// Registers the memory of `obj` (see [`buffer::hold`]).
    pub(crate) fn register(
        &self,
        obj: &Bound<'_, PyAny>,
        mem_type: MemType,
        device: Option<&str>,
    ) -> PyResult<MemHandle> {
        let device = device.map(buffer::parse_device).transpose()?;
        if mem_type == MemType::Device && device.is_none() && obj.cast::<PyTuple>().is_ok() {
            return Err(errors::invalid(
                "device memory given as (addr, length) needs device= (cuda:0, rocm:1, ...)",
            ));
        }
        let held = buffer::hold(obj, device)?;
        if mem_type == MemType::Host && device.is_some() {
            return Err(errors::invalid(
                "device= names device memory; pass mem_type=MemType.DEVICE with it",
            ));
        }
        if mem_type == MemType::Device && held.placement == Placement::Host {
            return Err(errors::invalid(
                "mem_type=DEVICE but the object is host memory; leave mem_type out for host buffers",
            ));
        }
        let rust_type = match held.placement {
            Placement::Host => hmc_engine::MemType::Host,
            Placement::Device(kind, ordinal) => hmc_engine::MemType::Device { kind, ordinal },
        };
        let desc = MemDesc {
            addr: held.addr,
            len: held.len,
        };
        // Read-only objects (bytes, a read-only mmap or memmap) register READ, so that a
        // peer's WRITE is refused by the transport instead of faulting in this process. A
        // raw host range gets what its mapping allows (the engine refuses unmapped ones).
        let access = if held.readonly {
            hmc_engine::Access::READ
        } else if matches!(held._keep, buffer::Keep::Raw) && held.placement == Placement::Host {
            hmc_engine::host_range_access(held.addr, held.len).map_err(errors::engine)?
        } else {
            hmc_engine::Access::READ_WRITE
        };
        let handle = match held.placement {
            Placement::Host => {
                // SAFETY: `held` keeps the memory alive (a held Py_buffer or DLPack tensor;
                // for a raw range, the caller's word) and is dropped only after
                // `deregister_mem` of the handle has returned (`deregister`, `finalize`,
                // `Drop`).
                unsafe { self.engine.register_mem(desc, rust_type, access) }
                    .map_err(errors::engine)?
            }
            Placement::Device(kind, ordinal) => {
                let device = crate::devices::open(kind, ordinal)?;
                if let Some(stream) = held.stream {
                    // Once, here: what the producer queued before handing the memory over
                    // lands before a peer or this engine reads it. Later writes are the
                    // application's to order before it asks for a transfer (as with NIXL
                    // and Mooncake): waiting on the producer's stream at every transfer
                    // would also wait for the model's next kernels.
                    // SAFETY: the stream came from the producer's DLPack or
                    // `__cuda_array_interface__` export of this memory (or is a default
                    // stream handle).
                    unsafe { device.synchronize(stream) }?;
                }
                // SAFETY: as for host memory above; the memory is on `device`'s device
                // (the producer said so, or the caller through device=).
                unsafe { self.engine.register_device_mem(desc, device.memory) }
                    .map_err(errors::engine)?
            }
        };
        let h = MemHandle {
            addr: held.addr,
            length: held.len as u64,
            readonly: !access.allows(hmc_engine::Access::WRITE),
            handle,
        };
        self.held.lock().insert(handle, held);
        Ok(h)
    }

    /// Deregisters and releases the Python memory of `h`.
    pub(crate) fn deregister(&self, py: Python<'_>, h: &MemHandle) -> PyResult<()> {
        self.close_allocated(&h.handle)?;
        wait(py, self.engine.deregister_mem(h.handle))?.map_err(errors::engine)?;
        let held = self.held.lock().remove(&h.handle);
        drop(held);
        Ok(())
    }

    /// Finalizes the engine (cancelling the transfers in flight, so that nothing below
    /// waits for their deadlines), deregisters everything still registered, then releases
    /// the Python memory.
    async fn shut_down(self: Arc<Self>) {
        self.engine.finalize().await;
        let mut handles: Vec<hmc_engine::MemHandle> = self.held.lock().keys().copied().collect();
        // Allocated memory with a view open stays (it is the engine's, freed when the
        // engine goes, which its `HostMemory` objects keep from happening before them).
        let allocated: Vec<hmc_engine::MemHandle> = self.allocated.lock().keys().copied().collect();
        handles.extend(
            allocated
                .into_iter()
                .filter(|h| self.close_allocated(h).is_ok()),
        );
        for h in handles {
            let _ = self.engine.deregister_mem(h).await;
        }
        // Taken out first: dropping Python objects attaches to the interpreter, which
        // must not happen under a lock a Python thread may be waiting for.
        let held = std::mem::take(&mut *self.held.lock());
        drop(held);
    }

    /// [`Live::shut_down`] to its end, blocking (interpreter exit, a dropped engine).
    fn shut(self: Arc<Self>) {
        crate::finish(async move {
            self.shut_down().await;
        });
    }
}

/// Converts a Python list of ``TransferOpDesc`` (or ``(local, remote, length)`` tuples).
pub(crate) fn descs(list: &Bound<'_, PyAny>) -> PyResult<Vec<hmc_engine::TransferOpDesc>> {
    let mut out = Vec::with_capacity(list.len().unwrap_or(0));
    for item in list.try_iter()? {
        let item = item?;
        let d = if let Ok(d) = item.cast::<TransferOpDesc>() {
            *d.get()
        } else {
            let (l, r, n): (u64, u64, u64) = item.extract().map_err(|_| {
                errors::invalid("transfer descriptors are TransferOpDesc(local_addr, remote_addr, length) or 3-tuples of ints")
            })?;
            TransferOpDesc::new(l, r, n)
        };
        out.push(hmc_engine::TransferOpDesc {
            local_addr: d.local_addr,
            remote_addr: d.remote_addr,
            len: d.length as usize,
        });
    }
    Ok(out)
}

/// A one-sided transfer engine (HIXL's ``Engine``): register memory, connect to peer
/// engines by address, and move bytes between registered memory on both sides by
/// address, synchronously or asynchronously. Safe to use from many threads; a context
/// manager (``with hmc.Engine() as e:`` finalizes it on exit).
///
/// Example:
///
/// ```python
/// e = hmc.Engine()
/// e.initialize("127.0.0.1:0")
/// buf = bytearray(4096)
/// h = e.register_mem(buf)
/// e.connect(peer_address)
/// e.transfer_sync(peer_address, hmc.TransferOp.WRITE,
///                 [hmc.TransferOpDesc(h.addr, remote_addr, 4096)])
/// ```
#[pyclass(module = "hmc", frozen)]
pub struct Engine {
    live: RwLock<Option<Arc<Live>>>,
}

impl Engine {
    /// An engine not yet initialized.
    pub(crate) fn new_py() -> Self {
        Engine {
            live: RwLock::new(None),
        }
    }

    /// The Rust engine (a clone: the same engine).
    pub(crate) fn rust(&self) -> PyResult<RustEngine> {
        Ok(self.live()?.engine.clone())
    }

    /// See `initialize`.
    pub(crate) fn initialize_py(
        &self,
        py: Python<'_>,
        local: &str,
        options: Option<HashMap<String, String>>,
    ) -> PyResult<()> {
        if self.live.read().is_some() {
            return Err(errors::state(
                "the engine is already initialized; make a new Engine for another address",
            ));
        }
        let config =
            EngineConfig::from_options(&options.unwrap_or_default()).map_err(errors::engine)?;
        let local = local.to_string();
        let engine = wait(py, async move {
            RustEngine::initialize_with(&local, config).await
        })?
        .map_err(errors::engine)?;
        *self.live.write() = Some(Arc::new(Live::new(engine)));
        Ok(())
    }

    /// See `finalize`. The shutdown runs as a task of the runtime, so that Ctrl-C returns
    /// control (KeyboardInterrupt) while it finishes on its own.
    pub(crate) fn finalize_py(&self, py: Python<'_>) -> PyResult<()> {
        let live = self.live.write().take();
        if let Some(live) = live {
            let task = runtime()?.spawn(live.shut_down());
            wait(py, task)?.map_err(|e| errors::state(format!("finalize failed: {e}")))?;
        }
        Ok(())
    }

    fn live(&self) -> PyResult<Arc<Live>> {
        self.live.read().clone().ok_or_else(|| {
            errors::state(
                "the engine is not initialized (or was finalized); call initialize(local) first",
            )
        })
    }
}

/// `options` with the `metadata` and `name` keyword arguments of `initialize` added (the
/// same keys; a key given both ways with different values is refused).
pub(crate) fn with_metadata(
    options: Option<HashMap<String, String>>,
    metadata: Option<String>,
    name: Option<String>,
) -> PyResult<HashMap<String, String>> {
    let mut options = options.unwrap_or_default();
    for (key, value) in [("metadata", metadata), ("name", name)] {
        let Some(value) = value else { continue };
        match options.get(key) {
            Some(given) if *given != value => {
                return Err(errors::invalid(format!(
                    "`{key}` is given twice: `{key}={value}` and options[\"{key}\"] = `{given}`; give it once"
                )));
            }
            _ => {
                options.insert(key.to_string(), value);
            }
        }
    }
    Ok(options)
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Some(live) = self.live.get_mut().take() {
            live.shut();
        }
    }
}

#[pymethods]
impl Engine {
    #[new]
    fn new() -> Self {
        Self::new_py()
    }

    /// Starts the engine at ``local`` (``"IP:PORT"``; port 0 picks a free one, then see
    /// ``local_address``). ``options`` are HIXL-style string options: ``transport``
    /// (``tcp``, ``ucx``, ``shm`` or ``auto``, the default), ``max_regions``,
    /// ``max_remote_regions``, ``max_descs_per_transfer``, ``max_pending_notifies``,
    /// ``max_notify_len``, ``max_pending_notify_bytes``, ``max_published_len``,
    /// ``allow_foreign_data_plane``, ``default_timeout_ms``, ``auth_secret_file`` (a file
    /// holding the job's shared secret: every engine of the job needs the same; without one,
    /// other users of this host are refused), and the metadata store's (``lease_ttl_ms``,
    /// ...). An unknown key raises ``InvalidArgumentError``.
    ///
    /// ``metadata`` is where engines find each other: ``"embedded"`` (the default: no
    /// service, an engine's name is its address) or ``"etcd://host:port[,host:port]/namespace"``,
    /// where the engine registers under ``name`` (default: its address) and peers
    /// ``connect`` to it by that name. The same as the ``metadata`` and ``name`` options.
    #[pyo3(signature = (local, options = None, *, metadata = None, name = None))]
    fn initialize(
        &self,
        py: Python<'_>,
        local: &str,
        options: Option<HashMap<String, String>>,
        metadata: Option<String>,
        name: Option<String>,
    ) -> PyResult<()> {
        let options = with_metadata(options, metadata, name)?;
        self.initialize_py(py, local, Some(options))
    }

    /// The name peers connect to: the engine's address (``"IP:PORT"``, with the port
    /// chosen if 0 was given), or its ``name`` in an etcd ``metadata`` namespace.
    #[getter]
    fn local_address(&self) -> PyResult<String> {
        Ok(self.live()?.engine.name().to_string())
    }

    /// Registers memory for transfers by this engine and its peers, in place (no copy).
    /// ``obj`` is a buffer-protocol object (bytearray, memoryview, numpy array), an object
    /// with ``__dlpack__`` (its device decides where it lives), an object with
    /// ``__cuda_array_interface__`` (CUDA memory of ``device=``, else of the object's
    /// ``device``, else of device 0), or ``(addr, length)`` for raw memory you keep alive
    /// yourself (``device="cuda:0"`` with ``MemType.DEVICE`` for device memory). The
    /// engine holds ``obj`` until ``deregister_mem``: peers may read and write it at any
    /// time until then. Device memory takes the path ``capabilities()["device_paths"]``
    /// names for its kind (over ``tcp``: staged, so peers READ and WRITE it); the
    /// producer's stream (DLPack's legacy default stream, the interface's ``stream``) is
    /// synchronised once here, and later kernels are yours to finish before a transfer
    /// (``torch.cuda.current_stream().synchronize()``), as with NIXL. A read-only object (``bytes``, a read-only
    /// ``mmap`` or ``numpy.memmap``, a raw range mapped read-only) registers read-only: the
    /// source of WRITEs and of peers' READs; a READ into it, or a peer's WRITE to it, is
    /// refused before a byte moves. A raw range that is not mapped is refused.
    #[pyo3(
        signature = (obj, mem_type = MemType::Host, device = None),
        text_signature = "(self, /, obj, mem_type=MemType.HOST, device=None)"
    )]
    fn register_mem(
        &self,
        obj: &Bound<'_, PyAny>,
        mem_type: MemType,
        device: Option<&str>,
    ) -> PyResult<MemHandle> {
        self.live()?.register(obj, mem_type, device)
    }

    /// Deregisters memory: peers can no longer reach it once this returns (transfers
    /// still using it are waited for), and the engine lets go of the object.
    fn deregister_mem(&self, py: Python<'_>, handle: MemHandle) -> PyResult<()> {
        self.live()?.deregister(py, &handle)
    }

    /// Allocates ``nbytes`` zeroed bytes of host memory that the engine owns, registered
    /// for reading and writing (no ``register_mem`` needed), and returns them as a
    /// writable buffer object (``numpy.frombuffer(m, dtype)``, ``memoryview(m)``) with
    /// ``handle``, ``addr`` and ``len``. Under the ``shm`` and ``auto`` transports it is
    /// shared memory, which a peer on this host copies with a plain ``memcpy`` instead of
    /// cross-memory attach: allocate the memory peers read and write (a prefill's KV
    /// cache) this way. ``deregister_mem(m.handle)`` frees it, once every view of it is
    /// closed.
    fn alloc_mem(slf: &Bound<'_, Self>, nbytes: usize) -> PyResult<HostMemory> {
        let live = slf.get().live()?;
        let (handle, mem) = live
            .engine
            .alloc_mem(nbytes, hmc_engine::Access::READ_WRITE)
            .map_err(errors::engine)?;
        let gate = Arc::new(ViewGate::live());
        live.allocated.lock().insert(handle, gate.clone());
        Ok(HostMemory {
            handle: MemHandle {
                addr: mem.addr,
                length: mem.len as u64,
                readonly: false,
                handle,
            },
            gate,
            _live: live,
        })
    }

    /// Connects to the engine at ``remote`` (its ``local_address``): fetches its table of
    /// registered memory and connects the data plane.
    #[pyo3(signature = (remote, timeout_ms = 1000))]
    fn connect(&self, py: Python<'_>, remote: &str, timeout_ms: u64) -> PyResult<()> {
        let live = self.live()?;
        wait(py, live.engine.connect(remote, millis(timeout_ms)))?.map_err(errors::engine)
    }

    /// Closes the connection to ``remote``; transfers already running finish. A peer the
    /// engine already dropped as gone (it left or restarted) is disconnected already: no
    /// error; a name never connected raises ``NotConnectedError``.
    #[pyo3(signature = (remote, timeout_ms = 1000))]
    fn disconnect(&self, py: Python<'_>, remote: &str, timeout_ms: u64) -> PyResult<()> {
        let live = self.live()?;
        let t = millis(timeout_ms);
        // The timer is made inside the runtime (`wait` runs the future there): built on
        // the caller's thread it panics for want of a reactor.
        let engine = live.engine.clone();
        match wait(py, async move {
            tokio::time::timeout(t, engine.disconnect(remote)).await
        })? {
            Ok(r) => r.map_err(errors::engine),
            Err(_) => Err(errors::engine(EngineError::Timeout {
                what: format!("disconnecting from `{remote}`"),
                after: t,
            })),
        }
    }

    /// Moves the bytes of ``descs`` (``TransferOpDesc`` or ``(local, remote, length)``)
    /// between this engine's memory and ``remote``'s, and returns once all are done (for
    /// a WRITE: visible at the peer). Every descriptor is checked before any byte moves.
    /// The GIL is released meanwhile; Ctrl-C cancels the transfer.
    #[pyo3(signature = (remote, op, descs, timeout_ms = 1000))]
    fn transfer_sync(
        &self,
        py: Python<'_>,
        remote: &str,
        op: TransferOp,
        descs: &Bound<'_, PyAny>,
        timeout_ms: u64,
    ) -> PyResult<()> {
        let live = self.live()?;
        let descs = self::descs(descs)?;
        wait(
            py,
            live.engine
                .transfer(remote, op.into(), &descs, millis(timeout_ms)),
        )?
        .map_err(errors::engine)
    }

    /// Starts a transfer and returns a ``TransferReq`` at once (``status()``,
    /// ``wait()``, ``cancel()``, ``await req``).
    #[pyo3(signature = (remote, op, descs, timeout_ms = 1000))]
    fn transfer_async(
        &self,
        remote: &str,
        op: TransferOp,
        descs: &Bound<'_, PyAny>,
        timeout_ms: u64,
    ) -> PyResult<TransferReq> {
        let live = self.live()?;
        let descs = self::descs(descs)?;
        let req = live
            .engine
            .transfer_async(remote, op.into(), descs, millis(timeout_ms))
            .map_err(errors::engine)?;
        Ok(TransferReq { req })
    }

    /// Sends ``msg`` to ``remote``'s queue; it reads it with ``get_notifies()`` (or
    /// ``get_notifications()``, which also shows ``name``).
    #[pyo3(signature = (remote, msg, timeout_ms = 1000, name = ""))]
    fn send_notify(
        &self,
        py: Python<'_>,
        remote: &str,
        msg: &[u8],
        timeout_ms: u64,
        name: &str,
    ) -> PyResult<()> {
        let live = self.live()?;
        let msg = msg.to_vec();
        wait(
            py,
            live.engine
                .send_notify(remote, name, &msg, millis(timeout_ms)),
        )?
        .map_err(errors::engine)
    }

    /// Takes every notification received so far, oldest first, as ``(sender, bytes)``.
    fn get_notifies<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let items: Vec<(String, Bound<'py, PyBytes>)> = self
            .live()?
            .engine
            .get_notifies()
            .into_iter()
            .map(|n| (n.from, PyBytes::new(py, &n.msg)))
            .collect();
        PyList::new(py, items)
    }

    /// Takes every notification received so far, oldest first, as ``(sender, name,
    /// bytes, failed)``: ``failed`` is ``None``, or why the transfer the notification was
    /// attached to failed (a failure notice: no byte of it is to be expected).
    fn get_notifications<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let items: Vec<_> = self
            .live()?
            .engine
            .get_notifies()
            .into_iter()
            .map(|n| (n.from, n.name, PyBytes::new(py, &n.msg), n.failed))
            .collect();
        PyList::new(py, items)
    }

    /// Prepares entries of this engine's registered memory for ``make_transfer``:
    /// ``(addr, len)``, ``(addr, len, dev)`` or strided ``(addr, len, dev, stride,
    /// count)`` tuples, or an N x 2, 3 or 5 integer numpy array (read in place: do not
    /// change it from another thread during the call). Each entry is resolved now, and
    /// refused now if it is outside every registered region.
    fn prepare_local(&self, entries: &Bound<'_, PyAny>) -> PyResult<crate::prepared::PreparedList> {
        let live = self.live()?;
        let list = crate::prepared::prepare_entries(entries, |e| Ok(live.engine.prepare_local(e)))?;
        Ok(crate::prepared::PreparedList { list })
    }

    /// Prepares entries (as ``prepare_local`` takes them) of the connected peer
    /// ``remote``'s memory. The list becomes invalid when the peer deregisters a region
    /// under it or restarts.
    #[pyo3(signature = (remote, entries, timeout_ms = 1000))]
    fn prepare_remote(
        &self,
        py: Python<'_>,
        remote: &str,
        entries: &Bound<'_, PyAny>,
        timeout_ms: u64,
    ) -> PyResult<crate::prepared::PreparedList> {
        let live = self.live()?;
        let list = crate::prepared::prepare_entries(entries, |e| {
            wait(
                py,
                live.engine.prepare_remote(remote, e, millis(timeout_ms)),
            )
        })?;
        Ok(crate::prepared::PreparedList { list })
    }

    /// A transfer of entries ``local_idx[k]`` of ``local`` with ``remote_idx[k]`` of
    /// ``remote`` (lists or 1-D integer numpy arrays of one length). With ``notif_msg``,
    /// every post ends by delivering that notification (named ``notif_name``) to the peer
    /// after the bytes, or a failure notice instead if the transfer fails.
    #[pyo3(signature = (op, local, local_idx, remote, remote_idx, notif_msg = None, notif_name = ""))]
    #[allow(clippy::too_many_arguments)]
    fn make_transfer(
        &self,
        op: TransferOp,
        local: &crate::prepared::PreparedList,
        local_idx: &Bound<'_, PyAny>,
        remote: &crate::prepared::PreparedList,
        remote_idx: &Bound<'_, PyAny>,
        notif_msg: Option<&[u8]>,
        notif_name: &str,
    ) -> PyResult<crate::prepared::PreparedXfer> {
        let live = self.live()?;
        let li = crate::prepared::indices(local_idx)?;
        let ri = crate::prepared::indices(remote_idx)?;
        let notify = notif_msg.map(|m| (notif_name.to_string(), m.to_vec()));
        let xfer = live
            .engine
            .make_transfer(op.into(), &local.list, &li, &remote.list, &ri, notify)
            .map_err(errors::engine)?;
        Ok(crate::prepared::PreparedXfer { xfer })
    }

    /// This engine's metadata as an opaque blob for a peer's ``add_remote`` (carry it over
    /// your own side channel).
    fn local_metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let b = self
            .live()?
            .engine
            .local_metadata()
            .map_err(errors::engine)?;
        Ok(PyBytes::new(py, &b))
    }

    /// A blob of only the regions of ``handles`` (registered after the peer added the full
    /// blob).
    fn partial_metadata<'py>(
        &self,
        py: Python<'py>,
        handles: Vec<MemHandle>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let h: Vec<_> = handles.iter().map(|h| h.handle).collect();
        let b = self
            .live()?
            .engine
            .partial_metadata(&h)
            .map_err(errors::engine)?;
        Ok(PyBytes::new(py, &b))
    }

    /// Adds the peer a blob describes (a partial blob: adds its regions) and returns its
    /// name. A blob of an engine that restarted since is refused.
    #[pyo3(signature = (blob, timeout_ms = 1000))]
    fn add_remote(&self, py: Python<'_>, blob: &[u8], timeout_ms: u64) -> PyResult<String> {
        let live = self.live()?;
        let blob = blob.to_vec();
        wait(py, live.engine.add_remote(&blob, millis(timeout_ms)))?.map_err(errors::engine)
    }

    /// Removes a peer added by ``add_remote`` or ``connect``.
    fn remove_remote(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        let live = self.live()?;
        wait(py, live.engine.remove_remote(name))?.map_err(errors::engine)
    }

    /// Publishes ``blob`` under ``label`` in the etcd namespace beside this engine's
    /// record (NIXL's labelled partial metadata), for a peer's ``fetch_label``.
    fn publish_label(&self, label: &str, blob: &[u8]) -> PyResult<()> {
        self.live()?
            .engine
            .publish_label(label, blob.to_vec())
            .map_err(errors::engine)
    }

    /// What the engine ``name`` published under ``label`` (``None`` while it has not).
    #[pyo3(signature = (name, label, timeout_ms = 1000))]
    fn fetch_label<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        label: &str,
        timeout_ms: u64,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let live = self.live()?;
        let got = wait(py, live.engine.fetch_label(name, label, millis(timeout_ms)))?
            .map_err(errors::engine)?;
        Ok(got.map(|b| PyBytes::new(py, &b)))
    }

    /// Takes this engine out of its etcd namespace (``False``: peers that watch it drop it)
    /// or lists it again (``True``); the engine keeps running.
    fn set_listed(&self, listed: bool) -> PyResult<()> {
        self.live()?
            .engine
            .set_listed(listed)
            .map_err(errors::engine)
    }

    /// True when ``name`` is added and not known gone.
    fn check_remote(&self, name: &str) -> PyResult<bool> {
        Ok(self.live()?.engine.check_remote(name))
    }

    /// What the transport can do: ``transport``, ``local_memory`` and ``remote_memory``
    /// (device kinds, or ``"any"``), ``device_memory`` (``refused``,
    /// ``library_dependent``, ``direct``, ``staged``), ``device_paths`` (per device kind,
    /// the path its registrations take: ``direct``; ``staged``, which peers reach through
    /// the transport's bounded pinned host chunks; or ``local_only``, which only this
    /// engine moves), ``notifications``, ``max_transfer_len``, ``max_batch_len``,
    /// ``zero_copy``.
    fn capabilities<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.live()?.engine.capabilities();
        let kinds = |k: &hmc_core::MemoryKinds| -> Vec<String> {
            match k {
                hmc_core::MemoryKinds::Only(v) => v.iter().map(|d| d.to_string()).collect(),
                _ => vec!["any".to_string()],
            }
        };
        let d = PyDict::new(py);
        d.set_item("transport", c.transport.to_string())?;
        d.set_item("local_memory", kinds(&c.local_memory))?;
        d.set_item("remote_memory", kinds(&c.remote_memory))?;
        d.set_item(
            "device_memory",
            match c.device_memory {
                hmc_core::DeviceMemoryPath::Refused => "refused",
                hmc_core::DeviceMemoryPath::Direct => "direct",
                hmc_core::DeviceMemoryPath::Staged => "staged",
                _ => "library_dependent",
            },
        )?;
        // Per device kind, the path a registration of that memory takes (the engine's one
        // rule: direct, then staged; else local-only, which peers cannot reach).
        let paths = PyDict::new(py);
        // Keyed by the names `device=` takes.
        for (name, kind) in [
            ("cuda", hmc_core::DeviceKind::CUDA),
            ("rocm", hmc_core::DeviceKind::ROCM),
            ("mlu", hmc_core::DeviceKind::MLU),
            ("musa", hmc_core::DeviceKind::MUSA),
            ("ascend", hmc_core::DeviceKind::ASCEND),
        ] {
            let path = match c.memory_path(kind) {
                hmc_core::DeviceMemoryPath::Direct => "direct",
                hmc_core::DeviceMemoryPath::Staged => "staged",
                hmc_core::DeviceMemoryPath::Refused => "local_only",
                _ => "library_dependent",
            };
            paths.set_item(name, path)?;
        }
        d.set_item("device_paths", paths)?;
        d.set_item("notifications", c.notifications)?;
        d.set_item("max_transfer_len", c.max_transfer_len)?;
        d.set_item("max_batch_len", c.max_batch_len)?;
        d.set_item("zero_copy", c.zero_copy)?;
        Ok(d)
    }

    /// Cancels the transfers in flight (their requests end ``FAILED`` with a
    /// ``CancelledError``), disconnects every peer, deregisters all memory and stops the
    /// engine; later calls raise ``StateError``. Idempotent. Ctrl-C interrupts the wait
    /// (``KeyboardInterrupt``) while the shutdown finishes on its own.
    fn finalize(&self, py: Python<'_>) -> PyResult<()> {
        self.finalize_py(py)
    }

    /// The engine itself (``with hmc.Engine() as e:``).
    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Finalizes the engine; exceptions propagate.
    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.finalize(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        match self.live.read().as_ref() {
            Some(l) => format!("Engine(local_address={:?})", l.engine.name()),
            None => "Engine(not initialized)".to_string(),
        }
    }

    /// Benchmark aid: ``iters`` synchronous transfers of ``desc`` (none: an empty batch,
    /// which the engine completes without I/O) made by plain Rust (the runtime's
    /// ``block_on`` of the engine's transfer, as ``hmc_engine::BlockingEngine::
    /// transfer_sync`` does, the GIL released once for the loop). Returns the seconds
    /// taken; ``cargo xtask bench python`` compares it with the same calls through
    /// ``transfer_sync``.
    #[pyo3(signature = (remote, op, desc, iters, timeout_ms = 1000))]
    fn _transfer_sync_loop(
        &self,
        py: Python<'_>,
        remote: &str,
        op: TransferOp,
        desc: Option<TransferOpDesc>,
        iters: u64,
        timeout_ms: u64,
    ) -> PyResult<f64> {
        let live = self.live()?;
        let d: Vec<hmc_engine::TransferOpDesc> = desc
            .map(|d| hmc_engine::TransferOpDesc {
                local_addr: d.local_addr,
                remote_addr: d.remote_addr,
                len: d.length as usize,
            })
            .into_iter()
            .collect();
        let rt = runtime()?;
        let (op, t) = (op.into(), millis(timeout_ms));
        py.detach(|| {
            let start = std::time::Instant::now();
            for _ in 0..iters {
                rt.block_on(live.engine.transfer(remote, op, &d, t))?;
            }
            Ok(start.elapsed().as_secs_f64())
        })
        .map_err(errors::engine)
    }
}

/// An asynchronous transfer from ``Engine.transfer_async``. ``status()`` polls,
/// ``wait(timeout_ms)`` blocks (GIL released, Ctrl-C cancels it), ``await req`` waits in
/// asyncio and raises the transfer's error if it failed, ``cancel()`` ends it. Dropping
/// the request does not cancel it.
#[pyclass(module = "hmc", frozen)]
pub struct TransferReq {
    req: hmc_engine::TransferRequest,
}

pub(crate) fn status_of(s: &hmc_engine::TransferStatus) -> TransferStatus {
    match s {
        hmc_engine::TransferStatus::Waiting => TransferStatus::Waiting,
        hmc_engine::TransferStatus::Completed => TransferStatus::Completed,
        hmc_engine::TransferStatus::TimedOut => TransferStatus::Timeout,
        _ => TransferStatus::Failed,
    }
}

/// The exception of an ended request (None when it completed or still runs).
fn error_of(s: &hmc_engine::TransferStatus) -> Option<PyErr> {
    match s {
        hmc_engine::TransferStatus::Failed(e) => Some(errors::engine_ref(e)),
        hmc_engine::TransferStatus::TimedOut => Some(errors::new(
            "TimeoutError",
            "the asynchronous transfer timed out; its memory is no longer touched; pass a longer timeout_ms",
        )),
        _ => None,
    }
}

#[pymethods]
impl TransferReq {
    /// The status now.
    fn status(&self) -> TransferStatus {
        status_of(&self.req.status())
    }

    /// Blocks until the transfer ends or ``timeout_ms`` passes (``None``: no limit) and
    /// returns the status (``WAITING`` if it is still running). Ctrl-C raises
    /// ``KeyboardInterrupt`` and cancels the transfer.
    #[pyo3(signature = (timeout_ms = None))]
    fn wait(&self, py: Python<'_>, timeout_ms: Option<u64>) -> PyResult<TransferStatus> {
        let req = self.req.clone();
        let waited = wait(py, async move {
            match timeout_ms {
                Some(t) => tokio::time::timeout(millis(t), req.wait()).await.ok(),
                None => Some(req.wait().await),
            }
        });
        match waited {
            Ok(Some(s)) => Ok(status_of(&s)),
            Ok(None) => Ok(TransferStatus::Waiting),
            Err(e) => {
                self.req.cancel();
                Err(e)
            }
        }
    }

    /// The exception the transfer ended with (``TimeoutError``, ``CancelledError``, ...),
    /// or ``None`` while it runs or if it completed.
    fn error(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        error_of(&self.req.status()).map(|e| e.into_value(py).into_any())
    }

    /// Cancels the transfer if it still runs: it ends ``FAILED`` with ``CancelledError``,
    /// and its memory is no longer touched once ``wait`` reports that.
    fn cancel(&self) {
        self.req.cancel();
    }

    fn __await__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let asyncio = py.import("asyncio")?;
        let lp = asyncio.call_method0("get_running_loop")?;
        let fut = lp.call_method0("create_future")?;
        let resolve = py.import("hmc._errors")?.getattr("_resolve")?.unbind();
        let (lp_obj, fut_obj) = (lp.unbind(), fut.clone().unbind());
        let req = self.req.clone();
        runtime()?.spawn(async move {
            let status = req.wait().await;
            Python::attach(|py| {
                let exc = error_of(&status).map(|e| e.into_value(py).into_any());
                let r = lp_obj.bind(py).call_method1(
                    "call_soon_threadsafe",
                    (resolve.bind(py), fut_obj.bind(py), exc),
                );
                if let Err(e) = r {
                    // The loop closed before the transfer ended: nobody awaits any more.
                    tracing::debug!(error = %e, "could not resolve an awaited transfer");
                }
            });
        });
        fut.call_method0("__await__")
    }

    fn __repr__(&self) -> String {
        format!("TransferReq(status={:?})", self.status())
    }
}

/// Adds the engine's classes to the module.
/// Host memory an engine allocated (``Engine.alloc_mem``), as a writable buffer object
/// (format ``B``, one dimension of bytes). Views keep this object, and so the engine,
/// alive; ``deregister_mem`` of its ``handle`` refuses while any view is open.
#[pyclass(module = "hmc", frozen)]
pub struct HostMemory {
    handle: MemHandle,
    gate: Arc<ViewGate>,
    /// The engine owns the memory: kept until every object over it is gone.
    _live: Arc<Live>,
}

#[pymethods]
impl HostMemory {
    /// The registration (for ``deregister_mem``); its ``addr`` and ``length`` are the
    /// memory's.
    #[getter]
    fn handle(&self) -> MemHandle {
        self.handle.clone()
    }

    /// Where the memory starts (for ``TransferOpDesc`` and block tables).
    #[getter]
    fn addr(&self) -> u64 {
        self.handle.addr
    }

    fn __len__(&self) -> usize {
        self.handle.length as usize
    }

    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: std::ffi::c_int,
    ) -> PyResult<()> {
        let m = slf.get();
        // SAFETY: `view` is the interpreter's; the memory stays allocated while its gate
        // is live and a view is open (`deregister_mem` refuses then, and finalization
        // leaves it to the engine, which `_live` keeps).
        unsafe {
            m.gate.export(
                slf.as_any(),
                view,
                flags,
                m.handle.addr,
                m.handle.length as usize,
                "the memory was freed (deregister_mem); it has no bytes any more",
            )
        }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {
        self.gate.release();
    }

    fn __repr__(&self) -> String {
        format!(
            "HostMemory(addr={:#x}, len={})",
            self.handle.addr, self.handle.length
        )
    }
}

pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Engine>()?;
    m.add_class::<MemType>()?;
    m.add_class::<MemHandle>()?;
    m.add_class::<HostMemory>()?;
    m.add_class::<TransferOp>()?;
    m.add_class::<TransferOpDesc>()?;
    m.add_class::<TransferStatus>()?;
    m.add_class::<TransferReq>()?;
    Ok(())
}
