//! Dialling a Unix socket from a named one, so that the target can name the connection.
//!
//! A Unix socket that dials without binding first has no address: the target cannot tell
//! one of an initiator's connections from another, so an ABANDON (`crate::abandon`) could
//! not name the one a WRITE was given up on. Bound first with only its address family
//! (Linux's autobind, unix(7)), a socket gets an abstract address the kernel picks and
//! keeps unique while it is open; the target reads it as the connection's peer address,
//! and the initiator as its own.

use std::io;
use std::mem::{offset_of, size_of};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use crate::conn_name::ConnName;

/// Connects to the Unix socket at `path` from a socket bound to an abstract address the
/// kernel picks, non-blocking. A listener whose backlog is full is tried again every
/// millisecond (the caller bounds the whole by its deadline).
pub(crate) async fn connect(path: &Path) -> io::Result<UnixStream> {
    let target = sockaddr(path)?;
    loop {
        match connect_once(&target) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            done => return done,
        }
    }
}

/// The name of a Unix-socket connection's side: its abstract address, if it has one.
pub(crate) fn name_of(addr: io::Result<std::os::unix::net::SocketAddr>) -> Option<ConnName> {
    addr.ok()?
        .as_abstract_name()
        .map(|name| ConnName::Unix(name.to_vec()))
}

/// `path` as a `sockaddr_un` and its length.
fn sockaddr(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: `sockaddr_un` is plain data, for which all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    // One byte stays for the terminating NUL.
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "the Unix socket path {} is longer than {} bytes or holds a NUL; use a \
                 shorter path",
                path.display(),
                addr.sun_path.len() - 1
            ),
        ));
    }
    for (to, from) in addr.sun_path.iter_mut().zip(bytes) {
        *to = *from as libc::c_char;
    }
    let len = offset_of!(libc::sockaddr_un, sun_path) + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

/// One try: a new socket, autobound, connected to `target`.
fn connect_once((target, len): &(libc::sockaddr_un, libc::socklen_t)) -> io::Result<UnixStream> {
    // SAFETY: creates a descriptor, owned at once by `fd` (closed on every path out).
    let raw = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor just opened, owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let family = libc::sockaddr_un {
        sun_family: libc::AF_UNIX as libc::sa_family_t,
        // SAFETY: plain data, all zeroes valid.
        ..unsafe { std::mem::zeroed() }
    };
    // SAFETY: binds `fd` to an address of only its family (autobind); the pointer and
    // length describe `family`, which lives across the call.
    let bound = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&raw const family).cast::<libc::sockaddr>(),
            size_of::<libc::sa_family_t>() as libc::socklen_t,
        )
    };
    if bound < 0 {
        // Still dialled, unnamed: only an ABANDON of it is lost (settle says so).
        tracing::debug!(
            error = %io::Error::last_os_error(),
            "could not autobind a Unix socket before dialling; its connection stays unnamed"
        );
    }
    // SAFETY: the pointer and length describe `target`, which lives across the call.
    let rc = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            std::ptr::from_ref(target).cast::<libc::sockaddr>(),
            *len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(UnixStream::from(fd))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_dialled_connection_is_named_the_same_on_both_sides() {
        let dir = std::env::temp_dir().join(format!("hmc-named-unix-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("l.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let (a, b) = (connect(&path).await.unwrap(), connect(&path).await.unwrap());
        let (served_a, _) = listener.accept().unwrap();
        let (served_b, _) = listener.accept().unwrap();
        let mine = name_of(a.local_addr()).expect("the dialler's side is named");
        assert_eq!(name_of(served_a.peer_addr()), Some(mine.clone()));
        assert_ne!(
            name_of(b.local_addr()),
            Some(mine),
            "two connections, two names"
        );
        assert_eq!(name_of(served_b.peer_addr()), name_of(b.local_addr()));
        drop((a, b, served_a, served_b, listener));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn a_path_too_long_is_refused_with_the_limit() {
        let long = Path::new("/tmp").join("x".repeat(200));
        let e = connect(&long).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("longer than 107 bytes"), "{e}");
    }
}
