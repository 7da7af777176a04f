//! The opened device: library, context, port and GID choice, one protection domain, one completion queue with its channel; queue pairs and memory regions over it, each freed by `Drop`.

use std::ffi::{CStr, c_int, c_uint};
use std::path::Path;
use std::sync::Arc;

use hmc_core::{Error, Result};

use crate::sys::*;
use crate::wire::{ConnRecord, GidKind, choose_gid};

/// How this host can register device (GPU) memory with the NIC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeviceMemorySupport {
    /// `ibv_reg_dmabuf_mr` is present and the provider answered the probe (an fd of -1)
    /// with `EBADF`: DMA-BUF file descriptors from the GPU driver can be registered.
    DmaBuf,
    /// A peer-memory kernel module (`/sys/module/nvidia_peermem`) lets `ibv_reg_mr` take
    /// CUDA device addresses directly.
    PeerMem,
    /// Neither: device memory is refused.
    None,
}

pub(crate) fn verbs_error(function: &'static str, code: i32, what: &str) -> Error {
    let io = std::io::Error::from_raw_os_error(code);
    Error::device(
        if code == libc::ENOMEM {
            hmc_core::DeviceErrorKind::OutOfMemory
        } else {
            hmc_core::DeviceErrorKind::Other
        },
        "libibverbs.so.1",
        function,
        code as i64,
        format!("{what}: {io}"),
    )
}

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Which device and port to open, and the limits the caller sets on top of the device's.
#[derive(Clone, Debug)]
pub(crate) struct NicChoice<'a> {
    pub library: Option<&'a Path>,
    pub device: Option<&'a str>,
    pub port: Option<u8>,
    pub gid_index: Option<u32>,
    pub cq_depth: u32,
}

/// One opened device with its PD, CQ and completion channel.
pub(crate) struct Nic {
    pub verbs: Arc<Verbs>,
    pub ctx: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub channel: *mut ibv_comp_channel,
    pub cq: *mut ibv_cq,
    pub name: String,
    pub port: u8,
    pub gid_index: u8,
    pub gid: [u8; 16],
    pub lid: u16,
    pub link_layer: u8,
    pub active_mtu: c_uint,
    pub max_msg: u32,
    pub max_qp_wr: u32,
    pub max_rd_atom: u8,
    pub max_init_rd_atom: u8,
    pub cq_depth: u32,
    pub device_memory: DeviceMemorySupport,
}

// SAFETY: the verbs objects are thread-safe by the rdma-core contract (every verb may be
// called from any thread; the provider locks what it shares); the raw pointers are only
// freed in `Drop`, once nothing else refers to this `Nic`.
unsafe impl Send for Nic {}
// SAFETY: as above.
unsafe impl Sync for Nic {}

impl Nic {
    /// Opens the chosen device (the first with an active port when none is named).
    pub fn open(choice: &NicChoice<'_>) -> Result<Arc<Nic>> {
        let verbs = Verbs::load(choice.library)?;
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer; the list is freed below.
        let list = unsafe { (verbs.ibv_get_device_list)(&mut n) };
        if list.is_null() {
            let code = errno();
            return Err(Error::Unavailable {
                what: "an RDMA device".into(),
                reason: format!(
                    "ibv_get_device_list failed: {} (without an RDMA stack in the kernel, as \
                     in most containers and VMs, this is ENOSYS)",
                    std::io::Error::from_raw_os_error(code)
                ),
                hint: "run on a host with an InfiniBand or RoCE NIC and its kernel driver \
                       (ib_uverbs loaded), or use the TCP or UCX transport"
                    .into(),
            });
        }
        // SAFETY: `list` holds `n` device pointers.
        let devices: Vec<*mut ibv_device> =
            (0..n as usize).map(|i| unsafe { *list.add(i) }).collect();
        let result = Self::open_from(&verbs, &devices, choice);
        // SAFETY: the list came from this library's ibv_get_device_list; an opened context
        // keeps its device alive.
        unsafe { (verbs.ibv_free_device_list)(list) };
        result
    }

