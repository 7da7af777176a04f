//! The engine thread's loop: creating the context and worker, draining commands,
//! progressing the worker, handling completion events, housekeeping (deadlines, lingering
//! endpoints, revocation acks), parking on the event fd, and the settling shutdown.

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use hmc_core::{Error, Result};
use hmc_transport_kit::wake::poll_in;

use super::callbacks::{AM_ID, Event, GEN_AM_ID, clear_events, on_am, on_gen_am, take_events};
use super::endpoints::{Endpoints, EpPhase};
use super::generations::{PeerGens, StallClock};
use super::keys::Keys;
use super::lifecycle::{Lifecycle, SETTLE_LIMIT};
use super::notifications::Notes;
use super::requests::{Owner, Requests};
use super::transfers::Transfers;
use super::{Command, EngineConfig, LEAKED_WORKERS, Links, State};
use crate::sys::{self, Ucp};

impl State {
    pub(super) fn new(
        ucp: Arc<Ucp>,
        cfg: EngineConfig,
        links: Links,
        ep_count: Arc<AtomicUsize>,
    ) -> Result<State> {
        let config = read_config(&ucp, &cfg)?;
        let context = init_context(&ucp, &cfg, config)?;
        let memory_types = context_memory_types(&ucp, context);
        let (worker, efd, worker_address) = create_worker(&ucp, &cfg, context)?;
        let (abandoned_tx, abandoned_rx) = mpsc::channel();
        Ok(State {
            eps: Endpoints::new(ep_count),
            keys: Keys::default(),
            ops: Transfers::new(),
            reqs: Requests::default(),
            notes: Notes::new(cfg.tunables.max_pending_notifications),
            life: Lifecycle::new(Instant::now()),
            ucp,
            cfg,
            context,
            worker,
            efd,
            wake: links.wake,
            abandoned_tx,
            abandoned_rx,
            control: links.control,
            gens: PeerGens::default(),
            stall: StallClock::new(),
            worker_address,
            memory_types,
            next_id: 1,
        })
    }

