//! Checks the binding against rdma-core: every struct size, field offset and constant `sys` declares against the installed `<infiniband/verbs.h>` (a C program compiled at test time), and every symbol it loads against the real `libibverbs.so.1` (present), the inline data-path calls too (absent).

use std::mem::{offset_of, size_of};
use std::path::Path;

use hmc_testshim::layout::c_values;
use hmc_transport_rdma::sys::*;

macro_rules! layout {
    ($rust:ty, $c:literal, [$($field:ident $(= $cfield:literal)?),* $(,)?]) => {{
        let mut v: Vec<(String, usize)> = vec![(format!("sizeof {}", $c), size_of::<$rust>())];
        $( v.push((
            format!("offsetof {}.{}", $c, layout!(@name $field $(, $cfield)?)),
            offset_of!($rust, $field),
        )); )*
        v
    }};
    (@name $field:ident) => { stringify!($field) };
    (@name $field:ident, $cfield:literal) => { $cfield };
}

fn rust_layouts() -> Vec<(String, usize)> {
    let mut all = Vec::new();
    all.extend(layout!(ibv_gid, "union ibv_gid", [raw]));
    all.extend(layout!(
        ibv_device_attr,
        "struct ibv_device_attr",
        [
            fw_ver,
            node_guid,
            max_mr_size,
            max_qp,
            max_qp_wr,
            max_sge,
            max_cqe,
            max_qp_rd_atom,
            max_qp_init_rd_atom,
            atomic_cap,
            max_pkeys,
            phys_port_cnt
        ]
    ));
    all.extend(layout!(
        ibv_port_attr,
        "struct ibv_port_attr",
        [
            state,
            max_mtu,
            active_mtu,
            gid_tbl_len,
            max_msg_sz,
            lid,
            link_layer,
            flags,
            port_cap_flags2
        ]
    ));
    all.extend(layout!(ibv_pd, "struct ibv_pd", [context, handle]));
    all.extend(layout!(
        ibv_mr,
        "struct ibv_mr",
        [context, pd, addr, length, handle, lkey, rkey]
    ));
    all.extend(layout!(
        ibv_comp_channel,
        "struct ibv_comp_channel",
        [context, fd, refcnt]
    ));
    all.extend(layout!(
        ibv_cq,
        "struct ibv_cq",
        [
            context,
            channel,
            cq_context,
            handle,
            cqe,
            mutex,
            cond,
            comp_events_completed,
            async_events_completed
        ]
    ));
    all.extend(layout!(
        ibv_qp,
        "struct ibv_qp",
        [
            context,
            qp_context,
            pd,
            send_cq,
            recv_cq,
            srq,
            handle,
            qp_num,
            state,
            qp_type,
            mutex,
            cond,
            events_completed
        ]
    ));
    all.extend(layout!(
        ibv_qp_cap,
        "struct ibv_qp_cap",
        [
            max_send_wr,
            max_recv_wr,
            max_send_sge,
            max_recv_sge,
            max_inline_data
        ]
    ));
    all.extend(layout!(
        ibv_qp_init_attr,
        "struct ibv_qp_init_attr",
        [qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all]
    ));
    all.extend(layout!(
        ibv_global_route,
        "struct ibv_global_route",
        [dgid, flow_label, sgid_index, hop_limit, traffic_class]
    ));
    all.extend(layout!(
        ibv_ah_attr,
        "struct ibv_ah_attr",
        [
            grh,
            dlid,
            sl,
            src_path_bits,
            static_rate,
            is_global,
            port_num
        ]
    ));
    all.extend(layout!(
        ibv_qp_attr,
        "struct ibv_qp_attr",
        [
            qp_state,
            cur_qp_state,
            path_mtu,
            path_mig_state,
            qkey,
            rq_psn,
            sq_psn,
            dest_qp_num,
            qp_access_flags,
            cap,
            ah_attr,
            alt_ah_attr,
            pkey_index,
            alt_pkey_index,
            en_sqd_async_notify,
            sq_draining,
            max_rd_atomic,
            max_dest_rd_atomic,
            min_rnr_timer,
            port_num,
            timeout,
            retry_cnt,
            rnr_retry,
            alt_port_num,
            alt_timeout,
            rate_limit
        ]
    ));
    all.extend(layout!(ibv_sge, "struct ibv_sge", [addr, length, lkey]));
    all.extend(layout!(
        ibv_send_wr,
        "struct ibv_send_wr",
        [
            wr_id,
            next,
            sg_list,
            num_sge,
            opcode,
            send_flags,
            imm_data,
            rdma = "wr.rdma",
            xrc_remote_srqn = "qp_type.xrc.remote_srqn",
            _tail = "bind_mw"
        ]
    ));
    all.extend(layout!(
        ibv_send_wr_rdma,
        "struct { uint64_t remote_addr; uint32_t rkey; }",
        [remote_addr, rkey]
    ));
    all.extend(layout!(
        ibv_recv_wr,
        "struct ibv_recv_wr",
        [wr_id, next, sg_list, num_sge]
    ));
    all.extend(layout!(
        ibv_wc,
        "struct ibv_wc",
        [
            wr_id,
            status,
            opcode,
            vendor_err,
            byte_len,
            imm_data,
            qp_num,
            src_qp,
            wc_flags,
            pkey_index,
            slid,
            sl,
            dlid_path_bits
        ]
    ));
    all.extend(layout!(
        ibv_gid_entry,
        "struct ibv_gid_entry",
        [gid, gid_index, port_num, gid_type, ndev_ifindex]
    ));
    all.extend(layout!(
        ibv_context_ops,
        "struct ibv_context_ops",
        [
            poll_cq,
            req_notify_cq,
            post_srq_recv,
            post_send,
            post_recv,
            _compat_async_event
        ]
    ));
    all.extend(layout!(
        ibv_context,
        "struct ibv_context",
        [
            device,
            ops,
            cmd_fd,
            async_fd,
            num_comp_vectors,
            mutex,
            abi_compat
        ]
    ));
    all
}

