//! The control connection beside every UCX endpoint: a small TCP protocol that bootstraps the endpoint (worker-address exchange), confirms keys at import, revokes keys at deregistration, and reports the peer's death by EOF.
//!
//! Frames are `kind u8, length u32 (big-endian), payload`:
//!
//! | kind | direction | payload |
//! | --- | --- | --- |
//! | 1 HELLO | initiator → target | version `u8` (2; a target accepts 1 too) |
//! | 2 HELLO_ACK | target → initiator | the target's UCX worker address |
//! | 3 VALIDATE | initiator → target | request id `u64`, region id `u64`, the descriptor as exported |
//! | 4 VALID | target → initiator | request id `u64`, verdict `u8` (0 live, 1 unknown or deregistered, 2 differs from the export) |
//! | 5 REVOKE | target → initiator | region id `u64` |
//! | 6 REVOKED | initiator → target | region id `u64` |
//! | 7 STAGED_READ | initiator → target | request id, region id, offset, length (`u64` each) |
//! | 8 STAGED_DATA | target → initiator | request id `u64`, bytes |
//! | 9 STAGED_DONE | target → initiator | request id `u64`, status `u8`, detail |
//! | 10 STAGED_WRITE | initiator → target | request id, region id, offset (`u64` each), last `u8`, bytes |
//! | 11 ABANDON | initiator → target | endpoint generation token `u64` |
//! | 12 ABANDONED | target → initiator | token `u64`, verdict `u8` (0 dropped, 1 unknown generation) |
//!
//! Frames 7-10 move device regions the loaded UCX cannot register (see `staged.rs`).
//! Frames 11-12 end a UCX endpoint generation whose bytes the target must drop (see the
//! engine's `generations` module): the target settles these connections (every frame
//! received handled, `TargetState`'s `wait_idle`) before it progresses again after a stall.
//!
//! Why: UCX neither checks a registration's access rights for TCP or shared memory nor
//! invalidates an rkey when its memory is unmapped (a CMA put with a stale key writes into
//! whatever now lives at that address). So the target stays the authority: an import is
//! accepted only when the target confirms the descriptor byte for byte (a forged key never
//! reaches `ucp_ep_rkey_unpack`, and the rights and bounds the initiator enforces are the
//! target's), and a deregistration first revokes the key at every peer that imported it and
//! waits until their in-flight operations on it have drained.

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak, mpsc};
use std::time::Duration;

use hmc_core::{Access, Error, Op, Result};
use hmc_transport_kit::wake::poll_in;
use parking_lot::Mutex;

use crate::engine::{AbandonAck, Command, Engine, InitiatorControl, KeyShared, TargetControl};
use crate::staged::{
    Refusal, STAGED_CHUNK, STAGED_ID_BIT, StagedEvent, StagedRegion, StagingPool, WRITE_HEADER,
    admit, serve_read, serve_write,
};

pub(crate) const HELLO: u8 = 1;
pub(crate) const HELLO_ACK: u8 = 2;
pub(crate) const VALIDATE: u8 = 3;
pub(crate) const VALID: u8 = 4;
pub(crate) const REVOKE: u8 = 5;
pub(crate) const REVOKED: u8 = 6;
pub(crate) const ABANDON: u8 = 11;
pub(crate) const ABANDONED: u8 = 12;
pub(crate) use crate::staged::{STAGED_DATA, STAGED_DONE, STAGED_READ, STAGED_WRITE};
/// Refused WRITE requests a connection may leave unfinished (their last frame not sent
/// yet) before the target drops it as misbehaving.
const MAX_UNFINISHED_REFUSED: usize = 1024;
/// The control protocol version an initiator sends: 2 binds every UCX endpoint's
/// generation (the engine's `generations`), whose BOUND answer a version-1 target never
/// sends; such a target refuses the HELLO, so the mismatch is a failed connect rather than
/// transfers that wait for a BOUND until their deadline.
pub(crate) const VERSION: u8 = 2;
/// The versions a target accepts: a version-1 initiator never binds, which costs the
/// target nothing (its transfers are just not protected against this target stopping).
const ACCEPTED_VERSIONS: [u8; 2] = [1, VERSION];
/// Largest control frame accepted (worker addresses and descriptors are far smaller).
pub(crate) const MAX_FRAME: usize = 1 << 20;