    pub(super) fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    pub(super) fn run(&mut self, rx: mpsc::Receiver<Command>) {
        let mut last_event = Instant::now();
        loop {
            let mut busy = false;
            loop {
                match rx.try_recv() {
                    Ok(cmd) => {
                        busy = true;
                        self.command(cmd);
                    }
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        self.shutdown();
                        return;
                    }
                }
            }
            while self.progress_allowed() && self.progress() {
                busy = true;
            }
            self.check_settled();
            busy |= self.handle_events();
            self.housekeeping();
            if busy {
                last_event = Instant::now();
                continue;
            }
            if last_event.elapsed() < self.cfg.tunables.spin
                || (self.efd < 0 && self.reqs.any_live())
            {
                // Without an event fd nothing would wake us for in-flight requests.
                std::hint::spin_loop();
                continue;
            }
            self.park();
            last_event = Instant::now() - self.cfg.tunables.spin / 2;
        }
    }

    /// Arms the worker and sleeps until it, a command, or the nearest deadline wakes us.
    pub(super) fn park(&mut self) {
        let progress = self.progress_allowed();
        // SAFETY: live worker on its own thread.
        if progress
            && self.efd >= 0
            && unsafe { (self.ucp.ucp_worker_arm)(self.worker) } == sys::UCS_ERR_BUSY
        {
            return;
        }
        let now = Instant::now();
        let mut until = now + self.cfg.tunables.park_max;
        for op in self.ops.values() {
            until = until.min(op.deadline);
            // An endpoint being abandoned wakes us with its answer, not at its drain limit.
            if let Some(t) = op.failed_at
                && !self.eps.abandoning(op.ep)
            {
                until = until.min(t + self.cfg.tunables.drain_timeout);
            }
        }
        if let Some(d) = self.notes.next_deadline() {
            until = until.min(d);
        }
        if let Some(t) = self.life.wake_by() {
            until = until.min(t);
        }
        if !self.keys.pending_acks.is_empty() {
            // A revocation may wait for direct copies (`KeyShared::direct_busy`), whose end
            // wakes nobody: look again soon.
            until = until.min(now + Duration::from_millis(1));
        }
        // A negative fd is skipped by poll(2). The wait cannot fail on valid descriptors;
        // were it to, the loop looks again at once, as after a wake.
        let worker_fd = if progress { self.efd } else { -1 };
        let wait = until.saturating_duration_since(now);
        self.stall.mark = now;
        self.stall.allowed = wait;
        let wait = Some(wait);
        let ready = poll_in([worker_fd, self.wake.as_raw_fd()], wait).unwrap_or([0; 2]);
        if ready[1] != 0 {
            self.wake.drain();
        }
    }

    /// One `ucp_worker_progress`; whether it did anything (see [`Lifecycle::progressed`]).
    pub(super) fn progress(&mut self) -> bool {
        self.before_progress();
        // SAFETY: the worker is live and only used on this thread.
        let did = unsafe { (self.ucp.ucp_worker_progress)(self.worker) } != 0;
        self.stall.mark = Instant::now();
        self.stall.allowed = Duration::ZERO;
        if did {
            self.life.progressed(Instant::now());
        }
        did
    }

    /// Ends the post-`close()` drain when it settled or gave up.
    pub(super) fn check_settled(&mut self) {
        self.life.check_settled(Instant::now());
    }

    /// Whether the worker may be progressed ([`Lifecycle::progress_allowed`]).
    pub(super) fn progress_allowed(&self) -> bool {
        self.life.progress_allowed(!self.eps.phys.is_empty())
    }

    pub(super) fn handle_events(&mut self) -> bool {
        let events = take_events();
        let any = !events.is_empty();
        for ev in events {
            match ev {
                Event::Req { slot, status } => self.request_done(slot, status),
                Event::EpError { ep, status } => {
                    let reason = format!(
                        "UCX reported an endpoint error: {}",
                        self.ucp.status_string(status)
                    );
                    self.phys_failed(ep, reason);
                }
                Event::Note(n) => self.notes.arrived(n),
                Event::Bind { token, reply_ep } => self.bind_arrived(token, reply_ep),
                Event::Bound { token } => self.bound_arrived(token),
            }
        }
        if any {
            self.notes.deliver();
        }
        any
    }

    /// Deadlines, drain limits, revocation acknowledgements, notification waiters.
    pub(super) fn housekeeping(&mut self) {
        while let Ok((pid, confirmed)) = self.abandoned_rx.try_recv() {
            self.abandoned(pid, confirmed);
        }
        let now = Instant::now();
        self.end_overdue_transfers(now);
        let eps: Vec<u64> = self
            .eps
            .by_id
            .iter()
            .filter(|(_, e)| {
                e.phase == EpPhase::Draining
                    && e.drain_since
                        .is_some_and(|t| now >= t + self.cfg.tunables.drain_timeout)
            })
            .map(|(i, _)| *i)
            .collect();
        for ep in eps {
            self.advance_ep(ep);
        }
        if let Some(t) = now.checked_sub(self.cfg.tunables.ep_linger) {
            self.close_idle_phys(Some(t));
        }
        self.expire_notify_sends(now);
        self.confirm_drained_revocations();
        self.notes.expire(now);
    }

    /// Fails the transfers past their deadline, and abandons (else closes) the endpoints
    /// of failed ones that did not drain within `drain_timeout`.
    fn end_overdue_transfers(&mut self, now: Instant) {
        let mut expired = Vec::new();
        let mut stuck = Vec::new();
        for (id, op) in &self.ops {
            if op.failure.is_none() && now >= op.deadline {
                expired.push(*id);
            }
            if op
                .failed_at
                .is_some_and(|t| now >= t + self.cfg.tunables.drain_timeout)
            {
                stuck.push(op.ep);
            }
        }
        for id in expired {
            let op = self.ops.get_mut(&id).expect("present");
            op.failure = Some(Error::DeadlineExceeded {
                during: "ucx transfer",
                elapsed: op.started.elapsed(),
            });
            op.failed_at = Some(now);
            self.cancel_requests_of(id);
            self.pump(id);
        }
        for ep in stuck {
            // The target holds what was sent and does not take it: have it drop that
            // generation and start a new one (`generations`), else close the endpoint.
            if self.abandon(ep) {
                continue;
            }
            tracing::warn!(
                ep,
                "a cancelled ucx transfer did not drain within drain_timeout; force-closing its endpoint"
            );
            self.begin_ep_close(
                ep,
                Some("a cancelled transfer did not drain within drain_timeout".into()),
                true,
            );
            if let Some(e) = self.eps.by_id.get_mut(&ep) {
                e.drain_since = Some(now - self.cfg.tunables.drain_timeout);
            }
            self.advance_ep(ep);
        }
    }

    /// Answers the notification sends past their deadline.
    fn expire_notify_sends(&mut self, now: Instant) {
        // Notify deadlines: the bytes are our own copy, so answering early is safe.
        for rec in self.reqs.iter_mut() {
            if let Owner::Notify {
                reply, deadline, ..
            } = &mut rec.owner
                && now >= *deadline
                && let Some(r) = reply.take()
            {
                let _ = r.send(Err(Error::DeadlineExceeded {
                    during: "ucx notify",
                    elapsed: Duration::ZERO,
                }));
            }
        }
    }

    /// Confirms the key revocations whose keys nothing uses any more, once the endpoint
    /// was flushed.
    fn confirm_drained_revocations(&mut self) {
        if !self.keys.pending_acks.is_empty() {
            let mut i = 0;
            while i < self.keys.pending_acks.len() {
                let (ep, reg_id, _) = &self.keys.pending_acks[i];
                if self.keys.in_use(*ep, *reg_id) {
                    i += 1;
                } else {
                    let (ep, _, ack) = self.keys.pending_acks.swap_remove(i);
                    self.flush_then(ep, ack);
                }
            }
        }
    }

    pub(super) fn shutdown(&mut self) {
        self.life.closed = true;
        let ids: Vec<u64> = self.eps.by_id.keys().copied().collect();
        for ep in ids {
            if let Some(e) = self.eps.by_id.get_mut(&ep) {
                e.released = true;
            }
            self.begin_ep_close(ep, Some("the communicator was dropped".into()), false);
        }
        self.close_idle_phys(None);
        let until = Instant::now() + Duration::from_secs(2);
        while !(self.eps.by_id.is_empty() && self.eps.phys.is_empty()) && Instant::now() < until {
            self.progress();
            self.handle_events();
            self.housekeeping();
        }
        let quiet = self.settled();
        for (_, k) in std::mem::take(&mut self.keys.imported) {
            self.destroy_rkey(k);
        }
        for (_, memh) in std::mem::take(&mut self.keys.mems) {
            // SAFETY: a mapping of this context, unmapped once.
            unsafe { (self.ucp.ucp_mem_unmap)(self.context, memh) };
        }
        if quiet {
            // SAFETY: nothing refers to the worker or context any more, and the worker
            // holds no send (see `settled`); destroyed once.
            unsafe {
                (self.ucp.ucp_worker_destroy)(self.worker);
                (self.ucp.ucp_cleanup)(self.context);
            }
        } else {
            // `ucp_worker_destroy` purges the sends still queued in the worker, and UCX 1.13
            // crashes purging its own GET replies (it reads a memory handle it never set).
            // Leaking one worker is the lesser harm; it is never progressed again.
            tracing::warn!(
                name = %self.cfg.name,
                "the UCX worker still held sends to peers that stopped reading; leaking the \
                 worker and context instead of destroying them (UCX 1.13 crashes purging them)"
            );
            LEAKED_WORKERS.fetch_add(1, Ordering::Relaxed);
        }
        clear_events();
    }

    /// Whether the worker may be destroyed: nothing it did since `close()` can have left a
    /// send queued in it. UCX offers no way to ask (`ucp_worker_flush_nbx` completes at
    /// once over shared memory whatever is queued), so the rule is progress that stayed
    /// quiet for [`SETTLE_QUIET`](super::lifecycle::SETTLE_QUIET) after the last work. Where the drain after `close()`
    /// ended unsettled, tear-down progresses the worker again, for at most
    /// [`SETTLE_LIMIT`], if that is safe: no registration was unmapped after `close()`
    /// (every earlier unmap revoked its key at the peers first), or the worker was
    /// progressed after such an unmap anyway, to close its own endpoints
    /// ([`State::progress_allowed`]); then it goes on until the worker is quiet.
    pub(super) fn settled(&mut self) -> bool {
        if !self.life.unsettled {
            return true;
        }
        if !self.life.may_settle_at_teardown() {
            return false;
        }
        let settled = self.progress_until_quiet(Instant::now() + SETTLE_LIMIT);
        self.life.unsettled = !settled;
        settled
    }

    /// Progresses the worker until it has been quiet for [`SETTLE_QUIET`](super::lifecycle::SETTLE_QUIET) (true) or
    /// `until` passes (false).
    pub(super) fn progress_until_quiet(&mut self, until: Instant) -> bool {
        loop {
            if self.life.quiet(Instant::now()) {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            self.progress();
            self.handle_events();
            std::thread::yield_now();
        }
    }
}