    fn open_from(
        verbs: &Arc<Verbs>,
        devices: &[*mut ibv_device],
        choice: &NicChoice<'_>,
    ) -> Result<Arc<Nic>> {
        let mut names = Vec::new();
        let mut why = Vec::new();
        for &dev in devices {
            // SAFETY: a device of the list; the name is a NUL-terminated string in it.
            let name = unsafe { CStr::from_ptr((verbs.ibv_get_device_name)(dev)) }
                .to_string_lossy()
                .into_owned();
            names.push(name.clone());
            if choice.device.is_some_and(|want| want != name) {
                continue;
            }
            // SAFETY: a device of the list.
            let ctx = unsafe { (verbs.ibv_open_device)(dev) };
            if ctx.is_null() {
                why.push(format!(
                    "{name}: ibv_open_device: {}",
                    std::io::Error::last_os_error()
                ));
                continue;
            }
            match Self::probe(verbs, ctx, choice) {
                Ok(p) => return Self::finish(verbs.clone(), ctx, name, p, choice.cq_depth),
                Err(e) => {
                    why.push(format!("{name}: {e}"));
                    // SAFETY: opened above, nothing else made from it.
                    unsafe { (verbs.ibv_close_device)(ctx) };
                }
            }
        }
        Err(Error::Unavailable {
            what: match choice.device {
                Some(d) => format!("RDMA device {d}"),
                None => "an RDMA device with an active port".into(),
            },
            reason: if names.is_empty() {
                "no RDMA devices are present".into()
            } else {
                format!(
                    "devices present: [{}]; {}",
                    names.join(", "),
                    why.join("; ")
                )
            },
            hint: "check `ibv_devinfo` (a port must be PORT_ACTIVE), or name another device \
                   and port in RdmaConfig"
                .into(),
        })
    }

    fn probe(verbs: &Verbs, ctx: *mut ibv_context, choice: &NicChoice<'_>) -> Result<Probe> {
        // SAFETY: zeroed POD out-structs of the declared layout; `ctx` is open.
        let mut dev: ibv_device_attr = unsafe { std::mem::zeroed() };
        let rc = unsafe { (verbs.ibv_query_device)(ctx, &mut dev) };
        if rc != 0 {
            return Err(verbs_error("ibv_query_device", rc, "querying the device"));
        }
        let ports: Vec<u8> = match choice.port {
            Some(p) => vec![p],
            None => (1..=dev.phys_port_cnt).collect(),
        };
        for port in ports {
            let mut attr = ibv_port_attr::default();
            // SAFETY: the exported ibv_query_port fills at most a full `ibv_port_attr`,
            // the fallback path of verbs.h's inline wrapper.
            let rc = unsafe { (verbs.ibv_query_port)(ctx, port, &mut attr) };
            if rc != 0 || attr.state != IBV_PORT_ACTIVE {
                continue;
            }
            let gid = Self::pick_gid(verbs, ctx, port, &attr, choice.gid_index)?;
            return Ok(Probe {
                dev,
                port,
                attr,
                gid,
            });
        }
        Err(Error::Unavailable {
            what: "an active port".into(),
            reason: "no port is PORT_ACTIVE".into(),
            hint: "bring the link up (`ibv_devinfo` shows the port state)".into(),
        })
    }

    fn pick_gid(
        verbs: &Verbs,
        ctx: *mut ibv_context,
        port: u8,
        attr: &ibv_port_attr,
        want: Option<u32>,
    ) -> Result<(u32, [u8; 16])> {
        let mut table = Vec::new();
        for i in 0..attr.gid_tbl_len.max(0) as u32 {
            if want.is_some_and(|w| w != i) {
                continue;
            }
            let mut gid = ibv_gid::default();
            // SAFETY: `gid` is a 16-byte out-parameter.
            if unsafe { (verbs.ibv_query_gid)(ctx, port, i as c_int, &mut gid) } != 0 {
                continue;
            }
            let kind = match verbs._ibv_query_gid_ex {
                Some(f) => {
                    let mut e = ibv_gid_entry::default();
                    // SAFETY: `e` is an out-struct of the size passed.
                    let rc =
                        unsafe { f(ctx, port.into(), i, &mut e, 0, size_of::<ibv_gid_entry>()) };
                    if rc == 0 && e.gid_type == IBV_GID_TYPE_ROCE_V2 {
                        GidKind::RoceV2
                    } else {
                        GidKind::IbOrRoceV1
                    }
                }
                None => GidKind::IbOrRoceV1,
            };
            table.push((i, gid.raw, kind));
        }
        if attr.link_layer == IBV_LINK_LAYER_INFINIBAND && want.is_none() {
            // InfiniBand routes by LID; GID 0 (the port GID) is the one to use.
            return Ok(table
                .first()
                .map(|(i, g, _)| (*i, *g))
                .unwrap_or((0, [0; 16])));
        }
        choose_gid(&table).ok_or_else(|| Error::Unavailable {
            what: format!("a GID on port {port}"),
            reason: "the GID table has no usable entry (no IP address on the RoCE netdev?)".into(),
            hint:
                "assign an IP address to the NIC's network interface, or set RdmaConfig::gid_index"
                    .into(),
        })
    }

