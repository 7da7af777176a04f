//! TCP sockets' owners from the kernel's socket-diagnostics netlink interface
//! (`NETLINK_SOCK_DIAG`, the one `ss` uses): one exact lookup per connection and a dump of
//! listening sockets only, where reading `/proc/net/tcp{,6}` parses every socket of the
//! namespace (milliseconds on a busy host, paid on each connection set up between local
//! processes). `None` when the interface is not there (no `inet_diag` module, a sandbox
//! that filters netlink): the caller then reads `/proc`.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::ip::canonical_ip;

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const TCP_ESTABLISHED: u32 = 1;
const TCP_LISTEN: u32 = 10;
/// `INET_DIAG_NOCOOKIE`: look the socket up by its addresses alone.
const NO_COOKIE: u32 = !0;

/// `struct inet_diag_sockid` (linux/inet_diag.h): ports and addresses in network order.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct SockId {
    sport: u16,
    dport: u16,
    src: [u32; 4],
    dst: [u32; 4],
    interface: u32,
    cookie: [u32; 2],
}

/// `struct nlmsghdr` followed by `struct inet_diag_req_v2`.
#[repr(C)]
struct Request {
    len: u32,
    kind: u16,
    flags: u16,
    seq: u32,
    pid: u32,
    family: u8,
    protocol: u8,
    ext: u8,
    pad: u8,
    states: u32,
    id: SockId,
}

/// Where `struct inet_diag_msg`'s `idiag_uid` sits after its `nlmsghdr`: family, state,
/// timer, retrans (4 bytes), the socket id (48), expires, rqueue, wqueue (12).
const UID_AT: usize = 16 + 4 + std::mem::size_of::<SockId>() + 12;
/// And its socket id (the local port first).
const ID_AT: usize = 16 + 4;

fn words(ip: IpAddr) -> (u8, [u32; 4]) {
    let mut w = [0u32; 4];
    match ip {
        IpAddr::V4(v4) => {
            w[0] = u32::from_ne_bytes(v4.octets());
            (libc::AF_INET as u8, w)
        }
        IpAddr::V6(v6) => {
            for (i, c) in v6.octets().chunks_exact(4).enumerate() {
                w[i] = u32::from_ne_bytes(c.try_into().expect("4 bytes"));
            }
            (libc::AF_INET6 as u8, w)
        }
    }
}

fn v4_mapped(a: SocketAddr) -> Option<SocketAddr> {
    match a.ip() {
        IpAddr::V4(v4) => Some(SocketAddr::new(IpAddr::V6(v4.to_ipv6_mapped()), a.port())),
        IpAddr::V6(_) => None,
    }
}

