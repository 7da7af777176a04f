//! Checks every UCX struct this crate declares against the installed UCX headers: a C program compiled with `cc` prints sizes and field offsets, which must equal the Rust layout.

use std::mem::{offset_of, size_of};
use std::path::Path;

use hmc_testshim::layout::c_values;
use hmc_transport_ucx::sys::*;

macro_rules! layout {
    ($rust:ty, $c:literal, [$($field:ident),* $(,)?]) => {{
        let mut v: Vec<(String, usize)> = vec![(format!("sizeof {}", $c), size_of::<$rust>())];
        $( v.push((format!("offsetof {}.{}", $c, stringify!($field)), offset_of!($rust, $field))); )*
        v
    }};
}

fn rust_layouts() -> Vec<(String, usize)> {
    let mut all = Vec::new();
    all.extend(layout!(
        ucp_params_t,
        "ucp_params_t",
        [
            field_mask,
            features,
            request_size,
            request_init,
            request_cleanup,
            tag_sender_mask,
            mt_workers_shared,
            estimated_num_eps,
            estimated_num_ppn,
            name
        ]
    ));
    all.extend(layout!(ucs_cpu_set_t, "ucs_cpu_set_t", [ucs_bits]));
    all.extend(layout!(
        ucp_worker_params_t,
        "ucp_worker_params_t",
        [
            field_mask,
            thread_mode,
            cpu_mask,
            events,
            user_data,
            event_fd,
            flags,
            name,
            am_alignment,
            client_id
        ]
    ));
    all.extend(layout!(ucp_err_handler_t, "ucp_err_handler_t", [cb, arg]));
    all.extend(layout!(ucs_sock_addr_t, "ucs_sock_addr_t", [addr, addrlen]));
    all.extend(layout!(
        ucp_ep_params_t,
        "ucp_ep_params_t",
        [
            field_mask,
            address,
            err_mode,
            err_handler,
            user_data,
            flags,
            sockaddr,
            conn_request,
            name,
            local_sockaddr
        ]
    ));
    all.extend(layout!(
        ucp_mem_map_params_t,
        "ucp_mem_map_params_t",
        [field_mask, address, length, flags, prot, memory_type]
    ));
    all.extend(layout!(
        ucp_request_param_t,
        "ucp_request_param_t",
        [
            op_attr_mask,
            flags,
            request,
            cb,
            datatype,
            user_data,
            reply_buffer,
            memory_type,
            recv_info,
            memh
        ]
    ));
    all.extend(layout!(
        ucp_context_attr_t,
        "ucp_context_attr_t",
        [field_mask, request_size, thread_mode, memory_types, name]
    ));
    all.extend(layout!(
        ucp_am_handler_param_t,
        "ucp_am_handler_param_t",
        [field_mask, id, flags, cb, arg]
    ));
    all.extend(layout!(
        ucp_am_recv_param_t,
        "ucp_am_recv_param_t",
        [recv_attr, reply_ep]
    ));
    all
}

/// Constants whose values must match the headers.
fn rust_constants() -> Vec<(String, i64)> {
    let c = |name: &str, v: i64| (format!("const {name}"), v);
    vec![
        c("UCP_API_MAJOR", API_MAJOR as i64),
        c("UCS_ERR_UNREACHABLE", UCS_ERR_UNREACHABLE as i64),
        c("UCS_ERR_BUSY", UCS_ERR_BUSY as i64),
        c("UCS_ERR_CANCELED", UCS_ERR_CANCELED as i64),
        c("UCS_ERR_LAST", UCS_ERR_LAST as i64),
        c("UCP_FEATURE_RMA", UCP_FEATURE_RMA as i64),
        c("UCP_FEATURE_WAKEUP", UCP_FEATURE_WAKEUP as i64),
        c("UCP_FEATURE_AM", UCP_FEATURE_AM as i64),
        c("UCP_PARAM_FIELD_NAME", UCP_PARAM_FIELD_NAME as i64),
        c("UCS_THREAD_MODE_SINGLE", UCS_THREAD_MODE_SINGLE as i64),
        c(
            "UCP_ATTR_FIELD_MEMORY_TYPES",
            UCP_ATTR_FIELD_MEMORY_TYPES as i64,
        ),
        c("UCS_MEMORY_TYPE_HOST", UCS_MEMORY_TYPE_HOST as i64),
        c("UCS_MEMORY_TYPE_CUDA", UCS_MEMORY_TYPE_CUDA as i64),
        c("UCS_MEMORY_TYPE_ROCM", UCS_MEMORY_TYPE_ROCM as i64),
        c("UCP_ENTITY_NAME_MAX", UCP_ENTITY_NAME_MAX as i64),
        c("UCP_WAKEUP_RMA", UCP_WAKEUP_RMA as i64),
        c("UCP_WAKEUP_TX", UCP_WAKEUP_TX as i64),
        c("UCP_WAKEUP_RX", UCP_WAKEUP_RX as i64),
        c(
            "UCP_ERR_HANDLING_MODE_PEER",
            UCP_ERR_HANDLING_MODE_PEER as i64,
        ),
        c("UCP_EP_CLOSE_FLAG_FORCE", UCP_EP_CLOSE_FLAG_FORCE as i64),
        c(
            "UCP_MEM_MAP_PROT_REMOTE_READ",
            UCP_MEM_MAP_PROT_REMOTE_READ as i64,
        ),
        c(
            "UCP_MEM_MAP_PROT_REMOTE_WRITE",
            UCP_MEM_MAP_PROT_REMOTE_WRITE as i64,
        ),
        c(
            "UCP_OP_ATTR_FIELD_CALLBACK",
            UCP_OP_ATTR_FIELD_CALLBACK as i64,
        ),
        c(
            "UCP_OP_ATTR_FIELD_USER_DATA",
            UCP_OP_ATTR_FIELD_USER_DATA as i64,
        ),
        c("UCP_OP_ATTR_FIELD_FLAGS", UCP_OP_ATTR_FIELD_FLAGS as i64),
        c("UCP_AM_SEND_FLAG_EAGER", UCP_AM_SEND_FLAG_EAGER as i64),
        c("UCP_AM_FLAG_WHOLE_MSG", UCP_AM_FLAG_WHOLE_MSG as i64),
        c(
            "UCP_AM_RECV_ATTR_FLAG_RNDV",
            UCP_AM_RECV_ATTR_FLAG_RNDV as i64,
        ),
        c(
            "UCP_AM_HANDLER_PARAM_FIELD_ARG",
            UCP_AM_HANDLER_PARAM_FIELD_ARG as i64,
        ),
        c(
            "UCP_EP_PARAM_FIELD_ERR_HANDLER",
            UCP_EP_PARAM_FIELD_ERR_HANDLER as i64,
        ),
        c(
            "UCP_MEM_MAP_PARAM_FIELD_PROT",
            UCP_MEM_MAP_PARAM_FIELD_PROT as i64,
        ),
        c(
            "UCP_WORKER_PARAM_FIELD_EVENTS",
            UCP_WORKER_PARAM_FIELD_EVENTS as i64,
        ),
    ]
}

