//! Dispatch of the [`Command`]s other threads send to the engine thread.

use std::time::Instant;

use hmc_core::Error;

use super::transfers::TransferState;
use super::{Command, State};

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
                let r = if self.life.closed {
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
            Command::CreateEp {
                worker_addr,
                link,
                reply,
            } => {
                let r = if self.life.closed {
                    Err(closed())
                } else {
                    self.create_ep(&worker_addr, link)
                };
                let _ = reply.send(r);
            }
            Command::TakeAbandons => self.take_abandons(),
            Command::CloseEp { ep } => {
                if let Some(e) = self.eps.by_id.get_mut(&ep) {
                    e.released = true;
                }
                self.begin_ep_close(ep, None, false);
            }
            Command::PeerGone { ep, reason } => {
                // The peer's process or communicator is gone: so is every endpoint to it.
                if let Some(pid) = self.eps.by_id.get(&ep).map(|e| e.phys) {
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
                if let Some(k) = self.keys.imported.get(&key) {
                    if k.inflight == 0 {
                        let k = self.keys.imported.remove(&key).expect("present");
                        self.destroy_rkey(k);
                    } else {
                        // In use by a draining transfer: destroyed when the endpoint closes.
                        k.shared.revoke();
                    }
                }
            }
            Command::Revoke { ep, reg_id, ack } => {
                self.keys.revoke(ep, reg_id);
                self.keys.pending_acks.push((ep, reg_id, ack));
            }
            Command::Transfer {
                id,
                ep,
                op,
                chunks,
                deadline,
                reply,
            } => {
                if self.life.closed {
                    let _ = reply.send(Err(closed()));
                    return;
                }
                self.ops
                    .insert(id, TransferState::new(ep, op, chunks, deadline, reply));
                self.pump(id);
            }
            Command::Notify {
                ep,
                header,
                data,
                deadline,
                reply,
            } => {
                if self.life.closed {
                    let _ = reply.send(Err(closed()));
                    return;
                }
                self.notify(ep, header, data, deadline, reply);
            }
            Command::Cancel { id, done } => match self.ops.get_mut(&id) {
                Some(op) => {
                    op.fail(Error::Cancelled("the transfer future was dropped".into()));
                    op.cancel_done.push(done);
                    self.pump(id);
                }
                None => {
                    let _ = done.send(());
                }
            },
            Command::Recv { deadline, reply } => {
                if self.life.closed {
                    let _ = reply.send(Err(closed()));
                    return;
                }
                self.notes.waiters.push_back((deadline, reply));
                self.notes.deliver();
            }
            Command::Close => {
                // Closed first: the endpoints released below close at once instead of
                // lingering. The drain's own flags are set by `close_by_user` at the end.
                self.life.closed = true;
                let ids: Vec<u64> = self.eps.by_id.keys().copied().collect();
                for ep in ids {
                    self.begin_ep_close(
                        ep,
                        Some("the local communicator was closed".into()),
                        false,
                    );
                }
                self.notes.fail_waiters(closed);
                self.close_idle_phys(None);
                // The registrations are all still mapped: progress until the worker settles
                // (see `lifecycle`).
                self.life.close_by_user(Instant::now());
            }
        }
    }
}
