//! A blocking client that drives its connection on the calling thread: no runtime and no thread hop; the caller writes the request and sleeps in `read` for the answer.
//!
//! [`BlockingClient`](crate::BlockingClient) runs the async client on a runtime thread of
//! its own, so every call crosses threads twice; it suits callers that issue calls from
//! many threads at once. [`DirectClient`] is the other trade: the caller's thread writes
//! the request and sleeps in `read` for the answer, exactly as a raw TCP ping-pong does,
//! and the process runs no runtime threads at all (for embedding in synchronous code, or in
//! processes that must not start threads behind the caller's back). Beside the async
//! client (figures in docs/benchmarks.md): about as fast on busy cores, where the server's
//! path dominates, and slower on idle ones, where the async client busy-polls for the
//! answer while a sleeping reader must be woken. Calls from several
//! threads take turns on the one connection. The protocol is the same sans-IO
//! [`ClientConn`] the async client drives: deadlines (CANCEL on expiry), keepalive,
//! TCP_STREAM payloads, GOAWAY. A lost connection fails the call in flight (never
//! replayed); the next call reconnects. No data plane.

use std::io::{IoSlice, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hmc_core::{Error, PeerAddr};
use parking_lot::Mutex;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::client::{CallError, CallOptions, ClientConfig};
use crate::codec::RpcCodec;
use crate::frame::Status;
use crate::proto::{ClientConn, ClientEvent, ReadTarget, StartError};

/// Bytes offered to each read.
const READ_CHUNK: usize = 256 * 1024;

/// A connected blocking socket.
enum Sock {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Sock {
    fn connect(addr: &PeerAddr, timeout: Duration) -> Result<Sock, CallError> {
        let io = |what: String| move |e| CallError::Connect(Error::io(what, e));
        match addr {
            PeerAddr::Tcp(a) => {
                let s = TcpStream::connect_timeout(a, timeout).map_err(io(format!(
                    "connecting to tcp://{a} (is an RPC server listening there?)"
                )))?;
                s.set_nodelay(true)
                    .map_err(io("setting TCP_NODELAY".into()))?;
                Ok(Sock::Tcp(s))
            }
            PeerAddr::Unix(p) => UnixStream::connect(p).map(Sock::Unix).map_err(io(format!(
                "connecting to unix://{} (is an RPC server listening there?)",
                p.display()
            ))),
            other => Err(CallError::Connect(Error::InvalidArgument(format!(
                "{other} is not an RPC address; use tcp://IP:PORT or unix:///path"
            )))),
        }
    }

    /// This end's address of a TCP connection, for the call spans.
    fn local_tcp_addr(&self) -> Option<std::net::SocketAddr> {
        match self {
            Sock::Tcp(s) => s.local_addr().ok(),
            Sock::Unix(_) => None,
        }
    }

    /// Timeouts of the next blocking read and write; `None` blocks without limit.
    fn set_timeouts(&self, t: Option<Duration>) -> std::io::Result<()> {
        // A zero timeout means "none" to the socket API: wait at least a microsecond.
        let t = t.map(|t| t.max(Duration::from_micros(1)));
        match self {
            Sock::Tcp(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
            Sock::Unix(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
        }
    }

    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.read(buf),
            Sock::Unix(s) => s.read(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.write_vectored(bufs),
            Sock::Unix(s) => s.write_vectored(bufs),
        }
    }
}

/// One connection and its protocol state.
struct Conn {
    sock: Sock,
    core: ClientConn,
    /// The server sent GOAWAY: the next call reconnects.
    draining: bool,
    /// Scratch for reads that append to a stream's reassembly buffer.
    scratch: Vec<u8>,
    /// A write ran out of time with bytes still queued (possibly half a frame): the
    /// connection cannot carry another call.
    broken: bool,
}

/// How waiting on the socket ended.
enum Waited {
    Bytes,
    TimedOut,
}

impl Conn {
    /// Writes everything queued, blocking; `until` bounds the wait. `Ok(false)`: `until`
    /// passed with bytes still queued (the connection is then `broken`).
    fn flush(&mut self, until: Instant) -> Result<bool, String> {
        while self.core.has_tx() {
            let now = Instant::now();
            if now >= until {
                self.broken = true;
                return Ok(false);
            }
            self.sock
                .set_timeouts(Some(until - now))
                .map_err(|e| format!("setting socket timeouts: {e}"))?;
            let r = {
                let mut slices = [IoSlice::new(&[]); 64];
                let n = self.core.tx_slices(&mut slices);
                if n == 0 {
                    return Ok(true);
                }
                self.sock.write_vectored(&slices[..n])
            };
            match r {
                Ok(0) => return Err("the server closed the connection".into()),
                Ok(n) => self.core.advance_tx(n),
                Err(e) if is_timeout(&e) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("write failed: {e}")),
            }
        }
        Ok(true)
    }

    /// Blocks until bytes arrive (fed to the core) or `until` passes.
    fn wait(&mut self, until: Instant) -> Result<Waited, String> {
        let now = Instant::now();
        if now >= until {
            return Ok(Waited::TimedOut);
        }
        self.sock
            .set_timeouts(Some(until - now))
            .map_err(|e| format!("setting socket timeouts: {e}"))?;
        let r = match self.core.read_target(READ_CHUNK) {
            ReadTarget::Input(b) => self.sock.read(b),
            ReadTarget::Append(v, max) => {
                // Through a scratch buffer: the stream's buffer has the capacity, but
                // reading into its spare capacity would need `unsafe`.
                self.scratch.resize(max.min(READ_CHUNK), 0);
                self.sock.read(&mut self.scratch).inspect(|&n| {
                    v.extend_from_slice(&self.scratch[..n]);
                })
            }
        };
        match r {
            Ok(0) => Err("the server closed the connection".into()),
            Ok(n) => {
                self.core.handle_read(n, Instant::now());
                Ok(Waited::Bytes)
            }
            Err(e) if is_timeout(&e) || e.kind() == std::io::ErrorKind::Interrupted => {
                Ok(Waited::TimedOut)
            }
            Err(e) => Err(format!("read failed: {e}")),
        }
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// A blocking RPC client that makes each call on the calling thread (see the module docs).
pub struct DirectClient {
    addr: PeerAddr,
    config: ClientConfig,
    conn: Mutex<Option<Conn>>,
    next_id: AtomicU64,
}

impl DirectClient {
    /// Connects to `addr` (TCP or Unix socket).
    pub fn connect(addr: &PeerAddr, config: ClientConfig) -> Result<Self, CallError> {
        let c = DirectClient {
            addr: addr.clone(),
            config,
            conn: Mutex::new(None),
            next_id: AtomicU64::new(1),
        };
        *c.conn.lock() = Some(c.open()?);
        Ok(c)
    }

    fn open(&self) -> Result<Conn, CallError> {
        let sock = Sock::connect(&self.addr, self.config.connect_timeout)?;
        Ok(Conn {
            sock,
            core: ClientConn::new(self.config.conn.clone(), Instant::now()),
            draining: false,
            scratch: Vec::new(),
            broken: false,
        })
    }

    /// The server this client calls.
    pub fn server_addr(&self) -> &PeerAddr {
        &self.addr
    }

    /// Calls `method` with raw bytes and the default deadline.
    pub fn call(&self, method: u32, payload: impl Into<Bytes>) -> Result<Bytes, CallError> {
        self.call_with(method, payload, CallOptions::default())
    }

    /// A typed call (the [`RpcCodec`] format both ways).
    pub fn call_typed<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        method: u32,
        req: &Req,
    ) -> Result<Resp, CallError> {
        let r = self.call(method, RpcCodec::encode(req)?)?;
        Ok(RpcCodec::decode(&r)?)
    }

    /// Calls `method` with raw bytes. Waits its turn behind calls of other threads on this
    /// client; the deadline counts from here.
    pub fn call_with(
        &self,
        method: u32,
        payload: impl Into<Bytes>,
        opts: CallOptions,
    ) -> Result<Bytes, CallError> {
        let payload = payload.into();
        let span = crate::trace::call(&self.addr, method);
        let r = span.in_scope(|| self.call_in_span(method, payload, opts, &span));
        crate::trace::finished(&span, &r);
        r
    }

    fn call_in_span(
        &self,
        method: u32,
        payload: Bytes,
        opts: CallOptions,
        span: &tracing::Span,
    ) -> Result<Bytes, CallError> {
        let timeout = opts.timeout.unwrap_or(self.config.default_timeout);
        let start = Instant::now();
        let deadline = start + timeout;
        let mut guard = self.conn.lock();
        if guard.as_ref().is_none_or(|c| c.draining || c.broken) {
            *guard = None;
            *guard = Some(self.open()?);
        }
        let conn = guard.as_mut().expect("connected above");
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        crate::trace::sent(span, id, || conn.sock.local_tcp_addr());
        match conn
            .core
            .start_call_with_id(id, method, payload, Some(deadline), false, start)
        {
            Ok(()) => {}
            Err(StartError::Closed(why)) => {
                *guard = None;
                return Err(CallError::Status {
                    status: Status::SHUTTING_DOWN,
                    message: why,
                });
            }
            Err(e) => return Err(CallError::Refused(e)),
        }
        let r = Self::drive(conn, id, deadline);
        if let Err(CallError::ConnectionLost(why)) = &r {
            conn.core.connection_lost(why);
            *guard = None;
        }
        match r {
            Err(CallError::DeadlineExceeded(_)) => {
                Err(CallError::DeadlineExceeded(start.elapsed()))
            }
            r => r,
        }
    }

    /// Runs the connection until call `id` is answered or fails.
    fn drive(conn: &mut Conn, id: u64, deadline: Instant) -> Result<Bytes, CallError> {
        let lost = CallError::ConnectionLost;
        loop {
            while let Some(ev) = conn.core.poll_event() {
                match ev {
                    ClientEvent::Response {
                        request_id,
                        status,
                        payload,
                    } if request_id == id => {
                        return if status == Status::OK {
                            Ok(payload)
                        } else {
                            Err(CallError::answered(status, &payload))
                        };
                    }
                    ClientEvent::TimedOut { request_id } if request_id == id => {
                        // The core queued a CANCEL; send it if the socket takes it at once.
                        let _ = conn.flush(Instant::now() + Duration::from_millis(10));
                        return Err(CallError::DeadlineExceeded(Duration::ZERO));
                    }
                    ClientEvent::ResponseInBuffer { request_id, .. } if request_id == id => {
                        return Err(lost(
                            "an HMC_BUFFER answer to a call that asked for none".into(),
                        ));
                    }
                    ClientEvent::Draining { reason } => {
                        tracing::debug!(%reason, "server draining; the next call reconnects");
                        conn.draining = true;
                    }
                    // Answers to calls given up earlier (deadline) carry other ids.
                    _ => {}
                }
            }
            if let Some(why) = conn.core.closed_reason() {
                return Err(lost(why.to_string()));
            }
            // Everything queued goes out first (the request, PONGs, CANCELs); the
            // deadline of the call bounds it.
            if !conn.flush(deadline).map_err(lost)? {
                return Err(CallError::DeadlineExceeded(Duration::ZERO));
            }
            let wake = conn
                .core
                .poll_timeout()
                .map_or(deadline, |t| t.min(deadline));
            match conn.wait(wake).map_err(lost)? {
                Waited::Bytes => {}
                // Expires the call's deadline (a TimedOut event) and runs the keepalive.
                Waited::TimedOut => conn.core.handle_timeout(Instant::now()),
            }
        }
    }
}
