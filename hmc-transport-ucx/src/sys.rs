//! The slice of the UCX 1.13 UCP C API this crate uses, declared once and bound at run time from `libucp.so.0`.
//!
//! Nothing here is linked at build time: [`Ucp::load`] opens the library with `libloading`,
//! resolves every function below, and checks the library's version. Struct layouts follow
//! `/usr/include/ucp/api/ucp.h` of UCX 1.13; `tests/layout.rs` compiles a C program against
//! the installed headers and compares every size and field offset with these declarations.
//! UCX reads struct fields only when their bit is set in `field_mask`, so a newer library
//! accepts these (shorter) structs unchanged.

#![allow(non_camel_case_types)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::path::{Path, PathBuf};

use hmc_core::{DeviceErrorKind, Error};

/// The library opened when `HMC_UCX_LIB` is not set.
pub const DEFAULT_LIB: &str = "libucp.so.0";
/// The environment variable naming another `libucp` (a newer or CUDA-enabled build).
pub const LIB_ENV: &str = "HMC_UCX_LIB";
/// The UCP API version these declarations follow (passed to `ucp_init_version`).
pub const API_MAJOR: c_uint = 1;
/// See [`API_MAJOR`].
pub const API_MINOR: c_uint = 13;
/// The oldest library accepted: the `*_nbx` API and active messages v2 are complete from 1.11.
pub const MIN_VERSION: (c_uint, c_uint) = (1, 11);

pub type ucs_status_t = i32;
pub type ucs_status_ptr_t = *mut c_void;
pub type ucp_context_h = *mut c_void;
pub type ucp_worker_h = *mut c_void;
pub type ucp_ep_h = *mut c_void;
pub type ucp_mem_h = *mut c_void;
pub type ucp_rkey_h = *mut c_void;
pub type ucp_config_t = c_void;
pub type ucp_address_t = c_void;

pub const UCS_OK: ucs_status_t = 0;
/// `UCS_ERR_NO_MEMORY` (ucs/type/status.h).
pub const UCS_ERR_NO_MEMORY: ucs_status_t = -4;
pub const UCS_INPROGRESS: ucs_status_t = 1;
pub const UCS_ERR_UNREACHABLE: ucs_status_t = -6;
pub const UCS_ERR_BUSY: ucs_status_t = -15;
pub const UCS_ERR_CANCELED: ucs_status_t = -16;
pub const UCS_ERR_LAST: isize = -100;

pub const UCP_PARAM_FIELD_FEATURES: u64 = 1 << 0;
pub const UCP_PARAM_FIELD_NAME: u64 = 1 << 8;
pub const UCP_FEATURE_RMA: u64 = 1 << 1;
pub const UCP_FEATURE_WAKEUP: u64 = 1 << 4;
pub const UCP_FEATURE_AM: u64 = 1 << 6;

pub const UCP_ATTR_FIELD_MEMORY_TYPES: u64 = 1 << 2;
/// `ucs_memory_type_t` values (bits of `ucp_context_attr_t::memory_types`); stable across
/// UCX versions (later ones append kinds).
pub const UCS_MEMORY_TYPE_HOST: u32 = 0;
pub const UCS_MEMORY_TYPE_CUDA: u32 = 1;
pub const UCS_MEMORY_TYPE_ROCM: u32 = 3;
pub const UCP_ENTITY_NAME_MAX: usize = 32;

pub const UCP_WORKER_PARAM_FIELD_THREAD_MODE: u64 = 1 << 0;
pub const UCP_WORKER_PARAM_FIELD_EVENTS: u64 = 1 << 2;
pub const UCS_THREAD_MODE_SINGLE: c_int = 0;
pub const UCP_WAKEUP_RMA: c_uint = 1 << 0;
pub const UCP_WAKEUP_TX: c_uint = 1 << 10;
pub const UCP_WAKEUP_RX: c_uint = 1 << 11;

pub const UCP_EP_PARAM_FIELD_REMOTE_ADDRESS: u64 = 1 << 0;
pub const UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE: u64 = 1 << 1;
pub const UCP_EP_PARAM_FIELD_ERR_HANDLER: u64 = 1 << 2;
pub const UCP_ERR_HANDLING_MODE_PEER: c_int = 1;
pub const UCP_EP_CLOSE_FLAG_FORCE: u32 = 1 << 0;