pub(crate) use hmc_transport_kit::control_frame::write_frame;
pub(crate) use hmc_transport_kit::control_frame::write_frame_parts;

/// Reads one control frame, refusing one over [`MAX_FRAME`] from its header.
pub(crate) fn read_frame(r: &mut impl Read) -> std::io::Result<(u8, Vec<u8>)> {
    hmc_transport_kit::control_frame::read_frame(r, MAX_FRAME)
}

fn be_u64(b: &[u8], at: usize) -> Option<u64> {
    b.get(at..at + 8)
        .map(|s| u64::from_be_bytes(s.try_into().expect("8 bytes")))
}

/// Target-side state shared by the listener, the accepted connections and registrations.
pub(crate) struct TargetState {
    /// Live exported registrations: id → the descriptor bytes as exported.
    pub regs: Mutex<HashMap<u64, Vec<u8>>>,
    /// The device regions among them that are served through `pool` (`staged.rs`).
    pub staged: Mutex<HashMap<u64, Arc<StagedRegion>>>,
    pub pool: StagingPool,
    next_staged: AtomicU64,
    pub conns: Mutex<HashMap<u64, Arc<Accepted>>>,
    pub next_conn: AtomicU64,
    pub closed: AtomicBool,
    /// Generations peers abandoned, with the answer to send, for the engine to end.
    abandons: Mutex<Vec<(u64, AbandonAck)>>,
}

/// One initiator connected to us.
pub(crate) struct Accepted {
    pub stream: TcpStream,
    writer: Mutex<TcpStream>,
    /// Regions this initiator imported (must be revoked there before unmapping).
    imported: Mutex<HashSet<u64>>,
    revokes: Mutex<HashMap<u64, mpsc::SyncSender<()>>>,
    /// Set from the moment a frame is readable until it has been handled.
    busy: AtomicBool,
}

impl TargetState {
    /// State with a staging pool of at most `max_staging_bytes`.
    pub fn new(max_staging_bytes: usize) -> Self {
        TargetState {
            regs: Mutex::default(),
            staged: Mutex::default(),
            pool: StagingPool::new(max_staging_bytes),
            next_staged: AtomicU64::new(1),
            conns: Mutex::default(),
            next_conn: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            abandons: Mutex::default(),
        }
    }

    /// A registration id for a staged region (never one of the progress thread's).
    pub fn staged_id(&self) -> u64 {
        STAGED_ID_BIT | self.next_staged.fetch_add(1, Ordering::Relaxed)
    }

    /// The staged region `reg` if `conn` imported it.
    fn staged_for(&self, conn: &Accepted, reg: u64) -> Option<Arc<StagedRegion>> {
        if !conn.imported.lock().contains(&reg) {
            return None;
        }
        self.staged.lock().get(&reg).cloned()
    }

    /// Serves a `STAGED_READ`: data frames, then the answer.
    fn staged_read(&self, conn: &Accepted, p: &[u8], wait: Duration) -> std::io::Result<()> {
        let (Some(req), Some(reg), Some(off), Some(len)) =
            (be_u64(p, 0), be_u64(p, 8), be_u64(p, 16), be_u64(p, 24))
        else {
            return Err(invalid("short STAGED_READ"));
        };
        let region = self.staged_for(conn, reg);
        let outcome = match admit(region.as_ref(), Access::required_by(Op::Read), off, len) {
            Err(r) => Err(r),
            Ok(r) => serve_read(&self.pool, &r, off, len, wait, |bytes| {
                write_frame_parts(
                    &mut *conn.writer.lock(),
                    STAGED_DATA,
                    &[&req.to_be_bytes(), bytes],
                )
            })?,
        };
        conn.answer(req, outcome)
    }

