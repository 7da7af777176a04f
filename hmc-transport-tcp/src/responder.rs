//! The target side of `TcpCommunicator`: serves peers' READ, WRITE and NOTIFY requests against this process's registrations, inside the library.
//!
//! Every request is checked in full (key, token, bounds, access) before any byte of
//! registered memory is touched. Bytes then move straight between the socket and the
//! region with non-blocking `read`/`write` calls made under the region's liveness lock,
//! which is never held across an `.await`: deregistration waits for one system call at
//! most, and after it no request reaches the memory.

use std::io;
use std::sync::Arc;

use hmc_core::{Access, Error, Notification, Op, PeerAddr, Result, check_bounds};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::comm::{RegEntry, Shared};
use crate::net::{Listener, Stream};
use crate::wire::{self, WireDesc};

/// Registers a task so `close` can abort it. `None` once closed (the task is aborted) or,
/// with `limit`, when `limit` connections are already served (the task is left to refuse).
fn track(shared: &Shared, task: tokio::task::AbortHandle, limit: Option<usize>) -> Option<u64> {
    let mut t = shared.tasks.lock();
    if t.closed {
        task.abort();
        return None;
    }
    // `running` also holds the accept loop, hence `>`.
    if limit.is_some_and(|l| t.running.len() > l) {
        return None;
    }
    t.next += 1;
    let id = t.next;
    t.running.insert(id, task);
    Some(id)
}

