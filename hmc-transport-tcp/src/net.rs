//! Sockets behind one type: TCP and Unix domain streams and listeners addressed by `PeerAddr`.
//!
//! A [`Stream`] is registered with the runtime's poller only while a task waits on it.
//! Requests and answers that arrive while their reader busy-polls are read with plain
//! non-blocking system calls; were the socket registered then, every arriving segment
//! would also wake the worker thread parked in the poller (it holds the runtime's I/O
//! driver), which on a machine of few cores takes the core the busy-polling reader or its
//! peer runs on: a context switch or two per small op on each side.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use hmc_core::{Deadline, Error, PeerAddr, Result};
use hmc_transport_kit::nonblocking;
use parking_lot::Mutex;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

use crate::conn_name::{ConnName, Holder};

mod named_unix;

/// A connected byte stream over TCP or a Unix domain socket, in non-blocking mode.
#[derive(Debug)]
pub(crate) struct Stream {
    /// The poller registration, made when a task first has to wait and dropped again by
    /// [`Stream::poll_readable`] (see the module docs). Declared before `sock`, so it is
    /// deregistered before the socket closes.
    reg: Mutex<Option<Arc<AsyncFd<Fd>>>>,
    /// Bytes read ahead of a small read (see [`READ_AHEAD`]); every read takes them first.
    ahead: Mutex<ReadAhead>,
    sock: Sock,
}

/// How many bytes a small read (a request's or an answer's header, field by field) asks
/// the socket for at once. A request of one descriptor is 46 bytes before its data, and
/// was read in four system calls; now the first takes the whole header (and, for a small
/// WRITE, the first bytes of its data). The protocol is request then answer on each
/// connection, so the bytes read ahead never belong to a later message.
const READ_AHEAD: usize = 256;

/// The most one bulk send hands the kernel. A single `sendmsg` of megabytes holds the
/// socket's lock while it copies everything that fits, so the receiver starts copying out
/// only when the call ends; in pieces, the receiver copies one out while the sender copies
/// the next in (a 64 KiB op is one piece).
pub(crate) const SEND_PIECE: usize = 256 << 10;

/// Buffers one gathering send takes at most (see [`Stream::try_write_gather`]).
pub(crate) const MAX_GATHER: usize = 64;

/// The most a busy-poll's check ([`Stream::poll_readable`]) takes ahead: a whole small
/// message, its header with the data coalesced after it (up to [`crate::wire::COALESCE_LEN`]).
/// A 4 KiB message then arrives in one `recv` and one copy instead of two `recv`s (the
/// header's, then the data's): on loopback a system call costs more than copying 4 KiB.
const READ_AHEAD_MAX: usize = crate::wire::COALESCE_LEN + 512;

/// Bytes received ahead of the reads that take them: `buf[start..end]`.
#[derive(Debug)]
struct ReadAhead {
    /// [`READ_AHEAD_MAX`] bytes.
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    /// An error a busy-poll's `recv` met (see [`Stream::readable_now`]), kept for the next
    /// read to report. Only set with no bytes kept.
    failed: Option<io::Error>,
}

