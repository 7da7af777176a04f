//! ABI shims: a C stand-in for a vendor library, compiled from the author's source at test time, so a backend that loads its vendor library at run time is tested without the hardware.
//!
//! A backend that `dlopen`s `libvendor.so` at run time can be pointed at another file
//! with the same symbols and C signatures. [`build_shim`] compiles such a stand-in, written
//! by the backend's author in C over host memory, with the system's C compiler, caches it
//! (rebuilt only when a source, a listed header or the command changes), exports exactly
//! the symbols the author lists (as the vendor library would, so the backend cannot come
//! to rely on a helper of the shim) and checks that each of them is there.
//!
//! ```no_run
//! use hmc_testshim::shim::{ShimSpec, build_shim};
//!
//! let lib = build_shim(
//!     &ShimSpec::new("vendor_shim", "tests/shim/vendor_shim.c")
//!         .exports(["vendorMalloc", "vendorFree", "vendorMemcpy"]),
//! )?;
//! // Point the backend at `lib` (its `HMC_..._LIB` variable or a config field).
//! # Ok::<(), hmc_testshim::shim::ShimError>(())
//! ```
//!
//! What a shim verifies: the binding layer (library loading, symbol names, argument order
//! and types, the enum values passed, how vendor error codes become `hmc_core::Error`).
//! What it does not: whether the real driver behaves as its header promises, or anything
//! about performance. docs/backend-guide.md ("Testing your backend without the hardware")
//! has a worked example.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// What to compile into a shim library.
#[derive(Clone, Debug)]
pub struct ShimSpec {
    name: String,
    sources: Vec<PathBuf>,
    include_dirs: Vec<PathBuf>,
    depends_on: Vec<PathBuf>,
    exports: Vec<String>,
    defines: Vec<String>,
    flags: Vec<String>,
    out_dir: Option<PathBuf>,
}

impl ShimSpec {
    /// The library `lib<name>.so`, compiled from `source` (a relative path is taken from
    /// the current directory, which is the crate's folder under `cargo test`).
    pub fn new(name: impl Into<String>, source: impl Into<PathBuf>) -> Self {
        ShimSpec {
            name: name.into(),
            sources: vec![source.into()],
            include_dirs: Vec::new(),
            depends_on: Vec::new(),
            exports: Vec::new(),
            defines: Vec::new(),
            flags: Vec::new(),
            out_dir: None,
        }
    }

    /// Another C file of the same library.
    pub fn source(mut self, source: impl Into<PathBuf>) -> Self {
        self.sources.push(source.into());
        self
    }

    /// A folder passed to the compiler with `-I`.
    pub fn include_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.include_dirs.push(dir.into());
        self
    }

    /// A file (a header the sources include) whose change rebuilds the library.
    pub fn depends_on(mut self, file: impl Into<PathBuf>) -> Self {
        self.depends_on.push(file.into());
        self
    }

    /// The symbols the library exports: exactly these (a linker version script hides
    /// the rest), and each must be defined, or [`build_shim`] fails naming the missing
    /// ones. Without this call every global symbol is exported and nothing is checked.
    pub fn exports<S: Into<String>>(mut self, symbols: impl IntoIterator<Item = S>) -> Self {
        self.exports.extend(symbols.into_iter().map(Into::into));
        self
    }

    /// A preprocessor definition, `NAME` or `NAME=VALUE` (passed as `-DNAME=VALUE`).
    pub fn define(mut self, definition: impl Into<String>) -> Self {
        self.defines.push(definition.into());
        self
    }

    /// An extra compiler argument, after the defaults (`-shared -fPIC -O1 -Wall
    /// -pthread`), so it can override them (`-O2`, `-std=c11`, `-Werror`).
    pub fn flag(mut self, flag: impl Into<String>) -> Self {
        self.flags.push(flag.into());
        self
    }

    /// Where the library is written and cached; default: [`default_out_dir`].
    pub fn out_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.out_dir = Some(dir.into());
        self
    }
}

