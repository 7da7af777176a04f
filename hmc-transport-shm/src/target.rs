//! The target side: this process's registrations, the Unix-socket listener and one thread
//! per accepted side-channel connection that grants leases, takes notifications and
//! receives lease releases; and revocation, which waits (bounded) for them.
//!
//! The target never copies: initiators move the bytes with `process_vm_*`. What it
//! guards is *which* of its addresses a key reaches, and *when* a registration's memory is
//! no longer reached, so that dropping a registration (or rekeying it) returns only once
//! every peer that held a lease on it said it stopped, or `revoke_timeout` passed.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use hmc_core::{Access, IpcDescriptor, Notification, Op, PeerAddr, Region, check_bounds};
use hmc_transport_kit::key_token::KeyToken;
use hmc_transport_kit::registry::Registry;
use parking_lot::{Condvar, Mutex};

use crate::ShmConfig;
use crate::cma::{self, PROBE, PeerCred};
use crate::mapped;
use crate::wire::{self, Msg, Refusal, TOKEN_LEN};

/// One registration as the target serves it.
pub(crate) struct RegEntry {
    pub(crate) id: u64,
    pub(crate) region: Region,
    pub(crate) access: Access,
    /// The random half of the key. Changed (by rekey) and read (by grants) only under
    /// [`Target::leases`], so no lease is granted for a token after it was replaced.
    pub(crate) token: KeyToken,
    /// False once deregistered; changed under [`Target::leases`] too.
    pub(crate) live: AtomicBool,
    /// The memfd behind memory from `alloc_registered`: sent to initiators, which map it
    /// instead of using cross-memory attach.
    pub(crate) memfd: Option<OwnedFd>,
    /// The vendor IPC descriptor of device memory registered by buffer
    /// (`register_device`): sent in every `Granted`, never in the exported key, so that
    /// only a peer that proved the token learns it and a key cannot name other memory.
    pub(crate) ipc: Option<IpcDescriptor>,
}

/// Who holds a lease.
#[derive(Clone, Copy)]
struct LeaseRec {
    reg: u64,
    conn: u64,
}

/// One accepted side-channel connection.
struct Conn {
    /// Writes are whole messages under this lock. A grant holds it from before the lease
    /// is recorded until the `Granted` answer is written, so a `Revoke` of that lease can
    /// never overtake its `Granted` on the wire.
    writer: Mutex<UnixStream>,
    /// Registrations whose memfd went to this connection (changed under `writer`).
    sent_fds: Mutex<HashSet<u64>>,
}

/// Notifications received, waiting for `recv_notification`.
#[derive(Default)]
pub(crate) struct Notes {
    pub(crate) closed: bool,
    pub(crate) queue: VecDeque<Notification>,
}

/// The target's state, shared by the communicator, its registrations and its threads.
pub(crate) struct Target {
    pub(crate) config: ShmConfig,
    pub(crate) path: PathBuf,
    pub(crate) regs: Registry<RegEntry>,
    next_lease: AtomicU64,
    next_conn: AtomicU64,
    /// Side-channel connections being served (`max_connections`).
    serving: AtomicUsize,
    /// Every lease granted and not yet released, by id. Guards tokens and liveness too.
    leases: Mutex<HashMap<u64, LeaseRec>>,
    released: Condvar,
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    pub(crate) closed: AtomicBool,
    pub(crate) notes: Mutex<Notes>,
    pub(crate) notes_ready: tokio::sync::Notify,
}

impl Target {
    /// Largest side-channel frame accepted from an initiator: a notification of
    /// `max_notify_len` bytes plus its header and lease lists.
    fn max_frame(&self) -> usize {
        self.config.max_notify_len.saturating_add(wire::FRAME_SLACK)
    }

    /// Starts serving `listener` (bound at `path`) on a thread of its own.
    pub(crate) fn start(
        config: ShmConfig,
        path: PathBuf,
        listener: UnixListener,
    ) -> io::Result<Arc<Target>> {
        let t = Arc::new(Target {
            config,
            path,
            regs: Registry::new(),
            next_lease: AtomicU64::new(1),
            next_conn: AtomicU64::new(1),
            serving: AtomicUsize::new(0),
            leases: Mutex::new(HashMap::new()),
            released: Condvar::new(),
            conns: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            notes: Mutex::new(Notes::default()),
            notes_ready: tokio::sync::Notify::new(),
        });
        let t2 = t.clone();
        std::thread::Builder::new()
            .name("hmc-shm-accept".into())
            .spawn(move || t2.accept_loop(listener))?;
        Ok(t)
    }

