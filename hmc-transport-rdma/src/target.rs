//! The target side of the control plane: the listener, and one thread per accepted control connection that owns the QPs a peer's endpoint talks to (handshake, QP re-establishment, key confirmation, notifications).

use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use hmc_core::{Error, Notification, PeerAddr, Result, TransportId};

use crate::comm::{Inner, random_psn};
use crate::control::{self, Stream, read_frame, write_frame};
use crate::nic::Qp;
use crate::wire::ConnRecord;

pub(crate) enum AnyListener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

pub(crate) fn bind_listener(addr: &PeerAddr) -> Result<(AnyListener, PeerAddr)> {
    match addr {
        PeerAddr::Tcp(sa) => {
            let l = TcpListener::bind(sa).map_err(|e| {
                Error::io(format!("binding {addr} (port in use? choose another)"), e)
            })?;
            let local = l
                .local_addr()
                .map_err(|e| Error::io("reading the control listener's address", e))?;
            Ok((AnyListener::Tcp(l), PeerAddr::Tcp(local)))
        }
        PeerAddr::Unix(path) => {
            // The kit's rule: a stale socket file is reclaimed, a live one or any other
            // file is refused and left alone.
            let l = hmc_transport_kit::unix::bind_unix(path).map_err(|e| match e.kind() {
                std::io::ErrorKind::AddrInUse | std::io::ErrorKind::AlreadyExists => {
                    Error::InvalidArgument(e.to_string())
                }
                _ => Error::io(format!("binding {addr}"), e),
            })?;
            Ok((AnyListener::Unix(l, path.clone()), addr.clone()))
        }
        other => Err(Error::InvalidArgument(format!(
            "the RDMA control plane listens on tcp://IP:PORT or unix:///path, not {other}"
        ))),
    }
}

pub(crate) fn accept_loop(listener: AnyListener, inner: Arc<Inner>) {
    loop {
        let stream = match &listener {
            AnyListener::Tcp(l) => l.accept().map(|(s, _)| {
                let _ = s.set_nodelay(true);
                Stream::Tcp(s)
            }),
            AnyListener::Unix(l, _) => l.accept().map(|(s, _)| Stream::Unix(s)),
        };
        if inner.closed.load(Ordering::Acquire) {
            break;
        }
        let stream = match stream {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::warn!(error = %e, "RDMA control listener stopped");
                break;
            }
        };
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        if let Ok(clone) = stream.try_clone() {
            inner.accepted.lock().insert(id, clone);
        }
        let serving = inner.clone();
        let spawned = std::thread::Builder::new()
            .name("hmc-rdma-peer".into())
            .spawn(move || {
                if let Err(e) = serve(&serving, stream) {
                    tracing::debug!(error = %e, "RDMA control connection ended");
                }
                serving.accepted.lock().remove(&id);
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot serve an RDMA control connection");
            inner.accepted.lock().remove(&id);
        }
    }
    if let AnyListener::Unix(_, path) = &listener {
        let _ = std::fs::remove_file(path);
    }
}

/// Returns accepted QPs to the `max_accepted_qps` budget when a connection ends.
struct AcceptedQps<'a>(&'a Inner, usize);

impl Drop for AcceptedQps<'_> {
    fn drop(&mut self) {
        self.0.accepted_qps.fetch_sub(self.1, Ordering::AcqRel);
    }
}

/// The target side of one control connection: its QPs live as long as it does.
fn serve(inner: &Inner, mut s: Stream) -> Result<()> {
    let io = |e: std::io::Error| Error::io("RDMA control connection", e);
    s.set_timeouts(Some(inner.config.control_timeout))
        .map_err(io)?;
    let (from, records, _budget) = accept_hello(inner, &mut s)?;
    let mut qps = Vec::with_capacity(records.len());
    let mut answer = Vec::with_capacity(records.len() * ConnRecord::LEN);
    for r in &records {
        let qp = Qp::create(&inner.shared.nic, 1)?;
        answer.extend_from_slice(&connect_qp(inner, &qp, r)?.encode());
        qps.push(qp);
    }
    write_frame(&mut s, control::HELLO_ACK, &answer).map_err(io)?;
    s.set_timeouts(None).map_err(io)?;
    let from_addr: PeerAddr = from.parse().unwrap_or(PeerAddr::Opaque {
        transport: TransportId::RDMA,
        bytes: from.into_bytes(),
    });
    loop {
        let (kind, payload) = match read_frame(&mut s) {
            Ok(f) => f,
            Err(_) => return Ok(()), // EOF: the initiator is gone; the QPs go with us.
        };
        match kind {
            control::RESET_QP => reset_qp(inner, &mut s, &qps, &payload)?,
            control::VALIDATE => {
                let verdict = validate(inner, &payload);
                write_frame(&mut s, control::VALID, &[verdict]).map_err(io)?;
            }
            control::NOTIFY if payload.len() >= 8 => {
                let tag = u64::from_be_bytes(payload[..8].try_into().expect("8 bytes"));
                inner.deliver(Notification {
                    from: from_addr.clone(),
                    tag,
                    msg: payload[8..].to_vec(),
                });
            }
            other => {
                return Err(Error::Protocol(format!(
                    "unexpected control frame kind {other}"
                )));
            }
        }
    }
}

