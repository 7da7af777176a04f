//! `hmc.rpc`: the RPC client (raw calls and the demo methods `echo`, `uppercase`,
//! `complex`) and a server whose methods are Python callables, run on the server's pool of
//! blocking workers (never on its I/O threads).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hmc_core::PeerAddr;
use hmc_rpc::demo::{COMPLEX, ComplexRequest, ComplexResponse, ECHO, UPPERCASE};
use hmc_rpc::{
    CallOptions, ClientConfig, Dispatcher, RpcError, RunningServer, ServerConfig, Status,
};
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};

use crate::{errors, millis, wait};

/// `HOST:PORT`, `tcp://HOST:PORT` or `unix:///path`.
fn parse_addr(s: &str) -> PyResult<PeerAddr> {
    let full = if s.contains("://") {
        s.to_string()
    } else {
        format!("tcp://{s}")
    };
    full.parse()
        .map_err(|e: hmc_core::Error| errors::invalid(format!("{e} (HOST:PORT also works)")))
}

/// An RPC client over one pipelined connection (reconnecting after a loss). Calls from
/// many threads share it; each releases the GIL while it waits.
#[pyclass(module = "hmc.rpc", frozen)]
pub struct Client {
    client: hmc_rpc::Client,
    timeout: Duration,
}

impl Client {
    fn opts(&self, timeout_ms: Option<u64>) -> CallOptions {
        CallOptions {
            timeout: Some(timeout_ms.map_or(self.timeout, millis)),
            ..CallOptions::default()
        }
    }
}

#[pymethods]
impl Client {
    /// Connects to the server at ``address`` (``HOST:PORT``, ``tcp://HOST:PORT`` or
    /// ``unix:///path``). ``timeout_ms`` is the default deadline of a call.
    #[new]
    #[pyo3(signature = (address, timeout_ms = 30_000, connect_timeout_ms = 5_000))]
    fn new(
        py: Python<'_>,
        address: &str,
        timeout_ms: u64,
        connect_timeout_ms: u64,
    ) -> PyResult<Self> {
        let addr = parse_addr(address)?;
        let config = ClientConfig {
            connect_timeout: millis(connect_timeout_ms),
            default_timeout: millis(timeout_ms),
            ..ClientConfig::default()
        };
        let client = wait(
            py,
            async move { hmc_rpc::Client::connect(&addr, config).await },
        )?
        .map_err(errors::call)?;
        Ok(Client {
            client,
            timeout: millis(timeout_ms),
        })
    }

    /// Calls ``method`` with ``payload`` and returns the answer's bytes. A non-OK answer
    /// raises ``RpcError`` (with ``status``); a passed deadline ``TimeoutError``.
    #[pyo3(signature = (method, payload, timeout_ms = None))]
    fn call<'py>(
        &self,
        py: Python<'py>,
        method: u32,
        payload: &[u8],
        timeout_ms: Option<u64>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let payload = Bytes::copy_from_slice(payload);
        let opts = self.opts(timeout_ms);
        let out = wait(py, self.client.call_with(method, payload, opts))?.map_err(errors::call)?;
        Ok(PyBytes::new(py, &out))
    }

    /// The demo method ``echo`` (1): the payload back.
    #[pyo3(signature = (payload, timeout_ms = None))]
    fn echo<'py>(
        &self,
        py: Python<'py>,
        payload: &[u8],
        timeout_ms: Option<u64>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        self.call(py, ECHO, payload, timeout_ms)
    }

    /// The demo method ``uppercase`` (2): the text upper-cased.
    #[pyo3(signature = (text, timeout_ms = None))]
    fn uppercase(&self, py: Python<'_>, text: String, timeout_ms: Option<u64>) -> PyResult<String> {
        let opts = self.opts(timeout_ms);
        wait(
            py,
            self.client
                .call_typed_with::<_, String>(UPPERCASE, &text, opts),
        )?
        .map_err(errors::call)
    }

    /// The demo method ``complex`` (3): a summary of ``values`` as a dict (``label``
    /// upper-cased, ``count``, ``sum``, ``min``, ``max``, ``mean``).
    #[pyo3(signature = (label, values, timeout_ms = None))]
    fn complex<'py>(
        &self,
        py: Python<'py>,
        label: String,
        values: Vec<i64>,
        timeout_ms: Option<u64>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let opts = self.opts(timeout_ms);
        let req = ComplexRequest { label, values };
        let r: ComplexResponse =
            wait(py, self.client.call_typed_with(COMPLEX, &req, opts))?.map_err(errors::call)?;
        let d = PyDict::new(py);
        d.set_item("label", r.label)?;
        d.set_item("count", r.count)?;
        d.set_item("sum", r.sum)?;
        d.set_item("min", r.min)?;
        d.set_item("max", r.max)?;
        d.set_item("mean", r.mean)?;
        Ok(d)
    }

    /// The server's address.
    #[getter]
    fn address(&self) -> String {
        self.client.server_addr().to_string()
    }
}

/// The answer of a Python handler: bytes-like out, an exception as a status.
fn run_handler(handler: &Py<PyAny>, payload: Bytes) -> Result<Bytes, RpcError> {
    Python::attach(|py| {
        let out = handler
            .call1(py, (PyBytes::new(py, &payload),))
            .map_err(|e| handler_error(py, e))?;
        let out = out.bind(py);
        if let Ok(b) = out.cast::<PyBytes>() {
            return Ok(Bytes::copy_from_slice(b.as_bytes()));
        }
        let v: Vec<u8> = out.extract().map_err(|_| {
            RpcError::new(
                Status::INTERNAL,
                format!(
                    "the handler returned {}, not bytes; return bytes, bytearray or memoryview",
                    out.get_type()
                        .name()
                        .map(|n| n.to_string())
                        .unwrap_or_default()
                ),
            )
        })?;
        Ok(Bytes::from(v))
    })
}