pub const UCP_MEM_MAP_PARAM_FIELD_ADDRESS: u64 = 1 << 0;
pub const UCP_MEM_MAP_PARAM_FIELD_LENGTH: u64 = 1 << 1;
pub const UCP_MEM_MAP_PARAM_FIELD_PROT: u64 = 1 << 3;
pub const UCP_MEM_MAP_PARAM_FIELD_FLAGS: u64 = 1 << 2;
pub const UCP_MEM_MAP_ALLOCATE: c_uint = 1 << 1;
pub const UCP_MEM_ATTR_FIELD_ADDRESS: u64 = 1 << 0;
pub const UCP_MEM_ATTR_FIELD_LENGTH: u64 = 1 << 1;
pub const UCP_MEM_MAP_PROT_LOCAL_READ: c_uint = 1 << 0;
pub const UCP_MEM_MAP_PROT_LOCAL_WRITE: c_uint = 1 << 1;
pub const UCP_MEM_MAP_PROT_REMOTE_READ: c_uint = 1 << 8;
pub const UCP_MEM_MAP_PROT_REMOTE_WRITE: c_uint = 1 << 9;

pub const UCP_OP_ATTR_FIELD_CALLBACK: u32 = 1 << 1;
pub const UCP_OP_ATTR_FIELD_USER_DATA: u32 = 1 << 2;
pub const UCP_OP_ATTR_FIELD_FLAGS: u32 = 1 << 4;
pub const UCP_AM_SEND_FLAG_REPLY: u32 = 1 << 0;
pub const UCP_AM_SEND_FLAG_EAGER: u32 = 1 << 1;

pub const UCP_AM_HANDLER_PARAM_FIELD_ID: u64 = 1 << 0;
pub const UCP_AM_HANDLER_PARAM_FIELD_FLAGS: u64 = 1 << 1;
pub const UCP_AM_HANDLER_PARAM_FIELD_CB: u64 = 1 << 2;
pub const UCP_AM_HANDLER_PARAM_FIELD_ARG: u64 = 1 << 3;
pub const UCP_AM_FLAG_WHOLE_MSG: u32 = 1 << 0;
pub const UCP_AM_RECV_ATTR_FIELD_REPLY_EP: u64 = 1 << 0;
pub const UCP_AM_RECV_ATTR_FLAG_RNDV: u64 = 1 << 17;

pub type ucp_send_nbx_callback_t = Option<
    unsafe extern "C" fn(request: *mut c_void, status: ucs_status_t, user_data: *mut c_void),
>;
pub type ucp_err_handler_cb_t =
    Option<unsafe extern "C" fn(arg: *mut c_void, ep: ucp_ep_h, status: ucs_status_t)>;
pub type ucp_am_recv_callback_t = Option<
    unsafe extern "C" fn(
        arg: *mut c_void,
        header: *const c_void,
        header_length: usize,
        data: *mut c_void,
        length: usize,
        param: *const ucp_am_recv_param_t,
    ) -> ucs_status_t,
>;

/// `ucp_params_t`.
#[repr(C)]
pub struct ucp_params_t {
    pub field_mask: u64,
    pub features: u64,
    pub request_size: usize,
    pub request_init: Option<unsafe extern "C" fn(*mut c_void)>,
    pub request_cleanup: Option<unsafe extern "C" fn(*mut c_void)>,
    pub tag_sender_mask: u64,
    pub mt_workers_shared: c_int,
    pub estimated_num_eps: usize,
    pub estimated_num_ppn: usize,
    pub name: *const c_char,
}

/// `ucs_cpu_set_t`: 1024 bits.
#[repr(C)]
pub struct ucs_cpu_set_t {
    pub ucs_bits: [libc::c_ulong; 1024 / (8 * std::mem::size_of::<libc::c_ulong>())],
}

/// `ucp_worker_params_t`.
#[repr(C)]
pub struct ucp_worker_params_t {
    pub field_mask: u64,
    pub thread_mode: c_int,
    pub cpu_mask: ucs_cpu_set_t,
    pub events: c_uint,
    pub user_data: *mut c_void,
    pub event_fd: c_int,
    pub flags: u64,
    pub name: *const c_char,
    pub am_alignment: usize,
    pub client_id: u64,
}