/// Starts the accept loop on `listener`.
pub(crate) fn start(shared: &Arc<Shared>, listener: Listener) {
    let weak = Arc::downgrade(shared);
    let task = tokio::spawn(async move {
        loop {
            let accepted = listener.accept().await;
            let Some(shared) = weak.upgrade() else { return };
            match accepted {
                Ok(stream) => spawn_connection(&shared, stream),
                Err(e) => {
                    tracing::warn!(addr = %shared.addr, error = %e, "data-plane accept failed");
                    drop(shared);
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    });
    track(shared, task.abort_handle(), None);
}

fn spawn_connection(shared: &Arc<Shared>, stream: Stream) {
    let limit = shared.config.max_accepted_connections;
    // The task waits for its id before serving, so it can always remove itself.
    let (id_tx, id_rx) = tokio::sync::oneshot::channel::<u64>();
    let conn_shared = shared.clone();
    let task = tokio::spawn(async move {
        match id_rx.await {
            Ok(id) => {
                serve(&conn_shared, stream).await;
                conn_shared.tasks.lock().running.remove(&id);
            }
            Err(_) => refuse(&conn_shared, stream, limit).await,
        }
    });
    if let Some(id) = track(shared, task.abort_handle(), Some(limit)) {
        let _ = id_tx.send(id);
    }
}

/// Answers a connection over `max_accepted_connections` with a refusal that says so.
/// Bounded by `hello_timeout`, like any connection that has not said HELLO.
async fn refuse(shared: &Shared, mut stream: Stream, limit: usize) {
    let why = format!(
        "limit `max_accepted_connections` ({limit}) reached at {}; retry later, or raise \
         TcpConfig::max_accepted_connections there",
        shared.addr
    );
    tracing::warn!(addr = %shared.addr, limit, "refusing a data-plane connection: {why}");
    let hello = wire::read_hello(&mut stream, false);
    let _ = tokio::time::timeout(shared.config.hello_timeout, hello).await;
    let _ = stream.write_all(&wire::encode_hello(Some(1), &why)).await;
    let _ = stream.shutdown().await;
}

/// Serves one connection until it closes or breaks the protocol.
async fn serve(shared: &Shared, mut stream: Stream) {
    let hello = tokio::time::timeout(
        shared.config.hello_timeout,
        wire::read_hello(&mut stream, false),
    )
    .await;
    let from = match hello {
        Err(_) => {
            tracing::warn!(
                addr = %shared.addr,
                timeout = ?shared.config.hello_timeout,
                "dropping a data-plane connection that sent no HELLO in time (hello_timeout)"
            );
            return;
        }
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "data-plane connection closed before its HELLO");
            return;
        }
        Ok(Ok(Err(why))) => {
            tracing::warn!(addr = %shared.addr, %why, "refusing a data-plane HELLO");
            let _ = stream.write_all(&wire::encode_hello(Some(1), &why)).await;
            return;
        }
        Ok(Ok(Ok((_, text)))) => match text.parse::<PeerAddr>() {
            Ok(a) => a,
            Err(e) => {
                let why = format!("the HELLO's address is not valid: {e}");
                tracing::warn!(addr = %shared.addr, %why, "refusing a data-plane HELLO");
                let _ = stream.write_all(&wire::encode_hello(Some(1), &why)).await;
                return;
            }
        },
    };
    let answer = wire::encode_hello(Some(0), &shared.addr.to_string());
    if stream.write_all(&answer).await.is_err() {
        return;
    }
    loop {
        let kind = match stream.read_u8().await {
            Ok(k) => k,
            Err(_) => return, // the initiator closed the connection
        };
        let outcome = match kind {
            wire::REQ_WRITE => serve_batch(shared, &mut stream, Op::Write).await,
            wire::REQ_READ => serve_batch(shared, &mut stream, Op::Read).await,
            wire::REQ_NOTIFY => serve_notify(shared, &mut stream, &from).await,
            other => Err(Broken::Protocol(format!("unknown request kind {other}"))),
        };
        match outcome {
            Ok(()) => {}
            Err(Broken::Io(e)) => {
                tracing::debug!(peer = %from, error = %e, "data-plane connection ended");
                return;
            }
            Err(Broken::Protocol(why)) => {
                tracing::warn!(peer = %from, %why, "closing a data-plane connection that broke the protocol");
                let status = wire::encode_error(&Error::Protocol(why));
                let _ = stream.write_all(&status).await;
                return;
            }
        }
    }
}

/// Why a connection cannot go on.
enum Broken {
    Io(io::Error),
    Protocol(String),
}

impl From<io::Error> for Broken {
    fn from(e: io::Error) -> Self {
        Broken::Io(e)
    }
}

/// Looks up and checks one descriptor against the registration table.
fn admit(shared: &Shared, op: Op, d: &WireDesc) -> Result<Arc<RegEntry>> {
    let entry = shared.regions.read().get(&d.id).cloned().ok_or_else(|| {
        Error::InvalidKey(format!(
            "region {} is not registered at {} (deregistered, or never exported there)",
            d.id, shared.addr
        ))
    })?;
    if !entry.token_matches(&d.token) {
        return Err(Error::InvalidKey(format!(
            "the key's token does not match region {} at {}",
            d.id, shared.addr
        )));
    }
    check_bounds("remote region", d.offset, d.len, entry.region.len as u64)?;
    let need = Access::required_by(op);
    if !entry.access.allows(need) {
        return Err(Error::AccessDenied(format!(
            "region {} at {} allows {:?}, and {op:?} needs {need:?}",
            d.id, shared.addr, entry.access
        )));
    }
    Ok(entry)
}

/// A success status followed by the bytes of every descriptor, or the error status when a
/// region was deregistered since admission. Synchronous: the liveness locks it takes never
/// meet an `.await`.
fn small_answer(
    shared: &Shared,
    descs: &[WireDesc],
    entries: &[Arc<RegEntry>],
    total: usize,
) -> Vec<u8> {
    let mut answer = Vec::with_capacity(2 + total);
    answer.extend_from_slice(&[0, 0]); // success, no padding
    for (d, entry) in descs.iter().zip(entries) {
        let live = entry.live.read();
        if !*live {
            return wire::encode_error(&Error::InvalidKey(format!(
                "region {} at {} was deregistered during the READ",
                d.id, shared.addr
            )));
        }
        // SAFETY: as in `recv_into`; `live` is held for the copy, and the bytes are only read.
        answer.extend_from_slice(unsafe {
            std::slice::from_raw_parts((entry.region.addr + d.offset) as *const u8, d.len as usize)
        });
    }
    answer
}

/// Reads and discards `n` bytes.
async fn drain(stream: &mut Stream, mut n: u64) -> io::Result<()> {
    let mut scratch = vec![0u8; 64 << 10];
    while n > 0 {
        let want = n.min(scratch.len() as u64) as usize;
        stream.read_exact(&mut scratch[..want]).await?;
        n -= want as u64;
    }
    Ok(())
}

/// What happened while moving one descriptor's bytes.
enum Moved {
    Done,
    /// The region was deregistered after `moved` bytes; `started` when any byte of this
    /// call's prefix or data had left.
    Deregistered {
        moved: u64,
        started: bool,
    },
}

/// Reads `len` bytes from the socket into `entry` at `offset`.
async fn recv_into(stream: &Stream, entry: &RegEntry, offset: u64, len: u64) -> io::Result<Moved> {
    let mut done = 0u64;
    while done < len {
        stream.readable().await?;
        let live = entry.live.read();
        if !*live {
            return Ok(Moved::Deregistered {
                moved: done,
                started: done > 0,
            });
        }
        // SAFETY: `admit` checked offset+len against the region, which stays allocated while
        // it is registered (the `register` contract), and `live` (held for this call only)
        // proves it still is. Concurrent access by others follows the DMA rule that
        // `register`'s caller accepted.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(
                (entry.region.addr + offset + done) as *mut u8,
                (len - done) as usize,
            )
        };
        match stream.try_read(dst) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => done += n as u64,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Moved::Done)
}

