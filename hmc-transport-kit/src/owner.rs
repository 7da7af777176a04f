//! Which user is at the other end of a socket on this host: `SO_PEERCRED` for Unix
//! sockets, the kernel's socket diagnostics (`NETLINK_SOCK_DIAG`, else the socket tables of
//! `/proc/net/tcp{,6}`) for TCP connections from this host (Linux), a socket file's owner, and the one rule every listener of the project applies
//! to its local peers ([`admit_local_peer`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::path::Path;

const ESTABLISHED: &str = "01";
const LISTEN: &str = "0A";

pub use crate::ip::canonical_ip;

/// This process's effective uid.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The uid of the process at the other end of a Unix socket (`SO_PEERCRED`; std's or
/// tokio's stream alike).
pub fn peer_uid(s: &impl AsRawFd) -> Option<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes passed; the fd is open for
    // the duration of the call (borrowed from `s`).
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(cred.uid)
}

/// The owner of the Unix socket file at `path` (symbolic links followed, as `connect`
/// follows them); `Err` says why there is none (no such file, not a socket).
pub fn socket_file_uid(path: &Path) -> Result<u32, String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let m = std::fs::metadata(path).map_err(|e| format!("cannot stat the socket file: {e}"))?;
    if !m.file_type().is_socket() {
        return Err("it is not a socket".into());
    }
    Ok(m.uid())
}

/// Who a connection's peer is, as far as this host can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalPeer {
    /// A process of this host running as this uid.
    User(u32),
    /// A TCP peer on another host: its user cannot be known here.
    Remote,
    /// A peer on this host whose user could not be found.
    Unknown,
}

/// Who is at the other end of a TCP connection from `peer` to our `local`: a process of
/// this host (loopback, or one of this host's own addresses) by its socket's owner, or a
/// remote peer.
pub fn tcp_local_peer(peer: SocketAddr, local: SocketAddr) -> LocalPeer {
    let ip = canonical_ip(peer.ip());
    if !ip.is_loopback() && ip != canonical_ip(local.ip()) {
        return LocalPeer::Remote;
    }
    connection_uid(peer, local).map_or(LocalPeer::Unknown, LocalPeer::User)
}

/// The rule for a listener without a shared secret: a peer on this host must run as this
/// process's user (or root); a peer on another host passes (its user cannot be known; a
/// shared secret is what authenticates it). `Err` says why, for the refusal's log line.
pub fn admit_local_peer(peer: LocalPeer) -> Result<(), String> {
    let me = euid();
    match peer {
        LocalPeer::User(u) if u == me || u == 0 => Ok(()),
        LocalPeer::User(u) => Err(format!(
            "the peer on this host runs as uid {u}, this process as uid {me}; without a shared secret only the same user (or root) is admitted: run both as one user, or give both the same auth_secret"
        )),
        LocalPeer::Remote => Ok(()),
        LocalPeer::Unknown => Err(
            "cannot tell which user the peer on this host is (no SO_PEERCRED, no /proc/net/tcp entry); give both sides the same auth_secret".into(),
        ),
    }
}

fn parse_addr(s: &str) -> Option<SocketAddr> {
    let (ip, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        Some(
            u32::from_str_radix(ip.get(i * 8..i * 8 + 8)?, 16)
                .ok()?
                .to_ne_bytes(),
        )
    };
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(b))
        }
        _ => return None,
    };
    Some(SocketAddr::new(canonical_ip(ip), port))
}

/// (local, remote, state, uid) of every TCP socket.
fn sockets() -> Vec<(SocketAddr, SocketAddr, String, u32)> {
    let mut out = Vec::new();
    for f in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let (Some(l), Some(r), Some(st), Some(uid)) =
                (cols.get(1), cols.get(2), cols.get(3), cols.get(7))
            else {
                continue;
            };
            if let (Some(l), Some(r), Ok(uid)) = (parse_addr(l), parse_addr(r), uid.parse()) {
                out.push((l, r, st.to_string(), uid));
            }
        }
    }
    out
}

fn canon(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(canonical_ip(a.ip()), a.port())
}

/// The uid of the process end of a TCP connection from `peer` to our `local`.
pub fn connection_uid(peer: SocketAddr, local: SocketAddr) -> Option<u32> {
    let (peer, local) = (canon(peer), canon(local));
    if let Some(answer) = crate::sock_diag::connection_uid(peer, local) {
        return answer;
    }
    sockets()
        .into_iter()
        .find(|(l, r, st, _)| st == ESTABLISHED && *l == peer && *r == local)
        .map(|s| s.3)
}

