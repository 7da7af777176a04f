//! Prepared lists and the transfers made of them (`Engine.prepare_local`,
//! `Engine.prepare_remote`, `Engine.make_transfer`), with entries and indices taken from
//! numpy arrays (read in place through the buffer protocol) or Python sequences.

use hmc_core::AnyCommunicator;
use hmc_engine::{BlockDesc, EngineError};
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::engine::{TransferStatus, status_of};
use crate::{errors, millis, runtime, wait};

/// Calls `f` with the shape and the values (in C order, each checked not negative) of a
/// buffer-protocol object of integers (a numpy array of int64, uint64, int32 or uint32),
/// C-contiguous, read in place; `None` when `obj` is not such an object.
fn with_int_array<R>(
    obj: &Bound<'_, PyAny>,
    f: impl FnOnce(&[usize], &mut dyn Iterator<Item = PyResult<u64>>) -> PyResult<R>,
) -> PyResult<Option<R>> {
    macro_rules! as_ints {
        ($t:ty) => {
            if let Ok(b) = PyBuffer::<$t>::get(obj) {
                let shape = b.shape().to_vec();
                // Read in place, each value once: no copy of a large array.
                let items = b.as_slice_ptr().ok_or_else(|| {
                    errors::invalid("pass a C-contiguous array (numpy.ascontiguousarray)")
                })?;
                let base = items.as_ptr() as *const $t;
                let mut values = (0..items.len()).map(|i| {
                    // SAFETY: `i` < the buffer's item count, and PyBuffer::get checked that
                    // the buffer's items are aligned `$t`s; the buffer (held by `b`) stays
                    // valid while we read. A volatile read of each item once: the array is
                    // the caller's and, under the documented rule that it is not changed
                    // during the call, nothing else writes it while we hold the GIL.
                    let v = unsafe { std::ptr::read_volatile(base.add(i)) };
                    #[allow(unused_comparisons)]
                    if v < 0 {
                        return Err(errors::invalid(format!(
                            "a negative value ({v}) in an address, length or index array"
                        )));
                    }
                    Ok(v as u64)
                });
                return f(&shape, &mut values).map(Some);
            }
        };
    }
    as_ints!(i64);
    as_ints!(u64);
    as_ints!(i32);
    as_ints!(u32);
    Ok(None)
}

/// Indices: a list of ints or a 1-D integer numpy array.
pub(crate) fn indices(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
    let found = with_int_array(obj, |shape, values| {
        if shape.len() != 1 {
            return Err(errors::invalid(format!(
                "an index array must be 1-D; this one has shape {shape:?}"
            )));
        }
        values.collect()
    })?;
    if let Some(v) = found {
        return Ok(v);
    }
    obj.try_iter()
        .map_err(|_| errors::invalid("indices are a list of ints or a 1-D integer numpy array"))?
        .map(|i| i?.extract::<u64>())
        .collect()
}

/// One entry from its columns: `(addr, len)`, `(addr, len, dev)` or `(addr, len, dev,
/// stride, count)` (NIXL's strided form; `dev` is not needed to find memory here).
fn entry(cols: &[u64]) -> PyResult<BlockDesc> {
    match *cols {
        [addr, len] | [addr, len, _] => Ok(BlockDesc::block(addr, len as usize)),
        [addr, len, _, stride, count] => Ok(BlockDesc::strided(addr, len as usize, stride, count)),
        _ => Err(errors::invalid(format!(
            "an entry has 2, 3 or 5 fields ((addr, len), (addr, len, dev) or (addr, len, dev, stride, count)), not {}",
            cols.len()
        ))),
    }
}

