//! Dispatch of the [`Command`]s other threads send to the engine thread.

use super::*;

impl State {
    pub(super) fn command(&mut self, cmd: Command) {
        let closed = || Error::Closed("the UCX communicator was closed".into());
        match cmd {
            Command::Register {
                addr,
                len,
                access,
                allocate,
                reply,
            } => {
                let r = if self.closed {
                    Err(closed())
                } else {
                    self.register(addr, len, access, allocate)
                };
                let _ = reply.send(r);
            }
            Command::Unregister { id, done } => {
                self.unmap(id);
                let _ = done.send(());
            }
            Command::CreateEp { worker_addr, reply } => {
                let r = if self.closed {
                    Err(closed())
                } else {
                    self.create_ep(&worker_addr)
                };
                let _ = reply.send(r);
            }
            Command::CloseEp { ep } => {
                if let Some(e) = self.eps.get_mut(&ep) {
                    e.released = true;
                }
                self.begin_ep_close(ep, None, false);
            }
            Command::PeerGone { ep, reason } => {
                // The peer's process or communicator is gone: so is every endpoint to it.
                if let Some(pid) = self.eps.get(&ep).map(|e| e.phys) {
                    self.phys_failed(pid, reason)
                }
            }
            Command::ImportKey {
                ep,
                reg_id,
                rkey,
                shared,
                reply,
            } => {
                let r = self.import_key(ep, reg_id, &rkey, shared);
                let _ = reply.send(r);
            }
            Command::DropKey { key } => {
                if let Some(k) = self.keys.get(&key) {
                    if k.inflight == 0 {
                        let k = self.keys.remove(&key).expect("present");
                        self.destroy_rkey(k);
                    } else {
                        // In use by a draining transfer: destroyed when the endpoint closes.
                        k.shared.revoke();
                    }
                }
            }
            Command::Revoke { ep, reg_id, ack } => {
                for k in self.keys.values() {
                    if k.ep == ep && k.reg_id == reg_id {
                        k.shared.revoke();
                    }
                }
                self.pending_acks.push((ep, reg_id, ack));
            }
            Command::Transfer {
                id,
                ep,
                op,
                chunks,
                deadline,
                reply,
            } => {
                if self.closed {
                    let _ = reply.send(Err(closed()));
                    return;
                }
                self.ops.insert(
                    id,
                    TransferState {
                        ep,
                        op,
                        chunks,
                        next: 0,
                        inflight: 0,
                        flushed: false,
                        failure: None,
                        failed_at: None,
                        deadline,
                        started: Instant::now(),
                        reply: Some(reply),
                        cancel_done: Vec::new(),
                    },
                );
                self.pump(id);
            }
            Command::Notify {
                ep,
                header,
                data,
                deadline,
                reply,
            } => {
                if self.closed {
                    let _ = reply.send(Err(closed()));
                    return;
                }
                self.notify(ep, header, data, deadline, reply);
            }
            Command::Cancel { id, done } => match self.ops.get_mut(&id) {
                Some(op) => {
                    if op.failure.is_none() {
                        op.failure =
                            Some(Error::Cancelled("the transfer future was dropped".into()));
                        op.failed_at = Some(Instant::now());
                    }
                    op.cancel_done.push(done);
                    self.pump(id);
                }
                None => {
                    let _ = done.send(());
                }
            },
            Command::Recv { deadline, reply } => {
                if self.closed {
                    let _ = reply.send(Err(closed()));
                    return;
                }
                self.waiters.push_back((deadline, reply));
                self.deliver_notes();
            }
            Command::Close => {
                self.closed = true;
                self.closed_by_user = true;
                let ids: Vec<u64> = self.eps.keys().copied().collect();
                for ep in ids {
                    self.begin_ep_close(
                        ep,
                        Some("the local communicator was closed".into()),
                        false,
                    );
                }
                for (_, w) in self.waiters.drain(..) {
                    let _ = w.send(Err(closed()));
                }
                self.close_idle_phys(None);
                // UCX answers peers by itself (replies to their emulated GETs, PUT
                // acknowledgements); queued behind a full peer queue, such a send stays in the
                // worker, and `ucp_worker_destroy` crashes UCX 1.13 purging it (its GET
                // replies carry a memory handle it never set). The registrations are all
                // still mapped now, so progressing until the worker settles is as safe as
                // before `close()`. A worker idle for `SETTLE_QUIET` already is settled.
                self.unsettled = true;
                self.close_drain = Some(Instant::now() + SETTLE_LIMIT);
                self.check_settled();
            }
        }
    }
}
