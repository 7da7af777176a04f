//! Non-blocking socket system calls on a raw descriptor: what the TCP transport's stream
//! and the RPC runtime's busy-polling read half both issue behind their runtime's back.
//! [`retry_eintr`] serves any system call that returns a count (shm's `process_vm_*` too).
//! Each is one call that returns at once (`MSG_DONTWAIT`, a zero `poll` timeout), retried
//! only when a signal interrupts it; nothing is ever written to memory the caller did not
//! pass. A descriptor that is not open makes the call fail with `EBADF`, never touch
//! another's memory, so the functions that take only a descriptor and slices are safe.
//!
//! Sends carry `MSG_NOSIGNAL`: a peer that closed its end is an error here, never a
//! `SIGPIPE`, which a host process such as Python's may not ignore.

use std::io;
use std::os::fd::RawFd;

/// Repeats a system call interrupted by a signal; a negative result becomes the OS error.
#[inline]
pub fn retry_eintr(mut call: impl FnMut() -> isize) -> io::Result<usize> {
    loop {
        let n = call();
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// One `recv` into `buf`; `WouldBlock` when nothing is there, `Ok(0)` at the end of the
/// stream.
#[inline]
pub fn recv_now(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the call.
    retry_eintr(|| unsafe {
        libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT)
    })
}

/// One `recv` into the spare capacity of `v`, at most `max` bytes, which then become part
/// of `v`. `WouldBlock` when nothing is there, or when `v` has no spare capacity (its
/// owner's ordinary read path grows it).
#[inline]
pub fn recv_append(fd: RawFd, v: &mut Vec<u8>, max: usize) -> io::Result<usize> {
    let spare = v.spare_capacity_mut();
    let len = spare.len().min(max);
    if len == 0 {
        return Err(io::ErrorKind::WouldBlock.into());
    }
    let ptr = spare.as_mut_ptr();
    // SAFETY: `ptr..ptr + len` is spare capacity of `v`, writable for the call.
    let n = retry_eintr(|| unsafe { libc::recv(fd, ptr.cast(), len, libc::MSG_DONTWAIT) })?;
    // SAFETY: `recv` initialised the first `n <= len` bytes of the spare capacity, so the
    // first `len() + n` bytes of `v` are initialised.
    unsafe { v.set_len(v.len() + n) };
    Ok(n)
}

/// One `recvmsg` scattering into `iov`; as [`recv_now`].
///
/// # Safety
/// Every iovec's buffer is valid for writes of its length for the call.
#[inline]
pub unsafe fn recvmsg_now(fd: RawFd, iov: &[libc::iovec]) -> io::Result<usize> {
    // SAFETY: an all-zero `msghdr` is valid (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: `msg` points at `iov`, whose buffers are valid for writes (the contract).
    retry_eintr(|| unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT) })
}

/// One `send` of `buf`; `WouldBlock` when the socket buffer is full.
#[inline]
pub fn send_now(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for reads of `buf.len()` bytes for the call.
    retry_eintr(|| unsafe {
        libc::send(
            fd,
            buf.as_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    })
}

/// One `sendmsg` gathering `bufs`; as [`send_now`].
#[inline]
pub fn sendmsg_now(fd: RawFd, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
    // SAFETY: an all-zero `msghdr` is valid (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // `IoSlice` is ABI-compatible with `iovec` on Unix (std guarantees it); the kernel
    // only reads the buffers.
    msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = bufs.len() as _;
    // SAFETY: `msg` points at `bufs`, valid for reads for the call.
    retry_eintr(|| unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) })
}

/// The `revents` of one `poll(2)` for `events` that does not wait (0: none of them, and
/// no error or hang-up either).
#[inline]
fn revents_now(fd: RawFd, events: i16) -> i16 {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: `p` is a valid `pollfd` on this frame and `nfds` is 1.
    let rc = unsafe { libc::poll(&mut p, 1, 0) };
    if rc > 0 { p.revents } else { 0 }
}

/// Whether the socket reports any of `events` now, or an error or hang-up (then the next
/// call fails or ends at once too).
#[inline]
pub fn ready_now(fd: RawFd, events: i16) -> bool {
    revents_now(fd, events) != 0
}

