//! Unix sockets' two chores: binding a path where a stale socket file may remain from a
//! dead process (one rule, for the blocking side channels and the tokio listeners alike),
//! and asking who is on the other end (`SO_PEERCRED`).

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

/// The one rule for a Unix socket path before binding it: a socket file nobody listens on
/// (a dead process's) is removed; a live listener is `AddrInUse`; any other file there is
/// `AlreadyExists` and left alone. Both [`bind_unix`] and the tokio listener of
/// [`crate::Listener`] follow it.
pub fn clear_stale_socket(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => match UnixStream::connect(path) {
            Ok(_) => Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!(
                    "{} is served by another process; stop it or choose another path",
                    path.display()
                ),
            )),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                tracing::debug!(path = %path.display(), "removing a stale socket file");
                match std::fs::remove_file(path) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                    _ => Ok(()),
                }
            }
            Err(e) => Err(io::Error::new(
                e.kind(),
                format!("checking the existing socket file {}: {e}", path.display()),
            )),
        },
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{} exists and is not a socket; choose another path (it is left alone)",
                path.display()
            ),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Binds a blocking Unix listener at `path`, after [`clear_stale_socket`].
pub fn bind_unix(path: &Path) -> io::Result<UnixListener> {
    clear_stale_socket(path)?;
    UnixListener::bind(path)
}

/// Who is on the other end of a Unix socket, as the kernel recorded at connect time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCred {
    /// Process id.
    pub pid: i32,
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

/// `SO_PEERCRED` of `stream` (any Unix stream socket, std's or tokio's).
pub fn peer_cred(stream: &impl AsRawFd) -> io::Result<PeerCred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes passed.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCred {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_socket_is_replaced_a_live_one_refused_and_other_files_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("side.sock");
        drop(bind_unix(&path).unwrap()); // leaves the file, as a dead process does
        assert!(path.exists());
        let live = bind_unix(&path).expect("a stale socket file is replaced");
        let e = bind_unix(&path).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse, "{e}");
        drop(live);
        let plain = dir.path().join("plain");
        std::fs::write(&plain, b"keep me").unwrap();
        assert!(bind_unix(&plain).is_err());
        assert_eq!(std::fs::read(&plain).unwrap(), b"keep me");
    }

    #[test]
    fn peer_credentials_name_this_process() {
        let (a, _b) = UnixStream::pair().unwrap();
        let c = peer_cred(&a).unwrap();
        assert_eq!(c.pid, std::process::id() as i32);
        // SAFETY: plain getters.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        assert_eq!((c.uid, c.gid), (uid, gid));
    }
}