/// `ucp_err_handler_t`.
#[repr(C)]
pub struct ucp_err_handler_t {
    pub cb: ucp_err_handler_cb_t,
    pub arg: *mut c_void,
}

/// `ucs_sock_addr_t`.
#[repr(C)]
pub struct ucs_sock_addr_t {
    pub addr: *const libc::sockaddr,
    pub addrlen: libc::socklen_t,
}

/// `ucp_ep_params_t`.
#[repr(C)]
pub struct ucp_ep_params_t {
    pub field_mask: u64,
    pub address: *const ucp_address_t,
    pub err_mode: c_int,
    pub err_handler: ucp_err_handler_t,
    pub user_data: *mut c_void,
    pub flags: c_uint,
    pub sockaddr: ucs_sock_addr_t,
    pub conn_request: *mut c_void,
    pub name: *const c_char,
    pub local_sockaddr: ucs_sock_addr_t,
}

/// `ucp_mem_map_params_t`.
#[repr(C)]
pub struct ucp_mem_map_params_t {
    pub field_mask: u64,
    pub address: *mut c_void,
    pub length: usize,
    pub flags: c_uint,
    pub prot: c_uint,
    pub memory_type: c_int,
}

/// `ucp_context_attr_t` (a newer UCX may append fields; it writes only those flagged).
#[repr(C)]
pub struct ucp_context_attr_t {
    pub field_mask: u64,
    pub request_size: usize,
    pub thread_mode: c_int,
    pub memory_types: u64,
    pub name: [c_char; UCP_ENTITY_NAME_MAX],
}

/// `ucp_mem_attr_t`.
#[repr(C)]
pub struct ucp_mem_attr_t {
    pub field_mask: u64,
    pub address: *mut c_void,
    pub length: usize,
    pub mem_type: c_int,
}

/// `ucp_request_param_t` (the `cb` and `recv_info` unions are declared as their one
/// pointer-sized member this crate uses).
#[repr(C)]
pub struct ucp_request_param_t {
    pub op_attr_mask: u32,
    pub flags: u32,
    pub request: *mut c_void,
    pub cb: ucp_send_nbx_callback_t,
    pub datatype: u64,
    pub user_data: *mut c_void,
    pub reply_buffer: *mut c_void,
    pub memory_type: c_int,
    pub recv_info: *mut c_void,
    pub memh: ucp_mem_h,
}

/// `ucp_am_handler_param_t`.
#[repr(C)]
pub struct ucp_am_handler_param_t {
    pub field_mask: u64,
    pub id: c_uint,
    pub flags: u32,
    pub cb: ucp_am_recv_callback_t,
    pub arg: *mut c_void,
}

/// `ucp_am_recv_param_t`.
#[repr(C)]
pub struct ucp_am_recv_param_t {
    pub recv_attr: u64,
    pub reply_ep: ucp_ep_h,
}

impl ucp_request_param_t {
    /// A parameter block with nothing set.
    pub fn empty() -> Self {
        // SAFETY: all-zero is a valid value for every field (null pointers, `None`, zero).
        unsafe { std::mem::zeroed() }
    }
}

/// True when an `ucs_status_ptr_t` is an error code (`UCS_PTR_IS_ERR`).
pub fn ptr_is_err(p: ucs_status_ptr_t) -> bool {
    (p as usize) >= (UCS_ERR_LAST as usize)
}

/// The status in an error pointer (`UCS_PTR_RAW_STATUS`).
pub fn ptr_status(p: ucs_status_ptr_t) -> ucs_status_t {
    p as isize as ucs_status_t
}