/// Entries: an Nx2, Nx3 or Nx5 integer numpy array, or a sequence of such tuples. With
/// `fold`, rows of an array that continue a run (the same length, a constant step of at
/// least that length) become one strided entry as they are read: a million contiguous
/// blocks are one entry, not 32 MB of them. The engine folds such rows into one segment
/// anyway, so the prepared list is the same; but a run may cross from one registration
/// into the next, which the engine refuses for one entry, so a caller retries a refused
/// folded list unfolded ([`prepare_entries`]).
pub(crate) fn entries(obj: &Bound<'_, PyAny>, fold: bool) -> PyResult<Vec<BlockDesc>> {
    let found = with_int_array(obj, |shape, values| {
        let [rows, width @ (2 | 3 | 5)] = shape[..] else {
            return Err(errors::invalid(format!(
                "an entry array is N x 2, 3 or 5 (an entry has 2, 3 or 5 fields); this one has shape {shape:?}"
            )));
        };
        let mut out: Vec<BlockDesc> = if fold {
            Vec::new()
        } else {
            Vec::with_capacity(rows)
        };
        let mut row = [0u64; 5];
        for _ in 0..rows {
            for col in row.iter_mut().take(width) {
                *col = values.next().unwrap_or_else(|| {
                    Err(errors::invalid(
                        "the array holds fewer values than its shape says",
                    ))
                })?;
            }
            let d = entry(&row[..width])?;
            match out.last_mut() {
                Some(run) if fold && continues(run, &d) => {
                    if run.count == 1 {
                        run.stride = d.addr - run.addr;
                    }
                    run.count += 1;
                }
                _ => out.push(d),
            }
        }
        Ok(out)
    })?;
    if let Some(v) = found {
        return Ok(v);
    }
    let it = obj.try_iter().map_err(|_| {
        errors::invalid("entries are a list of tuples or an N x 3 / N x 5 integer numpy array")
    })?;
    let mut out = Vec::new();
    for item in it {
        let item = item?;
        let t = item.cast::<PyTuple>().map_err(|_| {
            errors::invalid("each entry is a tuple (addr, len[, dev[, stride, count]])")
        })?;
        let cols: Vec<u64> = t
            .iter()
            .map(|x| x.extract::<u64>())
            .collect::<PyResult<_>>()?;
        out.push(entry(&cols)?);
    }
    Ok(out)
}

/// True when the single block `d` extends `run` by one step (the first two blocks fix it:
/// at least the block's length, so folded blocks never overlap).
fn continues(run: &BlockDesc, d: &BlockDesc) -> bool {
    if d.count != 1 || d.len != run.len || d.len == 0 || d.addr <= run.addr {
        return false;
    }
    if run.count == 1 {
        return d.addr - run.addr >= run.len as u64;
    }
    run.count
        .checked_mul(run.stride)
        .and_then(|span| run.addr.checked_add(span))
        == Some(d.addr)
}

/// Prepares `obj`'s entries with `prepare`: folded first, and when the engine refuses an
/// entry of that (a run crossing from one registration into the next), unfolded, so that a
/// list is refused only as given and its error names the entry as the caller wrote it.
pub(crate) fn prepare_entries<T>(
    obj: &Bound<'_, PyAny>,
    mut prepare: impl FnMut(&[BlockDesc]) -> PyResult<Result<T, EngineError>>,
) -> PyResult<T> {
    let folded = entries(obj, true)?;
    match prepare(&folded)? {
        Ok(t) => Ok(t),
        Err(
            EngineError::NotRegistered { .. }
            | EngineError::Straddles { .. }
            | EngineError::InvalidArgument(_),
        ) if folded.iter().any(|d| d.count > 1) => {
            prepare(&entries(obj, false)?)?.map_err(errors::engine)
        }
        Err(e) => Err(errors::engine(e)),
    }
}

/// A prepared descriptor list: made by ``Engine.prepare_local`` or
/// ``Engine.prepare_remote``, named by index in ``Engine.make_transfer``.
#[pyclass(module = "hmc", frozen)]
pub struct PreparedList {
    pub(crate) list: hmc_engine::PreparedList<AnyCommunicator>,
}

#[pymethods]
impl PreparedList {
    fn __len__(&self) -> usize {
        self.list.len() as usize
    }