    fn finish(
        verbs: Arc<Verbs>,
        ctx: *mut ibv_context,
        name: String,
        p: Probe,
        cq_depth: u32,
    ) -> Result<Arc<Nic>> {
        let cq_depth = cq_depth.min(p.dev.max_cqe.max(1) as u32);
        // SAFETY: `ctx` is open; every object made here is freed in `Drop` or on failure.
        let pd = unsafe { (verbs.ibv_alloc_pd)(ctx) };
        let channel = if pd.is_null() {
            std::ptr::null_mut()
        } else {
            // SAFETY: as above.
            unsafe { (verbs.ibv_create_comp_channel)(ctx) }
        };
        let cq = if channel.is_null() {
            std::ptr::null_mut()
        } else {
            // SAFETY: as above; no cq_context, completion vector 0.
            unsafe {
                (verbs.ibv_create_cq)(ctx, cq_depth as c_int, std::ptr::null_mut(), channel, 0)
            }
        };
        if cq.is_null() {
            let code = errno();
            // SAFETY: freeing exactly what was made, in reverse order.
            unsafe {
                if !channel.is_null() {
                    (verbs.ibv_destroy_comp_channel)(channel);
                }
                if !pd.is_null() {
                    (verbs.ibv_dealloc_pd)(pd);
                }
                (verbs.ibv_close_device)(ctx);
            }
            return Err(verbs_error("ibv_alloc_pd/ibv_create_cq", code, &name));
        }
        // SAFETY: the channel's fd belongs to the channel; non-blocking so that
        // ibv_get_cq_event returns EAGAIN instead of sleeping.
        unsafe {
            let fd = (*channel).fd;
            let flags = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
        let device_memory = probe_device_memory(&verbs, pd);
        Ok(Arc::new(Nic {
            verbs,
            ctx,
            pd,
            channel,
            cq,
            name,
            port: p.port,
            gid_index: p.gid.0 as u8,
            gid: p.gid.1,
            lid: p.attr.lid,
            link_layer: p.attr.link_layer,
            active_mtu: p.attr.active_mtu,
            max_msg: p.attr.max_msg_sz.max(1),
            max_qp_wr: p.dev.max_qp_wr.max(1) as u32,
            max_rd_atom: p.dev.max_qp_rd_atom.clamp(1, 16) as u8,
            max_init_rd_atom: p.dev.max_qp_init_rd_atom.clamp(1, 16) as u8,
            cq_depth,
            device_memory,
        }))
    }

    /// This side's record for a QP.
    pub fn record(&self, qpn: u32, psn: u32, mtu: u8) -> ConnRecord {
        ConnRecord {
            port: self.port,
            gid: self.gid,
            lid: self.lid,
            qpn,
            psn,
            mtu,
        }
    }

    /// The completion channel's fd.
    pub fn channel_fd(&self) -> c_int {
        // SAFETY: the channel lives as long as `self`.
        unsafe { (*self.channel).fd }
    }
}

struct Probe {
    dev: ibv_device_attr,
    port: u8,
    attr: ibv_port_attr,
    gid: (u32, [u8; 16]),
}

fn probe_device_memory(verbs: &Verbs, pd: *mut ibv_pd) -> DeviceMemorySupport {
    if let Some(reg) = verbs.ibv_reg_dmabuf_mr {
        // SAFETY: an invalid fd (-1) makes a provider that supports DMA-BUF fail with EBADF
        // before touching anything; one that does not, with EOPNOTSUPP.
        let mr = unsafe { reg(pd, 0, 4096, 0, -1, IBV_ACCESS_LOCAL_WRITE) };
        let code = errno();
        if !mr.is_null() {
            // SAFETY: unexpected success: free what was made.
            unsafe { (verbs.ibv_dereg_mr)(mr) };
        } else if code == libc::EBADF {
            return DeviceMemorySupport::DmaBuf;
        }
    }
    if Path::new("/sys/module/nvidia_peermem").exists() {
        return DeviceMemorySupport::PeerMem;
    }
    DeviceMemorySupport::None
}

impl Drop for Nic {
    fn drop(&mut self) {
        // SAFETY: every QP and MR holds an `Arc<Nic>`, so all are gone; the completion
        // thread has been joined. Reverse order of creation.
        unsafe {
            (self.verbs.ibv_destroy_cq)(self.cq);
            (self.verbs.ibv_destroy_comp_channel)(self.channel);
            (self.verbs.ibv_dealloc_pd)(self.pd);
            (self.verbs.ibv_close_device)(self.ctx);
        }
    }
}

/// Attributes of the RC state walk, capped by what the device reports.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QpParams {
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
}