/// Why a shim could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShimError {
    /// The C compiler could not be run at all.
    #[error(
        "no C compiler: running `{compiler}` failed ({reason}); install one (Debian/Ubuntu: \
         `apt-get install gcc`, Fedora: `dnf install gcc`) or set CC to a compiler's path"
    )]
    NoCompiler {
        /// The compiler tried (`$CC`, else `cc`).
        compiler: String,
        /// What the OS said.
        reason: String,
    },
    /// The compiler ran and refused the sources.
    #[error("`{compiler}` failed to build the ABI shim {library}:\n{stderr}")]
    CompileFailed {
        /// The compiler.
        compiler: String,
        /// The library it was building.
        library: PathBuf,
        /// Its diagnostics.
        stderr: String,
    },
    /// The library built but does not define every symbol of [`ShimSpec::exports`].
    #[error(
        "the ABI shim {library} does not define {}; add them to its C source (with the \
         vendor header's signatures) or remove them from ShimSpec::exports",
        missing.join(", ")
    )]
    MissingSymbols {
        /// The library.
        library: PathBuf,
        /// The symbols listed but not defined.
        missing: Vec<String>,
    },
    /// A file could not be read or written.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ShimError {
    let path = path.to_path_buf();
    move |source| ShimError::Io { what, path, source }
}

/// The C compiler shims are built with: `$CC` when set, else `cc`.
pub fn c_compiler() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".to_string())
}

/// Where shims go by default: `$OUT_DIR` in a build script; else `hmc-shims` in the
/// profile folder of the running test or bench (`target/debug/hmc-shims`); else a folder
/// under the system's temporary directory.
pub fn default_out_dir() -> PathBuf {
    if let Some(out) = std::env::var_os("OUT_DIR") {
        return PathBuf::from(out).join("hmc-shims");
    }
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf));
    match exe_dir {
        // Tests and benches run from `target/<profile>/deps`.
        Some(d) if d.ends_with("deps") => d.parent().unwrap_or(&d).join("hmc-shims"),
        Some(d) => d.join("hmc-shims"),
        None => std::env::temp_dir().join("hmc-shims"),
    }
}