    /// The peer a remote list was prepared for (``None`` for a local list).
    #[getter]
    fn peer(&self) -> Option<String> {
        self.list.peer().map(str::to_string)
    }

    /// Segments the entries were folded into (consecutive blocks of one region with one
    /// length and a constant step make one).
    #[getter]
    fn segments(&self) -> usize {
        self.list.segments()
    }

    /// Heap bytes the list holds.
    #[getter]
    fn heap_bytes(&self) -> usize {
        self.list.heap_bytes()
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.list)
    }
}

/// A transfer over prepared lists: ``post()`` starts it, ``status()`` polls it,
/// ``wait()`` blocks, ``release()`` ends it for good; it may be posted again once ended.
#[pyclass(module = "hmc", frozen)]
pub struct PreparedXfer {
    pub(crate) xfer: hmc_engine::PreparedTransfer<AnyCommunicator>,
}

fn error_of(s: &Option<hmc_engine::TransferStatus>) -> Option<PyErr> {
    match s {
        Some(hmc_engine::TransferStatus::Failed(e)) => Some(errors::engine_ref(e)),
        Some(hmc_engine::TransferStatus::TimedOut) => Some(errors::new(
            "TimeoutError",
            "the transfer made no progress for no_progress_timeout_ms; its memory is no longer touched on either side",
        )),
        _ => None,
    }
}

#[pymethods]
impl PreparedXfer {
    /// Starts the transfer and returns at once (refused while a post of it is in
    /// progress, and after ``release``).
    fn post(&self) -> PyResult<()> {
        let _rt = runtime()?;
        self.xfer.post().map_err(errors::engine)
    }

    /// Where the last post stands: ``WAITING`` (also before the first post),
    /// ``COMPLETED``, ``TIMEOUT`` (no progress) or ``FAILED``.
    fn status(&self) -> TransferStatus {
        self.xfer
            .status()
            .map_or(TransferStatus::Waiting, |s| status_of(&s))
    }

    /// True once the last post ended.
    fn done(&self) -> bool {
        self.xfer.status().is_some_and(|s| s.is_done())
    }

    /// Blocks until the last post ends or ``timeout_ms`` passes (``None``: until it ends;
    /// it always does) and returns the status.
    #[pyo3(signature = (timeout_ms = None))]
    fn wait(&self, py: Python<'_>, timeout_ms: Option<u64>) -> PyResult<TransferStatus> {
        let x = self.xfer.clone();
        let s = wait(py, async move {
            match timeout_ms {
                Some(t) => tokio::time::timeout(millis(t), x.wait())
                    .await
                    .ok()
                    .flatten(),
                None => x.wait().await,
            }
        })?;
        Ok(s.map_or(TransferStatus::Waiting, |s| status_of(&s)))
    }

    /// The exception the last post ended with, or ``None``.
    fn error(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        error_of(&self.xfer.status()).map(|e| e.into_value(py).into_any())
    }

    /// Cancels a post in progress and waits for it to end (its memory is then no longer
    /// touched on either side); later posts are refused.
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        let x = self.xfer.clone();
        wait(py, async move { x.release().await })
    }

    /// The last post's telemetry once it ended: ``posted_at`` (seconds since the epoch),
    /// ``duration_us``, ``bytes``, ``requested_descs``, ``descs`` (runs after merging),
    /// ``staged_at_peer_bytes`` (bytes in the peer's device memory moved through its
    /// staging chunks; 0 on the direct path), ``transport``, ``ok``; ``None`` before.
    fn telemetry<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(t) = self.xfer.telemetry() else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        let at = t
            .posted_at
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        d.set_item("posted_at", at)?;
        d.set_item("duration_us", t.duration.as_micros() as u64)?;
        d.set_item("bytes", t.bytes)?;
        d.set_item("requested_descs", t.requested_descs)?;
        d.set_item("descs", t.descs)?;
        d.set_item("staged_at_peer_bytes", t.staged_at_peer_bytes)?;
        d.set_item("transport", t.transport.to_string())?;
        d.set_item("ok", t.ok)?;
        Ok(Some(d))
    }

    /// Bytes one post moves.
    #[getter]
    fn bytes(&self) -> u64 {
        self.xfer.bytes()
    }

    /// Runs after merging pairs contiguous on both sides.
    #[getter]
    fn runs(&self) -> usize {
        self.xfer.runs()
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.xfer)
    }
}