/// The attribute masks of each step of RESET → INIT → RTR → RTS (RC), as the IB spec
/// requires them (the stand-in refuses any other mask).
pub(crate) mod masks {
    use crate::sys::*;
    use std::ffi::c_int;
    /// RESET → INIT.
    pub const INIT: c_int = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    /// INIT → RTR.
    pub const RTR: c_int = IBV_QP_STATE
        | IBV_QP_AV
        | IBV_QP_PATH_MTU
        | IBV_QP_DEST_QPN
        | IBV_QP_RQ_PSN
        | IBV_QP_MAX_DEST_RD_ATOMIC
        | IBV_QP_MIN_RNR_TIMER;
    /// RTR → RTS.
    pub const RTS: c_int = IBV_QP_STATE
        | IBV_QP_TIMEOUT
        | IBV_QP_RETRY_CNT
        | IBV_QP_RNR_RETRY
        | IBV_QP_SQ_PSN
        | IBV_QP_MAX_QP_RD_ATOMIC;
}

/// One RC queue pair on the shared CQ.
pub(crate) struct Qp {
    pub nic: Arc<Nic>,
    pub raw: *mut ibv_qp,
    pub max_send_wr: u32,
}

// SAFETY: see `Nic`: verbs calls on a QP are thread-safe; the pointer is freed once, in Drop.
unsafe impl Send for Qp {}
// SAFETY: as above.
unsafe impl Sync for Qp {}

