//! The target side of `TcpCommunicator`: serves peers' READ, WRITE and NOTIFY requests against this process's registrations, inside the library.
//!
//! Every request is checked in full (key, token, bounds, access) before any byte of
//! registered memory is touched. Bytes then move straight between the socket and the
//! region with non-blocking `read`/`write` calls made under the region's liveness lock,
//! which is never held across an `.await`: deregistration waits for one system call at
//! most, and after it no request reaches the memory.
//!
//! # Bounds on what a peer can hold
//!
//! - Time: `hello_timeout` until the HELLO (and the authentication exchange) is done,
//!   `idle_timeout` between requests, and `request_timeout` for a request's header and a
//!   NOTIFY's message to arrive whole, and for each step of bulk data to progress. A
//!   connection past any of them is closed and counted in [`crate::TcpStats`].
//! - Memory: a NOTIFY's announced length is checked against `max_notify_len` from its
//!   header, before any of its body is read (the connection is then closed, as its body
//!   cannot be skipped cheaply). A NOTIFY is taken only with the key of one of this
//!   communicator's live registrations (KEYED NOTIFY), or over a connection that passed
//!   the pre-shared-secret authentication; then it must fit both
//!   `max_pending_notifications` and `max_pending_notification_bytes`. Refused ones are
//!   read and dropped (they are at most `max_notify_len`) so the connection stays usable.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hmc_core::{Access, Error, Notification, Op, PeerAddr, Result, check_bounds};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::abandon::Gate;
use crate::auth::{self, NONCE_LEN, PROOF_LEN};
use crate::conn_name::ConnName;
use crate::net::{Listener, MAX_GATHER, Stream};
use crate::region::RegEntry;
use crate::staged::{StagedMoved, recv_staged, send_staged};
use crate::state::{Counters, Shared};
use crate::wire::{self, TOKEN_LEN, WireDesc};

/// The `context` of data-plane authentication proofs (see [`crate::auth`]).
pub(crate) const AUTH_CONTEXT: &str = "hmc-tcp data v1";

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
    let hello = async {
        let h = wire::read_hello_v(&mut stream, false).await;
        let version = match h {
            Ok(Ok(h)) if h.version == wire::VERSION_AUTH => {
                // Read the nonce too, so the refusal is not lost to a reset.
                let mut nonce = [0u8; NONCE_LEN];
                let _ = stream.read_exact(&mut nonce).await;
                wire::VERSION_AUTH
            }
            _ => wire::VERSION,
        };
        let answer = wire::encode_hello_v(version, Some(1), why.as_bytes());
        let _ = stream.write_all(&answer).await;
        let _ = stream.shutdown().await;
    };
    let _ = tokio::time::timeout(shared.config.hello_timeout, hello).await;
}

/// Why a HELLO was not admitted.
struct Refusal {
    why: String,
    /// The version to answer in (the dialler's).
    version: u8,
    /// Counted in `auth_failures`.
    auth: bool,
}