    fn accept_loop(self: Arc<Self>, listener: UnixListener) {
        for s in listener.incoming() {
            if self.closed.load(Ordering::Acquire) {
                break;
            }
            let Ok(s) = s else { continue };
            let max = self.config.max_connections;
            if self.serving.fetch_add(1, Ordering::AcqRel) >= max {
                self.serving.fetch_sub(1, Ordering::AcqRel);
                tracing::warn!(
                    "limit `max_connections` ({max}) of the shared-memory side channel reached; a connection was closed unread (raise ShmConfig::max_connections)"
                );
                continue;
            }
            let t = self.clone();
            let spawned = std::thread::Builder::new()
                .name("hmc-shm-conn".into())
                .spawn(move || {
                    t.clone().serve(s);
                    t.serving.fetch_sub(1, Ordering::AcqRel);
                });
            if let Err(e) = spawned {
                self.serving.fetch_sub(1, Ordering::AcqRel);
                tracing::warn!(error = %e, "could not start a side-channel thread; connection dropped");
            }
        }
    }

    /// Serves one connection until it closes, then releases every lease it held.
    fn serve(self: Arc<Self>, s: UnixStream) {
        let id = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let Ok((mut reader, peer, from)) = self.handshake(&s) else {
            return;
        };
        let conn = Arc::new(Conn {
            writer: Mutex::new(s),
            sent_fds: Mutex::new(HashSet::new()),
        });
        self.conns.lock().insert(id, conn.clone());
        if self.closed.load(Ordering::Acquire) {
            let _ = conn.writer.lock().shutdown(std::net::Shutdown::Write);
        }
        tracing::trace!(conn = id, pid = peer.pid, "side channel open");
        while let Ok(Some(body)) = self.next_frame(&mut reader) {
            match Msg::decode(&body) {
                Ok(Msg::Grant {
                    req,
                    id: reg,
                    token,
                    op,
                    offset,
                    len,
                }) => {
                    let w = conn.writer.lock();
                    let (answer, memfd) = self.grant(&conn, id, req, reg, &token, op, offset, len);
                    let sent = match &memfd {
                        Some(e) => {
                            let fd = e.memfd.as_ref().expect("granted with a memfd").as_fd();
                            mapped::send_with_fd(&w, &answer.encode(), fd)
                        }
                        None => wire::write_msg(&mut &*w, &answer),
                    };
                    if sent.is_err() {
                        break;
                    }
                }
                Ok(Msg::Notify { req, tag, msg }) => {
                    let answer = self.take_note(req, tag, msg, &from);
                    if wire::write_msg(&mut *conn.writer.lock(), &answer).is_err() {
                        break;
                    }
                }
                Ok(Msg::Released { leases }) => {
                    let mut l = self.leases.lock();
                    for lease in leases {
                        if l.get(&lease).is_some_and(|r| r.conn == id) {
                            l.remove(&lease);
                        }
                    }
                    self.released.notify_all();
                }
                other => {
                    tracing::debug!(conn = id, msg = ?other.map(|_| ()), "side-channel protocol violation; closing");
                    break;
                }
            }
        }
        // The peer closed its end (or died): it copies nothing more under these leases.
        self.conns.lock().remove(&id);
        self.leases.lock().retain(|_, r| r.conn != id);
        self.released.notify_all();
        tracing::trace!(conn = id, "side channel closed");
    }

    /// The next message on a connection: waits for its first byte as long as it takes (an
    /// idle connection is fine), then for the rest within `frame_timeout`.
    fn next_frame(&self, reader: &mut UnixStream) -> io::Result<Option<Vec<u8>>> {
        use std::io::Read;
        let mut first = [0u8; 1];
        if reader.read(&mut first)? == 0 {
            return Ok(None);
        }
        reader.set_read_timeout(Some(self.config.frame_timeout))?;
        let frame = wire::read_frame(&mut (&first[..]).chain(&mut *reader), self.max_frame());
        reader.set_read_timeout(None)?;
        frame
    }

