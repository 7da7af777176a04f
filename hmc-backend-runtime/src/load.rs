//! Loading a vendor runtime library at run time: the search order (explicit path, then the
//! vendor's environment variable, then its candidate names), symbol resolution, and the
//! `Unavailable` errors that say what was looked for and how to fix it.

use std::ffi::{CStr, c_char};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use hmc_core::{Error, Result};

/// What the loader needs to know about one vendor's runtime library.
#[derive(Clone, Copy, Debug)]
pub struct LibrarySpec {
    /// The library name used in errors (`"libamdhip64"`).
    pub library: &'static str,
    /// The runtime, as errors name it (`"the HIP runtime"`).
    pub runtime: &'static str,
    /// The environment variable naming the library to load instead of the default search.
    pub env: &'static str,
    /// File names tried, in order, when [`LibrarySpec::env`] is not set.
    pub candidates: &'static [&'static str],
    /// How to install the runtime; errors append ", or set `<env>` to its full path".
    pub install: &'static str,
    /// Why a library missing a symbol is refused (`"it is not a HIP runtime HMC supports"`).
    pub missing_symbol: &'static str,
}

impl LibrarySpec {
    /// An [`Error::Unavailable`] about `what`, with the install hint.
    pub fn unavailable(&self, what: String, reason: String) -> Error {
        Error::Unavailable {
            what,
            reason,
            hint: format!("{}, or set {} to its full path", self.install, self.env),
        }
    }

    /// An [`Error::Unavailable`] about the library loaded from `path`.
    pub fn unavailable_at(&self, path: &Path, reason: String) -> Error {
        self.unavailable(format!("{} at {}", self.library, path.display()), reason)
    }

    /// Loads the library: `explicit` when given, else `$env`, else the first of the
    /// candidates that loads. Returns it with the path it was loaded from.
    pub fn load(&self, explicit: Option<&Path>) -> Result<(libloading::Library, PathBuf)> {
        let env = std::env::var_os(self.env).map(PathBuf::from);
        let tries: Vec<PathBuf> = match explicit.map(Path::to_path_buf).or(env) {
            Some(p) => vec![p],
            None => self.candidates.iter().map(PathBuf::from).collect(),
        };
        let mut reasons = Vec::new();
        for path in tries {
            // SAFETY: loading a library runs its initialisers; a vendor runtime's
            // initialisers are designed to run in any process that links or dlopens it.
            match unsafe { libloading::Library::new(&path) } {
                Ok(lib) => return Ok((lib, path)),
                Err(e) => reasons.push(format!("{}: {e}", path.display())),
            }
        }
        Err(self.unavailable(
            format!("{} ({})", self.runtime, self.library),
            format!("could not load it: {}", reasons.join("; ")),
        ))
    }

    /// Resolves one symbol as a function pointer of type `T`; a missing symbol is
    /// `Unavailable`, naming it.
    ///
    /// # Safety
    /// `T` must be the exact C signature of `name` in the library.
    pub unsafe fn symbol<T: Copy>(
        &self,
        lib: &libloading::Library,
        path: &Path,
        name: &str,
    ) -> Result<T> {
        // SAFETY: the caller guarantees `T` matches the symbol's C signature.
        let sym = unsafe { lib.get::<T>(name.as_bytes()) }.map_err(|e| {
            self.unavailable_at(
                path,
                format!("it does not export `{name}` ({e}); {}", self.missing_symbol),
            )
        })?;
        Ok(*sym)
    }

    /// Resolves a symbol some versions of the runtime lack: `None` when it is missing.
    ///
    /// # Safety
    /// As for [`LibrarySpec::symbol`].
    pub unsafe fn optional_symbol<T: Copy>(lib: &libloading::Library, name: &str) -> Option<T> {
        // SAFETY: the caller guarantees `T` matches the symbol's C signature.
        unsafe { lib.get::<T>(name.as_bytes()) }.ok().map(|s| *s)
    }
}

/// The process-wide runtime for the default search: `cell`'s value, or `open()`'s stored
/// there on its first success (a failure is retried on the next call).
pub fn default_runtime<A>(
    cell: &'static OnceLock<Arc<A>>,
    open: impl FnOnce() -> Result<Arc<A>>,
) -> Result<Arc<A>> {
    if let Some(api) = cell.get() {
        return Ok(api.clone());
    }
    let api = open()?;
    Ok(cell.get_or_init(|| api).clone())
}

/// Copies a C string returned by the runtime (`"(no description)"` for NULL).
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that stays valid during the call.
pub unsafe fn c_string(p: *const c_char) -> String {
    if p.is_null() {
        return "(no description)".into();
    }
    // SAFETY: non-null and NUL-terminated per the caller's contract.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: LibrarySpec = LibrarySpec {
        library: "libhmc-no-such-runtime",
        runtime: "the test runtime",
        env: "HMC_TEST_NO_SUCH_RUNTIME_LIB",
        candidates: &[
            "libhmc-no-such-runtime.so",
            "/nonexistent/libhmc-no-such-runtime.so",
        ],
        install: "install nothing",
        missing_symbol: "it is not a test runtime",
    };

    #[test]
    fn a_missing_library_is_unavailable_naming_every_path_tried_and_the_variable() {
        let err = SPEC.load(None).unwrap_err();
        let Error::Unavailable { what, reason, hint } = &err else {
            panic!("expected Unavailable, got {err:?}");
        };
        assert!(what.contains("libhmc-no-such-runtime"), "{err}");
        assert!(
            reason.contains("/nonexistent/libhmc-no-such-runtime.so"),
            "{err}"
        );
        assert!(reason.contains("libhmc-no-such-runtime.so:"), "{err}");
        assert!(hint.contains("HMC_TEST_NO_SUCH_RUNTIME_LIB"), "{err}");
    }

    #[test]
    fn an_explicit_path_is_the_only_one_tried() {
        let err = SPEC
            .load(Some(Path::new("/nonexistent/explicit.so")))
            .unwrap_err();
        let s = err.to_string();
        assert!(s.contains("/nonexistent/explicit.so"), "{s}");
        assert!(!s.contains("libhmc-no-such-runtime.so:"), "{s}");
    }

    #[test]
    fn null_c_strings_read_as_no_description() {
        // SAFETY: NULL is allowed by the contract.
        assert_eq!(unsafe { c_string(std::ptr::null()) }, "(no description)");
        let s = c"out of memory";
        // SAFETY: a NUL-terminated static string.
        assert_eq!(unsafe { c_string(s.as_ptr()) }, "out of memory");
    }
}
