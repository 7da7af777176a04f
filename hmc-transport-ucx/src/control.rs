//! The control connection beside every UCX endpoint: a small TCP protocol that bootstraps the endpoint (worker-address exchange), confirms keys at import, revokes keys at deregistration, and reports the peer's death by EOF.
//!
//! Frames are `kind u8, length u32 (big-endian), payload`:
//!
//! | kind | direction | payload |
//! | --- | --- | --- |
//! | 1 HELLO | initiator → target | version `u8` |
//! | 2 HELLO_ACK | target → initiator | the target's UCX worker address |
//! | 3 VALIDATE | initiator → target | request id `u64`, region id `u64`, the descriptor as exported |
//! | 4 VALID | target → initiator | request id `u64`, verdict `u8` (0 live, 1 unknown or deregistered, 2 differs from the export) |
//! | 5 REVOKE | target → initiator | region id `u64` |
//! | 6 REVOKED | initiator → target | region id `u64` |
//!
//! Why: UCX neither checks a registration's access rights for TCP or shared memory nor
//! invalidates an rkey when its memory is unmapped (a CMA put with a stale key writes into
//! whatever now lives at that address). So the target stays the authority: an import is
//! accepted only when the target confirms the descriptor byte for byte (a forged key never
//! reaches `ucp_ep_rkey_unpack`, and the rights and bounds the initiator enforces are the
//! target's), and a deregistration first revokes the key at every peer that imported it and
//! waits until their in-flight operations on it have drained.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use hmc_core::{Error, Result};
use parking_lot::Mutex;

use crate::engine::{Command, Engine, KeyShared};

pub(crate) const HELLO: u8 = 1;
pub(crate) const HELLO_ACK: u8 = 2;
pub(crate) const VALIDATE: u8 = 3;
pub(crate) const VALID: u8 = 4;
pub(crate) const REVOKE: u8 = 5;
pub(crate) const REVOKED: u8 = 6;
pub(crate) const VERSION: u8 = 1;
/// Largest control frame accepted (worker addresses and descriptors are far smaller).
pub(crate) const MAX_FRAME: usize = 1 << 20;

pub(crate) fn write_frame(w: &mut impl Write, kind: u8, payload: &[u8]) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(5 + payload.len());
    buf.push(kind);
    buf.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    buf.extend_from_slice(payload);
    w.write_all(&buf)
}

pub(crate) fn read_frame(r: &mut impl Read) -> std::io::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 5];
    r.read_exact(&mut head)?;
    let len = u32::from_be_bytes(head[1..5].try_into().expect("4 bytes")) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("control frame of {len} bytes exceeds {MAX_FRAME}"),
        ));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload)?;
    Ok((head[0], payload))
}

fn be_u64(b: &[u8], at: usize) -> Option<u64> {
    b.get(at..at + 8)
        .map(|s| u64::from_be_bytes(s.try_into().expect("8 bytes")))
}

/// Target-side state shared by the listener, the accepted connections and registrations.
#[derive(Default)]
pub(crate) struct TargetState {
    /// Live exported registrations: id → the descriptor bytes as exported.
    pub regs: Mutex<HashMap<u64, Vec<u8>>>,
    pub conns: Mutex<HashMap<u64, Arc<Accepted>>>,
    pub next_conn: AtomicU64,
    pub closed: AtomicBool,
}

/// One initiator connected to us.
pub(crate) struct Accepted {
    pub stream: TcpStream,
    writer: Mutex<TcpStream>,
    /// Regions this initiator imported (must be revoked there before unmapping).
    imported: Mutex<HashSet<u64>>,
    revokes: Mutex<HashMap<u64, mpsc::SyncSender<()>>>,
}