    /// Reads `Hello` (within `hello_timeout`), answers `Welcome`.
    fn handshake(&self, s: &UnixStream) -> io::Result<(UnixStream, PeerCred, PeerAddr)> {
        let peer = cma::peer_cred(s)?;
        let mut reader = s.try_clone()?;
        reader.set_read_timeout(Some(self.config.hello_timeout))?;
        s.set_write_timeout(Some(self.config.revoke_timeout))?;
        let body =
            wire::read_frame(&mut reader, self.max_frame())?.ok_or(io::ErrorKind::UnexpectedEof)?;
        let Ok(Msg::Hello { version, addr }) = Msg::decode(&body) else {
            return Err(io::ErrorKind::InvalidData.into());
        };
        if version != wire::VERSION {
            return Err(io::ErrorKind::InvalidData.into());
        }
        let from = addr.parse().unwrap_or(PeerAddr::Unix(PathBuf::from(addr)));
        wire::write_msg(
            &mut &*s,
            &Msg::Welcome {
                version: wire::VERSION,
                probe_addr: &PROBE as *const u8 as u64,
            },
        )?;
        reader.set_read_timeout(None)?;
        Ok((reader, peer, from))
    }

    /// Checks a grant request and records the lease; the answer to send, and the
    /// registration whose memfd goes with it (the first grant of shared memory on `c`).
    /// The caller holds `c`'s writer lock.
    #[allow(clippy::too_many_arguments)]
    fn grant(
        &self,
        c: &Conn,
        conn: u64,
        req: u64,
        reg: u64,
        token: &[u8; TOKEN_LEN],
        op: Op,
        offset: u64,
        len: u64,
    ) -> (Msg, Option<Arc<RegEntry>>) {
        let refuse = |why, limit, text: String| {
            let m = Msg::Refused {
                req,
                why,
                limit,
                text,
            };
            (m, None)
        };
        if self.closed.load(Ordering::Acquire) {
            return refuse(
                Refusal::Closed,
                0,
                "the target communicator was closed".into(),
            );
        }
        let Some(entry) = self.regs.get(reg) else {
            return refuse(
                Refusal::InvalidKey,
                0,
                format!("no registration {reg} (deregistered?)"),
            );
        };
        let mut leases = self.leases.lock();
        let same = entry.token.matches(token);
        if !same || !entry.live.load(Ordering::Acquire) {
            return refuse(
                Refusal::InvalidKey,
                0,
                format!("the key of registration {reg} is forged, rekeyed or deregistered"),
            );
        }
        if check_bounds("remote region", offset, len, entry.region.len as u64).is_err() {
            return refuse(Refusal::OutOfBounds, entry.region.len as u64, String::new());
        }
        let need = Access::required_by(op);
        if !entry.access.allows(need) {
            return refuse(
                Refusal::AccessDenied,
                0,
                format!(
                    "registration {reg} allows {:?}, {op:?} needs {need:?}",
                    entry.access
                ),
            );
        }
        let lease = self.next_lease.fetch_add(1, Ordering::Relaxed);
        leases.insert(lease, LeaseRec { reg, conn });
        let (map, memfd) = match &entry.memfd {
            None if entry.ipc.is_some() => (wire::MAP_IPC, None),
            None => (wire::MAP_NONE, None),
            Some(_) if c.sent_fds.lock().insert(reg) => (wire::MAP_FD, Some(entry.clone())),
            Some(_) => (wire::MAP_KNOWN, None),
        };
        let granted = Msg::Granted {
            req,
            lease,
            addr: entry.region.addr,
            len: entry.region.len as u64,
            access: entry.access,
            map,
            ipc: entry.ipc.clone(),
        };
        (granted, memfd)
    }

    /// Tells every connection that mapped `entry`'s memfd to unmap it: after
    /// deregistration, once its leases are revoked.
    pub(crate) fn forget(&self, entry: &RegEntry) {
        if entry.memfd.is_none() {
            return;
        }
        let conns: Vec<Arc<Conn>> = self.conns.lock().values().cloned().collect();
        for c in conns {
            let w = c.writer.lock();
            if c.sent_fds.lock().remove(&entry.id) {
                // A failed write means the connection is closing: the mapping goes with it.
                let _ = wire::write_msg(
                    &mut &*w,
                    &Msg::Forget {
                        regs: vec![entry.id],
                    },
                );
            }
        }
    }