macro_rules! ucp_functions {
    ($( $name:ident : fn($($arg:ty),*) $(-> $ret:ty)? ;)*) => {
        /// The resolved UCP entry points and the library that holds them.
        pub struct Ucp {
            $( pub $name: unsafe extern "C" fn($($arg),*) $(-> $ret)?, )*
            /// Where the library was found.
            pub path: PathBuf,
            /// `(major, minor, release)` reported by `ucp_get_version`.
            pub version: (c_uint, c_uint, c_uint),
            // Last: the function pointers above are only valid while this is loaded.
            _lib: libloading::Library,
        }

        impl Ucp {
            fn resolve(lib: libloading::Library, path: PathBuf) -> Result<Self, Error> {
                $(
                    // SAFETY: the symbol is declared above with the signature of UCX 1.13's
                    // `ucp.h`; the pointer is kept next to the library that owns it.
                    let $name = unsafe {
                        *lib.get::<unsafe extern "C" fn($($arg),*) $(-> $ret)?>(
                            concat!(stringify!($name), "\0").as_bytes(),
                        )
                        .map_err(|e| unavailable(&path, format!(
                            "symbol {} is missing ({e}); the library is not a UCX >= {}.{} libucp",
                            stringify!($name), MIN_VERSION.0, MIN_VERSION.1
                        )))?
                    };
                )*
                Ok(Ucp { $($name,)* path, version: (0, 0, 0), _lib: lib })
            }
        }
    };
}

ucp_functions! {
    ucp_get_version: fn(*mut c_uint, *mut c_uint, *mut c_uint);
    ucp_config_read: fn(*const c_char, *const c_char, *mut *mut ucp_config_t) -> ucs_status_t;
    ucp_config_modify: fn(*mut ucp_config_t, *const c_char, *const c_char) -> ucs_status_t;
    ucp_config_release: fn(*mut ucp_config_t);
    ucp_init_version: fn(c_uint, c_uint, *const ucp_params_t, *const ucp_config_t, *mut ucp_context_h) -> ucs_status_t;
    ucp_cleanup: fn(ucp_context_h);
    ucp_context_query: fn(ucp_context_h, *mut ucp_context_attr_t) -> ucs_status_t;
    ucp_worker_create: fn(ucp_context_h, *const ucp_worker_params_t, *mut ucp_worker_h) -> ucs_status_t;
    ucp_worker_destroy: fn(ucp_worker_h);
    ucp_worker_get_address: fn(ucp_worker_h, *mut *mut ucp_address_t, *mut usize) -> ucs_status_t;
    ucp_worker_release_address: fn(ucp_worker_h, *mut ucp_address_t);
    ucp_worker_get_efd: fn(ucp_worker_h, *mut c_int) -> ucs_status_t;
    ucp_worker_arm: fn(ucp_worker_h) -> ucs_status_t;
    ucp_worker_progress: fn(ucp_worker_h) -> c_uint;
    ucp_worker_set_am_recv_handler: fn(ucp_worker_h, *const ucp_am_handler_param_t) -> ucs_status_t;
    ucp_ep_create: fn(ucp_worker_h, *const ucp_ep_params_t, *mut ucp_ep_h) -> ucs_status_t;
    ucp_ep_close_nbx: fn(ucp_ep_h, *const ucp_request_param_t) -> ucs_status_ptr_t;
    ucp_ep_flush_nbx: fn(ucp_ep_h, *const ucp_request_param_t) -> ucs_status_ptr_t;
    ucp_mem_map: fn(ucp_context_h, *const ucp_mem_map_params_t, *mut ucp_mem_h) -> ucs_status_t;
    ucp_mem_unmap: fn(ucp_context_h, ucp_mem_h) -> ucs_status_t;
    ucp_mem_query: fn(ucp_mem_h, *mut ucp_mem_attr_t) -> ucs_status_t;
    ucp_rkey_pack: fn(ucp_context_h, ucp_mem_h, *mut *mut c_void, *mut usize) -> ucs_status_t;
    ucp_rkey_buffer_release: fn(*mut c_void);
    ucp_ep_rkey_unpack: fn(ucp_ep_h, *const c_void, *mut ucp_rkey_h) -> ucs_status_t;
    ucp_rkey_destroy: fn(ucp_rkey_h);
    ucp_rkey_ptr: fn(ucp_rkey_h, u64, *mut *mut c_void) -> ucs_status_t;
    ucp_put_nbx: fn(ucp_ep_h, *const c_void, usize, u64, ucp_rkey_h, *const ucp_request_param_t) -> ucs_status_ptr_t;
    ucp_get_nbx: fn(ucp_ep_h, *mut c_void, usize, u64, ucp_rkey_h, *const ucp_request_param_t) -> ucs_status_ptr_t;
    ucp_am_send_nbx: fn(ucp_ep_h, c_uint, *const c_void, usize, *const c_void, usize, *const ucp_request_param_t) -> ucs_status_ptr_t;
    ucp_request_check_status: fn(*mut c_void) -> ucs_status_t;
    ucp_request_cancel: fn(ucp_worker_h, *mut c_void);
    ucp_request_free: fn(*mut c_void);
    ucs_status_string: fn(ucs_status_t) -> *const c_char;
}

