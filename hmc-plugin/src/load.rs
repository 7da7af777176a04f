//! Finding and loading plugins: the search path (`HMC_PLUGIN_PATH`, then `PluginConfig::search_path`), `dlopen(RTLD_NOW | RTLD_LOCAL)`, the version handshake and the table checks, and the report of what was found, loaded and refused.

use std::ffi::{CStr, c_char};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use hmc_core::{Error, TransportId};

use crate::abi::*;
use crate::error::{PluginError, status_error};

/// Where to look for plugins.
#[derive(Clone, Debug, Default)]
pub struct PluginConfig {
    /// Files or folders searched after `HMC_PLUGIN_PATH`'s, in order. A folder contributes
    /// its `*.so` files in name order.
    pub search_path: Vec<PathBuf>,
}

impl PluginConfig {
    /// The environment variable whose `:`-separated entries are searched first.
    pub const ENV: &'static str = "HMC_PLUGIN_PATH";

    /// The full search path: `HMC_PLUGIN_PATH`'s entries, then [`PluginConfig::search_path`].
    pub fn resolved_path(&self) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = std::env::var_os(Self::ENV)
            .map(|v| {
                std::env::split_paths(&v)
                    .filter(|p| !p.as_os_str().is_empty())
                    .collect()
            })
            .unwrap_or_default();
        out.extend(self.search_path.iter().cloned());
        out
    }
}

/// A loaded plugin. Its library stays mapped for the life of the process (plugins are
/// never unloaded: a thread or destructor of theirs may still run).
pub struct Plugin {
    name: String,
    path: PathBuf,
    pub(crate) api: HmcPluginApi,
    abi: (u32, u32),
    transport: TransportId,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("name", &self.name)
            .field("path", &self.path)
            .field("abi", &self.abi)
            .field("transport", &self.transport)
            .finish()
    }
}

// SAFETY: the table holds function pointers and a pointer to a static name; the ABI
// requires every function to be callable from any thread.
unsafe impl Send for Plugin {}
// SAFETY: as above; the table is never written after loading.
unsafe impl Sync for Plugin {}

/// The shape of the table's `*_open` functions: `config` (`len` bytes) in, a handle out.
pub(crate) type OpenFn<T> =
    unsafe extern "C" fn(config: *const u8, len: usize, out: *mut *mut T) -> i32;

/// The host's table, handed to every plugin.
static HOST_API: HostApi = HostApi(HmcHostApi {
    header: HmcTableHeader {
        struct_size: std::mem::size_of::<HmcHostApi>(),
        abi_major: HMC_PLUGIN_ABI_MAJOR,
        abi_minor: HMC_PLUGIN_ABI_MINOR,
        name: c"hmc".as_ptr(),
        capabilities: 0,
    },
    log: Some(host_log),
});

struct HostApi(HmcHostApi);
// SAFETY: the table is immutable; its name points to a static C string.
unsafe impl Sync for HostApi {}

/// The host's log callback: a plugin's log lines go to `tracing` under target
/// `hmc_plugin::plugin`.
unsafe extern "C" fn host_log(level: u32, msg: *const u8, len: usize) {
    let _ = std::panic::catch_unwind(|| {
        if msg.is_null() {
            return;
        }
        // SAFETY: the ABI says `msg` points to `len` readable bytes for this call.
        let bytes = unsafe { std::slice::from_raw_parts(msg, len) };
        let text = String::from_utf8_lossy(bytes);
        match level {
            HMC_LOG_ERROR => tracing::error!(target: "hmc_plugin::plugin", "{text}"),
            HMC_LOG_WARN => tracing::warn!(target: "hmc_plugin::plugin", "{text}"),
            HMC_LOG_INFO => tracing::info!(target: "hmc_plugin::plugin", "{text}"),
            _ => tracing::debug!(target: "hmc_plugin::plugin", "{text}"),
        }
    });
}

