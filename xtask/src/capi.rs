//! libhmc, the C and C++ API (crate `hmc-capi`), in `cargo xtask test` and `cargo xtask
//! install`: the install layout (library with its SONAME links, headers, `hmc.pc`, CMake
//! package), and the checks a C user's build would make: exported symbols, the headers
//! alone as C11 and C++17, the examples and C tests compiled with warnings as errors (gcc,
//! and clang where installed) and run (two processes over tcp and shm), the C tests again
//! under AddressSanitizer and UndefinedBehaviorSanitizer, and a CMake consumer and a
//! pkg-config consumer built from a clean prefix. All of it against the debug library
//! `cargo xtask test` has already built, so it adds seconds, not a release build. Also the
//! C API inside the Python wheel: staged for maturin ([`stage_for_wheel`]) and used from
//! the installed package ([`wheel_test`]).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{Result, cargo, on_path, root, run};

/// The crate's version: the library's file name and the `.pc`/CMake version.
const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The C API's major version: the SONAME's number.
const MAJOR: &str = "0";
/// What a program linking `libhmc.a` also links (`rustc --print native-static-libs`).
const STATIC_LIBS: &str = "-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc";
/// How long one example or test program may run.
const PROGRAM_TIMEOUT: Duration = Duration::from_secs(120);

/// `cargo xtask install --prefix PREFIX [--debug]`: builds libhmc (release unless
/// `--debug`) and installs it under PREFIX.
pub fn install(args: &[String]) -> Result {
    let prefix = args
        .iter()
        .position(|a| a == "--prefix")
        .and_then(|i| args.get(i + 1))
        .ok_or("usage: cargo xtask install --prefix PREFIX [--debug]")?;
    let debug = args.iter().any(|a| a == "--debug");
    let mut build = cargo();
    build.args(["build", "-p", "hmc-capi", "--lib"]);
    if !debug {
        build.arg("--release");
    }
    run(&mut build)?;
    let profile = if debug { "debug" } else { "release" };
    let prefix = std::path::absolute(prefix).map_err(|e| format!("{prefix}: {e}"))?;
    install_from(&root().join("target").join(profile), &prefix, true)?;
    eprintln!(
        "xtask: libhmc {VERSION} installed under {}: pkg-config --cflags --libs hmc \
         (PKG_CONFIG_PATH={0}/lib/pkgconfig) or find_package(hmc CONFIG REQUIRED) \
         (CMAKE_PREFIX_PATH={0})",
        prefix.display()
    );
    Ok(())
}

/// Installs the library built in `built` (a cargo profile folder) under `prefix`:
/// `lib/libhmc.so.VERSION` with its `libhmc.so.MAJOR` and `libhmc.so` links, `libhmc.a`
/// when `with_static`, `include/hmc/`, `lib/pkgconfig/hmc.pc`, `lib/cmake/hmc/`.
fn install_from(built: &Path, prefix: &Path, with_static: bool) -> Result {
    let lib = prefix.join("lib");
    let io = |what: &str, e: std::io::Error| format!("{what}: {e}");
    for d in ["lib/pkgconfig", "lib/cmake/hmc", "include/hmc"] {
        std::fs::create_dir_all(prefix.join(d)).map_err(|e| io(d, e))?;
    }
    let real = format!("libhmc.so.{VERSION}");
    copy(&built.join("libhmc.so"), &lib.join(&real))?;
    for (link, to) in [
        (format!("libhmc.so.{MAJOR}"), real.clone()),
        ("libhmc.so".to_string(), format!("libhmc.so.{MAJOR}")),
    ] {
        let at = lib.join(&link);
        let _ = std::fs::remove_file(&at);
        std::os::unix::fs::symlink(&to, &at).map_err(|e| io(&link, e))?;
    }
    if with_static {
        copy(&built.join("libhmc.a"), &lib.join("libhmc.a"))?;
    }
    copy_headers(prefix)?;
    let pc = lib.join("pkgconfig/hmc.pc");
    std::fs::write(&pc, fill_template("hmc.pc.in", prefix)?)
        .map_err(|e| format!("{}: {e}", pc.display()))?;
    cmake_package(&lib)
}