/// The memory types `context` moves (`ucs_memory_type_t` bits): what this UCX was built
/// with and could start (a CUDA module needs the driver). Host only when UCX cannot say.
fn context_memory_types(ucp: &Ucp, context: sys::ucp_context_h) -> u64 {
    // SAFETY: all-zero is a valid attribute block; only the flagged field is written.
    let mut attr: sys::ucp_context_attr_t = unsafe { std::mem::zeroed() };
    attr.field_mask = sys::UCP_ATTR_FIELD_MEMORY_TYPES;
    // SAFETY: a live context and an attribute block of at least the declared size.
    let st = unsafe { (ucp.ucp_context_query)(context, &mut attr) };
    if st == sys::UCS_OK {
        attr.memory_types
    } else {
        tracing::debug!(status = %ucp.status_string(st), "ucp_context_query failed: host memory only");
        1 << sys::UCS_MEMORY_TYPE_HOST
    }
}

/// UCX's configuration from its environment, with the communicator's soft options (those
/// UCX may ignore) and the caller's options (refused by name when UCX rejects one) applied.
fn read_config(ucp: &Ucp, cfg: &EngineConfig) -> Result<*mut sys::ucp_config_t> {
    let mut config: *mut sys::ucp_config_t = std::ptr::null_mut();
    // SAFETY: out-parameter; NULL prefix/file mean "UCX_ environment, no file".
    let st = unsafe { (ucp.ucp_config_read)(std::ptr::null(), std::ptr::null(), &mut config) };
    ucp.check("ucp_config_read", st)?;
    for (k, v) in &cfg.soft_options {
        if let (Ok(ck), Ok(cv)) = (CString::new(k.as_str()), CString::new(v.as_str())) {
            // SAFETY: valid config handle and NUL-terminated strings.
            let st = unsafe { (ucp.ucp_config_modify)(config, ck.as_ptr(), cv.as_ptr()) };
            if st != sys::UCS_OK {
                tracing::debug!(option = %k, status = %ucp.status_string(st), "UCX ignored a default option");
            }
        }
    }
    for (k, v) in &cfg.ucx_options {
        let refused = match (CString::new(k.as_str()), CString::new(v.as_str())) {
            (Ok(ck), Ok(cv)) => {
                // SAFETY: valid config handle and NUL-terminated strings.
                let st = unsafe { (ucp.ucp_config_modify)(config, ck.as_ptr(), cv.as_ptr()) };
                (st != sys::UCS_OK).then(|| {
                    format!(
                        "UCX rejected option {k}={v}: {} (names are UCX variables without the UCX_ prefix, e.g. TLS)",
                        ucp.status_string(st)
                    )
                })
            }
            _ => Some(format!("UCX option {k}={v} contains NUL")),
        };
        if let Some(why) = refused {
            // SAFETY: `config` came from `ucp_config_read` and is released once.
            unsafe { (ucp.ucp_config_release)(config) };
            return Err(Error::InvalidArgument(why));
        }
    }
    Ok(config)
}