/// The functions ABI 1.0 requires of what the plugin says it provides, by name, for the
/// refusal message.
fn missing_functions(api: &HmcPluginApi) -> Vec<&'static str> {
    let provides = api.header.capabilities;
    let mut required = vec![("last_error", api.last_error.is_some())];
    if provides & HMC_PLUGIN_PROVIDES_COMMUNICATOR != 0 {
        required.extend([
            ("comm_open", api.comm_open.is_some()),
            ("comm_close", api.comm_close.is_some()),
            ("comm_destroy", api.comm_destroy.is_some()),
            ("comm_event_fd", api.comm_event_fd.is_some()),
            ("comm_address", api.comm_address.is_some()),
            ("comm_capabilities", api.comm_capabilities.is_some()),
            ("connect", api.connect.is_some()),
            ("endpoint_release", api.endpoint_release.is_some()),
            ("register_mem", api.register_mem.is_some()),
            ("deregister", api.deregister.is_some()),
            ("export_key", api.export_key.is_some()),
            ("import", api.import.is_some()),
            ("remote_key_release", api.remote_key_release.is_some()),
            ("transfer_start", api.transfer_start.is_some()),
            ("transfer_poll", api.transfer_poll.is_some()),
            ("transfer_release", api.transfer_release.is_some()),
            ("notify", api.notify.is_some()),
            ("recv_notification", api.recv_notification.is_some()),
        ]);
    }
    if provides & HMC_PLUGIN_PROVIDES_MEMORY != 0 {
        required.extend([
            ("memory_open", api.memory_open.is_some()),
            ("memory_destroy", api.memory_destroy.is_some()),
            ("memory_info", api.memory_info.is_some()),
            ("memory_alloc", api.memory_alloc.is_some()),
            ("memory_free", api.memory_free.is_some()),
            ("memory_copy", api.memory_copy.is_some()),
        ]);
    }
    required
        .iter()
        .filter(|(_, present)| !present)
        .map(|(n, _)| *n)
        .collect()
}

/// `hmc_plugin_init`'s answer `code`: a plugin of another major (by its code, or by the
/// header it filled), or one that failed, is refused with its own message.
fn check_init(path: &Path, api: &HmcPluginApi, code: i32) -> Result<(), PluginError> {
    let header_size = std::mem::size_of::<HmcTableHeader>();
    let filled = api.header.struct_size;
    if code == HMC_ERR_VERSION
        || (filled >= header_size && api.header.abi_major != HMC_PLUGIN_ABI_MAJOR)
    {
        return Err(PluginError::Version {
            path: path.to_path_buf(),
            plugin_major: api.header.abi_major,
            plugin_minor: api.header.abi_minor,
            host_major: HMC_PLUGIN_ABI_MAJOR,
            host_minor: HMC_PLUGIN_ABI_MINOR,
        });
    }
    if code != HMC_OK {
        let message = last_error(api).unwrap_or_else(|| {
            if api.last_error.is_none() {
                "(its message is lost: it failed before setting out->last_error; set that \
                 first in hmc_plugin_init)"
                    .into()
            } else {
                "(the plugin set no last-error message; it must, with every error)".into()
            }
        });
        return Err(PluginError::Init {
            path: path.to_path_buf(),
            code,
            message,
        });
    }
    Ok(())
}

/// The bytes of the table the plugin says it filled, between ABI 1.0's size and the
/// host's; otherwise the problem with it.
fn filled_size(api: &HmcPluginApi) -> Result<usize, String> {
    let filled = api.header.struct_size;
    if filled == 0 {
        return Err(
            "hmc_plugin_init returned HMC_OK but filled nothing (struct_size 0); fill the \
             table and set header.struct_size to the bytes filled"
                .into(),
        );
    }
    if filled > std::mem::size_of::<HmcPluginApi>() {
        return Err(format!(
            "header.struct_size is {filled} bytes, more than the {} the host offered; \
             fill at most out_size bytes and say how many",
            std::mem::size_of::<HmcPluginApi>()
        ));
    }
    if filled < HMC_PLUGIN_API_V1_0_SIZE {
        return Err(format!(
            "header.struct_size is {filled} bytes, ABI 1.0 needs at least \
             {HMC_PLUGIN_API_V1_0_SIZE} (through recv_notification); build against \
             hmc_plugin.h and set struct_size = sizeof(HmcPluginApi)"
        ));
    }
    Ok(filled)
}