fn rust_constants() -> Vec<(String, i64)> {
    let c = |name: &str, v: i64| (format!("const {name}"), v);
    vec![
        c("IBV_QPS_RESET", IBV_QPS_RESET as i64),
        c("IBV_QPS_INIT", IBV_QPS_INIT as i64),
        c("IBV_QPS_RTR", IBV_QPS_RTR as i64),
        c("IBV_QPS_RTS", IBV_QPS_RTS as i64),
        c("IBV_QPS_ERR", IBV_QPS_ERR as i64),
        c("IBV_QPT_RC", IBV_QPT_RC as i64),
        c("IBV_PORT_ACTIVE", IBV_PORT_ACTIVE as i64),
        c("IBV_MTU_256", IBV_MTU_256 as i64),
        c("IBV_MTU_4096", IBV_MTU_4096 as i64),
        c(
            "IBV_LINK_LAYER_INFINIBAND",
            IBV_LINK_LAYER_INFINIBAND as i64,
        ),
        c("IBV_LINK_LAYER_ETHERNET", IBV_LINK_LAYER_ETHERNET as i64),
        c("IBV_GID_TYPE_IB", IBV_GID_TYPE_IB as i64),
        c("IBV_GID_TYPE_ROCE_V1", IBV_GID_TYPE_ROCE_V1 as i64),
        c("IBV_GID_TYPE_ROCE_V2", IBV_GID_TYPE_ROCE_V2 as i64),
        c("IBV_ACCESS_LOCAL_WRITE", IBV_ACCESS_LOCAL_WRITE as i64),
        c("IBV_ACCESS_REMOTE_WRITE", IBV_ACCESS_REMOTE_WRITE as i64),
        c("IBV_ACCESS_REMOTE_READ", IBV_ACCESS_REMOTE_READ as i64),
        c("IBV_QP_STATE", IBV_QP_STATE as i64),
        c("IBV_QP_ACCESS_FLAGS", IBV_QP_ACCESS_FLAGS as i64),
        c("IBV_QP_PKEY_INDEX", IBV_QP_PKEY_INDEX as i64),
        c("IBV_QP_PORT", IBV_QP_PORT as i64),
        c("IBV_QP_AV", IBV_QP_AV as i64),
        c("IBV_QP_PATH_MTU", IBV_QP_PATH_MTU as i64),
        c("IBV_QP_TIMEOUT", IBV_QP_TIMEOUT as i64),
        c("IBV_QP_RETRY_CNT", IBV_QP_RETRY_CNT as i64),
        c("IBV_QP_RNR_RETRY", IBV_QP_RNR_RETRY as i64),
        c("IBV_QP_RQ_PSN", IBV_QP_RQ_PSN as i64),
        c("IBV_QP_MAX_QP_RD_ATOMIC", IBV_QP_MAX_QP_RD_ATOMIC as i64),
        c("IBV_QP_MIN_RNR_TIMER", IBV_QP_MIN_RNR_TIMER as i64),
        c("IBV_QP_SQ_PSN", IBV_QP_SQ_PSN as i64),
        c(
            "IBV_QP_MAX_DEST_RD_ATOMIC",
            IBV_QP_MAX_DEST_RD_ATOMIC as i64,
        ),
        c("IBV_QP_DEST_QPN", IBV_QP_DEST_QPN as i64),
        c("IBV_WR_RDMA_WRITE", IBV_WR_RDMA_WRITE as i64),
        c("IBV_WR_RDMA_READ", IBV_WR_RDMA_READ as i64),
        c("IBV_SEND_SIGNALED", IBV_SEND_SIGNALED as i64),
        c("IBV_WC_SUCCESS", IBV_WC_SUCCESS as i64),
        c("IBV_WC_LOC_LEN_ERR", IBV_WC_LOC_LEN_ERR as i64),
        c("IBV_WC_LOC_PROT_ERR", IBV_WC_LOC_PROT_ERR as i64),
        c("IBV_WC_WR_FLUSH_ERR", IBV_WC_WR_FLUSH_ERR as i64),
        c("IBV_WC_REM_INV_REQ_ERR", IBV_WC_REM_INV_REQ_ERR as i64),
        c("IBV_WC_REM_ACCESS_ERR", IBV_WC_REM_ACCESS_ERR as i64),
        c("IBV_WC_REM_OP_ERR", IBV_WC_REM_OP_ERR as i64),
        c("IBV_WC_RETRY_EXC_ERR", IBV_WC_RETRY_EXC_ERR as i64),
        c("IBV_WC_RNR_RETRY_EXC_ERR", IBV_WC_RNR_RETRY_EXC_ERR as i64),
    ]
}