/// Writes `prefix` (a status) and then `len` bytes of `entry` at `offset` to the socket,
/// the prefix in the same system call as the first bytes.
async fn send_from(
    stream: &Stream,
    entry: &RegEntry,
    offset: u64,
    len: u64,
    mut prefix: &[u8],
) -> io::Result<Moved> {
    let mut done = 0u64;
    let prefix_len = prefix.len();
    while done < len || !prefix.is_empty() {
        stream.writable().await?;
        let live = entry.live.read();
        if !*live {
            return Ok(Moved::Deregistered {
                moved: done,
                started: done > 0 || prefix.len() < prefix_len,
            });
        }
        // SAFETY: as in `recv_into`; the bytes are only read.
        let src = unsafe {
            std::slice::from_raw_parts(
                (entry.region.addr + offset + done) as *const u8,
                (len - done) as usize,
            )
        };
        match stream.try_write_prefixed(prefix, src) {
            Ok(n) => {
                let from_prefix = n.min(prefix.len());
                prefix = &prefix[from_prefix..];
                done += (n - from_prefix) as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Moved::Done)
}

async fn serve_batch(shared: &Shared, stream: &mut Stream, op: Op) -> Result<(), Broken> {
    let count = stream.read_u32().await? as usize;
    let max = shared.config.max_batch_descs;
    if count > max {
        return Err(Broken::Protocol(format!(
            "a request of {count} descriptors exceeds the target's max_batch_descs ({max}); \
             use the same TcpConfig on both peers"
        )));
    }
    let mut raw = vec![0u8; count * WireDesc::LEN];
    stream.read_exact(&mut raw).await?;
    if op == Op::Write {
        wire::skip_pad(stream).await?;
    }
    let descs = WireDesc::decode_all(&raw);
    let total = descs
        .iter()
        .try_fold(0u64, |acc, d| acc.checked_add(d.len))
        .ok_or_else(|| Broken::Protocol("descriptor lengths overflow u64".into()))?;
    let admitted: Result<Vec<Arc<RegEntry>>> = descs.iter().map(|d| admit(shared, op, d)).collect();
    let entries = match admitted {
        Ok(e) => e,
        Err(refusal) => {
            tracing::debug!(addr = %shared.addr, error = %refusal, ?op, "refused a batch");
            if op == Op::Write {
                drain(stream, total).await?;
            }
            stream.write_all(&wire::encode_error(&refusal)).await?;
            return Ok(());
        }
    };
    match op {
        Op::Write => {
            let mut remaining = total;
            for (d, entry) in descs.iter().zip(&entries) {
                match recv_into(stream, entry, d.offset, d.len).await? {
                    Moved::Done => remaining -= d.len,
                    Moved::Deregistered { moved, .. } => {
                        drain(stream, remaining - moved).await?;
                        let e = Error::InvalidKey(format!(
                            "region {} at {} was deregistered during the WRITE; part of the \
                             batch may have landed",
                            d.id, shared.addr
                        ));
                        stream.write_all(&wire::encode_error(&e)).await?;
                        return Ok(());
                    }
                }
            }
            stream.write_all(&[0]).await?;
        }
        Op::Read if total <= wire::COALESCE_LEN as u64 => {
            // Small answers go out in one write with their status: one segment, one wakeup.
            let answer = small_answer(shared, &descs, &entries, total as usize);
            stream.write_all(&answer).await?;
        }
        Op::Read => {
            // The success status and its padding leave with the first bytes.
            let first = descs
                .iter()
                .zip(&entries)
                .find(|(d, _)| d.len > 0)
                .map_or(0, |(d, e)| (e.region.addr + d.offset) as usize);
            let pad = wire::align_pad(2, first);
            let mut prefix = [0u8; 2 + 63];
            prefix[1] = pad;
            let mut status: &[u8] = &prefix[..2 + pad as usize];
            for (d, entry) in descs.iter().zip(&entries) {
                let sent = send_from(stream, entry, d.offset, d.len, status).await?;
                let first_call = !status.is_empty();
                status = &[];
                if let Moved::Deregistered { started: false, .. } = sent
                    && first_call
                {
                    // Nothing has left yet: the answer can still be a refusal.
                    let e = Error::InvalidKey(format!(
                        "region {} at {} was deregistered before the READ was served",
                        d.id, shared.addr
                    ));
                    stream.write_all(&wire::encode_error(&e)).await?;
                    return Ok(());
                }
                if let Moved::Deregistered { .. } = sent {
                    // The answer is already under way; only closing can tell the initiator.
                    return Err(Broken::Io(io::Error::other(format!(
                        "region {} was deregistered during a READ",
                        d.id
                    ))));
                }
            }
        }
    }
    Ok(())
}

async fn serve_notify(shared: &Shared, stream: &mut Stream, from: &PeerAddr) -> Result<(), Broken> {
    let tag = stream.read_u64().await?;
    let len = stream.read_u32().await? as usize;
    let max = shared.config.max_notify_len;
    if len > max {
        drain(stream, len as u64).await?;
        let e = Error::LimitExceeded {
            limit: "max_notify_len",
            value: len as u64,
            max: max as u64,
            hint: "raise TcpConfig::max_notify_len at the target".into(),
        };
        stream.write_all(&wire::encode_error(&e)).await?;
        return Ok(());
    }
    let mut msg = vec![0u8; len];
    stream.read_exact(&mut msg).await?;
    let max_pending = shared.config.max_pending_notifications;
    let queued = shared.notifications.update(|n| {
        if n.queue.len() >= max_pending {
            return Err(Error::LimitExceeded {
                limit: "max_pending_notifications",
                value: n.queue.len() as u64 + 1,
                max: max_pending as u64,
                hint: "the target is not calling recv_notification fast enough; retry later, or \
                       raise TcpConfig::max_pending_notifications there"
                    .into(),
            });
        }
        n.queue.push_back(Notification {
            from: from.clone(),
            tag,
            msg,
        });
        Ok(())
    });
    match queued {
        Ok(()) => stream.write_all(&[0]).await?,
        Err(e) => stream.write_all(&wire::encode_error(&e)).await?,
    }
    Ok(())
}
