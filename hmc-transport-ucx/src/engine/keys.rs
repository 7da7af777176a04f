//! Registrations and remote keys: mapping and unmapping local memory, importing and
//! destroying peers' packed rkeys, and the revocations waiting for a key's requests to end.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use hmc_core::{Access, Error, Result};

use super::requests::Ack;
use super::{KeyShared, Registered, State};
use crate::sys;

/// A peer's key imported on one of our endpoints.
pub(super) struct KeyState {
    pub ep: u64,
    /// The registration at the target it names.
    pub reg_id: u64,
    pub rkey: sys::ucp_rkey_h,
    /// The key as the target packed it, to unpack again on a new endpoint generation.
    pub packed: Vec<u8>,
    /// Chunks in flight through it.
    pub inflight: usize,
    pub shared: Arc<KeyShared>,
}

/// Our registrations and the keys we imported.
#[derive(Default)]
pub(super) struct Keys {
    /// Our memory maps by registration id.
    pub mems: HashMap<u64, sys::ucp_mem_h>,
    /// Imported keys by id.
    pub imported: HashMap<u64, KeyState>,
    /// Revocations (endpoint, registration, confirmation) confirmed once no request and no
    /// direct copy uses the key any more.
    pub pending_acks: Vec<(u64, u64, Ack)>,
}

impl Keys {
    /// Marks every key of registration `reg_id` imported on `ep` revoked.
    pub fn revoke(&self, ep: u64, reg_id: u64) {
        for k in self.imported.values() {
            if k.ep == ep && k.reg_id == reg_id {
                k.shared.revoke();
            }
        }
    }

    /// Whether a key of registration `reg_id` on `ep` is still in use (requests in flight
    /// or direct copies running).
    pub fn in_use(&self, ep: u64, reg_id: u64) -> bool {
        self.imported.values().any(|k| {
            k.ep == ep
                && k.reg_id == reg_id
                && (k.inflight > 0 || k.shared.direct_busy.load(Ordering::SeqCst) > 0)
        })
    }
}

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
        self.keys.mems.insert(id, memh);
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
        let Some(memh) = self.keys.mems.remove(&id) else {
            return;
        };
        while self.progress_allowed() && self.progress() {}
        // The first unmap after close() ends the drain for good (see `progress_allowed`),
        // so settle the worker first, while this memory is still mapped.
        let endpoints_left = !self.eps.phys.is_empty();
        if let Some(until) = self
            .life
            .settle_before_unmap(Instant::now(), endpoints_left)
        {
            self.life.unsettled = !self.progress_until_quiet(until);
        }
        // SAFETY: `memh` came from `ucp_mem_map` on this context and is unmapped exactly
        // once (removed from the table).
        let st = unsafe { (self.ucp.ucp_mem_unmap)(self.context, memh) };
        if st != sys::UCS_OK {
            tracing::warn!(status = %self.ucp.status_string(st), "ucp_mem_unmap failed");
        }
        self.life.unmapped();
    }

    pub(super) fn import_key(
        &mut self,
        ep: u64,
        reg_id: u64,
        rkey: &[u8],
        shared: Arc<KeyShared>,
    ) -> Result<u64> {
        let Some(handle) = self.eps.open_handle(ep) else {
            return Err(self.eps.error(ep));
        };
        let out = self.unpack(handle, rkey, &shared)?;
        let id = self.id();
        self.keys.imported.insert(
            id,
            KeyState {
                ep,
                reg_id,
                rkey: out,
                packed: rkey.to_vec(),
                inflight: 0,
                shared,
            },
        );
        self.eps.by_id.get_mut(&ep).expect("checked").keys.push(id);
        Ok(id)
    }

    /// Unpacks `rkey` on `handle` and records UCX's local mapping of the region in
    /// `shared` when there is one.
    fn unpack(
        &self,
        handle: sys::ucp_ep_h,
        rkey: &[u8],
        shared: &KeyShared,
    ) -> Result<sys::ucp_rkey_h> {
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
        if self.cfg.tunables.direct_mapped {
            let mut local: *mut c_void = std::ptr::null_mut();
            // SAFETY: `out` was just unpacked on this thread; out-parameter. UCX answers
            // UCS_OK only when the region is mapped into this process (shared memory
            // allocated by UCX at the target); the mapping lives until `ucp_rkey_destroy`.
            let st = unsafe { (self.ucp.ucp_rkey_ptr)(out, shared.remote_base, &mut local) };
            if st == sys::UCS_OK && !local.is_null() {
                shared.mapped.store(local as u64, Ordering::Release);
            }
        }
        Ok(out)
    }

    /// Unpacks key `key` again on `handle`, a new generation of its endpoint, and
    /// destroys the old rkey (whose endpoint was force-closed: no request uses it).
    pub(super) fn unpack_again(&mut self, key: u64, handle: sys::ucp_ep_h) -> Result<()> {
        let Some(k) = self.keys.imported.get(&key) else {
            return Ok(());
        };
        let (old, packed, shared) = (k.rkey, k.packed.clone(), k.shared.clone());
        // A direct copy through the old mapping may be running: no new one starts, and
        // the old rkey goes only once the running ones ended.
        shared.mapped.store(0, Ordering::Release);
        while shared.direct_busy.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
        if !old.is_null() {
            // SAFETY: unpacked on this thread; its endpoint was force-closed, which
            // completed every request using it; destroyed once (replaced below).
            unsafe { (self.ucp.ucp_rkey_destroy)(old) };
        }
        let fresh = self.unpack(handle, &packed, &shared);
        let k = self.keys.imported.get_mut(&key).expect("present");
        k.rkey = *fresh.as_ref().unwrap_or(&std::ptr::null_mut());
        fresh.map(|_| ())
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