impl ReadAhead {
    /// Moves up to `out.len()` buffered bytes into `out`; how many (0 when empty).
    fn take(&mut self, out: &mut [u8]) -> usize {
        let n = out.len().min(self.end - self.start);
        out[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
        self.start += n;
        n
    }

    fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// True when a read would take something from here: bytes or the kept error.
    fn is_ready(&self) -> bool {
        !self.is_empty() || self.failed.is_some()
    }
}

/// The owned socket.
#[derive(Debug)]
enum Sock {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

/// The socket's descriptor as the poller registration holds it (not owned: `Sock` closes it).
#[derive(Debug)]
struct Fd(RawFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// How long [`Stream::poll_readable`] checks the socket without yielding to the runtime.
/// A task that yields asks the multi-threaded runtime to wake a parked worker to help (a
/// write to its wake-up descriptor, and a context switch on a core the peer may need);
/// a small op's answer comes within this, so most ops never yield. Other tasks of the
/// same worker wait at most this long.
const SPIN_BEFORE_YIELD: std::time::Duration = std::time::Duration::from_micros(20);

/// A piece of memory to read into or write from: (address, length).
pub(crate) type Piece = (usize, usize);

pub(crate) const EMPTY_IOVEC: libc::iovec = libc::iovec {
    iov_base: std::ptr::null_mut(),
    iov_len: 0,
};

/// Where a scattered read is in a list of [`Piece`]s: the first piece not yet full, and
/// the bytes of it already read.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Cursor {
    pub(crate) first: usize,
    skip: usize,
}

impl Cursor {
    /// Moves past `n` bytes of `pieces`, and past empty pieces after them.
    pub(crate) fn advance(&mut self, pieces: &[Piece], mut n: usize) {
        while let Some(&(_, len)) = pieces.get(self.first) {
            let left = len - self.skip;
            if left == 0 {
                (self.first, self.skip) = (self.first + 1, 0);
            } else if n == 0 {
                return;
            } else {
                let t = n.min(left);
                (self.skip, n) = (self.skip + t, n - t);
            }
        }
    }

    /// Fills `iov` with the rest of `pieces` from here, up to its length; how many.
    pub(crate) fn iovecs(&self, pieces: &[Piece], iov: &mut [libc::iovec]) -> usize {
        let mut n = 0;
        for (k, &(addr, len)) in pieces[self.first..].iter().take(iov.len()).enumerate() {
            let from = if k == 0 { self.skip } else { 0 };
            iov[k] = libc::iovec {
                iov_base: (addr + from) as *mut libc::c_void,
                iov_len: len - from,
            };
            n += 1;
        }
        n
    }
}

/// The error of a bulk read or write that ran into its deadline (see
/// [`Stream::read_exact_eager`]).
fn past(until: Instant) -> io::Result<()> {
    if Instant::now() >= until {
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the transfer's deadline passed mid-stream",
        ))
    } else {
        Ok(())
    }
}

impl Stream {
    /// Takes a connection from `hmc-transport-kit` out of the runtime's poller (see the module docs).
    fn from_conn(c: hmc_transport_kit::Conn) -> io::Result<Stream> {
        let sock = match c {
            hmc_transport_kit::Conn::Tcp(s) => Sock::Tcp(s.into_std()?),
            hmc_transport_kit::Conn::Unix(s) => Sock::Unix(s.into_std()?),
        };
        Ok(Stream::from_sock(sock))
    }

    /// A socket already in non-blocking mode.
    fn from_sock(sock: Sock) -> Stream {
        Stream {
            reg: Mutex::new(None),
            ahead: Mutex::new(ReadAhead {
                buf: vec![0; READ_AHEAD_MAX].into_boxed_slice(),
                start: 0,
                end: 0,
                failed: None,
            }),
            sock,
        }
    }

    /// Who the peer is, as this host can tell (`hmc_transport_kit::owner`): a Unix peer's uid, a TCP
    /// peer on this host by its socket's owner, or a remote one.
    pub(crate) fn local_peer(&self) -> hmc_transport_kit::owner::LocalPeer {
        use hmc_transport_kit::owner::{self, LocalPeer};
        match &self.sock {
            Sock::Tcp(s) => match (s.peer_addr(), s.local_addr()) {
                (Ok(p), Ok(l)) => owner::tcp_local_peer(p, l),
                _ => LocalPeer::Unknown,
            },
            Sock::Unix(s) => owner::peer_uid(s).map_or(LocalPeer::Unknown, LocalPeer::User),
        }
    }

    /// The peer's address and port, for a TCP connection (`None` over a Unix socket).
    pub(crate) fn peer_socket_addr(&self) -> Option<std::net::SocketAddr> {
        match &self.sock {
            Sock::Tcp(s) => s.peer_addr().ok(),
            Sock::Unix(_) => None,
        }
    }