/// Compiles `spec` into `lib<name>.so` and returns its path; cached: nothing is compiled
/// when the library is newer than every source and [`ShimSpec::depends_on`] file and was
/// built by the same command. Safe to call from parallel tests and processes: the
/// library is written under a temporary name and renamed into place.
pub fn build_shim(spec: &ShimSpec) -> Result<PathBuf, ShimError> {
    // One build at a time in this process; the rename keeps other processes safe.
    static BUILDING: Mutex<()> = Mutex::new(());
    let _one = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = spec.out_dir.clone().unwrap_or_else(default_out_dir);
    std::fs::create_dir_all(&dir).map_err(io("cannot create", &dir))?;
    let out = dir.join(format!("lib{}.so", spec.name));
    let stamp = dir.join(format!("lib{}.so.cmd", spec.name));
    let map = dir.join(format!("lib{}.map", spec.name));
    let tmp = dir.join(format!("lib{}.so.{}.tmp", spec.name, std::process::id()));
    let compiler = c_compiler();
    let mut args: Vec<String> = ["-shared", "-fPIC", "-O1", "-Wall", "-pthread"]
        .map(String::from)
        .to_vec();
    args.extend(spec.flags.iter().cloned());
    args.extend(spec.defines.iter().map(|d| format!("-D{d}")));
    for d in &spec.include_dirs {
        args.push(format!("-I{}", d.display()));
    }
    if !spec.exports.is_empty() {
        args.push(format!("-Wl,--version-script={}", map.display()));
    }
    args.extend(spec.sources.iter().map(|s| s.display().to_string()));
    let command = format!("{compiler} {} {}", args.join(" "), spec.exports.join(","));
    let inputs: Vec<&Path> = spec
        .sources
        .iter()
        .chain(&spec.depends_on)
        .map(PathBuf::as_path)
        .collect();
    if is_fresh(&out, &inputs) && std::fs::read_to_string(&stamp).is_ok_and(|s| s == command) {
        return Ok(out);
    }
    if !spec.exports.is_empty() {
        let script = format!(
            "{{\n  global:\n{}  local: *;\n}};\n",
            spec.exports
                .iter()
                .map(|s| format!("    {s};\n"))
                .collect::<String>()
        );
        std::fs::write(&map, script).map_err(io("cannot write", &map))?;
    }
    let output = Command::new(&compiler)
        .args(&args)
        .arg("-o")
        .arg(&tmp)
        .output()
        .map_err(|e| ShimError::NoCompiler {
            compiler: compiler.clone(),
            reason: e.to_string(),
        })?;
    if !output.status.success() {
        let _ = std::fs::remove_file(&tmp);
        return Err(ShimError::CompileFailed {
            compiler,
            library: out,
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    if !spec.exports.is_empty() {
        let bytes = std::fs::read(&tmp).map_err(io("cannot read", &tmp))?;
        let defined = elf::defined_dynamic_symbols(&bytes).map_err(|reason| ShimError::Io {
            what: "cannot read the symbols of",
            path: tmp.clone(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, reason),
        })?;
        let missing: Vec<String> = spec
            .exports
            .iter()
            .filter(|s| !defined.iter().any(|d| d == *s))
            .cloned()
            .collect();
        if !missing.is_empty() {
            let _ = std::fs::remove_file(&tmp);
            return Err(ShimError::MissingSymbols {
                library: out,
                missing,
            });
        }
    }
    std::fs::rename(&tmp, &out).map_err(io("cannot move into place", &tmp))?;
    std::fs::write(&stamp, command).map_err(io("cannot write", &stamp))?;
    Ok(out)
}

fn is_fresh(out: &Path, inputs: &[&Path]) -> bool {
    let Ok(built) = std::fs::metadata(out).and_then(|m| m.modified()) else {
        return false;
    };
    inputs.iter().all(|p| {
        std::fs::metadata(p)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t <= built)
    })
}

/// Just enough ELF to list a shared library's exported symbols without loading it (so
/// checking a shim runs none of its code).
mod elf {
    fn u16_at(b: &[u8], at: usize) -> Option<u16> {
        Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
    }
    fn u32_at(b: &[u8], at: usize) -> Option<u32> {
        Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
    }
    fn u64_at(b: &[u8], at: usize) -> Option<usize> {
        usize::try_from(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?)).ok()
    }

    /// Names of the global and weak symbols `.dynsym` defines, of a little-endian ELF64
    /// file.
    pub fn defined_dynamic_symbols(b: &[u8]) -> Result<Vec<String>, String> {
        if b.get(..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1][..]) {
            return Err("not a little-endian 64-bit ELF file".into());
        }
        let malformed = || "a malformed ELF file".to_string();
        let shoff = u64_at(b, 0x28).ok_or_else(malformed)?;
        let shentsize = usize::from(u16_at(b, 0x3a).ok_or_else(malformed)?);
        let shnum = usize::from(u16_at(b, 0x3c).ok_or_else(malformed)?);
        let section = |i: usize| shoff + i * shentsize;
        const SHT_DYNSYM: u32 = 11;
        let dynsym = (0..shnum)
            .map(section)
            .find(|s| u32_at(b, s + 4) == Some(SHT_DYNSYM))
            .ok_or("no dynamic symbol table")?;
        let (off, size) = (
            u64_at(b, dynsym + 24).ok_or_else(malformed)?,
            u64_at(b, dynsym + 32).ok_or_else(malformed)?,
        );
        let strtab = section(u32_at(b, dynsym + 40).ok_or_else(malformed)? as usize);
        let str_off = u64_at(b, strtab + 24).ok_or_else(malformed)?;
        let mut names = Vec::new();
        for sym in (off..off + size).step_by(24) {
            let info = *b.get(sym + 4).ok_or_else(malformed)?;
            let shndx = u16_at(b, sym + 6).ok_or_else(malformed)?;
            let (global, weak) = (info >> 4 == 1, info >> 4 == 2);
            if shndx == 0 || !(global || weak) {
                continue;
            }
            let start = str_off + u32_at(b, sym).ok_or_else(malformed)? as usize;
            let tail = b.get(start..).ok_or_else(malformed)?;
            let end = tail.iter().position(|c| *c == 0).ok_or_else(malformed)?;
            names.push(String::from_utf8_lossy(&tail[..end]).into_owned());
        }
        Ok(names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str = r#"
        static int helper(int x) { return x + 1; }
        int shim_helper_visible(int x) { return helper(x); }
        int vendorInit(int flags) { return helper(flags) - 1; }
        int vendorCount(int *n) { *n = 2; return 0; }
    "#;

    fn source(dir: &Path) -> PathBuf {
        let src = dir.join("vendor_shim.c");
        std::fs::write(&src, SOURCE).unwrap();
        src
    }

    fn exported(lib: &Path) -> Vec<String> {
        elf::defined_dynamic_symbols(&std::fs::read(lib).unwrap()).unwrap()
    }

    #[test]
    fn only_the_listed_symbols_are_exported_and_the_build_is_cached() {
        let dir = tempfile::tempdir().unwrap();
        let spec = ShimSpec::new("vendor", source(dir.path()))
            .exports(["vendorInit", "vendorCount"])
            .out_dir(dir.path());
        let lib = build_shim(&spec).unwrap();
        assert_eq!(lib, dir.path().join("libvendor.so"));
        let syms = exported(&lib);
        assert!(syms.contains(&"vendorInit".to_string()), "{syms:?}");
        assert!(syms.contains(&"vendorCount".to_string()), "{syms:?}");
        assert!(
            !syms.contains(&"shim_helper_visible".to_string()),
            "{syms:?}"
        );
        // Unchanged: not rebuilt.
        let built = std::fs::metadata(&lib).unwrap().modified().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        build_shim(&spec).unwrap();
        assert_eq!(std::fs::metadata(&lib).unwrap().modified().unwrap(), built);
        // Another command (a define): rebuilt.
        build_shim(&spec.clone().define("VARIANT=2")).unwrap();
        assert_ne!(std::fs::metadata(&lib).unwrap().modified().unwrap(), built);
    }

    #[test]
    fn without_a_list_every_global_symbol_is_exported() {
        let dir = tempfile::tempdir().unwrap();
        let lib =
            build_shim(&ShimSpec::new("all", source(dir.path())).out_dir(dir.path())).unwrap();
        let syms = exported(&lib);
        assert!(
            syms.contains(&"shim_helper_visible".to_string()),
            "{syms:?}"
        );
        assert!(!syms.contains(&"helper".to_string()), "static: {syms:?}");
    }

    #[test]
    fn a_listed_symbol_the_source_lacks_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let spec = ShimSpec::new("lacking", source(dir.path()))
            .exports(["vendorInit", "vendorMalloc", "vendorFree"])
            .out_dir(dir.path());
        let e = build_shim(&spec).unwrap_err();
        assert!(
            matches!(&e, ShimError::MissingSymbols { missing, .. } if missing == &["vendorMalloc", "vendorFree"]),
            "{e:?}"
        );
        assert!(e.to_string().contains("vendorMalloc, vendorFree"), "{e}");
        assert!(!dir.path().join("liblacking.so").exists());
    }

    #[test]
    fn a_broken_source_reports_the_compiler_output() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("broken.c");
        std::fs::write(&src, "int f( {").unwrap();
        let e = build_shim(&ShimSpec::new("broken", &src).out_dir(dir.path())).unwrap_err();
        assert!(matches!(e, ShimError::CompileFailed { .. }), "{e:?}");
        assert!(e.to_string().contains("failed to build"), "{e}");
    }

    #[test]
    fn a_missing_compiler_says_how_to_get_one() {
        // In a child process: CC is process-wide.
        if std::env::var_os("HMC_SHIM_CHILD").is_none() {
            let out = Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "shim::tests::a_missing_compiler_says_how_to_get_one",
                ])
                .env("HMC_SHIM_CHILD", "1")
                .env("CC", "/nonexistent/hmc-no-such-cc")
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success() && text.contains("1 passed"), "{text}");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let e =
            build_shim(&ShimSpec::new("nocc", source(dir.path())).out_dir(dir.path())).unwrap_err();
        assert!(matches!(e, ShimError::NoCompiler { .. }), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains("/nonexistent/hmc-no-such-cc") && text.contains("apt-get install gcc"),
            "{text}"
        );
    }

    #[test]
    fn elf_parsing_refuses_what_is_not_elf() {
        assert!(elf::defined_dynamic_symbols(b"#!/bin/sh\n").is_err());
        assert!(elf::defined_dynamic_symbols(&[0x7f, b'E', b'L', b'F', 2, 1, 0]).is_err());
    }
}
