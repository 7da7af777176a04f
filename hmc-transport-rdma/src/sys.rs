//! The slice of rdma-core's `verbs.h` this crate uses, declared by hand (`#[repr(C)]`), and `libibverbs.so.1` opened at run time with `libloading`.
//!
//! Every struct size, field offset and constant here is checked against the installed
//! `<infiniband/verbs.h>` by a C program at test time (`tests/layout.rs`), which also
//! checks that every symbol [`Verbs::load`] resolves exists in the real library and that
//! the four data-path calls below do not.
//!
//! `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` and `ibv_req_notify_cq` are `static
//! inline` in `verbs.h`: they are not exported, and a program calls them through the
//! provider's table in [`ibv_context::ops`], as those inline functions do
//! (`qp->context->ops.post_send(qp, wr, bad_wr)`). [`Verbs`] does the same.

#![allow(non_camel_case_types, missing_docs)]

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::path::Path;
use std::sync::{Arc, OnceLock};

use hmc_core::{Error, Result};
use libloading::Library;
use parking_lot::Mutex;

/// The library's soname.
pub const LIBRARY: &str = "libibverbs.so.1";
/// The environment variable that overrides the library path.
pub const LIB_ENV: &str = "HMC_IBVERBS_LIB";

// enum ibv_qp_state
pub const IBV_QPS_RESET: c_uint = 0;
pub const IBV_QPS_INIT: c_uint = 1;
pub const IBV_QPS_RTR: c_uint = 2;
pub const IBV_QPS_RTS: c_uint = 3;
pub const IBV_QPS_ERR: c_uint = 6;
// enum ibv_qp_type
pub const IBV_QPT_RC: c_uint = 2;
// enum ibv_port_state
pub const IBV_PORT_ACTIVE: c_uint = 4;
// enum ibv_mtu
pub const IBV_MTU_256: c_uint = 1;
pub const IBV_MTU_4096: c_uint = 5;
// link layers
pub const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;
// enum ibv_gid_type (of struct ibv_gid_entry)
pub const IBV_GID_TYPE_IB: u32 = 0;
pub const IBV_GID_TYPE_ROCE_V1: u32 = 1;
pub const IBV_GID_TYPE_ROCE_V2: u32 = 2;
// enum ibv_access_flags
pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 1 << 1;
pub const IBV_ACCESS_REMOTE_READ: c_int = 1 << 2;
// enum ibv_qp_attr_mask
pub const IBV_QP_STATE: c_int = 1;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;
// enum ibv_wr_opcode
pub const IBV_WR_RDMA_WRITE: c_uint = 0;
pub const IBV_WR_RDMA_READ: c_uint = 4;
// enum ibv_send_flags
pub const IBV_SEND_SIGNALED: c_uint = 1 << 1;
// enum ibv_wc_status
pub const IBV_WC_SUCCESS: c_uint = 0;
pub const IBV_WC_LOC_LEN_ERR: c_uint = 1;
pub const IBV_WC_LOC_PROT_ERR: c_uint = 4;
pub const IBV_WC_WR_FLUSH_ERR: c_uint = 5;
pub const IBV_WC_REM_INV_REQ_ERR: c_uint = 9;
pub const IBV_WC_REM_ACCESS_ERR: c_uint = 10;
pub const IBV_WC_REM_OP_ERR: c_uint = 11;
pub const IBV_WC_RETRY_EXC_ERR: c_uint = 12;
pub const IBV_WC_RNR_RETRY_EXC_ERR: c_uint = 13;

/// `union ibv_gid`: 16 bytes, network order; 8-byte aligned like the union (whose other
/// member is two `__be64`s).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