/// Reads the initiator's HELLO: its address and QP records, refused (with REFUSED) when
/// malformed or when its QPs would pass `max_accepted_qps`; the budget it takes is
/// returned when the guard drops.
fn accept_hello<'a>(
    inner: &'a Inner,
    s: &mut Stream,
) -> Result<(String, Vec<ConnRecord>, AcceptedQps<'a>)> {
    let (kind, payload) = read_frame(s).map_err(|e| Error::io("RDMA control connection", e))?;
    if kind != control::HELLO {
        return Err(Error::Protocol(format!(
            "expected HELLO, got frame kind {kind}"
        )));
    }
    let (from, records) = control::decode_hello(&payload).inspect_err(|e| control::refuse(s, e))?;
    let n = records.len();
    let max = inner.config.max_accepted_qps;
    let before = inner.accepted_qps.fetch_add(n, Ordering::AcqRel);
    let budget = AcceptedQps(inner, n);
    if n == 0 || n > 64 || before + n > max {
        let e = Error::LimitExceeded {
            limit: "max_accepted_qps",
            value: (before + n) as u64,
            max: max as u64,
            hint: "the target has too many QPs open for peers; raise RdmaConfig::max_accepted_qps \
                   there, or connect fewer endpoints"
                .into(),
        };
        control::refuse(s, &e);
        return Err(e);
    }
    Ok((from, records, budget))
}

/// Walks `qp` (new, or just reset) to RTS with the initiator's record `r` under a fresh
/// PSN; the record of this side to answer with.
fn connect_qp(inner: &Inner, qp: &Qp, r: &ConnRecord) -> Result<ConnRecord> {
    let psn = random_psn();
    qp.connect(r, inner.local_mtu.min(r.mtu), psn, &inner.params)?;
    Ok(inner.shared.nic.record(qp.qpn(), psn, inner.local_mtu))
}

/// RESET_QP: walks the named QP back through RESET to RTS with the initiator's new
/// record, answering RESET_ACK with this side's, or REFUSED when the walk failed. A
/// malformed request ends the connection.
fn reset_qp(inner: &Inner, s: &mut Stream, qps: &[Qp], payload: &[u8]) -> Result<()> {
    let idx = *payload.first().unwrap_or(&u8::MAX) as usize;
    let rec = payload.get(1..).map(ConnRecord::decode);
    let (Some(qp), Some(Ok(r))) = (qps.get(idx), rec) else {
        return Err(Error::Protocol("malformed RESET_QP".into()));
    };
    match qp.to_reset().and_then(|()| connect_qp(inner, qp, &r)) {
        Ok(rec) => write_frame(s, control::RESET_ACK, &rec.encode())
            .map_err(|e| Error::io("RDMA control connection", e)),
        Err(e) => {
            control::refuse(s, &e);
            Ok(())
        }
    }
}

/// VALIDATE's verdict on a registration id and the descriptor bytes the initiator
/// imported: 0 live and the same, 1 unknown (or deregistered, or a short payload), 2
/// differs from what was exported.
fn validate(inner: &Inner, payload: &[u8]) -> u8 {
    if payload.len() < 8 {
        return 1;
    }
    let id = u64::from_be_bytes(payload[..8].try_into().expect("8 bytes"));
    match inner.regs.lock().get(&id) {
        None => 1,
        Some(bytes) if bytes[..] == payload[8..] => 0,
        Some(_) => 2,
    }
}

impl Inner {
    pub(crate) fn deliver(&self, n: Notification) {
        let mut q = self.notifications.lock();
        if n.msg.len() > self.config.max_notify_len
            || q.queue.len() >= self.config.max_pending_notifications
        {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                len = n.msg.len(),
                queued = q.queue.len(),
                "notification dropped: max_notify_len or max_pending_notifications reached \
                 (raise them in RdmaConfig, or receive faster)"
            );
            return;
        }
        q.queue.push_back(n);
        for w in q.waiters.drain(..) {
            w.wake();
        }
    }
}