/// The CMake package into `lib/cmake/hmc` (which exists): `hmcConfig.cmake` finds its
/// prefix from its own place, so the same files serve an install and a wheel.
fn cmake_package(lib: &Path) -> Result {
    let dir = lib.join("cmake/hmc");
    let version = dir.join("hmcConfigVersion.cmake");
    // The version file names no path: any prefix fills it the same.
    std::fs::write(&version, fill_template("hmcConfigVersion.cmake.in", lib)?)
        .map_err(|e| format!("{}: {e}", version.display()))?;
    copy(
        &root().join("hmc-capi/cmake/hmcConfig.cmake"),
        &dir.join("hmcConfig.cmake"),
    )
}

/// `include/hmc/hmc.h` and `hmc.hpp` under `prefix` (whose `include/hmc` exists).
fn copy_headers(prefix: &Path) -> Result {
    for h in ["hmc.h", "hmc.hpp"] {
        copy(
            &root().join("hmc-capi/include/hmc").join(h),
            &prefix.join("include/hmc").join(h),
        )?;
    }
    Ok(())
}

/// The template `hmc-capi/cmake/<template>` with its `@...@` fields filled for `prefix`.
fn fill_template(template: &str, prefix: &Path) -> Result<String> {
    let path = root().join("hmc-capi/cmake").join(template);
    let t = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(t.replace("@PREFIX@", &prefix.display().to_string())
        .replace("@VERSION@", VERSION)
        .replace("@MAJOR@", MAJOR)
        .replace("@STATIC_LIBS@", STATIC_LIBS))
}

fn copy(from: &Path, to: &Path) -> Result {
    // Remove first: the old file may be a running program's mapped library.
    let _ = std::fs::remove_file(to);
    std::fs::copy(from, to)
        .map(drop)
        .map_err(|e| format!("copying {} to {}: {e}", from.display(), to.display()))
}

/// What a wheel holds as `lib/libhmc.so`, so that `-lhmc` finds the library: a linker
/// script naming `libhmc.so.0` beside it. A wheel cannot hold the usual symlink, and a copy
/// would carry the library twice; the program's `DT_NEEDED` is the SONAME either way.
const WHEEL_LINKER_SCRIPT: &str =
    "/* A GNU ld script: -lhmc links libhmc.so.0, the library beside it. */\nINPUT(libhmc.so.0)\n";

/// libhmc staged into `hmc-py/python/hmc/_capi` for the wheel maturin builds next (see
/// [`stage_for_wheel`]); the folder is removed when this is dropped, so the source tree never
/// keeps a copy that a later build (pip from source) would pack stale.
pub(crate) struct WheelStage {
    dir: PathBuf,
    // Held until the wheel is built: another xtask staging at the same time waits.
    _lock: std::fs::File,
}

impl Drop for WheelStage {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Builds libhmc (`--release` or the dev profile) and stages what the wheel carries into
/// `dir`: `include/hmc/`, `lib/libhmc.so.0`, `lib/libhmc.so` (a linker script),
/// `lib/pkgconfig/hmc.pc` (relocatable: its prefix is `${pcfiledir}/../..`, its `Libs`
/// carry an rpath to `lib/`), `lib/cmake/hmc/` (the CMake package, relocatable too).
pub(crate) fn stage_for_wheel(release: bool, dir: &Path) -> Result<WheelStage> {
    let mut build = cargo();
    build.args(["build", "-p", "hmc-capi", "--lib"]);
    if release {
        build.arg("--release");
    }
    run(&mut build)?;
    let io = |what: &Path, e: std::io::Error| format!("{}: {e}", what.display());
    let lock_path = root().join("target/py-wheels/.capi-stage.lock");
    if let Some(parent) = lock_path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
    }
    let lock = std::fs::File::create(&lock_path).map_err(|e| io(&lock_path, e))?;
    lock.lock().map_err(|e| io(&lock_path, e))?;
    let stage = WheelStage {
        dir: dir.to_path_buf(),
        _lock: lock,
    };
    let _ = std::fs::remove_dir_all(dir);
    for d in ["include/hmc", "lib/pkgconfig", "lib/cmake/hmc"] {
        std::fs::create_dir_all(dir.join(d)).map_err(|e| io(&dir.join(d), e))?;
    }
    copy_headers(dir)?;
    let profile = if release { "release" } else { "debug" };
    let lib = dir.join("lib");
    copy(
        &root().join("target").join(profile).join("libhmc.so"),
        &lib.join(format!("libhmc.so.{MAJOR}")),
    )?;
    let script = lib.join("libhmc.so");
    std::fs::write(&script, WHEEL_LINKER_SCRIPT).map_err(|e| io(&script, e))?;
    let pc = lib.join("pkgconfig/hmc.pc");
    std::fs::write(&pc, fill_template("hmc-wheel.pc.in", dir)?).map_err(|e| io(&pc, e))?;
    cmake_package(&lib)?;
    Ok(stage)
}