/// Why a plugin's name is refused.
enum NameProblem {
    /// The header's name is missing or malformed.
    Table(String),
    /// The name of a built-in transport.
    Reserved(String),
}

/// The plugin's name from its header: present, UTF-8, usable as `--data-plane NAME`, and
/// none of the built-ins'.
fn plugin_name(api: &HmcPluginApi) -> Result<String, NameProblem> {
    if api.header.name.is_null() {
        return Err(NameProblem::Table(
            "header.name is NULL; every plugin has a name".into(),
        ));
    }
    // SAFETY: the ABI says `name` is a NUL-terminated string that lives forever.
    let name = unsafe { CStr::from_ptr(api.header.name) }
        .to_str()
        .map_err(|_| NameProblem::Table("header.name is not UTF-8".into()))?
        .to_string();
    if name.is_empty() || name.contains(|c: char| c.is_whitespace() || c == ':') {
        return Err(NameProblem::Table(format!(
            "name `{name}` must be non-empty, without spaces or `:` (it is used as \
             --data-plane NAME)"
        )));
    }
    if RESERVED_NAMES.contains(&name.as_str()) {
        return Err(NameProblem::Reserved(name));
    }
    Ok(name)
}

/// What the table provides: at least one of a communicator and memory, every function
/// ABI 1.0 requires of it, and (for a communicator) a transport wire number; the number
/// it names, else the problem.
fn provided_transport(api: &HmcPluginApi) -> Result<TransportId, String> {
    let known = HMC_PLUGIN_PROVIDES_COMMUNICATOR | HMC_PLUGIN_PROVIDES_MEMORY;
    if api.header.capabilities & known == 0 {
        return Err(format!(
            "header.capabilities is {:#x}: it provides neither a communicator \
             (HMC_PLUGIN_PROVIDES_COMMUNICATOR) nor memory (HMC_PLUGIN_PROVIDES_MEMORY)",
            api.header.capabilities
        ));
    }
    let missing = missing_functions(api);
    if !missing.is_empty() {
        return Err(format!(
            "required functions are NULL: {}; ABI 1.0 requires every function of what \
             header.capabilities provides, but rekey",
            missing.join(", ")
        ));
    }
    let communicates = api.header.capabilities & HMC_PLUGIN_PROVIDES_COMMUNICATOR != 0;
    u8::try_from(api.transport_id)
        .ok()
        .filter(|id| *id != 0 || !communicates)
        .map(TransportId::from_wire_id)
        .ok_or_else(|| {
            format!(
                "transport_id {} is not a wire number 1..=255 (third parties: 128..=255)",
                api.transport_id
            )
        })
}

impl Plugin {
    /// Loads the plugin at `path`: `dlopen(RTLD_NOW | RTLD_LOCAL)`, `hmc_plugin_init` with
    /// this host's ABI version, and the checks of the table it filled. Each file is loaded
    /// once per process; loading it again returns the same plugin.
    pub fn load(path: &Path) -> Result<Arc<Plugin>, PluginError> {
        load_cached(path)
    }