/// Reads the HELLO and, with a secret configured, runs the authentication exchange (see
/// [`crate::auth`]). `Ok(Ok((from, authenticated)))` admits the connection.
async fn accept_hello(
    shared: &Shared,
    stream: &mut Stream,
) -> io::Result<Result<(PeerAddr, bool), Refusal>> {
    let refuse = |why: String, version, auth| Ok(Err(Refusal { why, version, auth }));
    let hello = match wire::read_hello_v(stream, false).await? {
        Ok(h) => h,
        Err(why) => return refuse(why, wire::VERSION, false),
    };
    let version = hello.version;
    let authenticated = match (&shared.config.auth_secret, version) {
        (None, wire::VERSION) => false,
        (None, _) => {
            let mut nonce = [0u8; NONCE_LEN];
            stream.read_exact(&mut nonce).await?;
            return refuse(
                format!(
                    "{} does not use authentication, and the dialler does: set the same \
                     TcpConfig::auth_secret on both peers, or on neither",
                    shared.addr
                ),
                version,
                true,
            );
        }
        (Some(_), wire::VERSION) => {
            return refuse(
                format!(
                    "{} requires authentication with a pre-shared secret: set the same \
                     TcpConfig::auth_secret on the dialler",
                    shared.addr
                ),
                version,
                true,
            );
        }
        (Some(secret), _) => {
            let mut dialler_nonce = [0u8; NONCE_LEN];
            stream.read_exact(&mut dialler_nonce).await?;
            let nonce = auth::nonce()?;
            let claim = &hello.payload;
            let proof = secret.proof(AUTH_CONTEXT, b'L', &dialler_nonce, &nonce, claim);
            let mut challenge = nonce.to_vec();
            challenge.extend_from_slice(&proof);
            let answer = wire::encode_hello_v(version, Some(wire::STATUS_AUTHENTICATE), &challenge);
            stream.write_all(&answer).await?;
            let mut theirs = [0u8; PROOF_LEN];
            stream.read_exact(&mut theirs).await?;
            if !secret.verify(AUTH_CONTEXT, b'D', &dialler_nonce, &nonce, claim, &theirs) {
                return refuse(
                    format!(
                        "authentication failed at {}: the dialler's proof does not match this \
                         side's secret; both peers need the same TcpConfig::auth_secret",
                        shared.addr
                    ),
                    version,
                    true,
                );
            }
            true
        }
    };
    let from = hello.text().and_then(|t| {
        t.parse::<PeerAddr>()
            .map_err(|e| format!("the HELLO's address is not valid: {e}"))
    });
    match from {
        Ok(a) => Ok(Ok((a, authenticated))),
        Err(why) => refuse(why, version, false),
    }
}

/// Counts an admitted connection as open for as long as it lives.
struct OpenConnection<'a>(&'a AtomicU64);

impl Drop for OpenConnection<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// `io` by `until`, or a `TimedOut` error naming `request_timeout`.
async fn by<T>(until: Instant, io: impl Future<Output = io::Result<T>>) -> io::Result<T> {
    tokio::time::timeout_at(until.into(), io)
        .await
        .unwrap_or_else(|_| Err(request_timed_out()))
}

/// `io` within `stall`, or a `TimedOut` error naming `request_timeout`.
async fn within<T>(stall: Duration, io: impl Future<Output = io::Result<T>>) -> io::Result<T> {
    tokio::time::timeout(stall, io)
        .await
        .unwrap_or_else(|_| Err(request_timed_out()))
}

fn request_timed_out() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "the request did not arrive or progress within request_timeout",
    )
}

/// Writes `bytes` (a status or an answer), giving up after `stall` without progress.
async fn send(stream: &mut Stream, bytes: &[u8], stall: Duration) -> io::Result<()> {
    within(stall, stream.write_all(bytes)).await
}

/// Serves one connection until it closes, breaks the protocol or runs into a timeout.
async fn serve(shared: &Shared, mut stream: Stream) {
    let Some((from, authenticated)) = admit_connection(shared, &mut stream).await else {
        return;
    };
    let counters = &shared.counters;
    Counters::bump(&counters.accepted);
    counters.open.fetch_add(1, Ordering::Relaxed);
    let _open = OpenConnection(&counters.open);
    let stall = shared.config.request_timeout;
    // This connection's apply gate, found by the initiator's address while it is served:
    // an ABANDON over another of its connections closes it (see `crate::abandon`).
    let registered = shared
        .gates
        .register(stream.peer_conn_name(), stream.holder());
    let gate = &registered.gate;
    let mut served = false;
    // How much of the next request a busy-poll takes ahead: as much as the last one took,
    // when it was small (a run of 4 KiB WRITEs then arrives in one `recv` each, and a run
    // of large ones copies no more than [`crate::net::Stream::poll_readable`]'s minimum).
    let mut expect = 0;
    loop {
        if served {
            // The initiator often sends its next request right away: catch it awake.
            stream.poll_readable(shared.config.busy_poll, expect).await;
        }
        served = true;
        let kind = match tokio::time::timeout(shared.config.idle_timeout, stream.read_u8()).await {
            Ok(Ok(k)) => k,
            Ok(Err(_)) => return, // the initiator closed the connection
            Err(_) => {
                Counters::bump(&counters.idle_timeouts);
                tracing::debug!(
                    peer = %from,
                    timeout = ?shared.config.idle_timeout,
                    "closing a data-plane connection idle for idle_timeout"
                );
                return;
            }
        };
        if *gate.lock() {
            // The initiator abandoned this connection: it serves nothing more.
            tracing::debug!(peer = %from, "closing a data-plane connection its initiator abandoned");
            return;
        }
        let until = Instant::now() + stall;
        let outcome = match kind {
            wire::REQ_WRITE => {
                serve_batch(shared, &mut stream, Op::Write, until, &mut expect, gate).await
            }
            wire::REQ_READ => {
                serve_batch(shared, &mut stream, Op::Read, until, &mut expect, gate).await
            }
            wire::REQ_ABANDON => serve_abandon(shared, &mut stream, &registered, until).await,
            wire::REQ_NOTIFY => {
                serve_notify(shared, &mut stream, &from, false, authenticated, until).await
            }
            wire::REQ_NOTIFY_KEYED => {
                serve_notify(shared, &mut stream, &from, true, authenticated, until).await
            }
            other => Err(Broken::Protocol(format!("unknown request kind {other}"))),
        };
        if let Err(broken) = outcome {
            return close_broken(shared, &mut stream, &from, broken).await;
        }
    }
}