/// Sends one request and calls `each` with every socket message of the answer (until
/// `NLMSG_DONE`, or the first message for an exact lookup). `None` if the netlink
/// interface cannot be used.
fn ask(req: Request, mut each: impl FnMut(&[u8]) -> bool) -> Option<()> {
    // SAFETY: socket(2) with constant arguments; the returned fd is owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_SOCK_DIAG,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is a fresh descriptor this function alone holds.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let dump = req.flags & libc::NLM_F_DUMP as u16 != 0;
    // SAFETY: `req` is a plain repr(C) value valid for reads of its size; the kernel's
    // netlink address is all zeroes but the family.
    let sent = unsafe {
        let mut to: libc::sockaddr_nl = std::mem::zeroed();
        to.nl_family = libc::AF_NETLINK as u16;
        libc::sendto(
            fd.as_raw_fd(),
            (&raw const req).cast(),
            std::mem::size_of::<Request>(),
            0,
            (&raw const to).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent < 0 {
        return None;
    }
    let mut buf = vec![0u8; 32 << 10];
    loop {
        // SAFETY: `buf` is valid for writes of its length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n <= 0 {
            return None;
        }
        let mut at = 0usize;
        let got = &buf[..n as usize];
        while at + 16 <= got.len() {
            let len = u32::from_ne_bytes(got[at..at + 4].try_into().expect("4 bytes")) as usize;
            let kind = u16::from_ne_bytes(got[at + 4..at + 6].try_into().expect("2 bytes"));
            if len < 16 || at + len > got.len() {
                return None;
            }
            let msg = &got[at..at + len];
            match kind {
                // NLMSG_DONE ends a dump; NLMSG_ERROR answers a lookup that found nothing
                // (ENOENT), or a request the kernel refused.
                k if k == libc::NLMSG_DONE as u16 => return Some(()),
                k if k == libc::NLMSG_ERROR as u16 => {
                    let errno = i32::from_ne_bytes(msg.get(16..20)?.try_into().expect("4"));
                    return (errno == -libc::ENOENT).then_some(());
                }
                SOCK_DIAG_BY_FAMILY if msg.len() >= UID_AT + 4 && (!each(msg) || !dump) => {
                    return Some(());
                }
                _ => {}
            }
            // Messages are 4-byte aligned.
            at += (len + 3) & !3;
        }
    }
}

fn request(family: u8, states: u32, id: SockId, flags: u16) -> Request {
    Request {
        len: std::mem::size_of::<Request>() as u32,
        kind: SOCK_DIAG_BY_FAMILY,
        flags: libc::NLM_F_REQUEST as u16 | flags,
        seq: 1,
        pid: 0,
        family,
        protocol: libc::IPPROTO_TCP as u8,
        ext: 0,
        pad: 0,
        states,
        id,
    }
}

fn uid_of(msg: &[u8]) -> u32 {
    u32::from_ne_bytes(msg[UID_AT..UID_AT + 4].try_into().expect("4 bytes"))
}

/// The uid of the established socket whose local end is `local` and remote end `remote`:
/// `Some(None)` when the kernel has none, `None` when it could not be asked.
pub(crate) fn connection_uid(local: SocketAddr, remote: SocketAddr) -> Option<Option<u32>> {
    let lookup = |l: SocketAddr, r: SocketAddr| {
        let ((family, src), (_, dst)) = (words(l.ip()), words(r.ip()));
        let id = SockId {
            sport: l.port().to_be(),
            dport: r.port().to_be(),
            src,
            dst,
            interface: 0,
            cookie: [NO_COOKIE; 2],
        };
        let mut found = None;
        ask(request(family, 1 << TCP_ESTABLISHED, id, 0), |m| {
            found = Some(uid_of(m));
            false
        })
        .map(|()| found)
    };
    match lookup(local, remote)? {
        Some(uid) => Some(Some(uid)),
        // An IPv4 connection may be held by a dual-stack IPv6 socket.
        None => match (v4_mapped(local), v4_mapped(remote)) {
            (Some(l), Some(r)) => lookup(l, r),
            _ => Some(None),
        },
    }
}

/// The uid of a socket listening on `at`'s port, bound to its IP or to the wildcard:
/// `Some(None)` when there is none, `None` when the kernel could not be asked.
pub(crate) fn listener_uid(at: SocketAddr) -> Option<Option<u32>> {
    let want = canonical_ip(at.ip());
    let mut found = None;
    for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
        let req = request(
            family,
            1 << TCP_LISTEN,
            SockId::default(),
            libc::NLM_F_DUMP as u16,
        );
        ask(req, |m| {
            let id = &m[ID_AT..ID_AT + std::mem::size_of::<SockId>()];
            let port = u16::from_be_bytes([id[0], id[1]]);
            let mut ip = [0u8; 16];
            ip.copy_from_slice(&id[4..20]);
            let ip = if m[16] == libc::AF_INET as u8 {
                IpAddr::from([ip[0], ip[1], ip[2], ip[3]])
            } else {
                canonical_ip(IpAddr::from(ip))
            };
            if port == at.port() && (ip == want || ip.is_unspecified()) {
                found = Some(uid_of(m));
                return false;
            }
            true
        })?;
        if found.is_some() {
            break;
        }
    }
    Some(found)
}