/// `struct ibv_device` is opaque here: only `ibv_get_device_name` reads it.
#[repr(C)]
pub struct ibv_device {
    _opaque: [u8; 0],
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: c_uint,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_port_attr {
    pub state: c_uint,
    pub max_mtu: c_uint,
    pub active_mtu: c_uint,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_uint,
    pub qp_type: c_uint,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub events_completed: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

#[repr(C)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub cap: ibv_qp_cap,
    pub qp_type: c_uint,
    pub sq_sig_all: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_qp_attr {
    pub qp_state: c_uint,
    pub cur_qp_state: c_uint,
    pub path_mtu: c_uint,
    pub path_mig_state: c_uint,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// The `rdma` member of `ibv_send_wr`'s `wr` union, padded to the union's size (its
/// largest member is `atomic`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_send_wr_rdma {
    pub remote_addr: u64,
    pub rkey: u32,
    pub _union_pad: [u32; 5],
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_uint,
    pub send_flags: c_uint,
    /// `imm_data` / `invalidate_rkey`.
    pub imm_data: u32,
    /// `wr.rdma` (the union's other members are never used here).
    pub rdma: ibv_send_wr_rdma,
    /// `qp_type.xrc.remote_srqn`.
    pub xrc_remote_srqn: u32,
    /// The trailing `bind_mw` / `tso` union, unused.
    pub _tail: [u64; 6],
}

impl Default for ibv_send_wr {
    fn default() -> Self {
        ibv_send_wr {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
            opcode: 0,
            send_flags: 0,
            imm_data: 0,
            rdma: ibv_send_wr_rdma::default(),
            xrc_remote_srqn: 0,
            _tail: [0; 6],
        }
    }
}

// SAFETY: a work request is plain data; its pointers are only followed by the provider
// during the `post_send` call that the owner of the pointed-to SGEs makes.
unsafe impl Send for ibv_send_wr {}

#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_uint,
    pub opcode: c_uint,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_gid_entry {
    pub gid: ibv_gid,
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

/// A slot of the ops table this crate never calls.
pub type Unused = Option<unsafe extern "C" fn()>;
pub type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
pub type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
pub type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
pub type ReqNotifyCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;

/// `struct ibv_context_ops`: the provider's table behind the inline data-path calls.
#[repr(C)]
pub struct ibv_context_ops {
    pub _compat_query_device: Unused,
    pub _compat_query_port: Unused,
    pub _compat_alloc_pd: Unused,
    pub _compat_dealloc_pd: Unused,
    pub _compat_reg_mr: Unused,
    pub _compat_rereg_mr: Unused,
    pub _compat_dereg_mr: Unused,
    pub alloc_mw: Unused,
    pub bind_mw: Unused,
    pub dealloc_mw: Unused,
    pub _compat_create_cq: Unused,
    pub poll_cq: Option<PollCqFn>,
    pub req_notify_cq: Option<ReqNotifyCqFn>,
    pub _compat_cq_event: Unused,
    pub _compat_resize_cq: Unused,
    pub _compat_destroy_cq: Unused,
    pub _compat_create_srq: Unused,
    pub _compat_modify_srq: Unused,
    pub _compat_query_srq: Unused,
    pub _compat_destroy_srq: Unused,
    pub post_srq_recv: Unused,
    pub _compat_create_qp: Unused,
    pub _compat_query_qp: Unused,
    pub _compat_modify_qp: Unused,
    pub _compat_destroy_qp: Unused,
    pub post_send: Option<PostSendFn>,
    pub post_recv: Option<PostRecvFn>,
    pub _compat_create_ah: Unused,
    pub _compat_destroy_ah: Unused,
    pub _compat_attach_mcast: Unused,
    pub _compat_detach_mcast: Unused,
    pub _compat_async_event: Unused,
}

/// `struct ibv_context`.
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub abi_compat: *mut c_void,
}

/// The exported functions this crate calls, by name: what the layout test checks against
/// the real library.
pub const REQUIRED_SYMBOLS: &[&str] = &[
    "ibv_get_device_list",
    "ibv_free_device_list",
    "ibv_get_device_name",
    "ibv_open_device",
    "ibv_close_device",
    "ibv_query_device",
    "ibv_query_port",
    "ibv_query_gid",
    "ibv_alloc_pd",
    "ibv_dealloc_pd",
    "ibv_reg_mr",
    "ibv_dereg_mr",
    "ibv_create_comp_channel",
    "ibv_destroy_comp_channel",
    "ibv_create_cq",
    "ibv_destroy_cq",
    "ibv_get_cq_event",
    "ibv_ack_cq_events",
    "ibv_create_qp",
    "ibv_modify_qp",
    "ibv_destroy_qp",
    "ibv_wc_status_str",
];
/// Looked up and used when present (rdma-core 34+ / 29+ / 31+).
pub const OPTIONAL_SYMBOLS: &[&str] =
    &["ibv_reg_dmabuf_mr", "ibv_reg_mr_iova2", "_ibv_query_gid_ex"];
/// `static inline` in `verbs.h`: called through [`ibv_context::ops`], never resolved.
pub const INLINE_FUNCTIONS: &[&str] = &[
    "ibv_post_send",
    "ibv_post_recv",
    "ibv_poll_cq",
    "ibv_req_notify_cq",
];

macro_rules! verbs_table {
    (
        required { $($name:ident: fn($($arg:ty),*) -> $ret:ty;)* }
        optional { $($oname:ident: fn($($oarg:ty),*) -> $oret:ty;)* }
    ) => {
        /// The resolved functions of one loaded `libibverbs.so.1`.
        pub struct Verbs {
            $(pub $name: unsafe extern "C" fn($($arg),*) -> $ret,)*
            $(pub $oname: Option<unsafe extern "C" fn($($oarg),*) -> $oret>,)*
            /// Where the library was loaded from.
            pub path: String,
            _lib: Library,
        }

        impl Verbs {
            fn resolve(lib: Library, path: String) -> Result<Verbs> {
                $(
                    // SAFETY: the type is the C prototype in verbs.h (rdma-core 44), checked
                    // by tests/layout.rs against the installed header.
                    let $name = unsafe {
                        *lib.get::<unsafe extern "C" fn($($arg),*) -> $ret>(
                            concat!(stringify!($name), "\0").as_bytes(),
                        )
                        .map_err(|e| missing(&path, stringify!($name), e))?
                    };
                )*
                $(
                    // SAFETY: as above; absence is fine (older rdma-core).
                    let $oname = unsafe {
                        lib.get::<unsafe extern "C" fn($($oarg),*) -> $oret>(
                            concat!(stringify!($oname), "\0").as_bytes(),
                        )
                        .ok()
                        .map(|s| *s)
                    };
                )*
                Ok(Verbs { $($name,)* $($oname,)* path, _lib: lib })
            }
        }
    };
}

verbs_table! {
    required {
        ibv_get_device_list: fn(*mut c_int) -> *mut *mut ibv_device;
        ibv_free_device_list: fn(*mut *mut ibv_device) -> ();
        ibv_get_device_name: fn(*mut ibv_device) -> *const c_char;
        ibv_open_device: fn(*mut ibv_device) -> *mut ibv_context;
        ibv_close_device: fn(*mut ibv_context) -> c_int;
        ibv_query_device: fn(*mut ibv_context, *mut ibv_device_attr) -> c_int;
        ibv_query_port: fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int;
        ibv_query_gid: fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int;
        ibv_alloc_pd: fn(*mut ibv_context) -> *mut ibv_pd;
        ibv_dealloc_pd: fn(*mut ibv_pd) -> c_int;
        ibv_reg_mr: fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr;
        ibv_dereg_mr: fn(*mut ibv_mr) -> c_int;
        ibv_create_comp_channel: fn(*mut ibv_context) -> *mut ibv_comp_channel;
        ibv_destroy_comp_channel: fn(*mut ibv_comp_channel) -> c_int;
        ibv_create_cq: fn(*mut ibv_context, c_int, *mut c_void, *mut ibv_comp_channel, c_int) -> *mut ibv_cq;
        ibv_destroy_cq: fn(*mut ibv_cq) -> c_int;
        ibv_get_cq_event: fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int;
        ibv_ack_cq_events: fn(*mut ibv_cq, c_uint) -> ();
        ibv_create_qp: fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp;
        ibv_modify_qp: fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int;
        ibv_destroy_qp: fn(*mut ibv_qp) -> c_int;
        ibv_wc_status_str: fn(c_uint) -> *const c_char;
    }
    optional {
        ibv_reg_dmabuf_mr: fn(*mut ibv_pd, u64, usize, u64, c_int, c_int) -> *mut ibv_mr;
        ibv_reg_mr_iova2: fn(*mut ibv_pd, *mut c_void, usize, u64, c_uint) -> *mut ibv_mr;
        _ibv_query_gid_ex: fn(*mut ibv_context, u32, u32, *mut ibv_gid_entry, u32, usize) -> c_int;
    }
}

fn missing(path: &str, symbol: &str, e: libloading::Error) -> Error {
    Error::Unavailable {
        what: format!("{symbol} in {path}"),
        reason: format!("the symbol is missing ({e}); this rdma-core is too old or not libibverbs"),
        hint: format!("install rdma-core's libibverbs1, or set {LIB_ENV} to a libibverbs.so.1"),
    }
}

impl Verbs {
    /// Opens `path`, else `$HMC_IBVERBS_LIB`, else `libibverbs.so.1` from the loader's
    /// search path, and resolves every required symbol.
    ///
    /// A library is loaded once per process and path, and stays loaded: rdma-core keeps
    /// provider state and threads that must not outlive its code, so it is never unloaded.
    pub fn load(path: Option<&Path>) -> Result<Arc<Verbs>> {
        static LOADED: OnceLock<Mutex<HashMap<String, Arc<Verbs>>>> = OnceLock::new();
        let chosen = match path {
            Some(p) => p.display().to_string(),
            None => std::env::var(LIB_ENV).unwrap_or_else(|_| LIBRARY.to_string()),
        };
        let mut loaded = LOADED.get_or_init(Mutex::default).lock();
        if let Some(v) = loaded.get(&chosen) {
            return Ok(v.clone());
        }
        let verbs = Arc::new(Verbs::open(chosen.clone())?);
        loaded.insert(chosen, verbs.clone());
        Ok(verbs)
    }

    fn open(chosen: String) -> Result<Verbs> {
        // SAFETY: loading libibverbs runs its constructors, which only set up its own
        // state (provider discovery happens at ibv_get_device_list).
        let lib = unsafe { Library::new(&chosen) }.map_err(|e| Error::Unavailable {
            what: chosen.clone(),
            reason: format!("it could not be loaded: {e}"),
            hint: format!(
                "install rdma-core (`apt-get install libibverbs1`), or set {LIB_ENV} to the \
                 path of libibverbs.so.1"
            ),
        })?;
        Verbs::resolve(lib, chosen)
    }

    /// `ibv_post_send` as `verbs.h` inlines it: through the context's ops table.
    ///
    /// # Safety
    /// `qp` is a live QP of a context opened by this library; `wr` a valid chain whose SGEs
    /// name registered memory.
    pub unsafe fn post_send(
        &self,
        qp: *mut ibv_qp,
        wr: *mut ibv_send_wr,
        bad: *mut *mut ibv_send_wr,
    ) -> c_int {
        // SAFETY: the caller's contract; `context` and its ops are the provider's.
        unsafe {
            let f = (*(*qp).context)
                .ops
                .post_send
                .expect("the provider has no post_send");
            f(qp, wr, bad)
        }
    }

    /// `ibv_poll_cq` through the ops table.
    ///
    /// # Safety
    /// `cq` is a live CQ; `wc` has room for `n` entries.
    pub unsafe fn poll_cq(&self, cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
        // SAFETY: the caller's contract.
        unsafe {
            let f = (*(*cq).context)
                .ops
                .poll_cq
                .expect("the provider has no poll_cq");
            f(cq, n, wc)
        }
    }

    /// `ibv_req_notify_cq` through the ops table.
    ///
    /// # Safety
    /// `cq` is a live CQ created with a completion channel.
    pub unsafe fn req_notify_cq(&self, cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
        // SAFETY: the caller's contract.
        unsafe {
            let f = (*(*cq).context)
                .ops
                .req_notify_cq
                .expect("the provider has no req_notify_cq");
            f(cq, solicited_only)
        }
    }

    /// `ibv_wc_status_str` as a Rust string.
    pub fn status_str(&self, status: c_uint) -> String {
        // SAFETY: returns a pointer to a static string ("unknown" for unknown values).
        let p = unsafe { (self.ibv_wc_status_str)(status) };
        if p.is_null() {
            return format!("status {status}");
        }
        // SAFETY: a NUL-terminated static string.
        unsafe { std::ffi::CStr::from_ptr(p) }
            .to_string_lossy()
            .into_owned()
    }
}