    fn load_uncached(path: &Path) -> Result<Arc<Plugin>, PluginError> {
        let path = path.to_path_buf();
        // Before anything of the file runs: its initialisers run at dlopen.
        check_permissions(&path)?;
        // SAFETY: loading a library runs its initialisers; loading a plugin is exactly the
        // trust the caller extends by putting it on the search path.
        let lib = unsafe {
            libloading::os::unix::Library::open(
                Some(&path),
                libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_LOCAL,
            )
        }
        .map_err(|e| PluginError::Open {
            path: path.clone(),
            reason: with_sources(&e),
        })?;
        // Never unloaded: a plugin's threads, or destructors it registered, may still run
        // after the last handle is gone.
        let lib: &'static libloading::os::unix::Library = Box::leak(Box::new(lib));
        // SAFETY: the symbol has the signature include/hmc_plugin.h declares for it.
        let init = unsafe { lib.get::<HmcPluginInitFn>(b"hmc_plugin_init\0") }
            .map_err(|_| PluginError::NoEntry { path: path.clone() })?;
        // SAFETY: an all-zero table is valid (null pointers, `None` functions).
        let mut api: HmcPluginApi = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<HmcPluginApi>();
        // SAFETY: `api` is a writable table of `size` bytes and HOST_API lives forever.
        let code = unsafe {
            init(
                HMC_PLUGIN_ABI_MAJOR,
                HMC_PLUGIN_ABI_MINOR,
                &HOST_API.0,
                &mut api,
                size,
            )
        };
        Self::check(path, api, code)
    }

    /// The checks of the table `hmc_plugin_init` filled (answering `code`), in order: its
    /// version and status, how much it filled, its name, and what it provides.
    fn check(path: PathBuf, mut api: HmcPluginApi, code: i32) -> Result<Arc<Plugin>, PluginError> {
        check_init(&path, &api, code)?;
        let table = |problem: String| PluginError::Table {
            path: path.clone(),
            problem,
        };
        let filled = filled_size(&api).map_err(table)?;
        // Fields past what the plugin filled are absent, whatever the memory holds.
        zero_tail(&mut api, filled);
        if api.header.abi_minor < 3 {
            // A field of ABI 1.3: a plugin that declares an older minor did not promise
            // what it means, whatever it wrote there.
            api.endpoint_settle = None;
        }
        let name = match plugin_name(&api) {
            Ok(name) => name,
            Err(NameProblem::Table(problem)) => return Err(table(problem)),
            Err(NameProblem::Reserved(name)) => {
                return Err(PluginError::Reserved {
                    path,
                    name,
                    builtins: RESERVED_NAMES.join(", "),
                });
            }
        };
        let transport = provided_transport(&api).map_err(table)?;
        Ok(Arc::new(Plugin {
            name,
            path,
            abi: (api.header.abi_major, api.header.abi_minor),
            transport,
            api,
        }))
    }

    /// The plugin's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The file it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The ABI version it was built for.
    pub fn abi(&self) -> (u32, u32) {
        self.abi
    }

    /// The transport wire number its descriptors carry.
    pub fn transport(&self) -> TransportId {
        self.transport
    }

    /// True when it provides a communicator.
    pub fn provides_communicator(&self) -> bool {
        self.api.header.capabilities & HMC_PLUGIN_PROVIDES_COMMUNICATOR != 0
    }

    /// True when it provides a device memory backend.
    pub fn provides_memory(&self) -> bool {
        self.api.header.capabilities & HMC_PLUGIN_PROVIDES_MEMORY != 0
    }

    /// The calling thread's last error in this plugin, if it set one.
    pub(crate) fn last_error(&self) -> Option<String> {
        last_error(&self.api)
    }

    /// Calls `open`, this plugin's `function` (`comm_open`, `memory_open`), with `config`
    /// (`key=value` lines): the handle it made, or its error. `HMC_OK` without a handle
    /// is the plugin's internal error.
    pub(crate) fn open_handle<T>(
        &self,
        function: &'static str,
        open: OpenFn<T>,
        config: &str,
    ) -> Result<*mut T, Error> {
        let mut handle: *mut T = std::ptr::null_mut();
        // SAFETY: `config` is readable for its length during the call; `handle` is written.
        let code = unsafe { open(config.as_ptr(), config.len(), &mut handle) };
        if code != HMC_OK || handle.is_null() {
            let code = if code == HMC_OK {
                HMC_ERR_INTERNAL
            } else {
                code
            };
            return Err(self.call_error(function, code, Instant::now()));
        }
        Ok(handle)
    }