    /// Applies a `STAGED_WRITE` frame; answers at its request's first refusal or last frame.
    fn staged_write(
        &self,
        conn: &Accepted,
        p: &[u8],
        refused: &mut HashSet<u64>,
    ) -> std::io::Result<()> {
        let (Some(req), Some(reg), Some(off), Some(&last)) =
            (be_u64(p, 0), be_u64(p, 8), be_u64(p, 16), p.get(24))
        else {
            return Err(invalid("short STAGED_WRITE"));
        };
        let last = last != 0;
        let data = &p[WRITE_HEADER..];
        if data.len() > STAGED_CHUNK {
            return Err(invalid("a STAGED_WRITE frame longer than a staging chunk"));
        }
        if refused.contains(&req) {
            // Already answered: drop the rest of the request.
            if last {
                refused.remove(&req);
            }
            return Ok(());
        }
        let region = self.staged_for(conn, reg);
        let outcome = admit(
            region.as_ref(),
            Access::required_by(Op::Write),
            off,
            data.len() as u64,
        )
        .and_then(|r| serve_write(&self.pool, &r, off, data));
        match outcome {
            Err(r) => {
                if !last {
                    if refused.len() >= MAX_UNFINISHED_REFUSED {
                        return Err(invalid(
                            "too many refused STAGED_WRITE requests left unfinished",
                        ));
                    }
                    refused.insert(req);
                }
                conn.answer(req, Err(r))
            }
            Ok(()) if last => conn.answer(req, Ok(())),
            Ok(()) => Ok(()),
        }
    }

    /// Serves one accepted connection until it closes.
    pub fn serve(self: &Arc<Self>, stream: TcpStream, engine: &Engine, timeout: Duration) {
        let peer = stream
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        if let Err(e) = self.serve_inner(stream, engine, timeout) {
            tracing::debug!(%peer, error = %e, "ucx control connection ended");
        }
    }