fn unavailable(path: &Path, reason: String) -> Error {
    Error::Unavailable {
        what: format!("UCX ({})", path.display()),
        reason,
        hint: format!(
            "install UCX (Debian/Ubuntu: `apt-get install libucx0`), or set {LIB_ENV} to the \
             path of a {DEFAULT_LIB} from UCX >= {}.{}",
            MIN_VERSION.0, MIN_VERSION.1
        ),
    }
}

impl Ucp {
    /// Opens `path`, or `$HMC_UCX_LIB`, or `libucp.so.0`, resolves the API and checks the
    /// version. Never panics: a missing or unsuitable library is [`Error::Unavailable`].
    pub fn load(path: Option<&Path>) -> Result<Self, Error> {
        let path = match path {
            Some(p) => p.to_path_buf(),
            None => std::env::var_os(LIB_ENV)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_LIB)),
        };
        // SAFETY: loading libucp runs its constructors (UCS/UCM initialisation), which are
        // designed to run in any process that links UCX.
        let lib = unsafe { libloading::Library::new(&path) }
            .map_err(|e| unavailable(&path, format!("cannot open {DEFAULT_LIB}: {e}")))?;
        let mut ucp = Ucp::resolve(lib, path)?;
        let (mut major, mut minor, mut release) = (0, 0, 0);
        // SAFETY: plain out-parameters.
        unsafe { (ucp.ucp_get_version)(&mut major, &mut minor, &mut release) };
        ucp.version = (major, minor, release);
        if (major, minor) < MIN_VERSION || major != API_MAJOR {
            return Err(unavailable(
                &ucp.path,
                format!(
                    "UCX {major}.{minor}.{release} is too old or of another major version \
                     (need {}.{} or newer 1.x)",
                    MIN_VERSION.0, MIN_VERSION.1
                ),
            ));
        }
        tracing::debug!(path = %ucp.path.display(), major, minor, release, "loaded UCX");
        Ok(ucp)
    }

    /// UCX's text for a status code.
    pub fn status_string(&self, status: ucs_status_t) -> String {
        // SAFETY: `ucs_status_string` returns a pointer to a static string for any value.
        let p = unsafe { (self.ucs_status_string)(status) };
        if p.is_null() {
            return format!("status {status}");
        }
        // SAFETY: non-null, NUL-terminated, static.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// An [`Error::Device`] for a failed call.
    pub fn error(&self, function: &'static str, status: ucs_status_t) -> Error {
        let kind = if status == UCS_ERR_NO_MEMORY {
            DeviceErrorKind::OutOfMemory
        } else {
            DeviceErrorKind::Other
        };
        Error::Device {
            kind,
            library: DEFAULT_LIB,
            function,
            code: status as i64,
            message: self.status_string(status),
        }
    }

    /// `Ok` for `UCS_OK`, else [`Ucp::error`].
    pub fn check(&self, function: &'static str, status: ucs_status_t) -> Result<(), Error> {
        if status == UCS_OK {
            Ok(())
        } else {
            Err(self.error(function, status))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_is_unavailable_and_names_the_variable() {
        let err = Ucp::load(Some(Path::new("/nonexistent/libucp.so.0")))
            .err()
            .unwrap();
        let text = err.to_string();
        assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
        assert!(
            text.contains("libucp.so.0") && text.contains(LIB_ENV),
            "{text}"
        );
    }

    #[test]
    fn a_library_without_ucp_symbols_is_unavailable() {
        let err = Ucp::load(Some(Path::new("libc.so.6"))).err().unwrap();
        assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
        assert!(err.to_string().contains("ucp_get_version"), "{err}");
    }

    #[test]
    fn status_pointers_decode_like_the_c_macros() {
        assert!(!ptr_is_err(std::ptr::null_mut()));
        assert!(ptr_is_err(-16isize as ucs_status_ptr_t));
        assert_eq!(ptr_status(-16isize as ucs_status_ptr_t), UCS_ERR_CANCELED);
        assert!(!ptr_is_err(0x1000 as ucs_status_ptr_t));
    }
}