/// The C expression where the key's default form does not fit: the anonymous `wr.rdma`
/// member of `ibv_send_wr`.
fn special(key: &str) -> Option<String> {
    const RDMA: &str = "struct { uint64_t remote_addr; uint32_t rkey; }";
    if key == format!("sizeof {RDMA}") {
        return Some("sizeof(((struct ibv_send_wr *)0)->wr)".into());
    }
    key.strip_prefix(&format!("offsetof {RDMA}.")).map(|field| {
        format!(
            "offsetof(struct ibv_send_wr, wr.rdma.{field}) - offsetof(struct ibv_send_wr, wr.rdma)"
        )
    })
}

#[test]
fn struct_layouts_and_constants_match_the_installed_verbs_header() {
    let header = Path::new("/usr/include/infiniband/verbs.h");
    assert!(
        header.exists(),
        "{} is missing: install rdma-core's headers (`apt-get install libibverbs-dev`; \
         `cargo xtask test` does) to run this check",
        header.display()
    );
    let rust: Vec<(String, i64)> = rust_layouts()
        .into_iter()
        .map(|(k, v)| (k, v as i64))
        .chain(rust_constants())
        .collect();
    let keys: Vec<&str> = rust.iter().map(|(k, _)| k.as_str()).collect();
    let c = c_values(
        Path::new("/usr/include"),
        "infiniband/verbs.h",
        &keys,
        special,
    );
    let mismatches: Vec<String> = rust
        .iter()
        .filter(|(k, v)| c[k] != *v)
        .map(|(k, v)| format!("{k}: C {}, Rust {v}", c[k]))
        .collect();
    assert!(
        mismatches.is_empty(),
        "layout differs from verbs.h:\n{}",
        mismatches.join("\n")
    );
}

/// The real library, not the stand-in: every symbol `Verbs::load` resolves is exported,
/// and the four inline data-path calls are not (they go through the ops table).
#[test]
fn loaded_symbols_exist_in_the_real_library_and_the_inline_ones_do_not() {
    // SAFETY: loading rdma-core's libibverbs runs only its own initialisers.
    let lib = unsafe { libloading::Library::new(LIBRARY) }.unwrap_or_else(|e| {
        panic!("{LIBRARY} must be installed for this check (`apt-get install libibverbs1`): {e}")
    });
    for name in REQUIRED_SYMBOLS.iter().chain(OPTIONAL_SYMBOLS) {
        // SAFETY: only looked up, never called.
        let found = unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_ok();
        assert!(found, "{name} is not exported by the installed {LIBRARY}");
    }
    for name in INLINE_FUNCTIONS {
        // SAFETY: only looked up.
        let found = unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_ok();
        assert!(
            !found,
            "{name} is exported: it is meant to be inline in verbs.h"
        );
    }
    // And the binding resolves everything from it.
    let verbs = Verbs::load(Some(Path::new(LIBRARY))).expect("resolve every required symbol");
    assert!(verbs.ibv_reg_dmabuf_mr.is_some() && verbs.ibv_reg_mr_iova2.is_some());
}