impl Qp {
    pub fn create(nic: &Arc<Nic>, max_send_wr: u32) -> Result<Qp> {
        let max_send_wr = max_send_wr.clamp(1, nic.max_qp_wr);
        let mut init = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: nic.cq,
            recv_cq: nic.cq,
            srq: std::ptr::null_mut(),
            cap: ibv_qp_cap {
                max_send_wr,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: `init` is a valid attribute struct naming this NIC's CQ.
        let raw = unsafe { (nic.verbs.ibv_create_qp)(nic.pd, &mut init) };
        if raw.is_null() {
            return Err(verbs_error(
                "ibv_create_qp",
                errno(),
                "creating an RC queue pair",
            ));
        }
        Ok(Qp {
            nic: nic.clone(),
            raw,
            max_send_wr,
        })
    }

    pub fn qpn(&self) -> u32 {
        // SAFETY: live QP.
        unsafe { (*self.raw).qp_num }
    }

    fn modify(&self, attr: &mut ibv_qp_attr, mask: c_int, step: &str) -> Result<()> {
        // SAFETY: live QP, a valid attribute struct.
        let rc = unsafe { (self.nic.verbs.ibv_modify_qp)(self.raw, attr, mask) };
        if rc != 0 {
            let code = if rc > 0 { rc } else { errno() };
            return Err(verbs_error("ibv_modify_qp", code, step));
        }
        Ok(())
    }

    /// RESET → INIT with remote READ and WRITE enabled (each MR's own rights still apply).
    pub fn to_init(&self) -> Result<()> {
        let mut a = ibv_qp_attr {
            qp_state: IBV_QPS_INIT,
            pkey_index: 0,
            port_num: self.nic.port,
            qp_access_flags: (IBV_ACCESS_LOCAL_WRITE
                | IBV_ACCESS_REMOTE_READ
                | IBV_ACCESS_REMOTE_WRITE) as c_uint,
            ..Default::default()
        };
        self.modify(&mut a, masks::INIT, "RESET -> INIT")
    }

    /// INIT → RTR towards `remote`, with path MTU `mtu` (`enum ibv_mtu`).
    pub fn to_rtr(&self, remote: &ConnRecord, mtu: u8) -> Result<()> {
        let mut a = ibv_qp_attr {
            qp_state: IBV_QPS_RTR,
            path_mtu: mtu.into(),
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: self.nic.max_rd_atom,
            min_rnr_timer: 12,
            ..Default::default()
        };
        a.ah_attr.port_num = self.nic.port;
        a.ah_attr.dlid = remote.lid;
        if self.nic.link_layer != IBV_LINK_LAYER_INFINIBAND || remote.lid == 0 {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid = ibv_gid { raw: remote.gid };
            a.ah_attr.grh.sgid_index = self.nic.gid_index;
            a.ah_attr.grh.hop_limit = 64;
        }
        self.modify(&mut a, masks::RTR, "INIT -> RTR")
    }

    /// RTR → RTS sending from `psn`.
    pub fn to_rts(&self, psn: u32, p: &QpParams) -> Result<()> {
        let mut a = ibv_qp_attr {
            qp_state: IBV_QPS_RTS,
            timeout: p.timeout.min(31),
            retry_cnt: p.retry_cnt.min(7),
            rnr_retry: p.rnr_retry.min(7),
            sq_psn: psn,
            max_rd_atomic: self.nic.max_init_rd_atom,
            ..Default::default()
        };
        self.modify(&mut a, masks::RTS, "RTR -> RTS")
    }

    /// The whole walk from RESET to RTS.
    pub fn connect(&self, remote: &ConnRecord, mtu: u8, psn: u32, p: &QpParams) -> Result<()> {
        self.to_init()?;
        self.to_rtr(remote, mtu)?;
        self.to_rts(psn, p)
    }

    /// Any state → ERR: outstanding WRs complete with flush errors.
    pub fn to_err(&self) -> Result<()> {
        let mut a = ibv_qp_attr {
            qp_state: IBV_QPS_ERR,
            ..Default::default()
        };
        self.modify(&mut a, IBV_QP_STATE, "-> ERR")
    }

    /// Any state → RESET, ready for a new walk.
    pub fn to_reset(&self) -> Result<()> {
        let mut a = ibv_qp_attr {
            qp_state: IBV_QPS_RESET,
            ..Default::default()
        };
        self.modify(&mut a, IBV_QP_STATE, "-> RESET")
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_qp, destroyed once; its WRs have completed.
        let rc = unsafe { (self.nic.verbs.ibv_destroy_qp)(self.raw) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_destroy_qp failed; the QP leaks");
        }
    }
}

/// One registered memory region.
pub(crate) struct Mr {
    pub nic: Arc<Nic>,
    pub raw: *mut ibv_mr,
}

// SAFETY: an MR is immutable after registration; freed once, in Drop.
unsafe impl Send for Mr {}
// SAFETY: as above.
unsafe impl Sync for Mr {}

impl Mr {
    /// Registers `len` bytes at `addr` with `access` (`IBV_ACCESS_*`).
    pub fn register(nic: &Arc<Nic>, addr: u64, len: usize, access: c_int) -> Result<Mr> {
        // SAFETY: the caller guarantees the memory stays mapped until the MR drops.
        let raw = unsafe { (nic.verbs.ibv_reg_mr)(nic.pd, addr as *mut _, len, access) };
        if raw.is_null() {
            let code = errno();
            return Err(verbs_error(
                "ibv_reg_mr",
                code,
                &format!("registering {len} bytes at {addr:#x} (locked-memory limit? `ulimit -l`)"),
            ));
        }
        Ok(Mr {
            nic: nic.clone(),
            raw,
        })
    }