    /// The error for status `code` of `function`, a call into this plugin begun at
    /// `started`, with the calling thread's last-error message (call right after the
    /// failing call, on its thread).
    pub(crate) fn call_error(&self, function: &'static str, code: i32, started: Instant) -> Error {
        status_error(
            self.name(),
            self.transport(),
            function,
            code,
            self.last_error(),
            started,
        )
    }
}

fn last_error(api: &HmcPluginApi) -> Option<String> {
    let f = api.last_error?;
    // SAFETY: ABI: returns NULL or a NUL-terminated string valid until the next call
    // into the plugin on this thread; it is copied at once.
    let p: *const c_char = unsafe { f() };
    if p.is_null() {
        return None;
    }
    // SAFETY: as above.
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    (!s.is_empty()).then_some(s)
}

/// An error and its sources: libloading's `dlopen failed` carries dlerror()'s text (the
/// missing library, the undefined symbol) as its source.
fn with_sources(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        source = s.source();
    }
    text
}

/// Zeroes every byte of `api` at or past `filled`.
fn zero_tail(api: &mut HmcPluginApi, filled: usize) {
    let size = std::mem::size_of::<HmcPluginApi>();
    if filled >= size {
        return;
    }
    // SAFETY: `filled < size`, so the range lies inside `api`; all-zero bytes are a valid
    // value for every field (null pointers, `None` function pointers, zero integers).
    unsafe {
        std::ptr::write_bytes(
            (api as *mut HmcPluginApi as *mut u8).add(filled),
            0,
            size - filled,
        )
    };
}

/// Names of the project's own transports and choices, which no plugin may take (a
/// plugin of such a name would be unreachable, or would shadow what users asked for).
pub const RESERVED_NAMES: &[&str] = &["tcp", "ucx", "shm", "rdma", "auto", "none"];

/// OpenSSH's StrictModes rule, for a plugin file and the folder it is in (symbolic links
/// followed): neither may be writable by group or others, and each must be owned by root
/// or by this process's user.
fn check_permissions(path: &Path) -> Result<(), PluginError> {
    use std::os::unix::fs::MetadataExt;
    let unsafe_file = |reason: String| PluginError::Unsafe {
        path: path.to_path_buf(),
        reason,
    };
    let real = path
        .canonicalize()
        .map_err(|e| unsafe_file(format!("cannot resolve it: {e}")))?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    let folder = real.parent().unwrap_or(Path::new("/")).to_path_buf();
    for (what, p) in [("the file", &real), ("its folder", &folder)] {
        let m = std::fs::metadata(p)
            .map_err(|e| unsafe_file(format!("cannot stat {what} {}: {e}", p.display())))?;
        let mode = m.mode();
        if mode & 0o022 != 0 {
            return Err(unsafe_file(format!(
                "{what} {} is writable by {} (mode {:o})",
                p.display(),
                if mode & 0o002 != 0 {
                    "others"
                } else {
                    "its group"
                },
                mode & 0o7777
            )));
        }
        if m.uid() != 0 && m.uid() != me {
            return Err(unsafe_file(format!(
                "{what} {} is owned by uid {}, neither root nor this process's uid {me}",
                p.display(),
                m.uid()
            )));
        }
    }
    Ok(())
}

/// What a search found: every candidate file, the plugins loaded, why each other candidate
/// was refused, and the plugins of folders not loaded yet.
///
/// A file named on the search path is loaded by the search (it was asked for by name). A
/// folder's plugins are not: each `lib<name>.so` or `<name>.so` in it is loaded only when
/// [`Discovery::load`] asks for that name, so a process that looks up one transport runs
/// no other plugin's code (nor crashes on a broken file beside it).
#[derive(Debug, Default)]
pub struct Discovery {
    /// Where it looked, in order (entries that do not exist included).
    pub searched: Vec<PathBuf>,
    /// Candidate files, in search order.
    pub found: Vec<PathBuf>,
    /// Plugins loaded, in search order.
    pub loaded: Vec<Arc<Plugin>>,
    /// Candidates refused, with the reason.
    pub rejected: Vec<PluginError>,
    /// Folder candidates not loaded yet: the name their file gives, and the file.
    pub unloaded: Vec<(String, PathBuf)>,
}

