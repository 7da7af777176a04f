//! Sockets behind one type: TCP and Unix domain streams and listeners addressed by `PeerAddr`.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use hmc_core::{Deadline, Error, PeerAddr, Result};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

/// A connected byte stream over TCP or a Unix domain socket.
#[derive(Debug)]
pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
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
    /// Connects to `addr` by `deadline`. TCP streams get `TCP_NODELAY`: every exchange is
    /// a request followed by a wait for the answer, which Nagle's algorithm would delay.
    pub(crate) async fn connect(addr: &PeerAddr, deadline: Deadline) -> Result<Stream> {
        let start = std::time::Instant::now();
        let connecting = async { hmc_net::connect(addr).await.map(Stream::from) };
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

    /// Busy-polls for up to `window` until the socket has bytes to read (or is closed),
    /// yielding to the runtime's other tasks between checks; returns at once for a zero
    /// window. An answer that comes within the window is then read without the thread
    /// having gone to sleep: on idle cores, waking a sleeping thread costs more than a
    /// small op itself (`TcpConfig::busy_poll`).
    pub(crate) async fn poll_readable(&self, window: std::time::Duration) {
        if window.is_zero() {
            return;
        }
        let start = Instant::now();
        while !self.readable_now() && start.elapsed() < window {
            tokio::task::yield_now().await;
        }
    }

    /// One `poll(2)` with a zero timeout: true when a read would not block.
    fn readable_now(&self) -> bool {
        use std::os::fd::AsRawFd;
        let fd = match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        };
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `p` is a valid `pollfd` on this frame and `nfds` is 1; a zero timeout
        // makes the call return at once. The fd belongs to `self`, alive for the call.
        unsafe { libc::poll(&mut p, 1, 0) > 0 }
    }

    /// Waits until a read may make progress.
    pub(crate) async fn readable(&self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.readable().await,
            Stream::Unix(s) => s.readable().await,
        }
    }

    /// Waits until a write may make progress.
    pub(crate) async fn writable(&self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.writable().await,
            Stream::Unix(s) => s.writable().await,
        }
    }

    /// Fills `buf`, reading again at once after every partial read and sleeping only on
    /// `WouldBlock`. For bulk data this beats `read_exact`, which sleeps after each partial
    /// read until the next readiness event although the sender keeps the socket fed.
    /// Fails with [`io::ErrorKind::TimedOut`] once `until` has passed: a socket that never
    /// runs dry never yields, so a timeout around the call alone could not stop it.
    pub(crate) async fn read_exact_eager(&self, buf: &mut [u8], until: Instant) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            past(until)?;
            // Bytes already there are taken without waiting for a readiness event.
            match self.try_read(&mut buf[done..]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.readable().await?,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Writes all of `prefix` then all of `buf`, the way [`Stream::read_exact_eager`] reads.
    /// The prefix (a request header) leaves in the same system call as the first bytes of
    /// `buf`, so the peer wakes once for both.
    pub(crate) async fn write_all_eager(
        &self,
        mut prefix: &[u8],
        buf: &[u8],
        until: Instant,
    ) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() || !prefix.is_empty() {
            past(until)?;
            self.writable().await?;
            match self.try_write_prefixed(prefix, &buf[done..]) {
                Ok(n) => {
                    let from_prefix = n.min(prefix.len());
                    prefix = &prefix[from_prefix..];
                    done += n - from_prefix;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// One non-blocking write of `prefix` followed by `buf` (a vectored write when the
    /// prefix is not empty); returns the bytes written from both together.
    pub(crate) fn try_write_prefixed(&self, prefix: &[u8], buf: &[u8]) -> io::Result<usize> {
        if prefix.is_empty() {
            return self.try_write(buf);
        }
        let bufs = [io::IoSlice::new(prefix), io::IoSlice::new(buf)];
        match self {
            Stream::Tcp(s) => s.try_write_vectored(&bufs),
            Stream::Unix(s) => s.try_write_vectored(&bufs),
        }
    }

    /// True when a pooled (idle) connection can no longer carry a request: the peer closed
    /// it, it failed, or it holds bytes nobody asked for (then it is out of step and is
    /// dropped anyway). One non-blocking read.
    pub(crate) fn closed_by_peer(&self) -> bool {
        let mut probe = [0u8; 1];
        !matches!(self.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// One non-blocking `read`; `WouldBlock` when nothing is there. It asks the socket
    /// directly (tokio's cached readiness may not know yet of bytes that arrived while
    /// this task busy-polled or ran), and only on `WouldBlock` goes through tokio too, so
    /// that a stale readiness is cleared and the next `readable()` really waits.
    pub(crate) fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self.recv_raw(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => match self {
                Stream::Tcp(s) => s.try_read(buf),
                Stream::Unix(s) => s.try_read(buf),
            },
            r => r,
        }
    }

    /// One `recv(MSG_DONTWAIT)` on the socket.
    fn recv_raw(&self, buf: &mut [u8]) -> io::Result<usize> {
        use std::os::fd::AsRawFd;
        let fd = match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        };
        loop {
            // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the call, and the
            // fd belongs to `self`, alive for the call.
            let n =
                unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// One non-blocking `write`; `WouldBlock` when the socket buffer is full.
    pub(crate) fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.try_write(buf),
            Stream::Unix(s) => s.try_write(buf),
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // Bytes already there first, without a readiness event (see `Stream::try_read`).
        match this.recv_raw(buf.initialize_unfilled()) {
            Ok(n) => {
                buf.advance(n);
                return Poll::Ready(Ok(()));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Poll::Ready(Err(e)),
        }
        match this {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

impl From<hmc_net::Conn> for Stream {
    fn from(c: hmc_net::Conn) -> Self {
        match c {
            hmc_net::Conn::Tcp(s) => Stream::Tcp(s),
            hmc_net::Conn::Unix(s) => Stream::Unix(s),
        }
    }
}

/// A listening socket (the layer `hmc-net` shares with the RPC runtime); removes its Unix
/// socket file when dropped.
#[derive(Debug)]
pub(crate) struct Listener(hmc_net::Listener);

impl Listener {
    /// Binds `addr`. `tcp://IP:0` picks a free port; [`Listener::local_addr`] tells which.
    /// Unix paths follow [`bind_unix_listener`].
    pub(crate) fn bind(addr: &PeerAddr) -> Result<Listener> {
        hmc_net::Listener::bind(addr).map(Listener)
    }

    /// The address peers dial, with the port the kernel chose.
    pub(crate) fn local_addr(&self) -> Result<PeerAddr> {
        self.0.local_addr()
    }

    /// Accepts one connection; TCP streams get `TCP_NODELAY`.
    pub(crate) async fn accept(&self) -> io::Result<Stream> {
        self.0.accept().await.map(Stream::from)
    }
}

pub use hmc_net::bind_unix_listener;

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
mod tests {
    use super::*;

    /// A connected client stream, and a peer task that reads pieces of `piece` bytes until
    /// the stream closes and returns how many it read.
    async fn stream_to_a_counting_peer(piece: usize) -> (Stream, tokio::task::JoinHandle<u64>) {
        let l = Listener::bind(&"tcp://127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        let peer = tokio::spawn(async move {
            let s = l.accept().await.unwrap();
            let mut buf = vec![0u8; piece];
            let mut pieces = 0u64;
            while s
                .read_exact_eager(&mut buf, Instant::now() + FAR)
                .await
                .is_ok()
            {
                pieces += 1;
            }
            pieces
        });
        let c = Stream::connect(&addr, Deadline::after(FAR)).await.unwrap();
        (c, peer)
    }

    /// A bulk read or write whose deadline has passed fails with `TimedOut` before it moves
    /// a byte; within the deadline the same calls move everything (the peer here reads one
    /// byte at a time and counts them).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bulk_reads_and_writes_past_their_deadline_move_nothing() {
        let (c, drain) = stream_to_a_counting_peer(1).await;
        let big = vec![5u8; 8 << 20];
        let e = c
            .write_all_eager(b"hdr", &big, Instant::now())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        // Within the deadline the same call moves everything.
        c.write_all_eager(b"", &big[..4096], Instant::now() + FAR)
            .await
            .unwrap();
        let mut back = [0u8; 16];
        let e = c
            .read_exact_eager(&mut back, Instant::now())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        drop(c);
        assert_eq!(
            drain.await.unwrap(),
            4096,
            "nothing written past the deadline"
        );
    }

    /// A peer that reads as fast as the writer writes rarely makes it wait, so the write
    /// loop must notice its deadline itself: writes of 64 MiB, one after another, to such a
    /// peer end with `TimedOut` soon after the deadline (without the check they would go on
    /// until the cap below).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_bulk_write_to_a_peer_that_keeps_up_stops_at_its_deadline() {
        let (c, drain) = stream_to_a_counting_peer(1 << 20).await;
        let big = vec![5u8; 64 << 20];
        let until = Instant::now() + std::time::Duration::from_millis(100);
        let cap = until + std::time::Duration::from_secs(10);
        let ended = loop {
            match c.write_all_eager(b"", &big, until).await {
                Ok(()) if Instant::now() < cap => continue,
                Ok(()) => break None,
                Err(e) => break Some(e),
            }
        };
        let e = ended.expect("the writes went on past the deadline until the cap");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        drop(c);
        assert!(
            drain.await.unwrap() > 0,
            "the peer received data before the deadline"
        );
    }

    const FAR: std::time::Duration = std::time::Duration::from_secs(20);
}