    fn serve_inner(
        self: &Arc<Self>,
        mut stream: TcpStream,
        engine: &Engine,
        timeout: Duration,
    ) -> std::io::Result<()> {
        accept_hello(&mut stream, engine, timeout)?;
        let id = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Accepted::new(&stream)?);
        self.conns.lock().insert(id, conn.clone());
        if self.closed.load(Ordering::Acquire) {
            let _ = conn.stream.shutdown(Shutdown::Both);
        }
        let result = self.serve_frames(&conn, stream, engine, timeout);
        self.conns.lock().remove(&id);
        // Dropping the pending revocation senders wakes their waiters: this peer is gone.
        conn.revokes.lock().clear();
        result
    }

    /// Handles the frames of accepted connection `conn` (read from `stream`) until it
    /// closes or sends one this side refuses.
    fn serve_frames(
        &self,
        conn: &Arc<Accepted>,
        mut stream: TcpStream,
        engine: &Engine,
        timeout: Duration,
    ) -> std::io::Result<()> {
        let mut refused = HashSet::new();
        let fd = stream.as_raw_fd();
        loop {
            // Idle between frames; busy from readable until handled (`wait_idle`).
            conn.busy.store(false, Ordering::SeqCst);
            let _ = poll_in([fd], None);
            conn.busy.store(true, Ordering::SeqCst);
            let (kind, payload) = read_frame(&mut stream)?;
            match kind {
                ABANDON => self.queue_abandon(conn, &payload, engine)?,
                STAGED_READ => self.staged_read(conn, &payload, timeout)?,
                STAGED_WRITE => self.staged_write(conn, &payload, &mut refused)?,
                VALIDATE => self.validate(conn, &payload)?,
                REVOKED => conn.revoked(&payload),
                other => return Err(invalid(&format!("unexpected control frame kind {other}"))),
            }
        }
    }

    /// An `ABANDON`: queued, with its answer, for the engine to end the generation.
    fn queue_abandon(
        &self,
        conn: &Arc<Accepted>,
        p: &[u8],
        engine: &Engine,
    ) -> std::io::Result<()> {
        let Some(token) = be_u64(p, 0) else {
            return Err(invalid("short ABANDON"));
        };
        let c = conn.clone();
        let ack: AbandonAck = Box::new(move |ended| {
            let mut out = token.to_be_bytes().to_vec();
            out.push(if ended { 0 } else { 1 });
            if let Err(e) = write_frame(&mut *c.writer.lock(), ABANDONED, &out) {
                tracing::debug!(error = %e, "could not answer an ABANDON");
            }
        });
        self.abandons.lock().push((token, ack));
        if engine.send(Command::TakeAbandons).is_err() {
            return Err(invalid("the local engine exited"));
        }
        Ok(())
    }

    /// A `VALIDATE`: compares the descriptor with the export and answers `VALID`; a live
    /// match counts as imported by `conn` (revoked there before unmapping).
    fn validate(&self, conn: &Accepted, p: &[u8]) -> std::io::Result<()> {
        let (Some(req), Some(reg)) = (be_u64(p, 0), be_u64(p, 8)) else {
            return Err(invalid("short VALIDATE"));
        };
        let verdict = {
            let regs = self.regs.lock();
            match regs.get(&reg) {
                None => 1u8,
                Some(desc) if desc[..] != p[16..] => 2,
                Some(_) => {
                    conn.imported.lock().insert(reg);
                    0
                }
            }
        };
        let mut out = req.to_be_bytes().to_vec();
        out.push(verdict);
        write_frame(&mut *conn.writer.lock(), VALID, &out)
    }

    /// Forgets registration `id` and revokes it at every peer that imported it, waiting up
    /// to `timeout` for each to confirm that nothing of it is in flight any more.
    pub fn revoke(&self, id: u64, timeout: Duration) {
        let mut waits = Vec::new();
        {
            let mut regs = self.regs.lock();
            regs.remove(&id);
            for conn in self.conns.lock().values() {
                if conn.imported.lock().remove(&id) {
                    let (tx, rx) = mpsc::sync_channel(1);
                    conn.revokes.lock().insert(id, tx);
                    if write_frame(&mut *conn.writer.lock(), REVOKE, &id.to_be_bytes()).is_ok() {
                        waits.push((conn.clone(), rx));
                    }
                }
            }
        }
        for (conn, rx) in waits {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(timeout) {
                tracing::warn!(
                    region = id,
                    ?timeout,
                    "a peer did not confirm a key revocation within revoke_timeout; \
                     disconnecting it before unmapping (raise UcxConfig::revoke_timeout for slow peers)"
                );
                let _ = conn.stream.shutdown(Shutdown::Both);
            }
        }
    }

    /// Closes every accepted connection.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        for conn in self.conns.lock().values() {
            let _ = conn.stream.shutdown(Shutdown::Both);
        }
    }
}

impl TargetControl for TargetState {
    /// The abandons queued since the last call.
    fn take_abandons(&self) -> Vec<(u64, AbandonAck)> {
        std::mem::take(&mut *self.abandons.lock())
    }

