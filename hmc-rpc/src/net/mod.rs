//! Sockets: one stream and listener type over TCP (IPv4/IPv6) and Unix domain sockets;
//! the connection tasks' timer; and their bounded busy-polling ([`busy_poll`]).

use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::time::{Duration, Instant};

use hmc_core::{Error, PeerAddr, Result};
use hmc_transport_kit::nonblocking;
use tokio::net::{TcpStream, UnixStream};

use crate::proto::{ReadTarget, TxQueue};

mod auth;
mod busy_poll;

pub(crate) use busy_poll::{BusyPoll, POLL_MAX_MESSAGE};

/// A connected socket.
pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

// ---- The RPC peer's identity, for the HMC_BUFFER dial rule (issue 22; data_plane.rs) ----

impl Stream {
    /// Who is at the other end, as the socket says: a TCP peer's address (and ours), a
    /// Unix peer's uid (SO_PEERCRED).
    pub(crate) fn rpc_peer(&self) -> crate::data_plane::RpcPeer {
        use crate::data_plane::RpcPeer;
        match self {
            Stream::Tcp(s) => match (s.peer_addr(), s.local_addr()) {
                (Ok(peer), Ok(local)) => RpcPeer::Tcp { peer, local },
                _ => RpcPeer::Unknown,
            },
            Stream::Unix(s) => RpcPeer::Unix {
                uid: s.peer_cred().ok().map(|c| c.uid()),
            },
        }
    }
}

// ---- end of the RPC peer's identity ----

impl Stream {
    /// Who the peer is, as this host can tell (for `same_user_only`).
    pub(crate) fn local_peer(&self) -> hmc_transport_kit::owner::LocalPeer {
        use hmc_transport_kit::owner::{self, LocalPeer};
        match self {
            Stream::Tcp(s) => match (s.peer_addr(), s.local_addr()) {
                (Ok(p), Ok(l)) => owner::tcp_local_peer(p, l),
                _ => LocalPeer::Unknown,
            },
            Stream::Unix(s) => owner::peer_uid(s).map_or(LocalPeer::Unknown, LocalPeer::User),
        }
    }

    /// Reads and drops what the peer sends for up to `for_`, or until it closes.
    pub(crate) async fn drain_briefly(&mut self, for_: Duration) {
        use tokio::io::AsyncReadExt;
        let mut sink = [0u8; 4096];
        let _ = tokio::time::timeout(for_, async {
            loop {
                let n = match self {
                    Stream::Tcp(s) => s.read(&mut sink).await,
                    Stream::Unix(s) => s.read(&mut sink).await,
                };
                if !matches!(n, Ok(n) if n > 0) {
                    return;
                }
            }
        })
        .await;
    }

    /// The server's side of the authentication exchange ([`auth`]).
    pub(crate) async fn authenticate_server(
        &mut self,
        secret: &hmc_transport_kit::auth::AuthSecret,
        timeout: Duration,
    ) -> std::result::Result<(), String> {
        match self {
            Stream::Tcp(s) => auth::server(s, secret, timeout).await,
            Stream::Unix(s) => auth::server(s, secret, timeout).await,
        }
    }

    /// The client's side of the authentication exchange ([`auth`]).
    pub(crate) async fn authenticate_client(
        &mut self,
        secret: &hmc_transport_kit::auth::AuthSecret,
        timeout: Duration,
    ) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => auth::client(s, secret, timeout).await,
            Stream::Unix(s) => auth::client(s, secret, timeout).await,
        }
    }
}

impl Stream {
    pub(crate) async fn connect(addr: &PeerAddr) -> Result<Stream> {
        match hmc_transport_kit::connect(addr).await {
            Ok(c) => Ok(c.into()),
            Err(e) if e.kind() == io::ErrorKind::Unsupported => Err(Error::InvalidArgument(
                format!("{addr} is not an RPC address; use tcp://IP:PORT or unix:///path"),
            )),
            Err(e) => Err(Error::io(
                format!("connecting to {addr} (is an RPC server listening there?)"),
                e,
            )),
        }
    }