impl TargetState {
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
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let (kind, payload) = read_frame(&mut stream)?;
        if kind != HELLO || payload.first() != Some(&VERSION) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "expected HELLO v1",
            ));
        }
        write_frame(&mut stream, HELLO_ACK, &engine.worker_address)?;
        stream.set_read_timeout(None)?;
        let id = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Accepted {
            stream: stream.try_clone()?,
            writer: Mutex::new(stream.try_clone()?),
            imported: Mutex::new(HashSet::new()),
            revokes: Mutex::new(HashMap::new()),
        });
        self.conns.lock().insert(id, conn.clone());
        if self.closed.load(Ordering::Acquire) {
            let _ = conn.stream.shutdown(Shutdown::Both);
        }
        let result = (|| loop {
            let (kind, payload) = read_frame(&mut stream)?;
            match kind {
                VALIDATE => {
                    let (Some(req), Some(reg)) = (be_u64(&payload, 0), be_u64(&payload, 8)) else {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            "short VALIDATE",
                        ));
                    };
                    let verdict = {
                        let regs = self.regs.lock();
                        match regs.get(&reg) {
                            None => 1u8,
                            Some(desc) if desc[..] != payload[16..] => 2,
                            Some(_) => {
                                conn.imported.lock().insert(reg);
                                0
                            }
                        }
                    };
                    let mut out = req.to_be_bytes().to_vec();
                    out.push(verdict);
                    write_frame(&mut *conn.writer.lock(), VALID, &out)?;
                }
                REVOKED => {
                    if let Some(reg) = be_u64(&payload, 0)
                        && let Some(tx) = conn.revokes.lock().remove(&reg)
                    {
                        let _ = tx.send(());
                    }
                }
                other => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("unexpected control frame kind {other}"),
                    ));
                }
            }
        })();
        self.conns.lock().remove(&id);
        // Dropping the pending revocation senders wakes their waiters: this peer is gone.
        conn.revokes.lock().clear();
        result
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

struct PendingImport {
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
    next_req: AtomicU64,
    dead: Mutex<Option<String>>,
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
        let (kind, worker) = read_frame(&mut stream)?;
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
            next_req: AtomicU64::new(1),
            dead: Mutex::new(None),
            closing: AtomicBool::new(false),
        });
        Ok((link, worker))
    }

    /// Asks the target to confirm a descriptor; on success the reader thread has the engine
    /// unpack the key (ordered before any later revocation of it) and the engine replies.
    pub fn validate(
        &self,
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
        let reason = loop {
            let (kind, payload) = match read_frame(&mut stream) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    break "the peer closed its control connection (process exited or communicator closed)".to_string();
                }
                Err(e) => break format!("control connection failed: {e}"),
            };
            match kind {
                VALID => {
                    let (Some(req), Some(&verdict)) = (be_u64(&payload, 0), payload.get(8)) else {
                        break "malformed VALID frame".into();
                    };
                    let Some(p) = self.pending.lock().remove(&req) else {
                        continue;
                    };
                    if verdict == 0 {
                        let cmd = Command::ImportKey {
                            ep: p.ep,
                            reg_id: p.reg_id,
                            rkey: p.rkey,
                            shared: p.shared,
                            reply: p.reply,
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
                        let _ = p.reply.send(Err(Error::InvalidKey(why.into())));
                    }
                }
                REVOKE => {
                    let Some(reg_id) = be_u64(&payload, 0) else {
                        break "malformed REVOKE frame".into();
                    };
                    let link = self.clone();
                    let ack = Box::new(move || {
                        if let Err(e) =
                            write_frame(&mut *link.writer.lock(), REVOKED, &reg_id.to_be_bytes())
                        {
                            tracing::debug!(error = %e, "could not confirm a key revocation");
                        }
                    });
                    if engine.send(Command::Revoke { ep, reg_id, ack }).is_err() {
                        break "the local engine exited".into();
                    }
                }
                other => break format!("unexpected control frame kind {other}"),
            }
        };
        *self.dead.lock() = Some(reason.clone());
        self.pending.lock().clear();
        if !self.closing.load(Ordering::Acquire) {
            let _ = engine.send(Command::PeerGone { ep, reason });
        }
    }
}