/// The C API of the wheel installed into `python`'s environment, as a `pip install` user
/// builds against it: the paths `hmc.get_include()`, `get_library_dir()` and
/// `get_pkgconfig_dir()` give (inside the installed package, holding the files), the
/// library's exports, then `one_sided.c` and `hixl_quickstart.cpp` (by gcc, and clang where
/// installed) compiled with warnings as errors from `pkg-config --cflags --libs hmc` alone
/// and run as two processes over tcp without `LD_LIBRARY_PATH` (the `.pc`'s rpath finds
/// the library); the examples built by CMake through `hmc.get_cmake_dir()`, one run so.
pub(crate) fn wheel_test(python: &Path) -> Result {
    let work = root().join("target/capi/wheel");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let out = Command::new(python)
        .current_dir(&work)
        .args([
            "-c",
            "import os, hmc\n\
             print(os.path.dirname(os.path.realpath(hmc.__file__)))\n\
             print(hmc.get_include()); print(hmc.get_library_dir())\n\
             print(hmc.get_pkgconfig_dir()); print(hmc.get_cmake_dir())",
        ])
        .output()
        .map_err(|e| format!("{}: {e}", python.display()))?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let paths: Vec<&Path> = text.lines().map(Path::new).collect();
    let [package, include, lib, pkgconfig, cmake] = paths[..] else {
        return Err(format!(
            "the installed wheel gave no C API paths: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    };
    for (dir, file) in [
        (include, "hmc/hmc.h"),
        (include, "hmc/hmc.hpp"),
        (lib, "libhmc.so.0"),
        (lib, "libhmc.so"),
        (pkgconfig, "hmc.pc"),
        (cmake, "hmcConfig.cmake"),
    ] {
        if !dir.starts_with(package) || !dir.join(file).is_file() {
            return Err(format!(
                "the wheel's {} is not a file inside the installed package {}",
                dir.join(file).display(),
                package.display()
            ));
        }
    }
    check_exports(&lib.join(format!("libhmc.so.{MAJOR}")))?;
    let flags = pkg_config_flags(pkgconfig)?;
    let programs = compilers()
        .into_iter()
        .flat_map(|(cc, cxx)| [(cc, "one_sided.c"), (cxx, "hixl_quickstart.cpp")]);
    for (compiler, example) in programs {
        let bin = work.join(compiler);
        std::fs::create_dir_all(&bin).map_err(|e| format!("{}: {e}", bin.display()))?;
        let src = root().join("hmc-capi/examples").join(example);
        run(compile_command(compiler, &src, &bin).args(&flags))?;
        let exe = bin.join(src.file_stem().unwrap_or_default());
        library_from(&exe, lib)?;
        let args: &[&str] = if example.ends_with(".cpp") {
            &["tcp", "host"]
        } else {
            &["tcp"]
        };
        let label = format!("tcp, built by {compiler} against the wheel");
        two_processes_in(&exe, args, &label, &|c| {
            c.env_remove("LD_LIBRARY_PATH");
        })?;
    }
    // CMake: find_package(hmc) through hmc_DIR; CMake's build-tree rpath finds the library.
    let build = work.join("cmake-build");
    cmake_examples(
        &build,
        &format!("-Dhmc_DIR={}", cmake.display()),
        &["one_sided"],
    )?;
    library_from(&build.join("one_sided"), lib)?;
    two_processes_in(&build.join("one_sided"), &["tcp"], "tcp, CMake", &|c| {
        c.env_remove("LD_LIBRARY_PATH");
    })
}

/// The examples' CMakeLists.txt configured with `define` (where `find_package(hmc)` looks)
/// and built into `build` (emptied first): `targets`, or all when empty.
fn cmake_examples(build: &Path, define: &str, targets: &[&str]) -> Result {
    let _ = std::fs::remove_dir_all(build);
    run(Command::new("cmake")
        .arg("-S")
        .arg(root().join("hmc-capi/examples"))
        .arg("-B")
        .arg(build)
        .arg(define)
        .arg("-DCMAKE_BUILD_TYPE=Debug"))?;
    let mut cmd = Command::new("cmake");
    cmd.arg("--build").arg(build);
    for t in targets {
        cmd.args(["--target", t]);
    }
    run(&mut cmd)
}

/// `ldd exe` without `LD_LIBRARY_PATH` resolves `libhmc.so.0` to the one in `lib` (through
/// the rpath, which may spell it `.../pkgconfig/../../lib`).
fn library_from(exe: &Path, lib: &Path) -> Result {
    let out = Command::new("ldd")
        .arg(exe)
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .map_err(|e| format!("ldd: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let name = format!("libhmc.so.{MAJOR}");
    let resolved = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix(&format!("{name} => ")))
        .filter_map(|rest| rest.split_whitespace().next())
        .find_map(|p| std::fs::canonicalize(p).ok());
    let expected = std::fs::canonicalize(lib.join(&name)).ok();
    if resolved.is_some() && resolved == expected {
        return Ok(());
    }
    Err(format!(
        "{} does not load {} through its rpath: ldd says\n{text}",
        exe.display(),
        lib.join(&name).display()
    ))
}

/// `pkg-config --cflags --libs hmc` with `PKG_CONFIG_PATH=dir`, split into arguments.
fn pkg_config_flags(dir: &Path) -> Result<Vec<String>> {
    let pc = Command::new("pkg-config")
        .args(["--cflags", "--libs", "hmc"])
        .env("PKG_CONFIG_PATH", dir)
        .output()
        .map_err(|e| format!("pkg-config: {e}"))?;
    if !pc.status.success() {
        return Err(format!(
            "pkg-config --cflags --libs hmc (PKG_CONFIG_PATH={}): {}",
            dir.display(),
            String::from_utf8_lossy(&pc.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&pc.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect())
}

/// The checks of `cargo xtask test`; see the module documentation.
pub fn test() -> Result {
    run(cargo().args(["build", "-p", "hmc-capi", "--lib"]))?;
    let work = root().join("target/capi");
    let prefix = work.join("prefix");
    // A clean prefix every time: the consumers must find everything in it.
    let _ = std::fs::remove_dir_all(&prefix);
    install_from(&root().join("target/debug"), &prefix, false)?;
    check_exports(&prefix.join(format!("lib/libhmc.so.{VERSION}")))?;
    headers_alone(&prefix, &work)?;
    let bin = work.join("bin");
    build_programs(&prefix, &bin)?;
    run_programs(&bin.join("gcc"), &work)?;
    // clang's builds of the one-process tests run too (the examples run from gcc's).
    if compilers().len() > 1 {
        single_process_tests(&bin.join("clang"))?;
    }
    sanitized(&prefix, &bin.join("sanitized"))?;
    readme_quick_start(&prefix, &work)?;
    consumers(&prefix, &work)
}

/// The (C, C++) compilers the C API is built with: gcc, and clang where installed.
fn compilers() -> Vec<(&'static str, &'static str)> {
    let mut compilers = vec![("gcc", "g++")];
    if on_path("clang") && on_path("clang++") {
        compilers.push(("clang", "clang++"));
    }
    compilers
}

/// Every example and C test, by gcc (and clang where installed), into `bin/<compiler>`.
fn build_programs(prefix: &Path, bin: &Path) -> Result {
    let compilers = compilers();
    if compilers.len() == 1 {
        eprintln!("xtask: clang is not installed; the C API is compiled with gcc only");
    }
    for (cc, cxx) in &compilers {
        let out = bin.join(cc);
        std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
        for (file, lang) in programs(&root().join("hmc-capi")) {
            let compiler = if lang == "c" { cc } else { cxx };
            compile(compiler, &file, prefix, &out, &[])?;
        }
    }
    Ok(())
}

/// The examples as two processes (tcp and shm; RPC over tcp and Unix sockets), the HIXL
/// port on CUDA memory of the driver shim, and the C tests.
fn run_programs(gcc: &Path, work: &Path) -> Result {
    for transport in ["tcp", "shm"] {
        for example in ["one_sided", "kv_pull", "kv_pull_cpp"] {
            two_processes(&gcc.join(example), &[transport], transport)?;
        }
        let hixl = gcc.join("hixl_quickstart");
        two_processes(&hixl, &[transport, "host"], transport)?;
        run_program(Command::new(gcc.join("threads")).arg(transport))?;
    }
    // Device memory from C++: the HIXL port with CUDA memory, against the CUDA driver ABI
    // shim (a GPU machine runs the same against the driver).
    let shim = cuda_shim(work)?;
    for transport in ["tcp", "shm"] {
        let label = format!("{transport}, CUDA memory (driver shim)");
        let hixl = gcc.join("hixl_quickstart");
        two_processes_in(&hixl, &[transport, "cuda"], &label, &|c| {
            c.env("LD_LIBRARY_PATH", &shim);
        })?;
    }
    // CUDA memory through every call that takes it: sync and async transfers, a KV cache.
    run_program(Command::new(gcc.join("device")).env("LD_LIBRARY_PATH", &shim))?;
    for socket in ["tcp", "unix"] {
        two_processes(&gcc.join("rpc_demo"), &[socket], socket)?;
    }
    two_processes(&gcc.join("rpc_demo_cpp"), &["tcp"], "tcp")?;
    single_process_tests(gcc)
}

/// The C and C++ tests that run in one process, from the programs in `dir`.
fn single_process_tests(dir: &Path) -> Result {
    for test in ["bad_input", "prepared", "cpp_layer"] {
        run_program(&mut Command::new(dir.join(test)))?;
    }
    Ok(())
}

/// The C tests again under AddressSanitizer and UndefinedBehaviorSanitizer (the C side
/// instrumented; libhmc is Rust).
fn sanitized(prefix: &Path, san: &Path) -> Result {
    std::fs::create_dir_all(san).map_err(|e| format!("{}: {e}", san.display()))?;
    let flags = [
        "-fsanitize=address,undefined",
        "-fno-omit-frame-pointer",
        "-g",
    ];
    for (name, compiler) in [
        ("bad_input.c", "gcc"),
        ("threads.c", "gcc"),
        ("prepared.c", "gcc"),
        ("cpp_layer.cpp", "g++"),
    ] {
        let file = root().join("hmc-capi/tests").join(name);
        compile(compiler, &file, prefix, san, &flags)?;
        let name = name.split('.').next().unwrap_or(name);
        run_program(
            Command::new(san.join(name))
                .env("UBSAN_OPTIONS", "halt_on_error=1:print_stacktrace=1")
                .env("ASAN_OPTIONS", "abort_on_error=0:detect_leaks=1"),
        )?;
    }
    Ok(())
}

/// The README's C quick start (the `c` block of its "C and C++" section), compiled with
/// warnings as errors and run: it prints what it wrote through the engine.
fn readme_quick_start(prefix: &Path, work: &Path) -> Result {
    let readme =
        std::fs::read_to_string(root().join("README.md")).map_err(|e| format!("README.md: {e}"))?;
    let code = readme
        .split_once("## C and C++\n")
        .and_then(|(_, rest)| rest.split_once("```c\n"))
        .and_then(|(_, rest)| rest.split_once("```\n"))
        .map(|(code, _)| code)
        .ok_or("README.md has no ```c block in a \"## C and C++\" section")?;
    let src = work.join("readme_quick_start.c");
    std::fs::write(&src, code).map_err(|e| format!("{}: {e}", src.display()))?;
    compile("gcc", &src, prefix, work, &[])?;
    let out = Command::new(work.join("readme_quick_start"))
        .output()
        .map_err(|e| format!("the README's quick start: {e}"))?;
    let printed = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || printed.trim() != "hello from C" {
        return Err(format!(
            "the README's C quick start exited {} printing `{printed}` ({})",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    eprintln!("xtask: the README's C quick start printed `hello from C`");
    Ok(())
}

/// Builds the project's CUDA driver ABI shim (`hmc-backend-cuda/tests/shim`) as
/// `libcuda.so` with a `libcuda.so.1` link (one library, whichever name is opened: the
/// example's allocations and the engine's CUDA backend share its allocation table); returns
/// its folder.
fn cuda_shim(work: &Path) -> Result<PathBuf> {
    let dir = work.join("cuda-shim");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    run(Command::new("gcc")
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-pthread"])
        .arg(format!("-I{}", root().join("hmc-testshim/shim").display()))
        .arg(root().join("hmc-backend-cuda/tests/shim/cuda_shim.c"))
        .arg("-o")
        .arg(dir.join("libcuda.so")))?;
    let link = dir.join("libcuda.so.1");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink("libcuda.so", &link)
        .map_err(|e| format!("{}: {e}", link.display()))?;
    Ok(dir)
}

/// The C and C++ programs of the crate: examples and C tests, with their language.
fn programs(src: &Path) -> Vec<(PathBuf, &'static str)> {
    let mut out = Vec::new();
    for dir in ["examples", "tests"] {
        let Ok(entries) = std::fs::read_dir(src.join(dir)) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        files.sort();
        for f in files {
            match f.extension().and_then(|e| e.to_str()) {
                Some("c") => out.push((f, "c")),
                Some("cpp") => out.push((f, "c++")),
                _ => {}
            }
        }
    }
    out
}

/// Compiles one program against the installed prefix, warnings as errors.
fn compile(compiler: &str, file: &Path, prefix: &Path, out: &Path, extra: &[&str]) -> Result {
    run(compile_command(compiler, file, out)
        .args(extra)
        .arg(format!("-I{}", prefix.join("include").display()))
        .arg(format!("-L{}", prefix.join("lib").display()))
        .args(["-lhmc", "-pthread", "-ldl"])
        .arg(format!("-Wl,-rpath,{}", prefix.join("lib").display())))
}

/// `compiler` on `file` into `out/<its stem>` with the language standard and warnings as
/// errors; the caller adds the include and library flags (after the source, as `-l` needs).
fn compile_command(compiler: &str, file: &Path, out: &Path) -> Command {
    let name = file
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("program");
    let std = if compiler.ends_with("++") {
        "-std=c++17"
    } else {
        "-std=c11"
    };
    let mut cmd = Command::new(compiler);
    cmd.args([
        std,
        "-Wall",
        "-Wextra",
        "-Werror",
        "-D_POSIX_C_SOURCE=200809L",
    ])
    .arg(file)
    .arg("-o")
    .arg(out.join(name));
    cmd
}

/// `nm -D`: the library defines only `hmc_*` symbols; and its SONAME is `libhmc.so.MAJOR`.
fn check_exports(lib: &Path) -> Result {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(lib)
        .output()
        .map_err(|e| format!("nm: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    let foreign: Vec<&&str> = names.iter().filter(|n| !n.starts_with("hmc_")).collect();
    if !out.status.success() || names.is_empty() || !foreign.is_empty() {
        return Err(format!(
            "{} exports symbols other than hmc_* (or none): {foreign:?}",
            lib.display()
        ));
    }
    let dynamic = Command::new("readelf")
        .arg("-d")
        .arg(lib)
        .output()
        .map_err(|e| format!("readelf: {e}"))?;
    let soname = format!("[libhmc.so.{MAJOR}]");
    if !String::from_utf8_lossy(&dynamic.stdout).contains(&soname) {
        return Err(format!("{} has no SONAME {soname}", lib.display()));
    }
    eprintln!(
        "xtask: libhmc exports {} symbols, all hmc_*; SONAME {soname}",
        names.len()
    );
    Ok(())
}

/// Each header compiled alone (a file that includes only it, as a user's does): `hmc.h` as
/// C11 and as C++17, `hmc.hpp` as C++17 with either libstdc++ string ABI; by each compiler.
fn headers_alone(prefix: &Path, work: &Path) -> Result {
    let dir = work.join("headers-alone");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut files = Vec::new();
    for (name, text) in [
        ("hmc_h.c", "#include <hmc/hmc.h>\n"),
        ("hmc_h.cpp", "#include <hmc/hmc.h>\n"),
        ("hmc_hpp.cpp", "#include <hmc/hmc.hpp>\n"),
    ] {
        let f = dir.join(name);
        std::fs::write(&f, text).map_err(|e| format!("{}: {e}", f.display()))?;
        files.push(f);
    }
    let strict = ["-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only"];
    let i = format!("-I{}", prefix.join("include").display());
    for (cc, cxx) in compilers() {
        run(Command::new(cc)
            .arg("-std=c11")
            .args(strict)
            .arg(&i)
            .arg(&files[0]))?;
        run(Command::new(cxx)
            .arg("-std=c++17")
            .args(strict)
            .arg(&i)
            .arg(&files[1]))?;
        for abi in ["0", "1"] {
            run(Command::new(cxx)
                .arg("-std=c++17")
                .args(strict)
                .arg(format!("-D_GLIBCXX_USE_CXX11_ABI={abi}"))
                .arg(&i)
                .arg(&files[2]))?;
        }
    }
    Ok(())
}

/// A CMake consumer (`find_package(hmc CONFIG REQUIRED)`, the examples' CMakeLists.txt)
/// and a pkg-config consumer, built from the clean prefix and run once.
fn consumers(prefix: &Path, work: &Path) -> Result {
    let build = work.join("cmake-build");
    cmake_examples(
        &build,
        &format!("-DCMAKE_PREFIX_PATH={}", prefix.display()),
        &[],
    )?;
    two_processes(&build.join("one_sided"), &["tcp"], "tcp")?;
    two_processes(&build.join("hixl_quickstart"), &["tcp", "host"], "tcp")?;
    two_processes(&build.join("rpc_demo"), &["tcp"], "tcp")?;
    two_processes(&build.join("kv_pull"), &["tcp"], "tcp")?;

    let flags = pkg_config_flags(&prefix.join("lib/pkgconfig"))?;
    let out = work.join("pkg-config-build");
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let src = root().join("hmc-capi/examples/one_sided.c");
    run(compile_command("gcc", &src, &out)
        .args(&flags)
        .arg(format!("-Wl,-rpath,{}", prefix.join("lib").display())))?;
    two_processes(&out.join("one_sided"), &["tcp"], "tcp")
}

/// Runs `cmd` to its end within [`PROGRAM_TIMEOUT`]; fails on a non-zero exit.
fn run_program(cmd: &mut Command) -> Result {
    eprintln!("xtask: running {cmd:?}");
    let child = cmd
        .spawn()
        .map_err(|e| format!("could not start {cmd:?}: {e}"))?;
    wait(child, &format!("{cmd:?}"))
}

fn wait(mut child: Child, what: &str) -> Result {
    let start = Instant::now();
    loop {
        match child.try_wait().map_err(|e| format!("{what}: {e}"))? {
            Some(s) if s.success() => return Ok(()),
            Some(s) => return Err(format!("{what} failed with {s}")),
            None if start.elapsed() > PROGRAM_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{what} did not end within {PROGRAM_TIMEOUT:?}"));
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// A two-process example: `exe server ARGS...` prints `READY <fields>` on its first line,
/// then `exe client ARGS... <fields>` runs against it; both must exit 0.
fn two_processes(exe: &Path, args: &[&str], label: &str) -> Result {
    two_processes_in(exe, args, label, &|_| {})
}

/// [`two_processes`] with `env` applied to both commands (variables set or removed).
fn two_processes_in(exe: &Path, args: &[&str], label: &str, env: &dyn Fn(&mut Command)) -> Result {
    eprintln!("xtask: {} server/client over {label}", exe.display());
    let mut server = Command::new(exe);
    env(&mut server);
    let mut server = server
        .arg("server")
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("could not start {}: {e}", exe.display()))?;
    let mut lines = BufReader::new(server.stdout.take().ok_or("no server stdout")?).lines();
    let ready = match lines.next() {
        Some(Ok(l)) if l.starts_with("READY ") => l,
        other => {
            let _ = server.kill();
            let _ = server.wait();
            return Err(format!(
                "{} server did not say READY: {other:?}",
                exe.display()
            ));
        }
    };
    // The rest of the server's output goes to ours.
    std::thread::spawn(move || {
        for l in lines.map_while(std::result::Result::ok) {
            println!("{l}");
        }
    });
    let mut client = Command::new(exe);
    env(&mut client);
    let client = client
        .arg("client")
        .args(args)
        .args(ready.split_whitespace().skip(1))
        .spawn()
        .map_err(|e| format!("could not start {}: {e}", exe.display()))?;
    let client_result = wait(client, &format!("{} client ({label})", exe.display()));
    if client_result.is_err() {
        let _ = server.kill();
    }
    let server_result = wait(server, &format!("{} server ({label})", exe.display()));
    client_result.and(server_result)
}
