//! Cross-memory attach: `process_vm_readv`/`process_vm_writev` of one chunk, the peer's
//! credentials from `SO_PEERCRED`, and the connect-time dial and probe that turns a
//! refusal into an `Unavailable` error naming the cause (Yama, seccomp, another user) and
//! the fix.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use hmc_core::{Deadline, Error, Op, PeerAddr, Result};

use crate::wire::{self, Msg};

/// A byte every target exposes for peers' probes (its address travels in `Welcome`).
pub(crate) static PROBE: u8 = 0x5a;

/// The process at the other end of a Unix socket, from the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PeerCred {
    pub(crate) pid: i32,
    pub(crate) uid: u32,
}

/// The peer's credentials (`SO_PEERCRED`), as the kernel recorded them at connect.
pub(crate) fn peer_cred(s: &UnixStream) -> io::Result<PeerCred> {
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
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCred {
        pid: cred.pid,
        uid: cred.uid,
    })
}

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
        let n = unsafe {
            match op {
                Op::Read => libc::process_vm_readv(pid, &l, 1, &r, 1, 0),
                Op::Write => libc::process_vm_writev(pid, &l, 1, &r, 1, 0),
            }
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
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
        };
        probe(me, &PROBE as *const u8 as u64).unwrap();
        let e = diagnose(me, &io::Error::from_raw_os_error(libc::EPERM)).to_string();
        assert!(e.contains("ptrace") || e.contains("uid"), "{e}");
        assert!(e.contains("CAP_SYS_PTRACE"), "{e}");
        let e = diagnose(me, &io::Error::from_raw_os_error(libc::ENOSYS)).to_string();
        assert!(e.contains("seccomp"), "{e}");
    }
}
