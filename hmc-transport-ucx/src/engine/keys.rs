//! Registrations and remote keys: mapping and unmapping local memory, importing and
//! destroying peers' packed rkeys.

use super::*;

impl State {
    pub(super) fn register(
        &mut self,
        addr: u64,
        len: usize,
        access: Access,
        allocate: bool,
    ) -> Result<Registered> {
        let mut prot = sys::UCP_MEM_MAP_PROT_LOCAL_READ | sys::UCP_MEM_MAP_PROT_LOCAL_WRITE;
        if access.allows(Access::READ) {
            prot |= sys::UCP_MEM_MAP_PROT_REMOTE_READ;
        }
        if access.allows(Access::WRITE) {
            prot |= sys::UCP_MEM_MAP_PROT_REMOTE_WRITE;
        }
        // SAFETY: all-zero is valid; flagged fields set below.
        let mut p: sys::ucp_mem_map_params_t = unsafe { std::mem::zeroed() };
        p.field_mask = sys::UCP_MEM_MAP_PARAM_FIELD_ADDRESS
            | sys::UCP_MEM_MAP_PARAM_FIELD_LENGTH
            | sys::UCP_MEM_MAP_PARAM_FIELD_PROT;
        p.address = if allocate {
            std::ptr::null_mut()
        } else {
            addr as *mut c_void
        };
        if allocate {
            p.field_mask |= sys::UCP_MEM_MAP_PARAM_FIELD_FLAGS;
            p.flags = sys::UCP_MEM_MAP_ALLOCATE;
        }
        // UCX refuses zero-length maps; a zero-length region maps one byte it never moves.
        p.length = len.max(1);
        p.prot = prot;
        let mut memh: sys::ucp_mem_h = std::ptr::null_mut();
        // SAFETY: the caller of `Communicator::register` promised the region stays allocated
        // (or UCX allocates it and owns it until unmap).
        let st = unsafe { (self.ucp.ucp_mem_map)(self.context, &p, &mut memh) };
        self.ucp.check("ucp_mem_map", st)?;
        let mut mapped = addr;
        if allocate {
            let mut attr = sys::ucp_mem_attr_t {
                field_mask: sys::UCP_MEM_ATTR_FIELD_ADDRESS | sys::UCP_MEM_ATTR_FIELD_LENGTH,
                address: std::ptr::null_mut(),
                length: 0,
                mem_type: 0,
            };
            // SAFETY: live memh; out-parameter.
            let st = unsafe { (self.ucp.ucp_mem_query)(memh, &mut attr) };
            if st != sys::UCS_OK || attr.address.is_null() || attr.length < len {
                // SAFETY: unmapping the handle just mapped.
                unsafe { (self.ucp.ucp_mem_unmap)(self.context, memh) };
                return Err(self.ucp.error("ucp_mem_query", st));
            }
            mapped = attr.address as u64;
        }
        let mut buf: *mut c_void = std::ptr::null_mut();
        let mut size = 0usize;
        // SAFETY: live context and memh; out-parameters.
        let st = unsafe { (self.ucp.ucp_rkey_pack)(self.context, memh, &mut buf, &mut size) };
        if st != sys::UCS_OK {
            // SAFETY: unmapping the handle just mapped.
            unsafe { (self.ucp.ucp_mem_unmap)(self.context, memh) };
            return Err(self.ucp.error("ucp_rkey_pack", st));
        }
        // SAFETY: UCX returned `size` bytes at `buf`; copied and released once.
        let rkey = unsafe { std::slice::from_raw_parts(buf as *const u8, size) }.to_vec();
        // SAFETY: as above.
        unsafe { (self.ucp.ucp_rkey_buffer_release)(buf) };
        let id = self.id();
        self.mems.insert(id, memh);
        Ok(Registered {
            id,
            rkey,
            addr: mapped,
        })
    }

    /// Unmaps a registration. Over transports that emulate RMA with messages (TCP, posix
    /// shared memory), a peer's put is applied by *our* progress; draining progress first
    /// applies everything already queued while the memory is still mapped.
    pub(super) fn unmap(&mut self, id: u64) {
        let Some(memh) = self.mems.remove(&id) else {
            return;
        };
        while self.progress_allowed() && self.progress() {}
        // The first unmap after close() ends the drain for good (see `progress_allowed`),
        // so settle the worker first, while this memory is still mapped: in the drain, or
        // where progress is allowed anyway (our own endpoints still closing).
        if self.closed_by_user && self.unsettled {
            let drain = self.close_drain.take();
            if let Some(until) = drain.or_else(|| {
                self.progress_allowed()
                    .then(|| Instant::now() + SETTLE_LIMIT)
            }) {
                self.unsettled = !self.progress_until_quiet(until);
            }
        }
        // SAFETY: `memh` came from `ucp_mem_map` on this context and is unmapped exactly
        // once (removed from the table).
        let st = unsafe { (self.ucp.ucp_mem_unmap)(self.context, memh) };
        if st != sys::UCS_OK {
            tracing::warn!(status = %self.ucp.status_string(st), "ucp_mem_unmap failed");
        }
        if self.closed_by_user {
            // Revocation cannot reach peers after close(): from now on their queued writes
            // may target memory the application frees, so they must never be applied.
            self.unmapped_after_close = true;
            self.close_drain = None;
        }
    }

    pub(super) fn import_key(
        &mut self,
        ep: u64,
        reg_id: u64,
        rkey: &[u8],
        shared: Arc<KeyShared>,
    ) -> Result<u64> {
        let handle = match self.eps.get(&ep) {
            Some(e) if e.phase == EpPhase::Open => e.handle,
            _ => return Err(self.ep_error(ep)),
        };
        let mut out: sys::ucp_rkey_h = std::ptr::null_mut();
        // SAFETY: live endpoint; `rkey` is a buffer the target produced with `ucp_rkey_pack`
        // and confirmed byte for byte over the control connection (see `control.rs`), so
        // UCX never parses bytes the owner did not pack.
        let st = unsafe {
            (self.ucp.ucp_ep_rkey_unpack)(handle, rkey.as_ptr() as *const c_void, &mut out)
        };
        if st != sys::UCS_OK {
            return Err(Error::InvalidKey(format!(
                "ucp_ep_rkey_unpack refused the key: {}",
                self.ucp.status_string(st)
            )));
        }
        if self.cfg.direct_mapped {
            let mut local: *mut c_void = std::ptr::null_mut();
            // SAFETY: `out` was just unpacked on this thread; out-parameter. UCX answers
            // UCS_OK only when the region is mapped into this process (shared memory
            // allocated by UCX at the target); the mapping lives until `ucp_rkey_destroy`.
            let st = unsafe { (self.ucp.ucp_rkey_ptr)(out, shared.remote_base, &mut local) };
            if st == sys::UCS_OK && !local.is_null() {
                shared.mapped.store(local as u64, Ordering::Release);
            }
        }
        let id = self.id();
        self.keys.insert(
            id,
            KeyState {
                ep,
                reg_id,
                rkey: out,
                inflight: 0,
                shared,
            },
        );
        self.eps.get_mut(&ep).expect("checked").keys.push(id);
        Ok(id)
    }

    pub(super) fn destroy_rkey(&self, k: KeyState) {
        k.shared.revoke_and_drain();
        if !k.rkey.is_null() {
            // SAFETY: unpacked on this thread, no request uses it (inflight == 0 or the
            // endpoint has drained), destroyed once (the entry is consumed).
            unsafe { (self.ucp.ucp_rkey_destroy)(k.rkey) };
        }
    }
}
