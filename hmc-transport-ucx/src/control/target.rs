//! The target's side of the control connections: the listener's accepted connections
//! (one per initiator endpoint), which confirm imports, revoke keys at deregistration,
//! serve staged transfers and queue the abandons of endpoint generations for the engine.

use std::collections::{HashMap, HashSet};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use hmc_core::{Access, Op};
use hmc_transport_kit::wake::poll_in;
use parking_lot::Mutex;

use super::{
    ABANDON, ABANDONED, ACCEPTED_VERSIONS, HELLO, HELLO_ACK, REVOKE, REVOKED, STAGED_DATA,
    STAGED_DONE, STAGED_READ, STAGED_WRITE, VALID, VALIDATE, be_u64, invalid, read_frame,
    write_frame, write_frame_parts,
};
use crate::engine::{AbandonAck, Command, Engine, TargetControl};
use crate::staged::{
    Refusal, STAGED_CHUNK, STAGED_ID_BIT, StagedRegion, StagingPool, WRITE_HEADER, admit,
    serve_read, serve_write,
};

/// Refused WRITE requests a connection may leave unfinished (their last frame not sent
/// yet) before the target drops it as misbehaving.
const MAX_UNFINISHED_REFUSED: usize = 1024;

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
