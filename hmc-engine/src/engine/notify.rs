//! Notifications between engines: sent through the peer's metadata service, queued at the
//! receiver within `max_pending_notifies` and `max_pending_notify_bytes`, each delivered
//! under the name its connection gave (see [`super::rules::sender_name`]).

use std::collections::VecDeque;
use std::time::Duration;

use hmc_core::Communicator;
use hmc_rpc::{CallOptions, RpcError};

use super::{Engine, Notify, Peer, Shared};
use crate::error::{EngineError, Result};
use crate::meta::{METHOD_NOTIFY, NotifyMsg};

impl<C: Communicator> Engine<C> {
    /// Sends a notification to `remote`; it waits in that engine's queue until
    /// [`Engine::get_notifies`] takes it.
    pub async fn send_notify(
        &self,
        remote: &str,
        name: &str,
        msg: &[u8],
        timeout: Duration,
    ) -> Result<()> {
        self.check_open()?;
        let peer = self.peer(remote)?;
        self.notify_peer(&peer, name, msg, None, timeout).await
    }

    /// Sends a notification (a failure notice with `failed`) to `peer`.
    pub(super) async fn notify_peer(
        &self,
        peer: &Peer<C>,
        name: &str,
        msg: &[u8],
        failed: Option<String>,
        timeout: Duration,
    ) -> Result<()> {
        // The receiver bounds the same sum with its own `max_notify_len`; refusing here
        // first names the limit as the caller's (a bad argument, not a failed peer).
        let len =
            msg.len() + name.len() + self.inner.name.len() + failed.as_ref().map_or(0, String::len);
        let max = self.inner.shared.config.max_notify_len;
        if len > max {
            return Err(EngineError::Limit {
                limit: "max_notify_len",
                value: len as u64,
                max: max as u64,
                hint: "send a shorter notification (name, message and sender), or raise max_notify_len at both engines",
            });
        }
        let n = NotifyMsg {
            from: self.inner.name.clone(),
            name: name.to_string(),
            msg: msg.to_vec(),
            failed,
        };
        let deadline = hmc_core::Deadline::after(timeout);
        let opts = || CallOptions {
            timeout: Some(deadline.remaining().max(Duration::from_millis(1))),
            ..CallOptions::default()
        };
        // A lost connection is the peer gone (callers drop it); any other failure is its
        // metadata service's answer.
        let failed = |e: hmc_rpc::CallError| match e {
            hmc_rpc::CallError::ConnectionLost(why) => EngineError::PeerGone {
                peer: peer.name.clone(),
                why,
            },
            e => EngineError::Metadata {
                peer: peer.name.clone(),
                why: e.to_string(),
            },
        };
        match peer
            .rpc
            .call_typed_with::<_, ()>(METHOD_NOTIFY, &n, opts())
            .await
        {
            // A new connection (the old one idled out and the client dialled again) is
            // not yet named at the peer: name it with a metadata request, then send again.
            Err(e) if e.status() == Some(hmc_rpc::Status::UNAUTHENTICATED) => {
                self.fetch_info(&peer.rpc, deadline).await?;
                peer.rpc
                    .call_typed_with::<_, ()>(METHOD_NOTIFY, &n, opts())
                    .await
                    .map_err(failed)
            }
            r => r.map_err(failed),
        }
    }

    /// Calls `hook` (on a runtime thread, so it must not block) after each notification
    /// is queued, in place of any earlier hook: a caller that waits on a descriptor (the
    /// C API's per-engine eventfd) learns that [`Engine::get_notifies`] has something.
    pub fn on_notify(&self, hook: impl Fn() + Send + Sync + 'static) {
        *self.inner.shared.notify_hook.write() = Some(std::sync::Arc::new(hook));
    }

    /// Takes every notification received so far, oldest first.
    pub fn get_notifies(&self) -> Vec<Notify> {
        let mut q = self.inner.shared.notifies.lock();
        q.bytes = 0;
        q.queue.drain(..).collect()
    }
}

impl<C: Communicator> Shared<C> {
    pub(super) fn take_notify(
        &self,
        conn: &hmc_rpc::Connection,
        n: NotifyMsg,
    ) -> std::result::Result<(), RpcError> {
        // Who sent it is the connection's business, not the message's.
        let from = match conn.label() {
            Some(l) => l.to_string(),
            None => {
                return Err(RpcError::new(
                    hmc_rpc::Status::UNAUTHENTICATED,
                    "a notification on a connection that never asked for this engine's metadata: connect (Engine::connect) first",
                ));
            }
        };
        let len =
            n.msg.len() + n.name.len() + from.len() + n.failed.as_ref().map_or(0, String::len);
        if len > self.config.max_notify_len {
            return Err(RpcError::new(
                hmc_rpc::Status::PAYLOAD_TOO_LARGE,
                format!(
                    "limit `max_notify_len` ({}) exceeded by a {len}-byte notification (name, message and sender); send less, or raise EngineConfig::max_notify_len at the receiver",
                    self.config.max_notify_len,
                ),
            ));
        }
        let mut q = self.notifies.lock();
        if q.queue.len() >= self.config.max_pending_notifies {
            return Err(RpcError::new(
                hmc_rpc::Status::OVERLOADED,
                format!(
                    "limit `max_pending_notifies` ({}) reached: the receiver has not taken its notifications (get_notifies); retry later, or raise EngineConfig::max_pending_notifies there",
                    self.config.max_pending_notifies
                ),
            ));
        }
        if q.bytes + len > self.config.max_pending_notify_bytes {
            return Err(RpcError::new(
                hmc_rpc::Status::OVERLOADED,
                format!(
                    "limit `max_pending_notify_bytes` ({}) reached: {} bytes of notifications wait for get_notifies, and this one is {len}; retry later, or raise EngineConfig::max_pending_notify_bytes there",
                    self.config.max_pending_notify_bytes, q.bytes
                ),
            ));
        }
        q.bytes += len;
        q.queue.push_back(Notify {
            from,
            name: n.name,
            msg: n.msg,
            failed: n.failed,
        });
        drop(q);
        if let Some(hook) = &*self.notify_hook.read() {
            hook();
        }
        Ok(())
    }
}

/// What [`Engine::on_notify`] keeps.
pub(super) type NotifyHook = std::sync::Arc<dyn Fn() + Send + Sync>;

/// Notifications waiting for [`Engine::get_notifies`], and their bytes.
#[derive(Default)]
pub(super) struct NotifyQueue {
    pub(super) queue: VecDeque<Notify>,
    pub(super) bytes: usize,
}