    /// Waits, at most `limit`, until every frame the control connections have received
    /// has been handled: nothing unread in any socket and no frame in hand.
    fn wait_idle(&self, limit: Duration) {
        let until = std::time::Instant::now() + limit;
        loop {
            let idle = self.conns.lock().values().all(|c| c.idle());
            if idle {
                return;
            }
            if std::time::Instant::now() >= until {
                tracing::warn!(
                    ?limit,
                    "ucx control connections did not settle after a stall; progressing anyway"
                );
                return;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// The target's half of the handshake on `stream`: a `HELLO` of an accepted version in,
/// `HELLO_ACK` with this side's worker address out.
fn accept_hello(stream: &mut TcpStream, engine: &Engine, timeout: Duration) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let (kind, payload) = read_frame(stream)?;
    if kind != HELLO
        || !payload
            .first()
            .is_some_and(|v| ACCEPTED_VERSIONS.contains(v))
    {
        return Err(invalid("expected HELLO v1 or v2"));
    }
    write_frame(stream, HELLO_ACK, &engine.worker_address)?;
    stream.set_read_timeout(None)
}

fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}

impl Accepted {
    /// An accepted connection over `stream`, past its handshake.
    fn new(stream: &TcpStream) -> std::io::Result<Self> {
        Ok(Accepted {
            stream: stream.try_clone()?,
            writer: Mutex::new(stream.try_clone()?),
            imported: Mutex::new(HashSet::new()),
            revokes: Mutex::new(HashMap::new()),
            busy: AtomicBool::new(false),
        })
    }

    /// A `REVOKED`: wakes the deregistration waiting for it.
    fn revoked(&self, p: &[u8]) {
        if let Some(reg) = be_u64(p, 0)
            && let Some(tx) = self.revokes.lock().remove(&reg)
        {
            let _ = tx.send(());
        }
    }

    /// Whether every frame received on this connection has been handled.
    fn idle(&self) -> bool {
        // Unread bytes first: a frame read since is `busy` until handled.
        let mut unread: libc::c_int = 0;
        // SAFETY: FIONREAD on our own socket, writing one int.
        let r = unsafe { libc::ioctl(self.stream.as_raw_fd(), libc::FIONREAD, &mut unread) };
        (r != 0 || unread == 0) && !self.busy.load(Ordering::SeqCst)
    }

    /// Writes a staged request's `STAGED_DONE`.
    fn answer(&self, req: u64, outcome: std::result::Result<(), Refusal>) -> std::io::Result<()> {
        let body = match outcome {
            Ok(()) => {
                let mut v = req.to_be_bytes().to_vec();
                v.push(0);
                v
            }
            Err(r) => r.encode(req),
        };
        write_frame(&mut *self.writer.lock(), STAGED_DONE, &body)
    }
}

struct PendingImport {
    /// A staged region's key: no UCX rkey to unpack.
    staged: bool,
    ep: u64,
    reg_id: u64,
    rkey: Vec<u8>,
    shared: Arc<KeyShared>,
    reply: mpsc::SyncSender<Result<u64>>,
}

/// Initiator side of one control connection (one per endpoint).
pub(crate) struct Link {
    pub stream: TcpStream,
    writer: Mutex<TcpStream>,
    pending: Mutex<HashMap<u64, PendingImport>>,
    /// Staged transfers waiting for frames, by request id; `None` once the link died.
    staged_ops: Mutex<Option<HashMap<u64, mpsc::SyncSender<StagedEvent>>>>,
    /// Keys of staged regions imported on this link, by region id (for revocation).
    staged_keys: Mutex<HashMap<u64, Vec<Weak<KeyShared>>>>,
    next_req: AtomicU64,
    dead: Mutex<Option<String>>,
    /// ABANDONs waiting for the target's answer, by generation token.
    abandons: Mutex<HashMap<u64, mpsc::SyncSender<bool>>>,
    /// Set when the local endpoint is dropped: the EOF that follows is ours, not a failure.
    pub closing: AtomicBool,
}

impl Link {
    /// Runs the handshake on a connected stream; returns the link and the target's worker
    /// address.
    pub fn handshake(
        mut stream: TcpStream,
        timeout: Duration,
    ) -> std::io::Result<(Arc<Link>, Vec<u8>)> {
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        write_frame(&mut stream, HELLO, &[VERSION])?;
        let (kind, worker) = read_frame(&mut stream).map_err(|e| {
            if e.kind() != std::io::ErrorKind::UnexpectedEof {
                return e;
            }
            // Still an EOF (the engine takes it as the peer possibly gone or replaced).
            std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!(
                    "the peer closed the control connection at HELLO v{VERSION}: it may run an \
                     older hmc-transport-ucx (control protocol version 1, without endpoint \
                     generations); run the same version on both sides"
                ),
            )
        })?;
        if kind != HELLO_ACK || worker.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "expected HELLO_ACK",
            ));
        }
        stream.set_read_timeout(None)?;
        let link = Arc::new(Link {
            stream: stream.try_clone()?,
            writer: Mutex::new(stream),
            pending: Mutex::new(HashMap::new()),
            staged_ops: Mutex::new(Some(HashMap::new())),
            staged_keys: Mutex::new(HashMap::new()),
            next_req: AtomicU64::new(1),
            dead: Mutex::new(None),
            abandons: Mutex::new(HashMap::new()),
            closing: AtomicBool::new(false),
        });
        Ok((link, worker))
    }

    /// Asks the target to confirm a descriptor; on success the reader thread has the engine
    /// unpack the key (ordered before any later revocation of it) and the engine replies.
    #[allow(clippy::too_many_arguments)]
    pub fn validate(
        &self,
        staged: bool,
        ep: u64,
        reg_id: u64,
        descriptor: &[u8],
        rkey: Vec<u8>,
        shared: Arc<KeyShared>,
        timeout: Duration,
    ) -> Result<u64> {
        if let Some(why) = self.dead.lock().clone() {
            return Err(Error::peer("ucx control connection", why));
        }
        let req = self.next_req.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::sync_channel(1);
        self.pending.lock().insert(
            req,
            PendingImport {
                staged,
                ep,
                reg_id,
                rkey,
                shared,
                reply: tx,
            },
        );
        let mut payload = req.to_be_bytes().to_vec();
        payload.extend_from_slice(&reg_id.to_be_bytes());
        payload.extend_from_slice(descriptor);
        if let Err(e) = write_frame(&mut *self.writer.lock(), VALIDATE, &payload) {
            self.pending.lock().remove(&req);
            return Err(Error::peer(
                "ucx control connection",
                format!("sending VALIDATE: {e}"),
            ));
        }
        match rx.recv_timeout(timeout) {
            Ok(r) => r,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                self.pending.lock().remove(&req);
                Err(Error::DeadlineExceeded {
                    during: "ucx key import (target confirmation)",
                    elapsed: timeout,
                })
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(Error::peer(
                "ucx control connection",
                self.dead
                    .lock()
                    .clone()
                    .unwrap_or_else(|| "closed during import".into()),
            )),
        }
    }

    /// A fresh request id.
    pub fn next_req(&self) -> u64 {
        self.next_req.fetch_add(1, Ordering::Relaxed)
    }

    /// Writes one frame of `parts`.
    pub fn send(&self, kind: u8, parts: &[&[u8]]) -> std::io::Result<()> {
        write_frame_parts(&mut *self.writer.lock(), kind, parts)
    }

    /// Routes the frames of staged request `req` to `to`; `Err` (why) once the link died.
    pub fn add_staged(
        &self,
        req: u64,
        to: mpsc::SyncSender<StagedEvent>,
    ) -> std::result::Result<(), String> {
        match self.staged_ops.lock().as_mut() {
            Some(m) => {
                m.insert(req, to);
                Ok(())
            }
            None => Err(self
                .dead_reason()
                .unwrap_or_else(|| "the control connection closed".into())),
        }
    }

    /// Stops routing frames of `req` (later ones are dropped).
    pub fn remove_staged(&self, req: u64) {
        if let Some(m) = self.staged_ops.lock().as_mut() {
            m.remove(&req);
        }
    }

    /// Why the link died, if it did.
    pub fn dead_reason(&self) -> Option<String> {
        self.dead.lock().clone()
    }

    /// Cuts the connection (the reader then reports the peer gone).
    pub fn disconnect(&self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    /// Reads the target's frames until EOF, then reports the peer gone to the engine.
    pub fn read_loop(self: Arc<Self>, ep: u64, engine: Engine) {
        let mut stream = match self.stream.try_clone() {
            Ok(s) => s,
            Err(e) => {
                let _ = engine.send(Command::PeerGone {
                    ep,
                    reason: format!("control connection: {e}"),
                });
                return;
            }
        };
        let reason = self.read_frames(&mut stream, ep, &engine);
        *self.dead.lock() = Some(reason.clone());
        self.pending.lock().clear();
        let waiting = self.staged_ops.lock().take().unwrap_or_default();
        for to in waiting.into_values() {
            let _ = to.send(StagedEvent::Gone);
        }
        if !self.closing.load(Ordering::Acquire) {
            let _ = engine.send(Command::PeerGone { ep, reason });
        }
    }

    /// Handles the target's frames until the connection ends or sends one this side
    /// refuses; why it ended.
    fn read_frames(self: &Arc<Self>, stream: &mut TcpStream, ep: u64, engine: &Engine) -> String {
        loop {
            let (kind, payload) = match read_frame(stream) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    return "the peer closed its control connection (process exited or communicator closed)".to_string();
                }
                Err(e) => return format!("control connection failed: {e}"),
            };
            let handled = match kind {
                VALID => self.valid(&payload, engine),
                REVOKE => self.revoke_asked(&payload, ep, engine),
                ABANDONED => self.abandoned(&payload),
                STAGED_DATA | STAGED_DONE => self.route_staged(kind, payload),
                other => Err(format!("unexpected control frame kind {other}")),
            };
            if let Err(reason) = handled {
                return reason;
            }
        }
    }

    /// A `VALID`: the import waiting for it goes on (a UCX key is unpacked by the
    /// engine, which replies) or fails with the target's verdict.
    fn valid(&self, p: &[u8], engine: &Engine) -> std::result::Result<(), String> {
        let (Some(req), Some(&verdict)) = (be_u64(p, 0), p.get(8)) else {
            return Err("malformed VALID frame".into());
        };
        let Some(import) = self.pending.lock().remove(&req) else {
            return Ok(());
        };
        if verdict == 0 && import.staged {
            let mut keys = self.staged_keys.lock();
            let held = keys.entry(import.reg_id).or_default();
            held.retain(|k| k.strong_count() > 0);
            held.push(Arc::downgrade(&import.shared));
            let _ = import.reply.send(Ok(0));
        } else if verdict == 0 {
            let cmd = Command::ImportKey {
                ep: import.ep,
                reg_id: import.reg_id,
                rkey: import.rkey,
                shared: import.shared,
                reply: import.reply,
            };
            if let Err(Command::ImportKey { reply, .. }) = engine.send_or_return(cmd) {
                let _ = reply.send(Err(Error::Closed(
                    "the UCX progress thread has exited".into(),
                )));
            }
        } else {
            let why = if verdict == 1 {
                "the target has no live registration with this id (deregistered, or never exported)"
            } else {
                "the descriptor differs from what the target exported (forged or damaged)"
            };
            let _ = import.reply.send(Err(Error::InvalidKey(why.into())));
        }
        Ok(())
    }

    /// A `REVOKE`: the keys of that region refuse from now on; `REVOKED` goes back once
    /// nothing of it is in flight here (at once for a staged region, else after the
    /// engine drained it).
    fn revoke_asked(
        self: &Arc<Self>,
        p: &[u8],
        ep: u64,
        engine: &Engine,
    ) -> std::result::Result<(), String> {
        let Some(reg_id) = be_u64(p, 0) else {
            return Err("malformed REVOKE frame".into());
        };
        if let Some(keys) = self.staged_keys.lock().remove(&reg_id) {
            // The target does the copies of a staged region and stops them
            // itself; here the keys only learn to refuse.
            for k in keys.iter().filter_map(Weak::upgrade) {
                k.revoked.store(true, Ordering::Release);
            }
            if let Err(e) = self.send(REVOKED, &[&reg_id.to_be_bytes()]) {
                tracing::debug!(error = %e, "could not confirm a key revocation");
            }
            return Ok(());
        }
        let link = self.clone();
        let ack = Box::new(move || {
            if let Err(e) = write_frame(&mut *link.writer.lock(), REVOKED, &reg_id.to_be_bytes()) {
                tracing::debug!(error = %e, "could not confirm a key revocation");
            }
        });
        if engine.send(Command::Revoke { ep, reg_id, ack }).is_err() {
            return Err("the local engine exited".into());
        }
        Ok(())
    }

    /// An `ABANDONED`: the abandon waiting for it hears the target's verdict.
    fn abandoned(&self, p: &[u8]) -> std::result::Result<(), String> {
        let (Some(token), Some(&verdict)) = (be_u64(p, 0), p.get(8)) else {
            return Err("malformed ABANDONED frame".into());
        };
        if let Some(tx) = self.abandons.lock().remove(&token) {
            let _ = tx.send(verdict == 0);
        }
        Ok(())
    }

    /// A `STAGED_DATA` or `STAGED_DONE`: handed to the staged transfer it belongs to.
    fn route_staged(&self, kind: u8, payload: Vec<u8>) -> std::result::Result<(), String> {
        let Some(req) = be_u64(&payload, 0) else {
            return Err("malformed staged frame".into());
        };
        let to = self
            .staged_ops
            .lock()
            .as_ref()
            .and_then(|m| m.get(&req).cloned());
        if let Some(to) = to {
            let ev = if kind == STAGED_DATA {
                StagedEvent::Data(payload)
            } else {
                StagedEvent::Done(payload)
            };
            // A transfer that ended meanwhile dropped its receiver: its frames
            // are dropped here.
            let _ = to.send(ev);
        }
        Ok(())
    }
}