    /// The peer's side of this connection, as an ABANDON names it (`None`: a Unix peer
    /// that dialled unnamed).
    pub(crate) fn peer_conn_name(&self) -> Option<ConnName> {
        match &self.sock {
            Sock::Tcp(s) => s.peer_addr().ok().map(ConnName::tcp),
            Sock::Unix(s) => named_unix::name_of(s.peer_addr()),
        }
    }

    /// This side of the connection, as the peer sees it in [`Stream::peer_conn_name`]
    /// (`None`: a Unix socket dialled unnamed).
    pub(crate) fn local_conn_name(&self) -> Option<ConnName> {
        match &self.sock {
            Sock::Tcp(s) => s.local_addr().ok().map(ConnName::tcp),
            Sock::Unix(s) => named_unix::name_of(s.local_addr()),
        }
    }

    /// Who holds the connection's other end, as far as this side can tell: a TCP peer's
    /// IP address, a Unix peer's uid.
    pub(crate) fn holder(&self) -> Option<Holder> {
        match &self.sock {
            Sock::Tcp(s) => s
                .peer_addr()
                .ok()
                .map(|a| Holder::Ip(a.ip().to_canonical())),
            Sock::Unix(s) => hmc_transport_kit::owner::peer_uid(s).map(Holder::Uid),
        }
    }