/// A handler's exception: ``hmc.RpcError`` keeps its status, anything else is INTERNAL
/// with the exception's type and message.
fn handler_error(py: Python<'_>, e: PyErr) -> RpcError {
    let v = e.value(py);
    if let Ok(status) = v.getattr("status").and_then(|s| s.extract::<u32>())
        && status != 0
    {
        return RpcError::new(
            Status(status),
            v.str().map(|s| s.to_string()).unwrap_or_default(),
        );
    }
    let ty = e
        .get_type(py)
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default();
    RpcError::new(Status::INTERNAL, format!("handler raised {ty}: {}", v))
}

/// An RPC server at ``bind``. Register Python handlers with ``register(method,
/// handler)`` (``handler(payload: bytes) -> bytes``; raise ``hmc.RpcError(msg, status)``
/// to answer a status), then ``start()`` (returns once listening; see ``address``) or
/// ``serve()`` (blocks until ``shutdown()`` or Ctrl-C). With ``demo=True`` (the default)
/// it also answers the demo methods ``echo``, ``uppercase`` and ``complex``. Handlers run
/// on ``workers`` threads of their own, never on the I/O threads.
#[pyclass(module = "hmc.rpc", frozen)]
pub struct Server {
    bind: PeerAddr,
    workers: usize,
    dispatcher: Mutex<Option<Dispatcher>>,
    running: Mutex<Option<Arc<RunningServer>>>,
}

impl Server {
    fn running(&self) -> PyResult<Arc<RunningServer>> {
        self.running.lock().clone().ok_or_else(|| {
            errors::state("the server is not running; call start() or serve() first")
        })
    }
}

#[pymethods]
impl Server {
    #[new]
    #[pyo3(signature = (bind, demo = true, workers = 4))]
    fn new(bind: &str, demo: bool, workers: usize) -> PyResult<Self> {
        let mut d = Dispatcher::new();
        if demo {
            hmc_rpc::demo::register_demo(&mut d);
        }
        Ok(Server {
            bind: parse_addr(bind)?,
            workers: workers.max(1),
            dispatcher: Mutex::new(Some(d)),
            running: Mutex::new(None),
        })
    }

    /// Makes ``handler(payload: bytes) -> bytes`` the method ``method`` (replacing a
    /// demo method of that id). Register before ``start()``/``serve()``.
    fn register(&self, method: u32, handler: Py<PyAny>) -> PyResult<()> {
        let mut d = self.dispatcher.lock();
        let d = d.as_mut().ok_or_else(|| {
            errors::state(
                "the server already started; register every method before start()/serve()",
            )
        })?;
        d.register_raw_blocking(method, move |_ctx, payload| run_handler(&handler, payload));
        Ok(())
    }

    /// Starts listening and returns; idempotent.
    fn start(&self, py: Python<'_>) -> PyResult<()> {
        if self.running.lock().is_some() {
            return Ok(());
        }
        let Some(d) = self.dispatcher.lock().take() else {
            return Err(errors::state("the server was shut down; make a new Server"));
        };
        let config = ServerConfig {
            workers: self.workers,
            ..ServerConfig::default()
        };
        let bind = self.bind.clone();
        let running = wait(py, async move {
            hmc_rpc::Server::new(d, config).bind(&bind).await
        })?
        .map_err(|e| {
            errors::new(
                "UnavailableError",
                format!("cannot listen at {}: {e}", self.bind),
            )
        })?;
        *self.running.lock() = Some(Arc::new(running));
        Ok(())
    }

    /// The address clients connect to (with the port chosen if 0 was given), as
    /// ``HOST:PORT`` for TCP.
    #[getter]
    fn address(&self) -> PyResult<String> {
        Ok(match self.running()?.local_addr() {
            PeerAddr::Tcp(a) => a.to_string(),
            other => other.to_string(),
        })
    }

    /// Starts (if needed) and blocks until ``shutdown()`` is called from another thread
    /// or Ctrl-C, which shuts the server down and raises ``KeyboardInterrupt``.
    fn serve(&self, py: Python<'_>) -> PyResult<()> {
        self.start(py)?;
        let running = self.running()?;
        let r = running.clone();
        match wait(py, async move { r.wait().await }) {
            Ok(()) => Ok(()),
            Err(e) => {
                let _ = wait(py, async move { running.shutdown().await });
                Err(e)
            }
        }
    }

    /// Stops taking calls, lets calls in flight finish (up to the grace period) and
    /// closes the listener.
    fn shutdown(&self, py: Python<'_>) -> PyResult<()> {
        let running = self.running.lock().clone();
        if let Some(r) = running {
            wait(py, async move { r.shutdown().await })?;
        }
        Ok(())
    }

    /// Starts the server (``with Server(...) as s:``).
    fn __enter__(slf: Py<Self>, py: Python<'_>) -> PyResult<Py<Self>> {
        slf.get().start(py)?;
        Ok(slf)
    }

    /// Shuts the server down; exceptions propagate.
    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.shutdown(py)?;
        Ok(false)
    }
}

/// Adds the RPC classes to the module.
pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Client>()?;
    m.add_class::<Server>()?;
    Ok(())
}