    /// Registers `len` bytes of a DMA-BUF at `offset`, seen by peers at `iova`.
    pub fn register_dmabuf(
        nic: &Arc<Nic>,
        fd: c_int,
        offset: u64,
        len: usize,
        iova: u64,
        access: c_int,
    ) -> Result<Mr> {
        let Some(reg) = nic.verbs.ibv_reg_dmabuf_mr else {
            return Err(Error::Unsupported(format!(
                "{} has no ibv_reg_dmabuf_mr (rdma-core 34 or newer has it)",
                nic.verbs.path
            )));
        };
        // SAFETY: `fd` is a DMA-BUF the caller keeps open for the call; the provider takes
        // its own reference.
        let raw = unsafe { reg(nic.pd, offset, len, iova, fd, access) };
        if raw.is_null() {
            return Err(verbs_error(
                "ibv_reg_dmabuf_mr",
                errno(),
                "registering a DMA-BUF",
            ));
        }
        Ok(Mr {
            nic: nic.clone(),
            raw,
        })
    }

    pub fn lkey(&self) -> u32 {
        // SAFETY: live MR.
        unsafe { (*self.raw).lkey }
    }

    pub fn rkey(&self) -> u32 {
        // SAFETY: live MR.
        unsafe { (*self.raw).rkey }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered once, deregistered once; no WR of ours uses it any more.
        let rc = unsafe { (self.nic.verbs.ibv_dereg_mr)(self.raw) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_dereg_mr failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn standin_nic() -> Arc<Nic> {
        static LIB: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
        let lib = LIB.get_or_init(|| {
            let dir = std::env::temp_dir().join(format!("hmc-rdma-nic-{}", std::process::id()));
            hmc_testshim::build_ibverbs_standin(&dir).expect("build the stand-in")
        });
        Nic::open(&NicChoice {
            library: Some(lib),
            device: None,
            port: None,
            gid_index: None,
            cq_depth: 1024,
        })
        .expect("open the stand-in's device")
    }

    fn params() -> QpParams {
        QpParams {
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
        }
    }

    #[test]
    fn the_qp_walk_follows_the_rc_state_machine_and_refuses_shortcuts() {
        let nic = standin_nic();
        // RoCE v2, IPv4-mapped, chosen over the v1 link-local entry at index 0.
        assert_eq!(nic.gid_index, 1);
        assert_eq!(&nic.gid[10..12], &[0xff, 0xff]);
        let a = Qp::create(&nic, 16).unwrap();
        let b = Qp::create(&nic, 16).unwrap();
        let ra = nic.record(a.qpn(), 100, 5);
        let rb = nic.record(b.qpn(), 200, 5);
        // RESET -> RTR skips INIT: refused.
        assert!(a.to_rtr(&rb, 5).is_err());
        a.to_init().unwrap();
        // INIT -> RTS skips RTR: refused.
        assert!(a.to_rts(100, &params()).is_err());
        // A path MTU above the port's active MTU: refused.
        let mut big = ibv_qp_attr {
            qp_state: IBV_QPS_RTR,
            path_mtu: 6,
            ..Default::default()
        };
        assert!(a.modify(&mut big, masks::RTR, "test").is_err());
        // INIT -> RTR without the address vector: refused (mask check).
        let mut no_av = ibv_qp_attr {
            qp_state: IBV_QPS_RTR,
            path_mtu: 5,
            ..Default::default()
        };
        assert!(
            a.modify(&mut no_av, masks::RTR & !IBV_QP_AV, "test")
                .is_err()
        );
        a.to_rtr(&rb, 5).unwrap();
        a.to_rts(100, &params()).unwrap();
        b.connect(&ra, 5, 200, &params()).unwrap();
        // ERR and back through RESET to RTS: how a QP is re-established.
        a.to_err().unwrap();
        a.to_reset().unwrap();
        a.connect(&rb, 5, 300, &params()).unwrap();
    }

    #[test]
    fn registrations_get_distinct_local_and_remote_keys() {
        let nic = standin_nic();
        let mut buf = vec![0u8; 4096];
        let mr = Mr::register(
            &nic,
            buf.as_mut_ptr() as u64,
            buf.len(),
            IBV_ACCESS_LOCAL_WRITE,
        )
        .unwrap();
        let other =
            Mr::register(&nic, buf.as_mut_ptr() as u64, 16, IBV_ACCESS_LOCAL_WRITE).unwrap();
        assert_ne!(mr.lkey(), mr.rkey());
        assert_ne!(mr.rkey(), other.rkey());
        // Remote write without local write is invalid (IB spec), and says so.
        let err = Mr::register(&nic, buf.as_mut_ptr() as u64, 16, IBV_ACCESS_REMOTE_WRITE)
            .err()
            .unwrap();
        assert!(err.to_string().contains("ibv_reg_mr"), "{err}");
    }

    /// Posts one signalled WR and polls for its completion (the stand-in completes it from
    /// its own thread).
    fn post_and_wait(
        nic: &Nic,
        qp: &Qp,
        op: u32,
        local: (u64, u32, u32),
        remote: (u64, u32),
    ) -> ibv_wc {
        let mut sge = ibv_sge {
            addr: local.0,
            length: local.1,
            lkey: local.2,
        };
        let mut wr = ibv_send_wr {
            wr_id: 7,
            sg_list: &mut sge,
            num_sge: 1,
            opcode: op,
            send_flags: IBV_SEND_SIGNALED,
            ..Default::default()
        };
        wr.rdma.remote_addr = remote.0;
        wr.rdma.rkey = remote.1;
        let mut bad = std::ptr::null_mut();
        // SAFETY: a live QP in RTS; the WR and its SGE outlive the call; registered memory.
        assert_eq!(unsafe { nic.verbs.post_send(qp.raw, &mut wr, &mut bad) }, 0);
        let mut wc = ibv_wc::default();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        // SAFETY: the NIC's CQ; room for one entry.
        while unsafe { nic.verbs.poll_cq(nic.cq, 1, &mut wc) } == 0 {
            assert!(std::time::Instant::now() < until, "no completion");
            std::thread::yield_now();
        }
        wc
    }

    #[test]
    fn the_nic_enforces_remote_rights_and_flushes_after_an_error() {
        let nic = standin_nic();
        let (a, b) = (Qp::create(&nic, 16).unwrap(), Qp::create(&nic, 16).unwrap());
        a.connect(&nic.record(b.qpn(), 1, 5), 5, 2, &params())
            .unwrap();
        b.connect(&nic.record(a.qpn(), 2, 5), 5, 1, &params())
            .unwrap();
        let mut src = vec![1u8; 64];
        let mut dst = vec![0u8; 64];
        let local =
            Mr::register(&nic, src.as_mut_ptr() as u64, 64, IBV_ACCESS_LOCAL_WRITE).unwrap();
        let read_only = Mr::register(
            &nic,
            dst.as_mut_ptr() as u64,
            64,
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ,
        )
        .unwrap();
        let l = (src.as_ptr() as u64, 64, local.lkey());
        let r = (dst.as_ptr() as u64, read_only.rkey());
        // READ is allowed.
        let wc = post_and_wait(&nic, &a, IBV_WR_RDMA_READ, l, r);
        assert_eq!((wc.status, wc.wr_id), (IBV_WC_SUCCESS, 7));
        // WRITE is not: a remote access error, and the bytes stay.
        let wc = post_and_wait(&nic, &a, IBV_WR_RDMA_WRITE, l, r);
        assert_eq!(wc.status, IBV_WC_REM_ACCESS_ERR);
        assert!(dst.iter().all(|&x| x == 0));
        // The requester's QP is in ERR now: what follows is flushed, not executed.
        let wc = post_and_wait(&nic, &a, IBV_WR_RDMA_READ, l, r);
        assert_eq!(wc.status, IBV_WC_WR_FLUSH_ERR);
        // An rkey nobody registered: a remote access error too (after re-establishing).
        a.to_reset().unwrap();
        b.to_reset().unwrap();
        a.connect(&nic.record(b.qpn(), 3, 5), 5, 4, &params())
            .unwrap();
        b.connect(&nic.record(a.qpn(), 4, 5), 5, 3, &params())
            .unwrap();
        let wc = post_and_wait(&nic, &a, IBV_WR_RDMA_READ, l, (r.0, r.1 ^ 0x100));
        assert_eq!(wc.status, IBV_WC_REM_ACCESS_ERR);
    }
}