/// The UCP context (RMA and active messages, and wake-ups when configured); releases
/// `config` either way.
fn init_context(
    ucp: &Ucp,
    cfg: &EngineConfig,
    config: *mut sys::ucp_config_t,
) -> Result<sys::ucp_context_h> {
    let name = CString::new(cfg.name.clone()).unwrap_or_default();
    // SAFETY: all-zero is a valid parameter block; we set the fields we flag.
    let mut params: sys::ucp_params_t = unsafe { std::mem::zeroed() };
    params.field_mask = sys::UCP_PARAM_FIELD_FEATURES | sys::UCP_PARAM_FIELD_NAME;
    params.features = sys::UCP_FEATURE_RMA | sys::UCP_FEATURE_AM;
    if cfg.tunables.wakeup {
        params.features |= sys::UCP_FEATURE_WAKEUP;
    }
    params.name = name.as_ptr();
    let mut context: sys::ucp_context_h = std::ptr::null_mut();
    // SAFETY: valid params and config; out-parameter.
    let st = unsafe {
        (ucp.ucp_init_version)(
            sys::API_MAJOR,
            sys::API_MINOR,
            &params,
            config,
            &mut context,
        )
    };
    // SAFETY: `config` came from `ucp_config_read` and is released once.
    unsafe { (ucp.ucp_config_release)(config) };
    ucp.check("ucp_init", st)?;
    Ok(context)
}