/// Whether a folder file's name stands for the plugin `name`: equal, with `-` and `_` taken
/// as one (cargo names the cdylib of crate `my-nic` `libmy_nic.so`).
fn file_stands_for(file_name: &str, name: &str) -> bool {
    file_name.len() == name.len()
        && file_name
            .bytes()
            .zip(name.bytes())
            .all(|(f, n)| f == n || (matches!(f, b'-' | b'_') && matches!(n, b'-' | b'_')))
}

/// The plugin name a folder's file stands for: `lib<name>.so` or `<name>.so` (a plugin
/// named with `-` may be in a file named with `_`, as cargo names cdylibs).
pub fn name_of_file(path: &Path) -> Option<String> {
    let stem = path.file_name()?.to_str()?.strip_suffix(".so")?;
    let name = stem.strip_prefix("lib").unwrap_or(stem);
    (!name.is_empty()).then(|| name.to_string())
}

impl Discovery {
    /// Searches `config`'s resolved path: loads each file it names, and notes each folder's
    /// `*.so` files by name for [`Discovery::load`]. Nothing here fails: each refusal is
    /// recorded with its reason.
    pub fn search(config: &PluginConfig) -> Discovery {
        let mut d = Discovery {
            searched: config.resolved_path(),
            ..Discovery::default()
        };
        for entry in d.searched.clone() {
            if entry.is_file() {
                d.found.push(entry.clone());
                d.admit(entry, None);
                continue;
            }
            for file in candidates(&entry) {
                d.found.push(file.clone());
                match name_of_file(&file) {
                    // The loader's file-mode and owner rule needs no load: a file it would
                    // refuse is listed as refused now, not as waiting.
                    Some(name) => match check_permissions(&file) {
                        Ok(()) => d.unloaded.push((name, file)),
                        Err(e) => d.rejected.push(e),
                    },
                    None => d.admit(file, None),
                }
            }
        }
        d
    }

    /// Loads `path`; `wanted` is the name its file promised, if it came from a folder.
    fn admit(&mut self, path: PathBuf, wanted: Option<&str>) {
        match load_cached(&path) {
            Ok(p) if wanted.is_some_and(|w| !file_stands_for(w, p.name())) => {
                self.rejected.push(PluginError::Misnamed {
                    path,
                    file_name: wanted.unwrap_or_default().to_string(),
                    name: p.name().to_string(),
                });
            }
            Ok(p) => match self.loaded.iter().find(|l| l.name() == p.name()) {
                Some(first) if Arc::ptr_eq(first, &p) => {}
                Some(first) => self.rejected.push(PluginError::Duplicate {
                    path,
                    name: p.name().to_string(),
                    first: first.path().to_path_buf(),
                }),
                None => {
                    tracing::debug!(name = p.name(), path = %p.path().display(), "transport plugin loaded");
                    self.loaded.push(p);
                }
            },
            Err(e) => {
                tracing::info!("transport plugin refused: {e}");
                self.rejected.push(e);
            }
        }
    }

    /// The plugin named `name`: loaded already, or loaded now from the first folder file
    /// named after it (`lib<name>.so`, `<name>.so`; `-` and `_` alike). Other folder files
    /// stay unloaded.
    pub fn load(&mut self, name: &str) -> Option<Arc<Plugin>> {
        while self.get(name).is_none() {
            let i = self
                .unloaded
                .iter()
                .position(|(n, _)| file_stands_for(n, name))?;
            let (wanted, path) = self.unloaded.remove(i);
            self.admit(path, Some(&wanted));
        }
        self.get(name).cloned()
    }