/// Admits a new connection before it is served: a same-user check where configured, then
/// the HELLO (and authentication) within `hello_timeout`, answered with a welcome or a
/// refusal. The dialler's address and whether it authenticated, when admitted.
async fn admit_connection(shared: &Shared, stream: &mut Stream) -> Option<(PeerAddr, bool)> {
    let counters = &shared.counters;
    if shared.config.same_user_only
        && shared.config.auth_secret.is_none()
        && let Err(why) = hmc_transport_kit::owner::admit_local_peer(stream.local_peer())
    {
        Counters::bump(&counters.auth_failures);
        tracing::warn!(addr = %shared.addr, %why, "refusing a data-plane connection (same_user_only)");
        return None;
    }
    let hello = tokio::time::timeout(shared.config.hello_timeout, accept_hello(shared, stream));
    let (from, authenticated) = match hello.await {
        Err(_) => {
            Counters::bump(&counters.hello_timeouts);
            tracing::warn!(
                addr = %shared.addr,
                timeout = ?shared.config.hello_timeout,
                "dropping a data-plane connection that did not finish its HELLO in time \
                 (hello_timeout)"
            );
            return None;
        }
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "data-plane connection closed during its HELLO");
            return None;
        }
        Ok(Ok(Err(refusal))) => {
            if refusal.auth {
                Counters::bump(&counters.auth_failures);
            }
            tracing::warn!(addr = %shared.addr, why = %refusal.why, "refusing a data-plane HELLO");
            let answer = wire::encode_hello_v(refusal.version, Some(1), refusal.why.as_bytes());
            answer_and_close(shared, stream, &answer).await;
            return None;
        }
        Ok(Ok(Ok(admitted))) => admitted,
    };
    let version = if authenticated {
        wire::VERSION_AUTH
    } else {
        wire::VERSION
    };
    let answer = wire::encode_hello_v(version, Some(0), shared.addr.to_string().as_bytes());
    let sent = send(stream, &answer, shared.config.hello_timeout).await;
    sent.is_ok().then_some((from, authenticated))
}