#[test]
fn struct_layouts_and_constants_match_the_installed_ucx_headers() {
    // `HMC_UCX_INCLUDE` checks another UCX's headers (`cargo xtask ucx-wheel` points it at
    // the wheel's), next to its library in `HMC_UCX_LIB`.
    let include = std::env::var("HMC_UCX_INCLUDE").unwrap_or_else(|_| "/usr/include".into());
    let header = Path::new(&include).join("ucp/api/ucp.h");
    let other_headers = include != "/usr/include";
    assert!(
        header.exists(),
        "{} is missing: install the UCX headers (`apt-get install libucx-dev`) to run this check",
        header.display()
    );
    let layouts = rust_layouts();
    let constants = rust_constants();
    let keys: Vec<&str> = layouts
        .iter()
        .map(|(k, _)| k.as_str())
        .chain(constants.iter().map(|(k, _)| k.as_str()))
        .collect();
    let c_values = c_values(Path::new(&include), "ucp/api/ucp.h", &keys, |_| None);
    let mut mismatches = Vec::new();
    for (what, rust) in layouts
        .iter()
        .map(|(k, v)| (k, *v as i64))
        .chain(constants.iter().map(|(k, v)| (k, *v)))
    {
        let c = c_values[what];
        // A newer UCX appends fields to its parameter structs (read only when their
        // field-mask bits are set, which this crate never sets): against other headers than
        // the 1.13 ones declared here, every field must keep its offset and a struct may
        // only grow.
        let grown_ok = other_headers && what.starts_with("sizeof ") && c > rust;
        if c != rust && !grown_ok {
            mismatches.push(format!("{what}: C {c}, Rust {rust}"));
        }
    }
    assert!(
        mismatches.is_empty(),
        "layout differs from the headers:\n{}",
        mismatches.join("\n")
    );
}

#[test]
fn the_installed_library_loads_and_is_new_enough() {
    let ucp = Ucp::load(None).expect("libucp.so.0 (install libucx0 or set HMC_UCX_LIB)");
    assert!(
        (ucp.version.0, ucp.version.1) >= MIN_VERSION,
        "{:?}",
        ucp.version
    );
}

/// The library the tests load is the one meant: `HMC_EXPECT_UCX_VERSION` (`1.22.0`), set by
/// `cargo xtask ucx-wheel`, must be what `ucp_get_version` reports; without it, any UCX the
/// binding accepts.
#[test]
fn the_loaded_ucx_is_the_expected_one() {
    let comm =
        hmc_transport_ucx::UcxCommunicator::new(hmc_transport_ucx::UcxConfig::with_tls("tcp"))
            .expect("UCX available");
    let (major, minor, release) = comm.ucx_version();
    let loaded = format!("{major}.{minor}.{release}");
    match std::env::var("HMC_EXPECT_UCX_VERSION") {
        Ok(want) => assert_eq!(loaded, want, "HMC_UCX_LIB did not select the UCX meant"),
        Err(_) => assert_eq!(major, 1, "UCX {loaded}"),
    }
}