/// The single-threaded worker on `context`, its event fd (-1 without wake-ups), its
/// address as peers need it, and the notification handler installed. On failure the
/// context is cleaned up too.
fn create_worker(
    ucp: &Ucp,
    cfg: &EngineConfig,
    context: sys::ucp_context_h,
) -> Result<(sys::ucp_worker_h, i32, Vec<u8>)> {
    // SAFETY: all-zero is a valid parameter block; we set the fields we flag.
    let mut wp: sys::ucp_worker_params_t = unsafe { std::mem::zeroed() };
    wp.field_mask = sys::UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    if cfg.tunables.wakeup {
        wp.field_mask |= sys::UCP_WORKER_PARAM_FIELD_EVENTS;
    }
    wp.thread_mode = sys::UCS_THREAD_MODE_SINGLE;
    wp.events = sys::UCP_WAKEUP_RMA | sys::UCP_WAKEUP_TX | sys::UCP_WAKEUP_RX;
    let mut worker: sys::ucp_worker_h = std::ptr::null_mut();
    // SAFETY: live context, valid params.
    let st = unsafe { (ucp.ucp_worker_create)(context, &wp, &mut worker) };
    if st != sys::UCS_OK {
        // SAFETY: context is live and unused elsewhere.
        unsafe { (ucp.ucp_cleanup)(context) };
        return Err(ucp.error("ucp_worker_create", st));
    }
    let cleanup = |e: Error| {
        // SAFETY: both handles are live and owned here.
        unsafe {
            (ucp.ucp_worker_destroy)(worker);
            (ucp.ucp_cleanup)(context);
        }
        e
    };
    let mut efd = -1;
    if cfg.tunables.wakeup {
        // SAFETY: live worker; out-parameter.
        let st = unsafe { (ucp.ucp_worker_get_efd)(worker, &mut efd) };
        if st != sys::UCS_OK {
            return Err(cleanup(ucp.error("ucp_worker_get_efd", st)));
        }
    }
    let mut addr: *mut sys::ucp_address_t = std::ptr::null_mut();
    let mut addr_len = 0usize;
    // SAFETY: live worker; out-parameters.
    let st = unsafe { (ucp.ucp_worker_get_address)(worker, &mut addr, &mut addr_len) };
    if st != sys::UCS_OK {
        return Err(cleanup(ucp.error("ucp_worker_get_address", st)));
    }
    // SAFETY: UCX returned `addr_len` bytes at `addr`; copied, then released once.
    let worker_address =
        unsafe { std::slice::from_raw_parts(addr as *const u8, addr_len) }.to_vec();
    // SAFETY: releasing the address just obtained.
    unsafe { (ucp.ucp_worker_release_address)(worker, addr) };
    let am = sys::ucp_am_handler_param_t {
        field_mask: sys::UCP_AM_HANDLER_PARAM_FIELD_ID
            | sys::UCP_AM_HANDLER_PARAM_FIELD_FLAGS
            | sys::UCP_AM_HANDLER_PARAM_FIELD_CB
            | sys::UCP_AM_HANDLER_PARAM_FIELD_ARG,
        id: AM_ID,
        flags: sys::UCP_AM_FLAG_WHOLE_MSG,
        cb: Some(on_am),
        arg: std::ptr::null_mut(),
    };
    let gen_am = sys::ucp_am_handler_param_t {
        id: GEN_AM_ID,
        cb: Some(on_gen_am),
        ..am
    };
    for am in [&am, &gen_am] {
        // SAFETY: live worker; the callback is a plain function valid forever.
        let st = unsafe { (ucp.ucp_worker_set_am_recv_handler)(worker, am) };
        if st != sys::UCS_OK {
            return Err(cleanup(ucp.error("ucp_worker_set_am_recv_handler", st)));
        }
    }
    Ok((worker, efd, worker_address))
}
