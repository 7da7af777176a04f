//! Sockets: one stream and listener type over TCP (IPv4/IPv6) and Unix domain sockets.

use std::io;
use std::path::PathBuf;

use hmc_core::{Error, PeerAddr, Result};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

/// A connected socket.
pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    pub(crate) async fn connect(addr: &PeerAddr) -> Result<Stream> {
        match addr {
            PeerAddr::Tcp(a) => {
                let s = TcpStream::connect(a).await.map_err(|e| {
                    Error::io(
                        format!("connecting to tcp://{a} (is hmc-rpc-server running there?)"),
                        e,
                    )
                })?;
                s.set_nodelay(true)
                    .map_err(|e| Error::io("setting TCP_NODELAY", e))?;
                Ok(Stream::Tcp(s))
            }
            PeerAddr::Unix(p) => UnixStream::connect(p).await.map(Stream::Unix).map_err(|e| {
                Error::io(
                    format!(
                        "connecting to unix://{} (is hmc-rpc-server running there?)",
                        p.display()
                    ),
                    e,
                )
            }),
            other => Err(Error::InvalidArgument(format!(
                "{other} is not an RPC address; use tcp://IP:PORT or unix:///path"
            ))),
        }
    }

    pub(crate) fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.try_write(buf),
            Stream::Unix(s) => s.try_write(buf),
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

/// A listening socket.
pub(crate) enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

impl Listener {
    pub(crate) async fn bind(addr: &PeerAddr) -> Result<Listener> {
        match addr {
            PeerAddr::Tcp(a) => TcpListener::bind(a).await.map(Listener::Tcp).map_err(|e| {
                Error::io(
                    format!("binding tcp://{a} (port in use? pick another --port)"),
                    e,
                )
            }),
            PeerAddr::Unix(p) => {
                // A stale socket file from a previous run blocks bind; remove only sockets.
                if let Ok(m) = std::fs::symlink_metadata(p) {
                    use std::os::unix::fs::FileTypeExt;
                    if m.file_type().is_socket() {
                        let _ = std::fs::remove_file(p);
                    }
                }
                UnixListener::bind(p)
                    .map(|l| Listener::Unix(l, p.clone()))
                    .map_err(|e| Error::io(format!("binding unix://{}", p.display()), e))
            }
            other => Err(Error::InvalidArgument(format!(
                "{other} is not a listen address; use tcp://IP:PORT or unix:///path"
            ))),
        }
    }

    pub(crate) fn local_addr(&self) -> Result<PeerAddr> {
        match self {
            Listener::Tcp(l) => l
                .local_addr()
                .map(PeerAddr::Tcp)
                .map_err(|e| Error::io("reading the listener address", e)),
            Listener::Unix(_, p) => Ok(PeerAddr::Unix(p.clone())),
        }
    }

    pub(crate) async fn accept(&self) -> io::Result<Stream> {
        match self {
            Listener::Tcp(l) => {
                let (s, _) = l.accept().await?;
                s.set_nodelay(true)?;
                Ok(Stream::Tcp(s))
            }
            Listener::Unix(l, _) => Ok(Stream::Unix(l.accept().await?.0)),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, p) = self {
            let _ = std::fs::remove_file(p);
        }
    }
}