/// Whether the peer closed or reset the connection, even with bytes of it still unread
/// here (`POLLRDHUP`, `POLLHUP` or `POLLERR`).
#[inline]
pub fn peer_hung_up(fd: RawFd) -> bool {
    revents_now(fd, libc::POLLRDHUP) & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

/// Makes closing the socket reset the connection (`SO_LINGER` of zero): bytes not yet
/// sent are discarded instead of delivered once the peer reads again, and the peer sees
/// the reset at once ([`peer_hung_up`]). For a request given up half-way.
pub fn reset_on_close(fd: RawFd) -> io::Result<()> {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: `linger` lives on this frame for the call and its size is passed with it.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{IoSlice, Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    fn pair() -> (UnixStream, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        b.set_nonblocking(true).unwrap();
        (a, b)
    }

    #[test]
    fn an_empty_socket_would_block_and_a_closed_one_ends() {
        let (a, b) = pair();
        let mut buf = [0u8; 8];
        let e = recv_now(a.as_raw_fd(), &mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert!(!ready_now(a.as_raw_fd(), libc::POLLIN));
        assert!(!peer_hung_up(a.as_raw_fd()));
        drop(b);
        assert!(ready_now(a.as_raw_fd(), libc::POLLIN));
        assert!(peer_hung_up(a.as_raw_fd()));
        assert_eq!(recv_now(a.as_raw_fd(), &mut buf).unwrap(), 0);
    }

    #[test]
    fn sends_arrive_whole_and_in_order() {
        let (a, mut b) = pair();
        assert_eq!(send_now(a.as_raw_fd(), b"head").unwrap(), 4);
        let n = sendmsg_now(a.as_raw_fd(), &[IoSlice::new(b"-"), IoSlice::new(b"tail")]).unwrap();
        assert_eq!(n, 5);
        let mut got = [0u8; 9];
        b.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"head-tail");
    }

    #[test]
    fn an_append_takes_no_more_than_its_limit_or_the_spare_capacity() {
        let (a, mut b) = pair();
        b.write_all(b"0123456789").unwrap();
        let mut v = Vec::with_capacity(4);
        v.push(b'>');
        assert_eq!(recv_append(a.as_raw_fd(), &mut v, 2).unwrap(), 2);
        assert_eq!(v, b">01");
        let rest = v.capacity() - v.len();
        assert_eq!(recv_append(a.as_raw_fd(), &mut v, 100).unwrap(), rest);
        let full = recv_append(a.as_raw_fd(), &mut v, 100).unwrap_err();
        assert_eq!(full.kind(), io::ErrorKind::WouldBlock, "no spare capacity");
    }

    #[test]
    fn a_scattered_read_fills_each_buffer_in_turn() {
        let (a, mut b) = pair();
        b.write_all(b"abcdefg").unwrap();
        let (mut x, mut y) = ([0u8; 3], [0u8; 8]);
        let iov = [
            libc::iovec {
                iov_base: x.as_mut_ptr().cast(),
                iov_len: x.len(),
            },
            libc::iovec {
                iov_base: y.as_mut_ptr().cast(),
                iov_len: y.len(),
            },
        ];
        // SAFETY: both buffers are live and writable for the call.
        let n = unsafe { recvmsg_now(a.as_raw_fd(), &iov) }.unwrap();
        assert_eq!(n, 7);
        assert_eq!(&x, b"abc");
        assert_eq!(&y[..4], b"defg");
    }

    #[test]
    fn a_reset_on_close_discards_unsent_bytes() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        s.set_nonblocking(true).unwrap();
        reset_on_close(c.as_raw_fd()).unwrap();
        drop(c);
        let mut buf = [0u8; 4];
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            match recv_now(s.as_raw_fd(), &mut buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    assert!(std::time::Instant::now() < deadline, "no reset seen");
                    std::thread::yield_now();
                }
                Err(e) => {
                    assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
                    break;
                }
                Ok(n) => panic!("a reset connection read {n} bytes"),
            }
        }
        assert!(peer_hung_up(s.as_raw_fd()));
        assert!(reset_on_close(-1).is_err(), "a bad descriptor is an error");
    }
}