    /// Loads every folder candidate not loaded yet (a full check, as tests and listings
    /// that ask for one do).
    pub fn load_all(&mut self) {
        for (wanted, path) in std::mem::take(&mut self.unloaded) {
            self.admit(path, Some(&wanted));
        }
    }

    /// The loaded plugin named `name` (`-` and `_` alike, as in file names: a listing shows
    /// a folder file's name before the plugin is loaded).
    pub fn get(&self, name: &str) -> Option<&Arc<Plugin>> {
        self.loaded.iter().find(|p| file_stands_for(p.name(), name))
    }

    /// A human-readable report: where it looked, what loaded, what was refused and why,
    /// and what waits to be loaded by name.
    pub fn report(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(s, "plugin search path ({} first):", PluginConfig::ENV);
        if self.searched.is_empty() {
            let _ = writeln!(
                s,
                "  (empty: set {} to files or folders)",
                PluginConfig::ENV
            );
        }
        for p in &self.searched {
            let _ = writeln!(s, "  {}", p.display());
        }
        let _ = writeln!(s, "found {} candidate file(s)", self.found.len());
        for p in &self.loaded {
            let (major, minor) = p.abi();
            let provides = match (p.provides_communicator(), p.provides_memory()) {
                (true, true) => "communicator and memory",
                (true, false) => "communicator",
                _ => "memory",
            };
            let _ = writeln!(
                s,
                "loaded  {:<12} {} (ABI {major}.{minor}, {provides}, transport wire id {})",
                p.name(),
                p.path().display(),
                p.transport().wire_id()
            );
        }
        for (name, path) in &self.unloaded {
            let _ = writeln!(
                s,
                "waiting {name:<12} {} (loaded when `{name}` is asked for; hmc-plugin-kit \
                 checks it)",
                path.display()
            );
        }
        for e in &self.rejected {
            let _ = writeln!(s, "refused {e}");
        }
        s
    }
}

/// The plugin files in a folder of the search path, in name order.
fn candidates(entry: &Path) -> Vec<PathBuf> {
    let Ok(dir) = std::fs::read_dir(entry) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = dir
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "so"))
        .collect();
    files.sort();
    files
}

/// Loads each file once per process: a second search returns the same plugin (its
/// `hmc_plugin_init` is not run twice).
fn load_cached(path: &Path) -> Result<Arc<Plugin>, PluginError> {
    static LOADED: parking_lot::Mutex<Vec<(PathBuf, Arc<Plugin>)>> =
        parking_lot::Mutex::new(Vec::new());
    let key = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let mut loaded = LOADED.lock();
    if let Some((_, p)) = loaded.iter().find(|(k, _)| *k == key) {
        return Ok(p.clone());
    }
    let p = Plugin::load_uncached(path)?;
    loaded.push((key, p.clone()));
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rstest::rstest]
    #[case::same("loopmem", "loopmem", true)]
    #[case::cargo_cdylib_of_a_dashed_crate("my_nic", "my-nic", true)]
    #[case::dash_for_underscore("my-nic", "my_nic", true)]
    #[case::another_name("my_nicx", "my-nic", false)]
    #[case::letters_differ("my_nid", "my-nic", false)]
    #[case::underscore_is_not_a_letter("myanic", "my-nic", false)]
    fn a_file_stands_for_its_plugin_with_dash_and_underscore_alike(
        #[case] file: &str,
        #[case] plugin: &str,
        #[case] expected: bool,
    ) {
        assert_eq!(file_stands_for(file, plugin), expected);
    }

    #[test]
    fn a_folder_file_gives_its_plugin_name() {
        assert_eq!(
            name_of_file(Path::new("/p/libmy_nic.so")).as_deref(),
            Some("my_nic")
        );
        assert_eq!(
            name_of_file(Path::new("/p/rtcp.so")).as_deref(),
            Some("rtcp")
        );
        assert_eq!(name_of_file(Path::new("/p/lib.so")), None);
        assert_eq!(name_of_file(Path::new("/p/libx.so.1")), None);
    }
}