impl Drop for PreparedXfer {
    fn drop(&mut self) {
        // A transfer nobody can release any more is released (cancelled if in progress).
        let x = self.xfer.clone();
        if let Ok(rt) = runtime() {
            rt.spawn(async move { x.release().await });
        }
    }
}

/// For `cargo xtask bench kv`: the loop a Python caller runs per request (make a transfer
/// of the request's indices, post it, wait, release) run by Rust over `requests`
/// (pairs of index arrays), the GIL released; returns the seconds it took.
#[pyfunction]
#[pyo3(signature = (engine, op, local, remote, requests, notif_msg = None))]
fn _prepared_loop(
    py: Python<'_>,
    engine: &crate::engine::Engine,
    op: crate::engine::TransferOp,
    local: &PreparedList,
    remote: &PreparedList,
    requests: Vec<(Bound<'_, PyAny>, Bound<'_, PyAny>)>,
    notif_msg: Option<Vec<u8>>,
) -> PyResult<f64> {
    let e = engine.rust()?;
    let reqs: Vec<(Vec<u64>, Vec<u64>)> = requests
        .iter()
        .map(|(l, r)| Ok((indices(l)?, indices(r)?)))
        .collect::<PyResult<_>>()?;
    let (l, r, op) = (local.list.clone(), remote.list.clone(), op.into());
    wait(py, async move {
        let start = std::time::Instant::now();
        for (li, ri) in &reqs {
            let notify = notif_msg.clone().map(|m| (String::new(), m));
            let x = e.make_transfer(op, &l, li, &r, ri, notify)?;
            x.post()?;
            match x.wait().await {
                Some(hmc_engine::TransferStatus::Completed) => {}
                Some(hmc_engine::TransferStatus::Failed(err)) => {
                    return Err(hmc_engine::EngineError::InvalidArgument(err.to_string()));
                }
                other => {
                    return Err(hmc_engine::EngineError::InvalidArgument(format!(
                        "the transfer ended {other:?}"
                    )));
                }
            }
            x.release().await;
        }
        Ok(start.elapsed().as_secs_f64())
    })?
    .map_err(errors::engine)
}

/// For `cargo xtask bench kv`'s memcpy row: copies `len` bytes from each `src[k]` to
/// `dst[k]`, `rounds` times, and returns the seconds it took. The addresses are the
/// caller's to vouch for (as `ctypes.memmove`'s are).
#[pyfunction]
fn _copy_blocks(
    py: Python<'_>,
    dst: &Bound<'_, PyAny>,
    src: &Bound<'_, PyAny>,
    len: usize,
    rounds: u64,
) -> PyResult<f64> {
    let (d, s) = (indices(dst)?, indices(src)?);
    if d.len() != s.len() {
        return Err(errors::invalid("one source per destination"));
    }
    Ok(py.detach(|| {
        let start = std::time::Instant::now();
        for _ in 0..rounds {
            for (&d, &s) in d.iter().zip(&s) {
                // SAFETY: the caller vouches for both ranges (a benchmark helper, named
                // with a leading underscore, as `ctypes.memmove` would be used).
                unsafe { std::ptr::copy_nonoverlapping(s as *const u8, d as *mut u8, len) };
            }
        }
        start.elapsed().as_secs_f64()
    }))
}

/// Adds the classes to the module.
pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PreparedList>()?;
    m.add_class::<PreparedXfer>()?;
    m.add_function(wrap_pyfunction!(_prepared_loop, m)?)?;
    m.add_function(wrap_pyfunction!(_copy_blocks, m)?)?;
    Ok(())
}
