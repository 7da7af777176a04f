//! Sockets named by [`PeerAddr`]: TCP (IPv4 or IPv6) and Unix domain listeners and
//! streams, `TCP_NODELAY` on every TCP stream (every exchange of the RPC runtime and the
//! TCP transport is a message followed by a wait, which Nagle's algorithm would delay),
//! and a listener that removes its Unix socket file when dropped. The stale-file rule is
//! [`crate::unix`]'s, shared with the blocking side channels.
//!
//! Each crate wraps [`Conn`] in a stream type of its own, with the reads and writes its
//! protocol needs (busy-polled receives for the RPC runtime, deadline-bounded bulk copies
//! for the transport).

use std::io;
use std::path::{Path, PathBuf};

use hmc_core::{Error, PeerAddr, Result};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

/// A connected socket.
#[derive(Debug)]
pub enum Conn {
    /// TCP, with `TCP_NODELAY` set.
    Tcp(TcpStream),
    /// A Unix domain socket.
    Unix(UnixStream),
}

/// Dials `addr` (`tcp://…` or `unix://…`); other address forms fail with
/// [`io::ErrorKind::Unsupported`]. Callers add their own deadline and error wording.
pub async fn connect(addr: &PeerAddr) -> io::Result<Conn> {
    match addr {
        PeerAddr::Tcp(sa) => {
            let s = TcpStream::connect(sa).await?;
            s.set_nodelay(true)?;
            Ok(Conn::Tcp(s))
        }
        PeerAddr::Unix(path) => Ok(Conn::Unix(UnixStream::connect(path).await?)),
        _ => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "only tcp:// and unix:// addresses can be dialled",
        )),
    }
}

/// A listening socket; removes its Unix socket file when dropped.
#[derive(Debug)]
pub enum Listener {
    /// TCP.
    Tcp(TcpListener),
    /// A Unix domain socket at this path.
    Unix(UnixListener, PathBuf),
}

impl Listener {
    /// Binds `addr` (within a tokio runtime). `tcp://IP:0` picks a free port;
    /// [`Listener::local_addr`] tells which. Unix paths follow [`bind_unix_listener`].
    pub fn bind(addr: &PeerAddr) -> Result<Listener> {
        match addr {
            PeerAddr::Tcp(sa) => {
                let std = std::net::TcpListener::bind(sa)
                    .and_then(|l| l.set_nonblocking(true).map(|()| l))
                    .map_err(|e| {
                        Error::io(format!("binding {addr} (port in use? choose another)"), e)
                    })?;
                let l = TcpListener::from_std(std)
                    .map_err(|e| Error::io(format!("registering the listener {addr}"), e))?;
                Ok(Listener::Tcp(l))
            }
            PeerAddr::Unix(path) => Ok(Listener::Unix(bind_unix_listener(path)?, path.clone())),
            other => Err(Error::InvalidArgument(format!(
                "cannot listen on {other}: use a tcp://IP:PORT or unix:///path address"
            ))),
        }
    }

    /// The address peers dial, with the port the kernel chose.
    pub fn local_addr(&self) -> Result<PeerAddr> {
        match self {
            Listener::Tcp(l) => l
                .local_addr()
                .map(PeerAddr::Tcp)
                .map_err(|e| Error::io("reading the listener's address", e)),
            Listener::Unix(_, path) => Ok(PeerAddr::Unix(path.clone())),
        }
    }

    /// Accepts one connection; TCP streams get `TCP_NODELAY`.
    pub async fn accept(&self) -> io::Result<Conn> {
        match self {
            Listener::Tcp(l) => {
                let (s, _) = l.accept().await?;
                s.set_nodelay(true)?;
                Ok(Conn::Tcp(s))
            }
            Listener::Unix(l, _) => Ok(Conn::Unix(l.accept().await?.0)),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, path) = self {
            remove_socket_file(path);
        }
    }
}

/// Binds a Unix domain socket listener at `path` (within a tokio runtime), after
/// [`crate::unix::clear_stale_socket`]: a stale file from a process that is gone is
/// reclaimed; a socket another process still serves, or a path that is not a socket, is
/// refused with an error that says so, never deleted.
pub fn bind_unix_listener(path: &Path) -> Result<UnixListener> {
    crate::unix::clear_stale_socket(path).map_err(|e| match e.kind() {
        io::ErrorKind::AddrInUse | io::ErrorKind::AlreadyExists => {
            Error::InvalidArgument(e.to_string())
        }
        _ => Error::io(format!("checking unix://{}", path.display()), e),
    })?;
    UnixListener::bind(path).map_err(|e| Error::io(format!("binding unix://{}", path.display()), e))
}

fn remove_socket_file(path: &Path) {
    if let Err(e) = std::fs::remove_file(path)
        && e.kind() != io::ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), error = %e, "could not remove the socket file");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stale_socket_file_is_reclaimed_a_live_one_and_a_plain_file_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        // A stale file: bound, then its listener forgotten without removing the file.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let l = Listener::bind(&PeerAddr::Unix(path.clone())).expect("stale file reclaimed");
        // A live one is refused, and left alone.
        let e = Listener::bind(&PeerAddr::Unix(path.clone())).unwrap_err();
        assert!(e.to_string().contains("served by another process"), "{e}");
        assert!(path.exists());
        let c = connect(&PeerAddr::Unix(path.clone())).await.unwrap();
        assert!(matches!(c, Conn::Unix(_)));
        assert!(matches!(l.accept().await.unwrap(), Conn::Unix(_)));
        drop(l);
        assert!(!path.exists(), "the listener removes its file");
        // A file that is not a socket is never deleted.
        std::fs::write(&path, b"data").unwrap();
        let e = Listener::bind(&PeerAddr::Unix(path.clone())).unwrap_err();
        assert!(e.to_string().contains("not a socket"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), b"data");
    }

    #[tokio::test]
    async fn tcp_streams_get_nodelay_and_opaque_addresses_are_refused() {
        let l = Listener::bind(&"tcp://127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        let (c, s) = tokio::join!(connect(&addr), l.accept());
        let (Conn::Tcp(c), Conn::Tcp(s)) = (c.unwrap(), s.unwrap()) else {
            panic!("TCP expected")
        };
        assert!(c.nodelay().unwrap() && s.nodelay().unwrap());
        let opaque = PeerAddr::Opaque {
            transport: hmc_core::TransportId::UCX,
            bytes: vec![1],
        };
        let e = connect(&opaque).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Unsupported);
        assert!(Listener::bind(&opaque).is_err());
    }
}