/// The uid of the socket listening at `at` (bound to its IP or to the wildcard).
pub fn listener_uid(at: SocketAddr) -> Option<u32> {
    let at = canon(at);
    if let Some(answer) = crate::sock_diag::listener_uid(at) {
        return answer;
    }
    sockets()
        .into_iter()
        .find(|(l, _, st, _)| {
            st == LISTEN && l.port() == at.port() && (l.ip() == at.ip() || l.ip().is_unspecified())
        })
        .map(|s| s.3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_kernels_hex_form() {
        assert_eq!(
            parse_addr("0100007F:1F90"),
            Some("127.0.0.1:8080".parse().unwrap())
        );
        assert_eq!(
            parse_addr("00000000000000000000000001000000:0016"),
            Some("[::1]:22".parse().unwrap())
        );
        assert_eq!(
            parse_addr("0000000000000000FFFF00000100007F:0050"),
            Some("127.0.0.1:80".parse().unwrap()),
            "IPv4-mapped, as IPv4"
        );
    }

    #[test]
    fn finds_our_own_listener_and_connection() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let at = l.local_addr().unwrap();
        let me = euid();
        assert_eq!(listener_uid(at), Some(me));
        let c = std::net::TcpStream::connect(at).unwrap();
        assert_eq!(connection_uid(c.local_addr().unwrap(), at), Some(me));
    }

    /// The netlink answers and the `/proc` tables agree, for IPv4, IPv6, a dual-stack
    /// listener reached over IPv4, and sockets that do not exist.
    #[test]
    fn socket_diagnostics_agree_with_the_proc_tables() {
        use crate::sock_diag;
        let from_proc_conn = |peer: SocketAddr, local: SocketAddr| {
            sockets()
                .into_iter()
                .find(|(l, r, st, _)| st == ESTABLISHED && *l == canon(peer) && *r == canon(local))
                .map(|s| s.3)
        };
        let me = Some(euid());
        let mut binds = vec!["127.0.0.1:0"];
        if std::net::TcpListener::bind("[::1]:0").is_ok() {
            binds.push("[::1]:0");
        }
        for bind in binds {
            let l = std::net::TcpListener::bind(bind).unwrap();
            let at = l.local_addr().unwrap();
            let c = std::net::TcpStream::connect(at).unwrap();
            let from = c.local_addr().unwrap();
            let Some(found) = sock_diag::connection_uid(from, at) else {
                // No NETLINK_SOCK_DIAG here (no inet_diag): the /proc tables are used, and
                // `finds_our_own_listener_and_connection` covers them.
                return;
            };
            assert_eq!(found, me, "{bind}");
            assert_eq!(found, from_proc_conn(from, at), "{bind}");
            assert_eq!(sock_diag::listener_uid(at), Some(me), "{bind}");
            // The other direction is the server's socket, also ours; a port nobody uses
            // has no socket.
            let (s, _) = l.accept().unwrap();
            assert_eq!(sock_diag::connection_uid(at, from), Some(me), "{bind}");
            drop((s, c));
            let gone = std::net::TcpListener::bind(bind)
                .unwrap()
                .local_addr()
                .unwrap();
            assert_eq!(sock_diag::listener_uid(gone), Some(None), "{bind}");
            assert_eq!(sock_diag::connection_uid(from, gone), Some(None), "{bind}");
        }
        if let Ok(dual) = std::net::TcpListener::bind("[::]:0") {
            let at: SocketAddr = format!("127.0.0.1:{}", dual.local_addr().unwrap().port())
                .parse()
                .unwrap();
            assert_eq!(sock_diag::listener_uid(at), Some(me));
            let c = std::net::TcpStream::connect(at).unwrap();
            assert_eq!(
                sock_diag::connection_uid(c.local_addr().unwrap(), at),
                Some(me)
            );
        }
    }

    /// A socket of another user is reported as that user's (the test runs as root, the
    /// socket is made by a process that dropped to uid 65534).
    #[test]
    fn another_users_listener_is_theirs() {
        if euid() != 0
            || !std::path::Path::new("/usr/bin/python3").exists()
            || std::process::Command::new("setpriv")
                .arg("--help")
                .output()
                .is_err()
        {
            // Needs root (to make a socket as another user) and setpriv.
            return;
        }
        let mut child = std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c"])
            .arg("import socket,sys; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(); print(s.getsockname()[1], flush=True); sys.stdin.read()")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let at: SocketAddr = format!("127.0.0.1:{}", line.trim()).parse().unwrap();
        assert_eq!(listener_uid(at), Some(65534));
        // Its end of a connection to it (queued, not yet accepted) is its user's too.
        let c = std::net::TcpStream::connect(at).unwrap();
        assert_eq!(connection_uid(at, c.local_addr().unwrap()), Some(65534));
        assert_eq!(connection_uid(c.local_addr().unwrap(), at), Some(0));
        drop(child.stdin.take());
        child.wait().unwrap();
    }
}