/// Writes `answer` (a refusal of the connection) and closes the connection, giving up
/// after `hello_timeout`.
async fn answer_and_close(shared: &Shared, stream: &mut Stream, answer: &[u8]) {
    let _ = tokio::time::timeout(shared.config.hello_timeout, async {
        let _ = stream.write_all(answer).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

/// Ends a connection whose request broke it: counts and logs why, and tells the initiator
/// where the protocol allows.
async fn close_broken(shared: &Shared, stream: &mut Stream, from: &PeerAddr, broken: Broken) {
    let stall = shared.config.request_timeout;
    match broken {
        Broken::Io(e) if e.kind() == io::ErrorKind::TimedOut => {
            Counters::bump(&shared.counters.request_timeouts);
            tracing::warn!(
                peer = %from,
                timeout = ?stall,
                "closing a data-plane connection whose request did not arrive or progress \
                 within request_timeout"
            );
        }
        Broken::Io(e) => {
            tracing::debug!(peer = %from, error = %e, "data-plane connection ended");
        }
        Broken::Protocol(why) => {
            tracing::warn!(peer = %from, %why, "closing a data-plane connection that broke the protocol");
            let status = wire::encode_error(&Error::Protocol(why));
            let _ = send(stream, &status, stall).await;
        }
        Broken::Refused(e) => {
            tracing::warn!(peer = %from, error = %e, "refused a request from its header; closing the connection");
            let _ = send(stream, &wire::encode_error(&e), stall).await;
            let _ = within(stall, stream.shutdown()).await;
        }
    }
}

/// Serves one ABANDON: sets the apply gate of each connection it names (waiting out a
/// `recvmsg` in progress) and answers 0, also when no such connection is served any more.
/// Only a connection from the same IP address may name one; any other is refused with
/// `AccessDenied`, and the connection stays usable.
async fn serve_abandon(
    shared: &Shared,
    stream: &mut Stream,
    asking: &crate::abandon::Registered<'_>,
    until: Instant,
) -> Result<(), Broken> {
    let stall = shared.config.request_timeout;
    let len = by(until, stream.read_u8()).await? as usize;
    if len > crate::abandon::MAX_ADDR_TEXT {
        return Err(Broken::Protocol(format!(
            "an ABANDON's address of {len} bytes exceeds {}",
            crate::abandon::MAX_ADDR_TEXT
        )));
    }
    let mut text = vec![0u8; len];
    by(until, stream.read_exact(&mut text)).await?;
    let named = std::str::from_utf8(&text)
        .ok()
        .and_then(crate::conn_name::ConnName::parse);
    let answer = match (named, stream.peer_socket_addr()) {
        (None, _) => Err(Error::InvalidArgument(format!(
            "an ABANDON at {} named {:?}, which is neither an IP address and port nor a \
             Unix socket's abstract address",
            shared.addr,
            String::from_utf8_lossy(&text)
        ))),
        (Some(ConnName::Tcp(named)), Some(asking_from))
            if named.ip() == asking_from.ip().to_canonical() =>
        {
            let name = ConnName::Tcp(named);
            crate::abandon::close_gates(shared.gates.named(&name, asking)).await;
            Ok(())
        }
        // Over Unix sockets the gates themselves hold the rule: only connections of the
        // asking connection's user are named (`Gates::named`).
        (Some(name @ ConnName::Unix(_)), None) => {
            crate::abandon::close_gates(shared.gates.named(&name, asking)).await;
            Ok(())
        }
        (Some(named), asking_from) => Err(Error::AccessDenied(format!(
            "{} refuses an ABANDON of a connection from {} asked by {}: only a \
             connection from the same IP address (or, over Unix sockets, of the same user) \
             may abandon one",
            shared.addr,
            named.to_text(),
            asking_from.map_or_else(|| "a Unix socket".to_string(), |a| a.to_string())
        ))),
    };
    let status = match &answer {
        Ok(()) => vec![0],
        Err(e) => {
            tracing::warn!(addr = %shared.addr, error = %e, "refused an ABANDON");
            wire::encode_error(e)
        }
    };
    send(stream, &status, stall).await?;
    Ok(())
}

/// Why a connection cannot go on.
enum Broken {
    Io(io::Error),
    Protocol(String),
    /// A refusal decided from a request's header whose body is not read: the error is
    /// sent, then the connection closes.
    Refused(Error),
}

impl From<io::Error> for Broken {
    fn from(e: io::Error) -> Self {
        Broken::Io(e)
    }
}

/// Looks up and checks one descriptor against the registration table.
fn admit(shared: &Shared, op: Op, d: &WireDesc) -> Result<Arc<RegEntry>> {
    let entry = shared.regions.get(d.id).ok_or_else(|| {
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

/// Reads and discards `n` bytes, giving up after `stall` without progress.
async fn drain(stream: &mut Stream, mut n: u64, stall: Duration) -> io::Result<()> {
    let mut scratch = vec![0u8; n.min(64 << 10) as usize];
    while n > 0 {
        let want = n.min(scratch.len() as u64) as usize;
        within(stall, stream.read_exact(&mut scratch[..want])).await?;
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

/// Reads the bytes of `descs` (one region, `entry`) from the socket, one after another,
/// giving up after `stall` without progress. Each `recvmsg` scatters into up to
/// [`MAX_GATHER`] of them, so scattered KV blocks cost the system calls of one contiguous
/// block; before each, under the connection's apply `gate`, the target checks that the
/// initiator has not abandoned the WRITE (by a reset or an ABANDON, see `crate::abandon`).
async fn recv_into(
    stream: &Stream,
    entry: &RegEntry,
    descs: &[WireDesc],
    stall: Duration,
    gate: &Gate,
) -> io::Result<Moved> {
    let pieces: Vec<crate::net::Piece> = descs
        .iter()
        .map(|d| ((entry.region.addr + d.offset) as usize, d.len as usize))
        .collect();
    let mut at = crate::net::Cursor::default();
    at.advance(&pieces, 0);
    let mut done = 0u64;
    let mut wait = false;
    while at.first < pieces.len() {
        if wait {
            within(stall, stream.readable()).await?;
        }
        // The initiator may have given up on this WRITE (its deadline, a cancel): what is
        // left of it is not applied, so none of its bytes land after it reported the end.
        // Checked under the gate, held for the `recvmsg`: an ABANDON waits for it.
        // The guards live in this block only: never across an `.await` (nor do the
        // iovecs' raw pointers).
        let read = crate::abandon::apply(gate, stream, || {
            let live = entry.live.read();
            if !*live {
                return None;
            }
            let mut iov = [crate::net::EMPTY_IOVEC; MAX_GATHER];
            let n = at.iovecs(&pieces, &mut iov);
            // SAFETY: `admit` checked every descriptor against the region, which stays
            // allocated while it is registered (the `register` contract), and `live` (held
            // for this call only) proves it still is. Concurrent access by others follows
            // the DMA rule that `register`'s caller accepted. Bytes already there are taken
            // before waiting for a readiness event.
            Some(unsafe { stream.try_read_iovecs(&iov[..n]) })
        })?;
        let Some(read) = read else {
            return Ok(Moved::Deregistered {
                moved: done,
                started: done > 0,
            });
        };
        match read {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                at.advance(&pieces, n);
                done += n as u64;
                wait = false;
                if at.first < pieces.len() {
                    tokio::task::coop::consume_budget().await;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait = true,
            Err(e) => return Err(e),
        }
    }
    Ok(Moved::Done)
}

/// Writes `prefix` (a status) and then the bytes of `entry` each of `descs` names to the
/// socket, the prefix in the same system call as the first bytes, giving up
/// after `stall` without progress. Consecutive descriptors leave together, up to
/// [`crate::net::SEND_PIECE`] per system call: scattered KV blocks of one region move in
/// the same pieces as one contiguous block.
async fn send_from(
    stream: &Stream,
    entry: &RegEntry,
    descs: &[WireDesc],
    mut prefix: &[u8],
    stall: Duration,
) -> io::Result<Moved> {
    let len: u64 = descs.iter().map(|d| d.len).sum();
    let mut done = 0u64;
    let prefix_len = prefix.len();
    let mut wait = false;
    while done < len || !prefix.is_empty() {
        if wait {
            within(stall, stream.writable()).await?;
        }
        // The guard lives in this block only: never across an `.await`.
        let sent = {
            let live = entry.live.read();
            if !*live {
                return Ok(Moved::Deregistered {
                    moved: done,
                    started: done > 0 || prefix.len() < prefix_len,
                });
            }
            // The descriptors' bytes not sent yet, from `done` on.
            let mut skip = done;
            let mut bufs: [&[u8]; MAX_GATHER] = [&[]; MAX_GATHER];
            let mut n_bufs = 0;
            for &WireDesc {
                offset, len: span, ..
            } in descs
            {
                if skip >= span {
                    skip -= span;
                    continue;
                }
                if n_bufs == MAX_GATHER {
                    break;
                }
                // SAFETY: as in `recv_into`; the bytes are only read.
                bufs[n_bufs] = unsafe {
                    std::slice::from_raw_parts(
                        (entry.region.addr + offset + skip) as *const u8,
                        (span - skip) as usize,
                    )
                };
                n_bufs += 1;
                skip = 0;
            }
            // Room in the socket buffer is used before waiting for a readiness event.
            stream.try_write_gather(prefix, &bufs[..n_bufs])
        };
        match sent {
            Ok(n) => {
                let from_prefix = n.min(prefix.len());
                prefix = &prefix[from_prefix..];
                done += (n - from_prefix) as u64;
                wait = false;
                // A reader that keeps up never makes the loop wait: yield now and then
                // (tokio's budget) so the worker's other tasks get their turn (not after
                // the last bytes: a small op pays nothing).
                if done < len || !prefix.is_empty() {
                    tokio::task::coop::consume_budget().await;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait = true,
            Err(e) => return Err(e),
        }
    }
    Ok(Moved::Done)
}

/// Serves one READ or WRITE; its header must be in by `until`.
async fn serve_batch(
    shared: &Shared,
    stream: &mut Stream,
    op: Op,
    until: Instant,
    size: &mut usize,
    gate: &Gate,
) -> Result<(), Broken> {
    let stall = shared.config.request_timeout;
    let count = by(until, stream.read_u32()).await? as usize;
    let max = shared.config.max_batch_descs;
    if count > max {
        return Err(Broken::Protocol(format!(
            "a request of {count} descriptors exceeds the target's max_batch_descs ({max}); \
             use the same TcpConfig on both peers"
        )));
    }
    let mut raw = vec![0u8; count * WireDesc::LEN];
    by(until, stream.read_exact(&mut raw)).await?;
    if op == Op::Write {
        by(until, wire::skip_pad(stream)).await?;
    }
    let descs = WireDesc::decode_all(&raw);
    let total = descs
        .iter()
        .try_fold(0u64, |acc, d| acc.checked_add(d.len))
        .ok_or_else(|| Broken::Protocol("descriptor lengths overflow u64".into()))?;
    // This request's bytes (a WRITE's padding is under 64), data included when it came
    // with the header (a small WRITE); 0 when it did not: its header alone is small.
    *size = match op {
        Op::Write if total <= wire::COALESCE_LEN as u64 => 5 + raw.len() + 64 + total as usize,
        _ => 0,
    };
    let admitted: Result<Vec<Arc<RegEntry>>> = descs.iter().map(|d| admit(shared, op, d)).collect();
    let entries = match admitted {
        Ok(e) => e,
        Err(refusal) => {
            tracing::debug!(addr = %shared.addr, error = %refusal, ?op, "refused a batch");
            if op == Op::Write {
                drain(stream, total, stall).await?;
            }
            send(stream, &wire::encode_error(&refusal), stall).await?;
            return Ok(());
        }
    };
    match op {
        Op::Write => serve_write(shared, stream, &descs, &entries, total, gate).await,
        Op::Read
            if total <= wire::COALESCE_LEN as u64
                && descs.iter().filter(|d| d.len > 0).count() != 1
                && entries.iter().all(|e| e.memory.is_none()) =>
        {
            // Small answers go out in one write with their status: one segment, one wakeup
            // (one descriptor's bytes leave with the status below, in one `sendmsg`, uncopied).
            let answer = small_answer(shared, &descs, &entries, total as usize);
            send(stream, &answer, stall).await?;
            Ok(())
        }
        Op::Read => serve_read(shared, stream, &descs, &entries).await,
    }
}

/// The runs of consecutive descriptors in the same region, each with its region: a run
/// moves together (see `recv_into` and `send_from`).
fn runs<'a>(
    descs: &'a [WireDesc],
    entries: &'a [Arc<RegEntry>],
) -> impl Iterator<Item = (&'a [WireDesc], &'a Arc<RegEntry>)> {
    let mut i = 0;
    std::iter::from_fn(move || {
        let entry = entries.get(i)?;
        let run = entries[i..]
            .iter()
            .take_while(|e| Arc::ptr_eq(e, entry))
            .count();
        let run_descs = &descs[i..i + run];
        i += run;
        Some((run_descs, entry))
    })
}

/// A staged move's outcome as a [`Moved`], or the refusal that came before any of its
/// bytes moved.
fn staged(moved: StagedMoved) -> Result<Moved> {
    match moved {
        StagedMoved::Done => Ok(Moved::Done),
        StagedMoved::Deregistered { moved, started } => Ok(Moved::Deregistered { moved, started }),
        StagedMoved::Refused(e) => Err(e),
    }
}

/// Receives an admitted WRITE's bytes into its regions (staged for device memory) and
/// answers; a refusal or a deregistration midway drains the rest and answers the error.
async fn serve_write(
    shared: &Shared,
    stream: &mut Stream,
    descs: &[WireDesc],
    entries: &[Arc<RegEntry>],
    total: u64,
    gate: &Gate,
) -> Result<(), Broken> {
    let stall = shared.config.request_timeout;
    let mut remaining = total;
    for (run, entry) in runs(descs, entries) {
        let moved = match &entry.memory {
            Some(memory) => {
                let pool = &shared.staging;
                staged(recv_staged(stream, pool, entry, memory, run, stall, gate).await?)
            }
            None => Ok(recv_into(stream, entry, run, stall, gate).await?),
        };
        let e = match moved {
            Ok(Moved::Done) => {
                remaining -= run.iter().map(|d| d.len).sum::<u64>();
                continue;
            }
            Ok(Moved::Deregistered { moved, .. }) => {
                drain(stream, remaining - moved, stall).await?;
                Error::InvalidKey(format!(
                    "region {} at {} was deregistered during the WRITE; part of the \
                         batch may have landed",
                    run[0].id, shared.addr
                ))
            }
            Err(refused) => {
                drain(stream, remaining, stall).await?;
                refused
            }
        };
        send(stream, &wire::encode_error(&e), stall).await?;
        return Ok(());
    }
    send(stream, &[0], stall).await?;
    Ok(())
}

/// Sends an admitted READ's answer: the success status and its padding with the first
/// bytes, then the regions' bytes (staged for device memory). A deregistration before
/// anything left is answered as a refusal; after, only closing can tell the initiator.
async fn serve_read(
    shared: &Shared,
    stream: &mut Stream,
    descs: &[WireDesc],
    entries: &[Arc<RegEntry>],
) -> Result<(), Broken> {
    let stall = shared.config.request_timeout;
    // The success status and its padding leave with the first bytes.
    let first = descs
        .iter()
        .zip(entries)
        .find(|(d, _)| d.len > 0)
        .map_or(0, |(d, e)| (e.region.addr + d.offset) as usize);
    let pad = wire::align_pad(2, first);
    let mut prefix = [0u8; 2 + 63];
    prefix[1] = pad;
    let mut status: &[u8] = &prefix[..2 + pad as usize];
    for (run, entry) in runs(descs, entries) {
        let sent = match &entry.memory {
            Some(memory) => {
                let pool = &shared.staging;
                staged(send_staged(stream, pool, entry, memory, run, status, stall).await?)
            }
            None => Ok(send_from(stream, entry, run, status, stall).await?),
        };
        let first_call = !status.is_empty();
        status = &[];
        let e = match sent {
            Ok(Moved::Done) => continue,
            // Refused only while nothing of the answer has left.
            Err(refused) => refused,
            // Nothing has left yet: the answer can still be a refusal.
            Ok(Moved::Deregistered { started: false, .. }) if first_call => {
                Error::InvalidKey(format!(
                    "region {} at {} was deregistered before the READ was served",
                    run[0].id, shared.addr
                ))
            }
            Ok(Moved::Deregistered { .. }) => {
                // The answer is already under way; only closing can tell the initiator.
                return Err(Broken::Io(io::Error::other(format!(
                    "region {} was deregistered during a READ",
                    run[0].id
                ))));
            }
        };
        send(stream, &wire::encode_error(&e), stall).await?;
        return Ok(());
    }
    Ok(())
}

/// Serves one NOTIFY (with a key when `keyed`); header and message must be in by `until`.
async fn serve_notify(
    shared: &Shared,
    stream: &mut Stream,
    from: &PeerAddr,
    keyed: bool,
    authenticated: bool,
    until: Instant,
) -> Result<(), Broken> {
    let stall = shared.config.request_timeout;
    let key_len = if keyed { 8 + TOKEN_LEN } else { 0 };
    let mut head = [0u8; 8 + TOKEN_LEN + 12];
    by(until, stream.read_exact(&mut head[..key_len + 12])).await?;
    let key = keyed.then(|| {
        (
            u64::from_be_bytes(head[..8].try_into().expect("8 bytes")),
            <[u8; TOKEN_LEN]>::try_from(&head[8..8 + TOKEN_LEN]).expect("16 bytes"),
        )
    });
    let tag = u64::from_be_bytes(head[key_len..key_len + 8].try_into().expect("8 bytes"));
    let len = u32::from_be_bytes(head[key_len + 8..key_len + 12].try_into().expect("4 bytes"));
    let len = len as usize;
    let counters = &shared.counters;
    let max = shared.config.max_notify_len;
    if len > max {
        // Refused from its header: its body is never read, and the connection closes.
        Counters::bump(&counters.refused_notifications);
        return Err(Broken::Refused(Error::LimitExceeded {
            limit: "max_notify_len",
            value: len as u64,
            max: max as u64,
            hint: format!(
                "raise TcpConfig::max_notify_len at the target ({}), or move the bytes with a \
                 transfer",
                shared.addr
            ),
        }));
    }
    if let Err(e) = admit_notify(shared, key, authenticated) {
        Counters::bump(&counters.refused_notifications);
        tracing::debug!(peer = %from, error = %e, "refused a NOTIFY");
        by(until, drain(stream, len as u64, stall)).await?;
        send(stream, &wire::encode_error(&e), stall).await?;
        return Ok(());
    }
    let mut msg = vec![0u8; len];
    by(until, stream.read_exact(&mut msg)).await?;
    let max_pending = shared.config.max_pending_notifications;
    let max_bytes = shared.config.max_pending_notification_bytes;
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
        if n.bytes + len > max_bytes {
            return Err(Error::LimitExceeded {
                limit: "max_pending_notification_bytes",
                value: (n.bytes + len) as u64,
                max: max_bytes as u64,
                hint: "the target is not calling recv_notification fast enough; retry later, or \
                       raise TcpConfig::max_pending_notification_bytes there"
                    .into(),
            });
        }
        n.bytes += len;
        n.queue.push_back(Notification {
            from: from.clone(),
            tag,
            msg,
        });
        Ok(())
    });
    match queued {
        Ok(()) => send(stream, &[0], stall).await?,
        Err(e) => {
            Counters::bump(&counters.refused_notifications);
            tracing::debug!(peer = %from, error = %e, "refused a NOTIFY");
            send(stream, &wire::encode_error(&e), stall).await?
        }
    }
    Ok(())
}

/// Whether a NOTIFY may be queued at all: notifications are taken here, and the sender
/// holds a live key of this communicator (or authenticated with the shared secret).
fn admit_notify(
    shared: &Shared,
    key: Option<(u64, [u8; TOKEN_LEN])>,
    authenticated: bool,
) -> Result<()> {
    if shared.config.max_pending_notifications == 0 {
        return Err(Error::LimitExceeded {
            limit: "max_pending_notifications",
            value: 1,
            max: 0,
            hint: format!(
                "{} takes no notifications (TcpConfig::max_pending_notifications is 0 there); \
                 send the message another way, or raise it above 0 at the target",
                shared.addr
            ),
        });
    }
    match key {
        Some((id, token)) => {
            let entry = shared.regions.get(id);
            match entry {
                Some(e) if e.token_matches(&token) => Ok(()),
                _ => Err(Error::InvalidKey(format!(
                    "the NOTIFY's key (region {id}) is not a live key at {}: the region was \
                     deregistered or rekeyed; import a current export of it on this endpoint",
                    shared.addr
                ))),
            }
        }
        None if authenticated => Ok(()),
        None => Err(Error::AccessDenied(format!(
            "{} takes a NOTIFY only from a peer it granted access: import one of its exported \
             regions on this endpoint first (the NOTIFY then carries that key), or set the same \
             TcpConfig::auth_secret on both peers",
            shared.addr
        ))),
    }
}
