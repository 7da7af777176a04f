//! Cross-memory attach: `process_vm_readv`/`process_vm_writev` of one chunk, the peer's
//! credentials from `SO_PEERCRED`, and the connect-time dial and probe that turns a
//! refusal into an `Unavailable` error naming the cause (Yama, seccomp, another user) and
//! the fix.

use std::io;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use hmc_core::{Deadline, Error, Op, PeerAddr, Result};
use hmc_transport_kit::nonblocking::retry_eintr;

use crate::wire::{self, Msg};

/// A byte every target exposes for peers' probes (its address travels in `Welcome`).
pub(crate) static PROBE: u8 = 0x5a;

/// The peer's credentials (`SO_PEERCRED`), as the kernel recorded them at connect: the
/// kit's, one reading for every transport.
pub(crate) use hmc_transport_kit::unix::{PeerCred, peer_cred};

/// Copies `len` bytes between local `local` and `remote` in process `pid`: for
/// [`Op::Read`] from the remote into the local bytes, for [`Op::Write`] the other way.
/// Loops over partial transfers; an error that moved nothing is returned as is.
///
/// # Safety
/// `local..local+len` must be valid for the access (writes for a read) for the whole
/// call, and nothing else may use it meanwhile in a way that races.
pub(crate) unsafe fn copy(
    pid: i32,
    op: Op,
    local: *mut u8,
    remote: u64,
    len: usize,
) -> io::Result<()> {
    let mut done = 0usize;
    while done < len {
        let l = libc::iovec {
            // SAFETY: `done < len`, inside the local range the caller vouches for.
            iov_base: unsafe { local.add(done) }.cast(),
            iov_len: len - done,
        };
        let r = libc::iovec {
            iov_base: (remote as usize + done) as *mut libc::c_void,
            iov_len: len - done,
        };
        // SAFETY: one valid local iovec (see the function's contract) and one remote iovec
        // that the kernel checks against the target's address space; no flags.
        let n = retry_eintr(|| unsafe {
            match op {
                Op::Read => libc::process_vm_readv(pid, &l, 1, &r, 1, 0),
                Op::Write => libc::process_vm_writev(pid, &l, 1, &r, 1, 0),
            }
        })?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "process_vm_* moved no bytes (the remote range is unmapped)",
            ));
        }
        done += n as usize;
    }
    Ok(())
}

/// Most iovecs one `process_vm_*` call takes (the kernel's `UIO_MAXIOV`).
pub(crate) const MAX_IOV: usize = 1024;

/// One piece of a vectored copy: `len` bytes at `local` here and at `remote` in the peer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Piece {
    pub(crate) local: *mut u8,
    pub(crate) remote: u64,
    pub(crate) len: usize,
}

// SAFETY: a piece is two addresses and a length; the contract of `copy_vectored` (the local
// range valid for the call) is the caller's wherever the call runs.
unsafe impl Send for Piece {}

/// Copies every piece between this process and process `pid` (for [`Op::Read`] from the
/// remote into the local bytes, for [`Op::Write`] the other way) with as few
/// `process_vm_*` calls as the kernel allows: [`MAX_IOV`] pieces a call. The kernel's fixed
/// cost of a call (finding the task, the ptrace check, taking its mm) is then paid once per
/// call rather than once per block. Loops over partial transfers from where one stopped; a
/// call that moved nothing is an error.
///
/// # Safety
/// Every piece's local range must be valid for the access (writes for a read) for the whole
/// call, and nothing else may use it meanwhile in a way that races.
pub(crate) unsafe fn copy_vectored(pid: i32, op: Op, pieces: &[Piece]) -> io::Result<()> {
    let mut local = Vec::with_capacity(pieces.len().min(MAX_IOV));
    let mut remote = Vec::with_capacity(pieces.len().min(MAX_IOV));
    // (index of the first piece not fully moved, bytes of it already moved)
    let (mut at, mut skip) = (0usize, 0usize);
    while at < pieces.len() {
        local.clear();
        remote.clear();
        let mut want = 0usize;
        for (k, p) in pieces[at..].iter().take(MAX_IOV).enumerate() {
            let from = if k == 0 { skip } else { 0 };
            local.push(libc::iovec {
                // SAFETY: `from < p.len` (a piece is advanced past only when fully moved),
                // inside the local range the caller vouches for.
                iov_base: unsafe { p.local.add(from) }.cast(),
                iov_len: p.len - from,
            });
            remote.push(libc::iovec {
                iov_base: (p.remote as usize + from) as *mut libc::c_void,
                iov_len: p.len - from,
            });
            want += p.len - from;
        }
        let count = local.len() as libc::c_ulong;
        // SAFETY: `count` valid local iovecs (see the function's contract) and as many remote
        // ones that the kernel checks against the target's address space; no flags.
        let n = retry_eintr(|| unsafe {
            match op {
                Op::Read => {
                    libc::process_vm_readv(pid, local.as_ptr(), count, remote.as_ptr(), count, 0)
                }
                Op::Write => {
                    libc::process_vm_writev(pid, local.as_ptr(), count, remote.as_ptr(), count, 0)
                }
            }
        })?;
        if n == 0 && want > 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "process_vm_* moved no bytes (the remote range is unmapped)",
            ));
        }
        // Advance past what moved: whole pieces, then into the one that stopped it.
        let mut moved = n as usize;
        while at < pieces.len() && moved > 0 {
            let left = pieces[at].len - skip;
            if moved >= left {
                moved -= left;
                at += 1;
                skip = 0;
            } else {
                skip += moved;
                moved = 0;
            }
        }
        // Zero-length pieces move nothing and never stop a call.
        while at < pieces.len() && pieces[at].len == skip {
            at += 1;
            skip = 0;
        }
    }
    Ok(())
}