    pub(crate) fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.try_write(buf),
            Stream::Unix(s) => s.try_write(buf),
        }
    }

    /// This end's address of a TCP connection (a client's names it in its call spans).
    pub(crate) fn local_tcp_addr(&self) -> Option<std::net::SocketAddr> {
        match self {
            Stream::Tcp(s) => s.local_addr().ok(),
            Stream::Unix(_) => None,
        }
    }
}

impl Stream {
    /// Splits into a read half and a write half usable from one task at once.
    pub(crate) fn into_split(self) -> (ReadHalf, WriteHalf) {
        match self {
            Stream::Tcp(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Tcp(r), WriteHalf::Tcp(w))
            }
            Stream::Unix(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Unix(r), WriteHalf::Unix(w))
            }
        }
    }
}

/// The reading side of a connection.
pub(crate) enum ReadHalf {
    Tcp(tokio::net::tcp::OwnedReadHalf),
    Unix(tokio::net::unix::OwnedReadHalf),
}

impl ReadHalf {
    pub(crate) async fn readable(&self) -> io::Result<()> {
        match self {
            ReadHalf::Tcp(s) => s.readable().await,
            ReadHalf::Unix(s) => s.readable().await,
        }
    }

    /// Reads what is there now (`WouldBlock` when nothing is). Unlike `try_read`, a short
    /// read clears the readiness, which saves the `EAGAIN` read that would follow it: the
    /// edge-triggered poller reports new data anyway.
    pub(crate) fn read_now(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use tokio::io::{AsyncRead, ReadBuf};
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        let mut rb = ReadBuf::new(buf);
        let r = match self {
            ReadHalf::Tcp(s) => std::pin::Pin::new(s).poll_read(&mut cx, &mut rb),
            ReadHalf::Unix(s) => std::pin::Pin::new(s).poll_read(&mut cx, &mut rb),
        };
        match r {
            std::task::Poll::Ready(Ok(())) => Ok(rb.filled().len()),
            std::task::Poll::Ready(Err(e)) => Err(e),
            // The noop waker is replaced by the next `readable()`.
            std::task::Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    /// Like [`ReadHalf::read_now`], appending at most `max` bytes to `buf` (into its
    /// spare capacity: nothing is zeroed or copied first).
    pub(crate) fn read_now_append(&mut self, buf: &mut Vec<u8>, max: usize) -> io::Result<usize> {
        use bytes::BufMut;
        use tokio::io::AsyncReadExt;
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        let mut dst = (&mut *buf).limit(max);
        let r = match self {
            ReadHalf::Tcp(s) => std::pin::pin!(s.read_buf(&mut dst)).poll(&mut cx),
            ReadHalf::Unix(s) => std::pin::pin!(s.read_buf(&mut dst)).poll(&mut cx),
        };
        match r {
            std::task::Poll::Ready(r) => r,
            // The noop waker is replaced by the next `readable()`.
            std::task::Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
    fn raw_fd(&self) -> RawFd {
        match self {
            ReadHalf::Tcp(s) => s.as_ref().as_raw_fd(),
            ReadHalf::Unix(s) => s.as_ref().as_raw_fd(),
        }
    }

    /// One non-blocking `recv` into `target`, asking the socket itself rather than the
    /// runtime's cached readiness (which only the poller sets): how a busy-polling task
    /// sees an answer before the poller would report it. `WouldBlock` when nothing is
    /// there. Taking bytes behind the runtime's back is safe with its edge-triggered
    /// poller: readiness it still caches turns into one `WouldBlock` read later.
    pub(crate) fn recv_now(&mut self, target: ReadTarget<'_>) -> io::Result<usize> {
        let fd = self.raw_fd();
        match target {
            ReadTarget::Input(b) => nonblocking::recv_now(fd, b),
            // Without spare capacity: WouldBlock, and the ordinary read path grows it.
            ReadTarget::Append(v, max) => nonblocking::recv_append(fd, v, max),
        }
    }
}

/// The writing side of a connection.
pub(crate) enum WriteHalf {
    Tcp(tokio::net::tcp::OwnedWriteHalf),
    Unix(tokio::net::unix::OwnedWriteHalf),
}

impl WriteHalf {
    pub(crate) async fn writable(&self) -> io::Result<()> {
        match self {
            WriteHalf::Tcp(s) => s.writable().await,
            WriteHalf::Unix(s) => s.writable().await,
        }
    }

    /// Writes as much of `conn`'s queued bytes as the socket takes now (vectored, up to 64
    /// slices a write). `Ok` also when the socket is full; an error ends the connection.
    pub(crate) fn write_queued(&self, conn: &mut impl TxQueue) -> io::Result<()> {
        loop {
            let r = {
                let mut slices = [io::IoSlice::new(&[]); 64];
                let n = conn.tx_slices(&mut slices);
                if n == 0 {
                    return Ok(());
                }
                self.try_write_vectored(&slices[..n])
            };
            match r {
                Ok(n) => conn.advance_tx(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }

    pub(crate) fn try_write_vectored(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            WriteHalf::Tcp(s) => s.try_write_vectored(bufs),
            WriteHalf::Unix(s) => s.try_write_vectored(bufs),
        }
    }

    pub(crate) fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        match self {
            WriteHalf::Tcp(s) => s.try_write(buf),
            WriteHalf::Unix(s) => s.try_write(buf),
        }
    }
}

impl From<hmc_transport_kit::Conn> for Stream {
    fn from(c: hmc_transport_kit::Conn) -> Self {
        match c {
            hmc_transport_kit::Conn::Tcp(s) => Stream::Tcp(s),
            hmc_transport_kit::Conn::Unix(s) => Stream::Unix(s),
        }
    }
}

/// A listening socket (the layer `hmc-transport-kit` shares with the TCP transport).
pub(crate) struct Listener(hmc_transport_kit::Listener);

impl Listener {
    pub(crate) async fn bind(addr: &PeerAddr) -> Result<Listener> {
        hmc_transport_kit::Listener::bind(addr).map(Listener)
    }

    pub(crate) fn local_addr(&self) -> Result<PeerAddr> {
        self.0.local_addr()
    }

    pub(crate) async fn accept(&self) -> io::Result<Stream> {
        self.0.accept().await.map(Stream::from)
    }
}

/// A connection task's one timer. It is re-armed only when the core wants a deadline
/// earlier than the armed one: a deadline that moves later (every call and every read
/// push the idle, keepalive and call deadlines out) costs no timer update; the timer then
/// fires early once, the core finds nothing due (it compares against `now`), and the
/// next wanted deadline is armed.
pub(crate) struct ConnTimer {
    sleep: Pin<Box<tokio::time::Sleep>>,
    armed: Option<Instant>,
}

impl ConnTimer {
    pub(crate) fn new() -> Self {
        // Not registered with the runtime until it is armed and polled.
        let far = Instant::now() + Duration::from_secs(86_400 * 365);
        ConnTimer {
            sleep: Box::pin(tokio::time::sleep_until(far.into())),
            armed: None,
        }
    }

    /// Makes the timer fire no later than `want` (`None`: nothing is due).
    pub(crate) fn want(&mut self, want: Option<Instant>) {
        if let Some(w) = want
            && self.armed.is_none_or(|a| w < a)
        {
            self.sleep.as_mut().reset(w.into());
            self.armed = Some(w);
        }
    }

    /// True while a deadline is armed.
    pub(crate) fn is_armed(&self) -> bool {
        self.armed.is_some()
    }

    /// Waits for the armed deadline; then nothing is armed until the next `want`.
    pub(crate) async fn fired(&mut self) {
        self.sleep.as_mut().await;
        self.armed = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_timer_moves_earlier_at_once_and_later_only_after_firing() {
        let t0 = Instant::now();
        let mut t = ConnTimer::new();
        assert!(!t.is_armed());
        t.want(None);
        assert!(!t.is_armed());
        t.want(Some(t0 + Duration::from_secs(30)));
        t.want(Some(t0 + Duration::from_secs(60)));
        assert_eq!(
            t.armed,
            Some(t0 + Duration::from_secs(30)),
            "later is ignored"
        );
        // A deadline already passed: it fires at once.
        t.want(Some(t0));
        assert_eq!(t.armed, Some(t0), "earlier re-arms");
        t.fired().await;
        assert!(!t.is_armed());
        t.want(Some(t0 + Duration::from_secs(60)));
        assert_eq!(t.armed, Some(t0 + Duration::from_secs(60)));
    }
}