    fn take_note(&self, req: u64, tag: u64, msg: Vec<u8>, from: &PeerAddr) -> Msg {
        let max_len = self.config.max_notify_len;
        let max_pending = self.config.max_pending_notifications;
        let refuse = |limit, text: String| Msg::Refused {
            req,
            why: Refusal::Limit,
            limit,
            text,
        };
        if msg.len() > max_len {
            return refuse(max_len as u64, "max_notify_len".into());
        }
        {
            let mut n = self.notes.lock();
            if n.closed {
                return Msg::Refused {
                    req,
                    why: Refusal::Closed,
                    limit: 0,
                    text: "the target communicator was closed".into(),
                };
            }
            if n.queue.len() >= max_pending {
                return refuse(max_pending as u64, "max_pending_notifications".into());
            }
            n.queue.push_back(Notification {
                from: from.clone(),
                tag,
                msg,
            });
        }
        self.notes_ready.notify_one();
        Msg::Ok { req }
    }

    /// Makes `entry`'s current leases stop working: runs `change` (a new token, or
    /// deregistration) under the lease lock so no lease is granted past it, sends `Revoke`
    /// to every connection holding one, and waits until they are released or
    /// `revoke_timeout` passes. Returns how many leases were given up on.
    pub(crate) fn revoke(&self, entry: &RegEntry, change: impl FnOnce()) -> usize {
        let mut by_conn: HashMap<u64, Vec<u64>> = HashMap::new();
        {
            let leases = self.leases.lock();
            change();
            for (lease, rec) in leases.iter() {
                if rec.reg == entry.id {
                    by_conn.entry(rec.conn).or_default().push(*lease);
                }
            }
        }
        if by_conn.is_empty() {
            return 0;
        }
        for (conn, ids) in &by_conn {
            let c = self.conns.lock().get(conn).cloned();
            if let Some(c) = c {
                // A failed write means the connection is closing: its leases go with it.
                let _ = wire::write_msg(
                    &mut *c.writer.lock(),
                    &Msg::Revoke {
                        leases: ids.clone(),
                    },
                );
            }
        }
        let until = Instant::now() + self.config.revoke_timeout;
        let ids: Vec<u64> = by_conn.into_values().flatten().collect();
        let mut leases = self.leases.lock();
        if ids.iter().all(|i| !leases.contains_key(i)) {
            return 0;
        }
        // Peers still hold leases: wait where it holds no runtime worker.
        crate::control::off_worker(|| {
            loop {
                let left = ids.iter().filter(|i| leases.contains_key(i)).count();
                if left == 0 {
                    return 0;
                }
                if self.released.wait_until(&mut leases, until).timed_out() {
                    let left: Vec<u64> = ids
                        .iter()
                        .copied()
                        .filter(|i| leases.contains_key(i))
                        .collect();
                    if left.is_empty() {
                        return 0;
                    }
                    tracing::warn!(
                        registration = entry.id,
                        leases = left.len(),
                        timeout = ?self.config.revoke_timeout,
                        "peers did not release their leases within revoke_timeout; giving up on them"
                    );
                    left.iter().for_each(|i| {
                        leases.remove(i);
                    });
                    return left.len();
                }
            }
        })
    }

    /// Leases granted and not yet released (for tests and monitoring).
    pub(crate) fn lease_count(&self) -> usize {
        self.leases.lock().len()
    }

    /// Stops accepting, ends every connection's sending side (peers see end of stream,
    /// drop their leases and close), wakes notification waiters, removes the socket file.
    pub(crate) fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        // Wakes the accept loop, which sees `closed` and ends.
        let _ = UnixStream::connect(&self.path);
        for c in self.conns.lock().values() {
            let _ = c.writer.lock().shutdown(std::net::Shutdown::Write);
        }
        self.notes.lock().closed = true;
        self.notes_ready.notify_waiters();
        if let Err(e) = std::fs::remove_file(&self.path)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.path.display(), error = %e, "could not remove the socket file");
        }
        crate::socket_files::removed(&self.path);
    }
}
