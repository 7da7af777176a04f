//! Dispatch of the [`Command`]s other threads send to the engine thread.

use std::sync::mpsc;
use std::time::Instant;

use futures::channel::oneshot;
use hmc_core::{Error, Result};

use super::transfers::TransferState;
use super::{Command, RawNote, State};

/// What a command that needs an open communicator is refused with once it was closed.
fn closed() -> Error {
    Error::Closed("the UCX communicator was closed".into())
}

/// A command's reply channel, on which it can be refused.
trait Refusable {
    fn refuse(self, err: Error);
}

impl<T> Refusable for mpsc::SyncSender<Result<T>> {
    fn refuse(self, err: Error) {
        let _ = self.send(Err(err));
    }
}

impl<T> Refusable for oneshot::Sender<Result<T>> {
    fn refuse(self, err: Error) {
        let _ = self.send(Err(err));
    }
}

impl State {
    pub(super) fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Register {
                addr,
                len,
                access,
                allocate,
                reply,
            } => {
                if let Some(reply) = self.unless_closed(reply) {
                    let _ = reply.send(self.register(addr, len, access, allocate));
                }
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
                if let Some(reply) = self.unless_closed(reply) {
                    let _ = reply.send(self.create_ep(&worker_addr, link));
                }
            }
            Command::TakeAbandons => self.take_abandons(),
            Command::CloseEp { ep } => self.release_ep(ep),
            Command::PeerGone { ep, reason } => self.peer_gone(ep, reason),
            Command::ImportKey {
                ep,
                reg_id,
                rkey,
                shared,
                reply,
            } => {
                let _ = reply.send(self.import_key(ep, reg_id, &rkey, shared));
            }
            Command::DropKey { key } => self.drop_key(key),
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
                if let Some(reply) = self.unless_closed(reply) {
                    self.ops
                        .insert(id, TransferState::new(ep, op, chunks, deadline, reply));
                    self.pump(id);
                }
            }
            Command::Notify {
                ep,
                header,
                data,
                deadline,
                reply,
            } => {
                if let Some(reply) = self.unless_closed(reply) {
                    self.notify(ep, header, data, deadline, reply);
                }
            }
            Command::Cancel { id, done } => self.cancel(id, done),
            Command::Recv { deadline, reply } => self.recv(deadline, reply),
            Command::Close => self.close_by_command(),
        }
    }

    /// `reply`, to go on with its command; `None` once the communicator was closed, the
    /// command then refused on it.
    fn unless_closed<R: Refusable>(&self, reply: R) -> Option<R> {
        if self.life.closed {
            reply.refuse(closed());
            return None;
        }
        Some(reply)
    }

    /// The user dropped endpoint `ep`: it closes, and its entry goes once closed.
    fn release_ep(&mut self, ep: u64) {
        if let Some(e) = self.eps.by_id.get_mut(&ep) {
            e.released = true;
        }
        self.begin_ep_close(ep, None, false);
    }

    /// The control connection of endpoint `ep` reported its peer gone.
    fn peer_gone(&mut self, ep: u64, reason: String) {
        // The peer's process or communicator is gone: so is every endpoint to it.
        if let Some(pid) = self.eps.by_id.get(&ep).map(|e| e.phys) {
            self.phys_failed(pid, reason)
        }
    }

    /// The user released imported key `key`.
    fn drop_key(&mut self, key: u64) {
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

    /// The caller gave transfer `id` up: it stops issuing, and `done` hears when it ended.
    fn cancel(&mut self, id: u64, done: mpsc::SyncSender<()>) {
        match self.ops.get_mut(&id) {
            Some(op) => {
                op.fail(Error::Cancelled("the transfer future was dropped".into()));
                op.cancel_done.push(done);
                self.pump(id);
            }
            None => {
                let _ = done.send(());
            }
        }
    }

    /// A caller waits for the next notification until `deadline`.
    fn recv(&mut self, deadline: Instant, reply: oneshot::Sender<Result<RawNote>>) {
        if let Some(reply) = self.unless_closed(reply) {
            self.notes.waiters.push_back((deadline, reply));
            self.notes.deliver();
        }
    }

    /// The user closed the communicator.
    fn close_by_command(&mut self) {
        // Closed first: the endpoints released below close at once instead of
        // lingering. The drain's own flags are set by `close_by_user` at the end.
        self.life.closed = true;
        let ids: Vec<u64> = self.eps.by_id.keys().copied().collect();
        for ep in ids {
            self.begin_ep_close(ep, Some("the local communicator was closed".into()), false);
        }
        self.notes.fail_waiters(closed);
        self.close_idle_phys(None);
        // The registrations are all still mapped: progress until the worker settles
        // (see `lifecycle`).
        self.life.close_by_user(Instant::now());
    }
}