fn yama_scope() -> Option<u8> {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

fn seccomp_mode() -> Option<u8> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Explains why cross-memory attach to `peer` failed with `e`, and how to fix it.
pub(crate) fn diagnose(peer: PeerCred, e: &io::Error) -> Error {
    // SAFETY: getuid has no preconditions and cannot fail.
    let me = unsafe { libc::getuid() };
    let code = e.raw_os_error().unwrap_or(0);
    let (reason, hint) = if code == libc::ENOSYS {
        (
            format!(
                "process_vm_readv is not available ({e}; seccomp mode {:?}, kernel built \
                 without CONFIG_CROSS_MEMORY_ATTACH or a seccomp filter of a container runtime)",
                seccomp_mode()
            ),
            "allow process_vm_readv/process_vm_writev in the seccomp profile (docker: \
             --security-opt seccomp=... with both syscalls) or use the TCP transport"
                .to_string(),
        )
    } else if code == libc::EPERM || code == libc::EACCES {
        let mut why = vec![format!(
            "the kernel refused to attach to pid {} ({e})",
            peer.pid
        )];
        if peer.uid != me {
            why.push(format!(
                "the peer runs as uid {} and this process as uid {me}",
                peer.uid
            ));
        }
        match yama_scope() {
            Some(s) if s >= 1 => why.push(format!(
                "Yama ptrace_scope is {s} (/proc/sys/kernel/yama/ptrace_scope): only \
                 descendants{} may be attached",
                if s >= 2 {
                    " of CAP_SYS_PTRACE holders"
                } else {
                    ""
                }
            )),
            _ => {}
        }
        if seccomp_mode().is_some_and(|m| m > 0) {
            why.push("a seccomp filter is active".into());
        }
        (
            why.join("; "),
            "run both processes as the same user, and either set \
             `sysctl kernel.yama.ptrace_scope=0`, give the initiator CAP_SYS_PTRACE, or bind \
             the target with ShmConfig::allow_any_ptracer = true (prctl PR_SET_PTRACER_ANY); \
             otherwise use the TCP transport"
                .to_string(),
        )
    } else {
        (
            format!("probing pid {} failed: {e}", peer.pid),
            "check that the peer is alive and on this host, or use the TCP transport".to_string(),
        )
    };
    Error::Unavailable {
        what: "cross-memory attach (process_vm_readv)".into(),
        reason,
        hint,
    }
}

/// Reads the peer's probe byte once: what `connect` does before any transfer.
pub(crate) fn probe(peer: PeerCred, probe_addr: u64) -> Result<()> {
    let mut b = 0u8;
    // SAFETY: one local byte, exclusively ours for the call.
    match unsafe { copy(peer.pid, Op::Read, &mut b, probe_addr, 1) } {
        Ok(()) if b == PROBE => Ok(()),
        Ok(()) => Err(Error::Protocol(format!(
            "the probe byte of pid {} reads {b:#04x}, not {PROBE:#04x}",
            peer.pid
        ))),
        Err(e) => Err(diagnose(peer, &e)),
    }
}

/// Dials, says `Hello`, reads `Welcome`, probes; with why cross-memory attach is
/// refused, when it is. Blocking: run on a blocking thread.
pub(crate) fn dial(
    path: PathBuf,
    me: String,
    peer: PeerAddr,
    deadline: Deadline,
) -> Result<(UnixStream, PeerCred, Option<String>)> {
    // The OS error stays the source, as from every transport's connect (a refusal is
    // `io::ErrorKind::ConnectionRefused`).
    let s = UnixStream::connect(&path).map_err(|e| {
        Error::io(
            format!("connecting to {peer}'s side channel (is a peer listening there?)"),
            e,
        )
    })?;
    let cred = peer_cred(&s).map_err(|e| Error::io("reading SO_PEERCRED", e))?;
    let left = deadline.remaining().max(Duration::from_millis(1));
    s.set_read_timeout(Some(left))
        .and_then(|()| s.set_write_timeout(Some(left)))
        .map_err(|e| Error::io("setting side-channel timeouts", e))?;
    wire::write_msg(
        &mut &s,
        &Msg::Hello {
            version: wire::VERSION,
            addr: me,
        },
    )
    .map_err(|e| Error::peer(&peer, format!("handshake: {e}")))?;
    let body = wire::read_frame(&mut &s, wire::MAX_FRAME)
        .map_err(|e| Error::peer(&peer, format!("handshake: {e}")))?
        .ok_or_else(|| Error::peer(&peer, "closed the side channel during the handshake"))?;
    let Msg::Welcome {
        version,
        probe_addr,
    } = Msg::decode(&body)?
    else {
        return Err(Error::Protocol("expected Welcome".into()));
    };
    if version != wire::VERSION {
        return Err(Error::Protocol(format!(
            "the peer speaks side-channel version {version}, this build {}",
            wire::VERSION
        )));
    }
    let cma_refused = match probe(cred, probe_addr) {
        Ok(()) => None,
        // Shared memory from the target's `alloc_registered` still works.
        Err(e @ Error::Unavailable { .. }) => {
            tracing::info!(pid = cred.pid, error = %e, "cross-memory attach refused; only the peer's shared memory is reachable");
            Some(e.to_string())
        }
        Err(e) => return Err(e),
    };
    s.set_read_timeout(None)
        .map_err(|e| Error::io("setting side-channel timeouts", e))?;
    Ok((s, cred, cma_refused))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_probe_byte_reads_and_refusals_say_how_to_fix() {
        let me = PeerCred {
            pid: std::process::id() as i32,
            uid: 0,
            gid: 0,
        };
        probe(me, &PROBE as *const u8 as u64).unwrap();
        let e = diagnose(me, &io::Error::from_raw_os_error(libc::EPERM)).to_string();
        assert!(e.contains("ptrace") || e.contains("uid"), "{e}");
        assert!(e.contains("CAP_SYS_PTRACE"), "{e}");
        let e = diagnose(me, &io::Error::from_raw_os_error(libc::ENOSYS)).to_string();
        assert!(e.contains("seccomp"), "{e}");
    }

    /// Scattered pieces, more than one call's worth, zero-length ones among them, both ways,
    /// against this process (its own pid): every byte lands where its piece says.
    #[test]
    fn vectored_copies_move_every_piece_across_calls() {
        let pid = std::process::id() as i32;
        let src: Vec<u8> = (0..(3 * MAX_IOV * 7) as u32)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        let mut dst = vec![0u8; src.len()];
        // Piece k: 7 bytes of src at 7k into dst at 7 * (n-1-k) (reversed), every 5th empty.
        let n = src.len() / 7;
        let pieces: Vec<Piece> = (0..n)
            .map(|k| Piece {
                local: dst[7 * (n - 1 - k)..].as_mut_ptr(),
                remote: src[7 * k..].as_ptr() as u64,
                len: if k % 5 == 4 { 0 } else { 7 },
            })
            .collect();
        // SAFETY: every local range lies inside `dst`, borrowed mutably for the call.
        unsafe { copy_vectored(pid, Op::Read, &pieces) }.unwrap();
        for k in 0..n {
            let want: &[u8] = if k % 5 == 4 {
                &[0; 7]
            } else {
                &src[7 * k..7 * k + 7]
            };
            assert_eq!(&dst[7 * (n - 1 - k)..7 * (n - k)], want, "piece {k}");
        }
        let mut back = vec![0u8; src.len()];
        let pieces: Vec<Piece> = (0..n)
            .map(|k| Piece {
                local: dst[7 * (n - 1 - k)..].as_mut_ptr(),
                remote: back[7 * k..].as_mut_ptr() as u64,
                len: 7,
            })
            .collect();
        // SAFETY: as above; the remote ranges lie inside `back`, which nothing reads meanwhile.
        unsafe { copy_vectored(pid, Op::Write, &pieces) }.unwrap();
        for k in (0..n).filter(|k| k % 5 != 4) {
            assert_eq!(&back[7 * k..7 * k + 7], &src[7 * k..7 * k + 7], "piece {k}");
        }
    }

    /// A piece whose remote range is not mapped fails the copy (it is never skipped).
    #[test]
    fn vectored_copy_of_an_unmapped_range_fails() {
        let pid = std::process::id() as i32;
        let src = [1u8; 64];
        let mut dst = [0u8; 128];
        let pieces = [
            Piece {
                local: dst.as_mut_ptr(),
                remote: src.as_ptr() as u64,
                len: 64,
            },
            Piece {
                // SAFETY: inside `dst`.
                local: unsafe { dst.as_mut_ptr().add(64) },
                remote: 8, // the first page is never mapped
                len: 64,
            },
        ];
        // SAFETY: both local ranges lie inside `dst`.
        let e = unsafe { copy_vectored(pid, Op::Read, &pieces) }.unwrap_err();
        assert!(
            e.raw_os_error() == Some(libc::EFAULT) || e.kind() == io::ErrorKind::UnexpectedEof,
            "{e}"
        );
        assert_eq!(&dst[..64], &src[..], "the mapped piece before it moved");
    }
}
