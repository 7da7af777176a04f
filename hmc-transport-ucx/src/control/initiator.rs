//! The initiator's side of the control connections: one [`Link`] beside each endpoint,
//! which runs the handshake, asks the target to confirm imports, answers its revocations,
//! carries staged transfers' frames and abandons endpoint generations for the engine.

use std::collections::HashMap;
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak, mpsc};
use std::time::Duration;

use hmc_core::{Error, Result};
use parking_lot::Mutex;

use super::{
    ABANDON, ABANDONED, HELLO, HELLO_ACK, REVOKE, REVOKED, STAGED_DATA, STAGED_DONE, VALID,
    VALIDATE, VERSION, be_u64, read_frame, write_frame, write_frame_parts,
};
use crate::engine::{Command, Engine, InitiatorControl, KeyShared};
use crate::staged::StagedEvent;

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
