//! Memory both processes map: `memfd_create` allocations (what
//! [`ShmCommunicator::alloc_registered`](crate::ShmCommunicator) returns), their file
//! descriptors passed over the side channel with `SCM_RIGHTS`, and the initiator's mapping
//! of them. Copies to such memory are a plain `memcpy` with no system call, and need no
//! cross-memory attach: the path for hosts whose kernel refuses `process_vm_*` (Yama
//! `ptrace_scope` 2 or 3, seccomp, containers without `CAP_SYS_PTRACE`).

use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use crate::control::{CONTROL_LEN, Page};

/// A shared mapping of a memfd, unmapped on drop.
pub(crate) struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; who may touch which bytes when is decided by
// leases (the transfer path), not by the type.
unsafe impl Send for Mapping {}
// SAFETY: as above; the type itself holds no interior state.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` shared, readable and writable.
    pub(crate) fn map(fd: BorrowedFd<'_>, len: usize) -> io::Result<Mapping> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty mapping"));
        }
        // SAFETY: a fresh mapping chosen by the kernel; nothing else is touched.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // Huge pages where the kernel gives them to shared memory on request
        // (`/sys/kernel/mm/transparent_hugepage/shmem_enabled` is `advise`): a block table's
        // scattered copies then miss the TLB less. Advice only: refused or ignored
        // elsewhere, with nothing to undo.
        // SAFETY: the range is the mapping just made; advice changes no contents.
        let _ = unsafe { libc::madvise(ptr, len, libc::MADV_HUGEPAGE) };
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The control page at the end of the mapping, where its owner wrote one.
    pub(crate) fn control(&self) -> Option<&Page> {
        // SAFETY: the whole mapping lives as long as `self`; `mmap` returns page-aligned
        // addresses and lengths here are whole pages.
        unsafe { Page::at(self.ptr, self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `map` mapped, once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Host memory this transport allocates: a memfd of `len` bytes (whole pages) followed by
/// its control page ([`crate::control`]), mapped.
pub(crate) struct SharedAlloc {
    pub(crate) fd: OwnedFd,
    pub(crate) map: Mapping,
}

impl SharedAlloc {
    pub(crate) fn new(len: usize) -> io::Result<SharedAlloc> {
        let page = 4096usize;
        let size = len.max(1).div_ceil(page) * page + CONTROL_LEN;
        // SAFETY: a NUL-terminated name and flags; the result is checked.
        let raw = unsafe {
            libc::memfd_create(
                c"hmc-shm".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor this function owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: a valid descriptor and a length.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // Sealed at this size: a peer that mapped it can trust it never shrinks under it
        // (a shrunk file would fault the peer's copies with SIGBUS).
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: a valid descriptor; F_ADD_SEALS takes an int.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let map = Mapping::map(fd.as_fd(), size)?;
        Ok(SharedAlloc { fd, map })
    }

    /// The control page, for its owner to write ([`Page::init`]) and change.
    pub(crate) fn control(&self) -> &Page {
        // SAFETY: the mapping is `size` bytes, page aligned, and lives as long as `self`.
        unsafe { Page::raw(self.map.ptr, self.map.len) }
    }
}

/// Maps a memfd a target granted for a registration of `len` bytes, after checking that it
/// is sealed against shrinking and long enough, so no copy into it can fault.
pub(crate) fn map_granted(fd: OwnedFd, len: u64) -> Result<Mapping, &'static str> {
    // SAFETY: a valid descriptor; F_GET_SEALS has no argument.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
        return Err("the granted memfd is not sealed against shrinking");
    }
    // SAFETY: fstat writes into the zeroed struct we pass.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a stat buffer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err("fstat of the granted memfd failed");
    }
    let size = st.st_size as u64;
    if size < len || len == 0 {
        return Err("the granted memfd is shorter than its registration");
    }
    Mapping::map(fd.as_fd(), size as usize).map_err(|_| "mapping the granted memfd failed")
}

/// Writes `frame` whole, with `fd` attached to its first byte (`SCM_RIGHTS`).
pub(crate) fn send_with_fd(s: &UnixStream, frame: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
    let raw: RawFd = fd.as_raw_fd();
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut control = vec![0u8; space];
    let iov = [IoSlice::new(frame)];
    // SAFETY: msghdr is plain data; every pointer set below outlives the sendmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: the control buffer has room for one header carrying one descriptor.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), raw);
    }
    // SAFETY: a valid socket and a msghdr whose buffers live for the call.
    let n = unsafe { libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // The descriptor went with the first byte; the rest is plain data.
    let mut rest = &frame[n as usize..];
    while !rest.is_empty() {
        let n = io::Write::write(&mut &*s, rest)?;
        rest = &rest[n..];
    }
    Ok(())
}

/// A side-channel reader that keeps descriptors arriving with the bytes, in order.
pub(crate) struct FdReader {
    sock: UnixStream,
    fds: VecDeque<OwnedFd>,
}

impl FdReader {
    /// Most descriptors kept unclaimed: a target sends one per `Granted` it answers, so
    /// more than a few unclaimed means a broken peer.
    const MAX_UNCLAIMED: usize = 64;

    pub(crate) fn new(sock: UnixStream) -> FdReader {
        FdReader {
            sock,
            fds: VecDeque::new(),
        }
    }

    /// Shuts the socket down both ways.
    pub(crate) fn shutdown(&self) {
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }

    /// The oldest descriptor received and not yet taken.
    pub(crate) fn take_fd(&mut self) -> Option<OwnedFd> {
        self.fds.pop_front()
    }
}

impl Read for FdReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: CMSG_SPACE is a pure size computation.
        let space = unsafe { libc::CMSG_SPACE(4 * std::mem::size_of::<RawFd>() as u32) } as usize;
        let mut control = vec![0u8; space];
        let mut iov = [IoSliceMut::new(buf)];
        // SAFETY: msghdr is plain data; every pointer set below outlives the recvmsg call.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr().cast();
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: a valid socket and buffers that live for the call.
        let n = unsafe { libc::recvmsg(self.sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: walks the control messages the kernel wrote into `control`.
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                    let count = ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                        / std::mem::size_of::<RawFd>();
                    for i in 0..count {
                        // Each received descriptor is new in this process and ours.
                        let fd = OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i)));
                        if self.fds.len() < Self::MAX_UNCLAIMED {
                            self.fds.push_back(fd);
                        }
                    }
                }
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the peer sent more descriptors at once than a side channel carries",
            ));
        }
        Ok(n as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_memfd_travels_with_its_frame_and_maps_the_same_bytes() {
        let alloc = SharedAlloc::new(10_000).unwrap();
        assert_eq!(
            alloc.map.len(),
            12_288 + CONTROL_LEN,
            "whole pages and the control page"
        );
        // SAFETY: the mapping is ours and 12 KiB long.
        unsafe { alloc.map.ptr().add(5000).write(42) };
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(b"plain").unwrap();
        send_with_fd(&a, b"with-fd", alloc.fd.as_fd()).unwrap();
        let mut r = FdReader::new(b);
        let mut got = [0u8; 5];
        r.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"plain");
        assert!(
            r.take_fd().is_none(),
            "no descriptor came with the plain bytes"
        );
        let mut got = [0u8; 7];
        r.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"with-fd");
        let fd = r.take_fd().expect("the descriptor came with its frame");
        let other = map_granted(fd, 10_000).unwrap();
        assert_eq!(other.len(), 12_288 + CONTROL_LEN);
        // SAFETY: both mappings are 12 KiB long.
        unsafe {
            assert_eq!(other.ptr().add(5000).read(), 42, "the same pages");
            other.ptr().add(6000).write(7);
            assert_eq!(alloc.map.ptr().add(6000).read(), 7, "both ways");
        }
        // SAFETY: a valid descriptor; the seals refuse the change.
        let shrink = unsafe { libc::ftruncate(alloc.fd.as_raw_fd(), 4096) };
        assert_ne!(shrink, 0, "sealed against shrinking");
    }

    #[test]
    fn unsealed_or_short_memfds_are_refused() {
        let alloc = SharedAlloc::new(4096).unwrap();
        let dup = |fd: &OwnedFd| fd.try_clone().unwrap();
        assert!(map_granted(dup(&alloc.fd), 4096).is_ok());
        assert_eq!(
            map_granted(dup(&alloc.fd), (4096 + CONTROL_LEN + 1) as u64).err(),
            Some("the granted memfd is shorter than its registration")
        );
        // SAFETY: a name and flags; checked below.
        let raw = unsafe { libc::memfd_create(c"plain".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: a new descriptor we own.
        let plain = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: a valid descriptor.
        assert_eq!(unsafe { libc::ftruncate(plain.as_raw_fd(), 4096) }, 0);
        assert_eq!(
            map_granted(plain, 4096).err(),
            Some("the granted memfd is not sealed against shrinking")
        );
    }
}