    /// Connects to `addr` by `deadline`. TCP streams get `TCP_NODELAY`: every exchange is
    /// a request followed by a wait for the answer, which Nagle's algorithm would delay.
    pub(crate) async fn connect(addr: &PeerAddr, deadline: Deadline) -> Result<Stream> {
        let start = std::time::Instant::now();
        let connecting = async {
            match addr {
                // Named, so that the target can tell this connection in an ABANDON.
                PeerAddr::Unix(path) => named_unix::connect(path)
                    .await
                    .map(|s| Stream::from_sock(Sock::Unix(s))),
                _ => hmc_transport_kit::connect(addr)
                    .await
                    .and_then(Stream::from_conn),
            }
        };
        match tokio::time::timeout_at(deadline.instant().into(), connecting).await {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(e)) if e.kind() == io::ErrorKind::Unsupported => Err(Error::InvalidArgument(
                format!("cannot dial {addr}: use a tcp://IP:PORT or unix:///path address"),
            )),
            // The OS error stays the source, so a caller can tell a refusal
            // (`io::ErrorKind::ConnectionRefused`) from an unreachable host.
            Ok(Err(e)) => Err(Error::io(
                format!("connecting to {addr} (is a peer listening there?)"),
                e,
            )),
            Err(_) => Err(Error::DeadlineExceeded {
                during: "connect",
                elapsed: start.elapsed(),
            }),
        }
    }

    fn fd(&self) -> RawFd {
        match &self.sock {
            Sock::Tcp(s) => s.as_raw_fd(),
            Sock::Unix(s) => s.as_raw_fd(),
        }
    }

    /// The poller registration, made on first use.
    fn registration(&self) -> io::Result<Arc<AsyncFd<Fd>>> {
        let mut reg = self.reg.lock();
        if let Some(r) = &*reg {
            return Ok(r.clone());
        }
        // SAFETY: the fd is `sock`'s, open until `sock` drops. The registration lives in
        // `reg`, dropped before `sock` (field order), and in clones that only methods
        // borrowing `self` hold, so it never outlives the descriptor.
        let r = unsafe {
            AsyncFd::register_with_interest(Fd(self.fd()), Interest::READABLE | Interest::WRITABLE)
        }?;
        let r = Arc::new(r);
        *reg = Some(r.clone());
        Ok(r)
    }

    /// Busy-polls for up to `window` until the socket has bytes to read (or is closed),
    /// yielding to the runtime's other tasks between checks; returns at once for a zero
    /// window. An answer that comes within the window is then read without the thread
    /// having gone to sleep: on idle cores, waking a sleeping thread costs more than a
    /// small op itself (`TcpConfig::busy_poll`). With a window, the socket first leaves
    /// the poller, so the bytes it waits for wake no other thread either.
    ///
    /// `expect` bytes is how much of the coming message the caller will read: the check
    /// takes up to that many (at least [`READ_AHEAD`], at most [`READ_AHEAD_MAX`]).
    pub(crate) async fn poll_readable(&mut self, window: std::time::Duration, expect: usize) {
        if window.is_zero() {
            return;
        }
        // No task waits on the registration: the caller holds the stream mutably.
        self.reg.get_mut().take();
        let start = Instant::now();
        let ask = expect.clamp(READ_AHEAD, READ_AHEAD_MAX);
        while !self.readable_now(ask) {
            let waited = start.elapsed();
            if waited >= window {
                break;
            }
            if waited < SPIN_BEFORE_YIELD {
                std::hint::spin_loop();
            } else {
                tokio::task::yield_now().await;
            }
        }
    }

    /// True when a read would not block, checked with one non-blocking `recv` into the
    /// read-ahead buffer: the bytes it takes are kept for the reads that follow, an error
    /// for the next read to report (the end of the stream repeats by itself). A busy-poll
    /// that checked with `poll(2)` and then read made two system calls where the bytes
    /// needed one, and on two cores the second cost about as much as the first.
    fn readable_now(&self, ask: usize) -> bool {
        let mut ahead = self.ahead.lock();
        if ahead.is_ready() {
            return true;
        }
        match self.refill(&mut ahead, ask) {
            Ok(_) => true,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => false,
            Err(e) => {
                ahead.failed = Some(e);
                true
            }
        }
    }

    /// One `poll(2)` for `events` with a zero timeout: true when the socket reports any of
    /// them, or an error or hang-up (then the next call fails or ends at once too).
    fn ready_now(&self, events: i16) -> bool {
        nonblocking::ready_now(self.fd(), events)
    }

    /// Waits until a read may make progress (bytes, end of stream or an error).
    pub(crate) async fn readable(&self) -> io::Result<()> {
        self.ready(Interest::READABLE, libc::POLLIN).await
    }

    /// Waits until a write may make progress.
    pub(crate) async fn writable(&self) -> io::Result<()> {
        self.ready(Interest::WRITABLE, libc::POLLOUT).await
    }

    /// Waits on the poller until the socket itself reports `events`. The poller's cached
    /// readiness can be stale (bytes it reported may have been read by a busy-polling
    /// reader since), so it is checked against the socket and cleared when the socket
    /// disagrees; an event that arrives meanwhile is kept (its tick is newer).
    async fn ready(&self, interest: Interest, events: i16) -> io::Result<()> {
        if interest.is_readable() && self.ahead.lock().is_ready() {
            return Ok(());
        }
        let reg = self.registration()?;
        loop {
            let mut guard = reg.ready(interest).await?;
            if self.ready_now(events) {
                return Ok(());
            }
            guard.clear_ready();
        }
    }

    /// Fills `buf`: [`Stream::read_exact_scatter_eager`] of one piece.
    #[cfg(test)]
    pub(crate) async fn read_exact_eager(
        &self,
        buf: &mut [u8],
        until: Instant,
        spin: std::time::Duration,
    ) -> io::Result<()> {
        let pieces = [(buf.as_mut_ptr() as usize, buf.len())];
        // SAFETY: the one piece is `buf`, borrowed mutably for the call.
        unsafe { self.read_exact_scatter_eager(&pieces, until, spin) }.await
    }

    /// Fills `pieces` (address, length) one after another, reading again at once after every partial read and sleeping only on
    /// `WouldBlock`. For bulk data this beats `read_exact`, which sleeps after each partial
    /// read until the next readiness event although the sender keeps the socket fed.
    /// Fails with [`io::ErrorKind::TimedOut`] once `until` has passed: a socket that never
    /// runs dry never yields, so a timeout around the call alone could not stop it.
    ///
    /// A socket that runs dry mid-way is polled for up to `spin` (as
    /// [`Stream::poll_readable`] does) before the read waits on the poller: a reader that
    /// drains faster than its peer sends runs dry many times per megabyte, and each wait
    /// on the poller costs a wake-up of this thread by the runtime's I/O driver.
    ///
    /// Each `recvmsg` scatters into up to [`MAX_GATHER`] pieces, so a batch of scattered
    /// blocks costs the system calls of one contiguous transfer.
    ///
    /// # Safety
    /// Every piece is valid for writes, and used by nothing else, until the future ends
    /// or is dropped.
    pub(crate) async unsafe fn read_exact_scatter_eager(
        &self,
        pieces: &[Piece],
        until: Instant,
        spin: std::time::Duration,
    ) -> io::Result<()> {
        let mut at = Cursor::default();
        at.advance(pieces, 0);
        let mut dry: Option<Instant> = None;
        while at.first < pieces.len() {
            past(until)?;
            // Bytes already there are taken without waiting for a readiness event. (The
            // iovecs hold raw pointers: never across an `.await`.)
            let read = {
                let mut iov = [EMPTY_IOVEC; MAX_GATHER];
                let n = at.iovecs(pieces, &mut iov);
                // SAFETY: the iovecs lie inside the pieces (this function's contract).
                unsafe { self.try_read_iovecs(&iov[..n]) }
            };
            match read {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    at.advance(pieces, n);
                    dry = None;
                    // As in `write_all_eager`: a socket that never runs dry never waits.
                    if at.first < pieces.len() {
                        tokio::task::coop::consume_budget().await;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let waited = dry.get_or_insert_with(Instant::now).elapsed();
                    if waited >= spin {
                        self.readable().await?;
                        dry = None;
                    } else if waited < SPIN_BEFORE_YIELD {
                        std::hint::spin_loop();
                    } else {
                        tokio::task::yield_now().await;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Bytes read ahead into `iov` (in order), else one non-blocking `recvmsg` scattered
    /// into it; `WouldBlock` when nothing is there.
    ///
    /// # Safety
    /// Every iovec is valid for writes for the call.
    pub(crate) unsafe fn try_read_iovecs(&self, iov: &[libc::iovec]) -> io::Result<usize> {
        let buffered = {
            let mut ahead = self.ahead.lock();
            if let Some(e) = ahead.failed.take() {
                return Err(e);
            }
            let mut n = 0;
            for v in iov {
                // SAFETY: per this function's contract.
                let out = unsafe { std::slice::from_raw_parts_mut(v.iov_base.cast(), v.iov_len) };
                let took = ahead.take(out);
                n += took;
                if took < v.iov_len {
                    break;
                }
            }
            n
        };
        if buffered > 0 || iov.iter().all(|v| v.iov_len == 0) {
            return Ok(buffered);
        }
        // SAFETY: the buffers are valid for writes (this function's contract).
        unsafe { nonblocking::recvmsg_now(self.fd(), iov) }
    }

    /// Writes all of `prefix` then all of `buf`, the way [`Stream::read_exact_eager`] reads.
    /// The prefix (a request header) leaves in the same system call as the first bytes of
    /// `buf`, so the peer wakes once for both.
    pub(crate) async fn write_all_eager(
        &self,
        prefix: &[u8],
        buf: &[u8],
        until: Instant,
    ) -> io::Result<()> {
        self.write_all_gather_eager(prefix, &[buf], until).await
    }

    /// As [`Stream::write_all_eager`] with the bytes of `bufs` one after another: each
    /// `sendmsg` gathers as many of them as fit in [`SEND_PIECE`] (up to [`MAX_GATHER`]),
    /// so a batch of scattered blocks costs the system calls of one contiguous transfer.
    pub(crate) async fn write_all_gather_eager(
        &self,
        mut prefix: &[u8],
        bufs: &[&[u8]],
        until: Instant,
    ) -> io::Result<()> {
        // The first buffer not yet sent in full, how much of it has been, and how many
        // bytes of all the buffers are left.
        let (mut first, mut sent) = (0, 0);
        let mut left: usize = bufs.iter().map(|b| b.len()).sum();
        let mut pending: [&[u8]; MAX_GATHER] = [&[]; MAX_GATHER];
        while left > 0 || !prefix.is_empty() {
            while first < bufs.len() && sent == bufs[first].len() {
                (first, sent) = (first + 1, 0);
            }
            past(until)?;
            let n_bufs = (bufs.len() - first).min(MAX_GATHER);
            for (slot, (i, b)) in pending.iter_mut().zip(bufs[first..].iter().enumerate()) {
                *slot = if i == 0 { &b[sent..] } else { b };
            }
            // Room in the socket buffer is used before waiting for a readiness event.
            match self.try_write_gather(prefix, &pending[..n_bufs]) {
                Ok(n) => {
                    let from_prefix = n.min(prefix.len());
                    prefix = &prefix[from_prefix..];
                    let mut moved = n - from_prefix;
                    left -= moved;
                    while moved > 0 {
                        let take = moved.min(bufs[first].len() - sent);
                        (sent, moved) = (sent + take, moved - take);
                        if sent == bufs[first].len() && moved > 0 {
                            (first, sent) = (first + 1, 0);
                        }
                    }
                    // A peer that keeps up never makes the loop wait: it yields to the
                    // runtime every so often (tokio's budget), so the task's other work
                    // and a cancellation get their turn during a large transfer. (Not
                    // after the last bytes: a small op pays nothing.)
                    if left > 0 || !prefix.is_empty() {
                        tokio::task::coop::consume_budget().await;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.writable().await?,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// One non-blocking write of `prefix` and then the bytes of `bufs`, one after another
    /// (a vectored write, unless that is a single buffer): at most [`SEND_PIECE`] bytes of
    /// `bufs` and up to [`MAX_GATHER`] of them. Returns the bytes written from all together.
    pub(crate) fn try_write_gather(&self, prefix: &[u8], bufs: &[&[u8]]) -> io::Result<usize> {
        let mut slices = [io::IoSlice::new(&[]); 1 + MAX_GATHER];
        let mut n = 0;
        if !prefix.is_empty() {
            slices[0] = io::IoSlice::new(prefix);
            n = 1;
        }
        let mut room = SEND_PIECE;
        for b in bufs.iter().take(MAX_GATHER) {
            if room == 0 {
                break;
            }
            let take = b.len().min(room);
            slices[n] = io::IoSlice::new(&b[..take]);
            n += 1;
            room -= take;
        }
        if n == 1 {
            return self.try_write(&slices[0]);
        }
        self.send_vectored(&slices[..n])
    }

    /// True when the peer closed or reset the connection, even with bytes of it still
    /// unread here: a target asks before applying each part of a WRITE, so the rest of a
    /// WRITE whose initiator gave up (and reset the connection, [`Stream::reset_on_close`])
    /// never lands. One `poll` that does not wait.
    pub(crate) fn abandoned_by_peer(&self) -> bool {
        nonblocking::peer_hung_up(self.fd())
    }

    /// Makes closing this connection reset it (a zero linger): bytes not yet sent are
    /// discarded instead of delivered once the peer reads again, and the peer sees the
    /// reset at once ([`Stream::abandoned_by_peer`]). For a request given up half-way.
    pub(crate) fn reset_on_close(&self) {
        if let Err(error) = nonblocking::reset_on_close(self.fd()) {
            tracing::debug!(%error, "SO_LINGER not set; the connection closes normally");
        }
    }

    /// True when a pooled (idle) connection can no longer carry a request: the peer closed
    /// it, it failed, or it holds bytes nobody asked for (then it is out of step and is
    /// dropped anyway). One non-blocking read.
    pub(crate) fn closed_by_peer(&self) -> bool {
        let mut probe = [0u8; 1];
        !matches!(self.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// Bytes read ahead, else one non-blocking `recv`; `WouldBlock` when nothing is there.
    pub(crate) fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        let buffered = {
            let mut ahead = self.ahead.lock();
            if let Some(e) = ahead.failed.take() {
                return Err(e);
            }
            ahead.take(buf)
        };
        if buffered > 0 || buf.is_empty() {
            return Ok(buffered);
        }
        self.recv_raw(buf)
    }

    /// One non-blocking `recv` straight into `buf`.
    fn recv_raw(&self, buf: &mut [u8]) -> io::Result<usize> {
        nonblocking::recv_now(self.fd(), buf)
    }

    /// As [`Stream::try_read`], but a read smaller than [`READ_AHEAD`] with nothing
    /// buffered asks the socket for [`READ_AHEAD`] bytes and keeps what `buf` cannot take.
    fn read_small_or_direct(&self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.len() >= READ_AHEAD {
            return self.try_read(buf);
        }
        let mut ahead = self.ahead.lock();
        if let Some(e) = ahead.failed.take() {
            return Err(e);
        }
        if ahead.is_empty() && self.refill(&mut ahead, READ_AHEAD)? == 0 {
            return Ok(0); // end of stream
        }
        Ok(ahead.take(buf))
    }

    /// One non-blocking `recv` of at most `ask` bytes into the empty read-ahead buffer;
    /// how many bytes it holds.
    fn refill(&self, ahead: &mut ReadAhead, ask: usize) -> io::Result<usize> {
        let n = self.recv_raw(&mut ahead.buf[..ask.min(READ_AHEAD_MAX)])?;
        ahead.start = 0;
        ahead.end = n;
        Ok(n)
    }

    /// One non-blocking `send`; `WouldBlock` when the socket buffer is full. A peer that
    /// closed its end is an error (`MSG_NOSIGNAL`), never a `SIGPIPE`: a host process
    /// such as Python's may not ignore that signal.
    pub(crate) fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        nonblocking::send_now(self.fd(), buf)
    }

    /// One non-blocking `sendmsg` of `bufs`, as [`Stream::try_write`].
    fn send_vectored(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        nonblocking::sendmsg_now(self.fd(), bufs)
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            match this.read_small_or_direct(buf.initialize_unfilled()) {
                Ok(n) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
            let reg = this.registration()?;
            match reg.poll_read_ready(cx) {
                Poll::Ready(Ok(mut ready)) => ready.clear_ready(),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        loop {
            match this.try_write(buf) {
                Ok(n) => return Poll::Ready(Ok(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
            let reg = this.registration()?;
            match reg.poll_write_ready(cx) {
                Poll::Ready(Ok(mut ready)) => ready.clear_ready(),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Bytes go straight to the socket: nothing is buffered here.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = match &self.sock {
            Sock::Tcp(s) => s.shutdown(std::net::Shutdown::Write),
            Sock::Unix(s) => s.shutdown(std::net::Shutdown::Write),
        };
        // A peer that already went away leaves nothing to shut down.
        Poll::Ready(match r {
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(()),
            r => r,
        })
    }
}

/// A listening socket (the layer `hmc-transport-kit` shares with the RPC runtime); removes its Unix
/// socket file when dropped.
#[derive(Debug)]
pub(crate) struct Listener(hmc_transport_kit::Listener);

impl Listener {
    /// Binds `addr`. `tcp://IP:0` picks a free port; [`Listener::local_addr`] tells which.
    /// Unix paths follow [`bind_unix_listener`].
    pub(crate) fn bind(addr: &PeerAddr) -> Result<Listener> {
        hmc_transport_kit::Listener::bind(addr).map(Listener)
    }

    /// The address peers dial, with the port the kernel chose.
    pub(crate) fn local_addr(&self) -> Result<PeerAddr> {
        self.0.local_addr()
    }

    /// Accepts one connection; TCP streams get `TCP_NODELAY`.
    pub(crate) async fn accept(&self) -> io::Result<Stream> {
        self.0.accept().await.and_then(Stream::from_conn)
    }
}

pub use hmc_transport_kit::bind_unix_listener;

/// True for errors that mean "the other side went away" rather than a local fault.
pub(crate) fn is_disconnect(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::NotConnected
    )
}

#[cfg(test)]
#[path = "net_tests.rs"]
mod tests;
