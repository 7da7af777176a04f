//! The side channel's default socket files (`hmc-shm-<pid>-<random>.sock` in the temporary
//! folder): a process removes its own however it ends normally, and the next one to start
//! removes those of processes that were killed.
//!
//! A communicator removes its file when it is closed or dropped; but a process that ends
//! without dropping it (Python exits without collecting module globals, a Rust program
//! calls `std::process::exit`) would leave the file behind, so every default path is also
//! registered for removal by an `atexit` hook. A killed process runs no hook: the first
//! default path a process makes sweeps the folder for files of this naming whose process
//! is gone and that nobody listens on (the kit's stale-file rule), owned by this user.

use std::path::{Path, PathBuf};
use std::sync::Once;

use parking_lot::Mutex;

/// The default socket files of this process not yet removed by their communicator.
static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
static HOOK_AND_SWEEP: Once = Once::new();

const PREFIX: &str = "hmc-shm-";
const SUFFIX: &str = ".sock";

/// A new default socket path in `dir` for this process (`token`: random hex), registered
/// for removal at exit; the first call also sweeps `dir` of killed processes' files.
pub(crate) fn default_path(dir: &Path, token: &str) -> PathBuf {
    HOOK_AND_SWEEP.call_once(|| {
        // SAFETY: `remove_at_exit` is an `extern "C" fn()` that takes no arguments, does not
        // unwind (it catches nothing that can panic: a try_lock and file removals) and
        // stays valid for the life of the process (it is a static function).
        if unsafe { libc::atexit(remove_at_exit) } != 0 {
            tracing::debug!("atexit refused the socket-file hook; files are removed on drop only");
        }
        sweep(dir);
    });
    let path = dir.join(format!("{PREFIX}{}-{token}{SUFFIX}", std::process::id()));
    LIVE.lock().push(path.clone());
    path
}

/// `path` was removed by its communicator: nothing left to do at exit.
pub(crate) fn removed(path: &Path) {
    LIVE.lock().retain(|p| p != path);
}

extern "C" fn remove_at_exit() {
    // At exit another thread may hold the lock forever (it was stopped mid-call): skip then.
    if let Some(mut live) = LIVE.try_lock() {
        remove_all(&mut live);
    }
}

fn remove_all(paths: &mut Vec<PathBuf>) {
    for p in paths.drain(..) {
        let _ = std::fs::remove_file(p);
    }
}

/// Removes from `dir` the default socket files of processes that are gone, owned by this
/// user, that nobody listens on.
pub(crate) fn sweep(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(owner_pid) else {
            continue;
        };
        let path = entry.path();
        let ours = std::os::unix::fs::MetadataExt::uid(&match entry.metadata() {
            Ok(m) => m,
            Err(_) => continue,
        }) == me;
        if !ours || pid == std::process::id() || alive(pid) {
            continue;
        }
        // Removed only if it is a socket nobody listens on (else it is left alone).
        if hmc_transport_kit::unix::clear_stale_socket(&path).is_ok() && !path.exists() {
            tracing::debug!(path = %path.display(), pid, "removed a killed process's socket file");
        }
    }
}

/// The pid in a default socket file's name (`hmc-shm-<pid>-<hex>.sock`).
fn owner_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(PREFIX)?.strip_suffix(SUFFIX)?;
    let (pid, token) = rest.split_once('-')?;
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    pid.parse().ok()
}

/// True unless `pid` names no process (another user's counts as alive).
fn alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 sends nothing; it only checks that the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn names_are_read_strictly() {
        assert_eq!(owner_pid("hmc-shm-123-0af9.sock"), Some(123));
        for bad in [
            "hmc-shm-123-.sock",
            "hmc-shm-x-0af9.sock",
            "hmc-shm-123-zz.sock",
            "other.sock",
        ] {
            assert_eq!(owner_pid(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_killed_processs_file_is_swept_and_a_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        // A process that is gone: started and waited for.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let stale = dir.path().join(format!("{PREFIX}{dead}-00aa{SUFFIX}"));
        drop(UnixListener::bind(&stale).unwrap()); // the file stays: nobody removed it
        // This process's own, listening; and a plain file of the same naming.
        let own = dir
            .path()
            .join(format!("{PREFIX}{}-00bb{SUFFIX}", std::process::id()));
        let _live = UnixListener::bind(&own).unwrap();
        let plain = dir.path().join(format!("{PREFIX}{dead}-00cc{SUFFIX}"));
        std::fs::write(&plain, b"not a socket").unwrap();
        sweep(dir.path());
        assert!(
            !stale.exists(),
            "the killed process's socket file is removed"
        );
        assert!(own.exists() && plain.exists(), "the rest are left alone");
    }

    #[test]
    fn paths_are_registered_until_their_communicator_removes_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = default_path(dir.path(), "00dd");
        let kept = default_path(dir.path(), "00ee");
        assert!(LIVE.lock().contains(&path) && LIVE.lock().contains(&kept));
        removed(&kept);
        assert!(LIVE.lock().contains(&path) && !LIVE.lock().contains(&kept));
        removed(&path);
        // What the exit hook does with what is left (here a list of its own: the real one
        // holds the other tests' live sockets).
        drop(UnixListener::bind(&path).unwrap());
        let mut left = vec![path.clone()];
        remove_all(&mut left);
        assert!(!path.exists() && left.is_empty());
    }
}