impl InitiatorControl for Link {
    /// Tells the target to drop UCX endpoint generation `token` (engine's `generations`).
    /// Returns once the target answered that it did (`true`), or else after `wait` and
    /// once the target's host acknowledged the frame, so that it lies in the target's
    /// socket buffer for a stopped target to handle before it progresses (`false`).
    fn abandon(&self, token: u64, wait: Duration) -> bool {
        let (tx, rx) = mpsc::sync_channel(1);
        self.abandons.lock().insert(token, tx);
        if let Err(e) = write_frame(&mut *self.writer.lock(), ABANDON, &token.to_be_bytes()) {
            self.abandons.lock().remove(&token);
            tracing::warn!(error = %e, "could not send ABANDON to the peer");
            return false;
        }
        let answer = rx.recv_timeout(wait);
        self.abandons.lock().remove(&token);
        match answer {
            Ok(true) => return true,
            Ok(false) => {
                tracing::warn!("the peer did not know the abandoned endpoint generation");
                return false;
            }
            Err(_) => {}
        }
        // No answer: the target does not run. Make sure the frame reached its host.
        let until = std::time::Instant::now() + wait;
        loop {
            let mut unacked: libc::c_int = 0;
            // SAFETY: TIOCOUTQ (SIOCOUTQ) on our own socket, writing one int: the bytes
            // sent and not yet acknowledged by the peer's host.
            let r = unsafe { libc::ioctl(self.stream.as_raw_fd(), libc::TIOCOUTQ, &mut unacked) };
            if r != 0 || unacked == 0 {
                return false;
            }
            if std::time::Instant::now() >= until {
                tracing::warn!(
                    ?wait,
                    "the peer's host did not acknowledge ABANDON within abandon_timeout; bytes \
                     of the abandoned transfer may still land there (raise \
                     UcxConfig::abandon_timeout for slow networks)"
                );
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn is_dead(&self) -> bool {
        self.dead.lock().is_some()
    }
}

impl crate::staged::StagedLink for Link {
    fn next_req(&self) -> u64 {
        Link::next_req(self)
    }
    fn send(&self, kind: u8, parts: &[&[u8]]) -> std::io::Result<()> {
        Link::send(self, kind, parts)
    }
    fn add_staged(
        &self,
        req: u64,
        to: mpsc::SyncSender<StagedEvent>,
    ) -> std::result::Result<(), String> {
        Link::add_staged(self, req, to)
    }
    fn remove_staged(&self, req: u64) {
        Link::remove_staged(self, req)
    }
    fn dead_reason(&self) -> Option<String> {
        Link::dead_reason(self)
    }
    fn disconnect(&self) {
        Link::disconnect(self)
    }
}
