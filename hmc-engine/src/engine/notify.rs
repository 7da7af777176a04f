//! Notifications between engines: sent through the peer's metadata service, queued at the
//! receiver within `max_pending_notifies` and `max_pending_notify_bytes`, each delivered
//! under the name its connection gave (see [`super::rules::sender_name`]), at most once
//! per send ([`super::notify_queue`]): a call that ends without the receiver's answer is
//! retracted, so the caller's error means the receiver's program never sees it.

use std::sync::atomic::Ordering;
use std::time::Duration;

use hmc_core::Communicator;
use hmc_faults::{FaultPlan, NotifyFault};
use hmc_rpc::{CallOptions, RpcError};

use super::notify_queue::{QueueFull, QueueLimits};
use super::{Engine, Notify, Peer, Shared};
use crate::error::{EngineError, Result};
use crate::meta::{METHOD_NOTIFY, METHOD_RETRACT, NotifyAck, NotifyId, NotifyMsg, Retract};

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
        let id = self.next_notify_id();
        match self.notify_peer(&peer, id, name, msg, None, timeout).await {
            Ok(_) => Ok(()),
            Err(e) => {
                // Whether it was queued is unknown (no answer) or it was refused: either
                // way the caller's error must mean "never delivered", so withdraw it.
                self.retract_notify(peer, id);
                Err(e)
            }
        }
    }

    /// Runs `work` on the engine's runtime until it ends or `peer` is gone (it left, or
    /// this engine was finalized): a notice or a retraction for a peer nobody waits on
    /// must not keep the engine's transport alive past `finalize`.
    pub(super) fn spawn_for_peer<F>(&self, peer: &Peer<C>, work: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let mut gone = peer.gone.subscribe();
        self.inner.runtime.spawn(async move {
            tokio::select! {
                () = work => {}
                _ = gone.wait_for(Option::is_some) => {}
            }
        });
    }

    /// A notification id this engine has not used.
    pub(super) fn next_notify_id(&self) -> NotifyId {
        NotifyId {
            instance: self.inner.shared.instance,
            seq: self.inner.notify_seq.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Withdraws the notification `id` from `peer`, in the background (a peer that does
    /// not answer its notifications may not answer this either); a copy of it that
    /// arrives after the withdrawal is dropped there.
    fn retract_notify(&self, peer: std::sync::Arc<Peer<C>>, id: NotifyId) {
        let t = self.inner.shared.config.default_timeout;
        let watched = peer.clone();
        self.spawn_for_peer(&watched, async move {
            let opts = CallOptions {
                timeout: Some(t),
                ..CallOptions::default()
            };
            match peer
                .rpc
                .call_typed_with::<_, NotifyAck>(METHOD_RETRACT, &Retract { id }, opts)
                .await
            {
                Ok(NotifyAck::AlreadyTaken) => tracing::warn!(
                    peer = %peer.name,
                    "a notification reported failed had already been taken by the peer's program (its answer was lost)"
                ),
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(peer = %peer.name, error = %e, "notification not retracted")
                }
            }
        });
    }

    /// Sends notification `id` (a failure notice with `failed`) to `peer`; what the peer
    /// did with it.
    pub(super) async fn notify_peer(
        &self,
        peer: &Peer<C>,
        id: NotifyId,
        name: &str,
        msg: &[u8],
        failed: Option<String>,
        timeout: Duration,
    ) -> Result<NotifyAck> {
        self.check_notify_len(name, msg, failed.as_deref())?;
        let n = NotifyMsg {
            from: self.inner.name.clone(),
            name: name.to_string(),
            msg: msg.to_vec(),
            failed,
            id,
        };
        let deadline = hmc_core::Deadline::after(timeout);
        self.on_the_way(peer, &n, deadline, timeout).await?;
        match peer
            .rpc
            .call_typed_with::<_, NotifyAck>(METHOD_NOTIFY, &n, call_options(deadline))
            .await
        {
            // A new connection (the old one idled out and the client dialled again) is
            // not yet named at the peer: name it with a metadata request, then send again
            // (the same id: were the first copy queued after all, this one is not).
            Err(e) if e.status() == Some(hmc_rpc::Status::UNAUTHENTICATED) => {
                self.fetch_info(&peer.rpc, deadline).await?;
                peer.rpc
                    .call_typed_with::<_, NotifyAck>(METHOD_NOTIFY, &n, call_options(deadline))
                    .await
                    .map_err(|e| call_failed(peer, e))
            }
            r => r.map_err(|e| call_failed(peer, e)),
        }
    }

    /// Refuses a notification over `max_notify_len`. The receiver bounds the same sum
    /// with its own `max_notify_len`; refusing here first names the limit as the
    /// caller's (a bad argument, not a failed peer).
    fn check_notify_len(&self, name: &str, msg: &[u8], failed: Option<&str>) -> Result<()> {
        let len = msg.len() + name.len() + self.inner.name.len() + failed.map_or(0, str::len);
        let max = self.inner.shared.config.max_notify_len;
        if len > max {
            return Err(EngineError::Limit {
                limit: "max_notify_len",
                value: len as u64,
                max: max as u64,
                hint: "send a shorter notification (name, message and sender), or raise max_notify_len at both engines",
            });
        }
        Ok(())
    }

    /// What happens to `n` on the way to `peer` under the engine's `notify.at=sender`
    /// faults: nothing (`Ok`, send it), lost or too late (the error its sender sees, at
    /// the deadline), late within the deadline (`Ok` after the delay), or a second copy
    /// sent beside it (`Ok`).
    async fn on_the_way(
        &self,
        peer: &Peer<C>,
        n: &NotifyMsg,
        deadline: hmc_core::Deadline,
        timeout: Duration,
    ) -> Result<()> {
        let fault = self
            .inner
            .shared
            .config
            .faults
            .as_ref()
            .map_or(NotifyFault::Deliver, FaultPlan::notify_send);
        match fault {
            NotifyFault::Deliver => {}
            // Lost on the way: nothing reaches the peer, and no answer comes.
            NotifyFault::Drop => {
                tokio::time::sleep(deadline.remaining()).await;
                return Err(EngineError::Metadata {
                    peer: peer.name.clone(),
                    why: format!("no answer within {timeout:?} (fault injected: notify.drop)"),
                });
            }
            // Late on the way: the answer comes after it lands, or never within the
            // deadline, in which case it lands later still.
            NotifyFault::Delay(late) if late < deadline.remaining() => {
                tokio::time::sleep(late).await;
            }
            NotifyFault::Delay(late) => {
                let (rpc, n) = (peer.rpc.clone(), n.clone());
                self.spawn_for_peer(peer, async move {
                    tokio::time::sleep(late).await;
                    let _ = rpc.call_typed::<_, NotifyAck>(METHOD_NOTIFY, &n).await;
                });
                tokio::time::sleep(deadline.remaining()).await;
                return Err(EngineError::Metadata {
                    peer: peer.name.clone(),
                    why: format!(
                        "no answer within {timeout:?} (fault injected: notify.delay of {late:?})"
                    ),
                });
            }
            // Twice on the way: the first copy's answer is the one the sender sees.
            NotifyFault::Duplicate => {
                let (rpc, n, opts) = (peer.rpc.clone(), n.clone(), call_options(deadline));
                self.spawn_for_peer(peer, async move {
                    let _ = rpc
                        .call_typed_with::<_, NotifyAck>(METHOD_NOTIFY, &n, opts)
                        .await;
                });
            }
        }
        Ok(())
    }

    /// Calls `hook` (on a runtime thread, so it must not block) after each notification
    /// is queued, in place of any earlier hook: a caller that waits on a descriptor (the
    /// C API's per-engine eventfd) learns that [`Engine::get_notifies`] has something.
    pub fn on_notify(&self, hook: impl Fn() + Send + Sync + 'static) {
        *self.inner.shared.notify_hook.write() = Some(std::sync::Arc::new(hook));
    }

    /// Takes every notification received so far, oldest first.
    pub fn get_notifies(&self) -> Vec<Notify> {
        self.inner.shared.notifies.lock().take_all()
    }
}

/// A notification call's options: what is left of `deadline` (at least a millisecond).
fn call_options(deadline: hmc_core::Deadline) -> CallOptions {
    CallOptions {
        timeout: Some(deadline.remaining().max(Duration::from_millis(1))),
        ..CallOptions::default()
    }
}

/// A failed notification call as the sender's error: a lost connection is the peer
/// gone (callers drop it); any other failure is its metadata service's answer.
fn call_failed<C: Communicator>(peer: &Peer<C>, e: hmc_rpc::CallError) -> EngineError {
    match e {
        hmc_rpc::CallError::ConnectionLost(why) => EngineError::PeerGone {
            peer: peer.name.clone(),
            why,
        },
        e => EngineError::Metadata {
            peer: peer.name.clone(),
            why: e.to_string(),
        },
    }
}

/// The name of the connection's engine, which every notification needs.
fn sender(conn: &hmc_rpc::Connection) -> std::result::Result<&str, RpcError> {
    // Who sent it is the connection's business, not the message's.
    conn.label().ok_or_else(|| {
        RpcError::new(
            hmc_rpc::Status::UNAUTHENTICATED,
            "a notification on a connection that never asked for this engine's metadata: connect (Engine::connect) first",
        )
    })
}

impl<C: Communicator> Shared<C> {
    fn queue_limits(&self) -> QueueLimits {
        QueueLimits {
            max_count: self.config.max_pending_notifies,
            max_bytes: self.config.max_pending_notify_bytes,
            remember: self.config.max_notify_ids,
        }
    }

    /// A notification arrived on `ctx`'s connection; with `notify.at=receiver` faults, as
    /// the plan says (lost: never answered; late; twice).
    pub(super) async fn receive_notify(
        &self,
        ctx: &hmc_rpc::CallContext,
        n: NotifyMsg,
    ) -> std::result::Result<NotifyAck, RpcError> {
        let fault = self
            .config
            .faults
            .as_ref()
            .map_or(NotifyFault::Deliver, FaultPlan::notify_recv);
        match fault {
            NotifyFault::Deliver => self.take_notify(&ctx.connection, n),
            NotifyFault::Drop => {
                ctx.cancel.cancelled().await;
                Err(RpcError::new(
                    hmc_rpc::Status::CANCELLED,
                    "notification lost (fault injected: notify.drop at the receiver)",
                ))
            }
            NotifyFault::Delay(late) => {
                tokio::time::sleep(late).await;
                self.take_notify(&ctx.connection, n)
            }
            NotifyFault::Duplicate => {
                let first = self.take_notify(&ctx.connection, n.clone());
                let _ = self.take_notify(&ctx.connection, n);
                first
            }
        }
    }

    pub(super) fn take_notify(
        &self,
        conn: &hmc_rpc::Connection,
        n: NotifyMsg,
    ) -> std::result::Result<NotifyAck, RpcError> {
        let from = sender(conn)?;
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
        let limits = self.queue_limits();
        let ack = {
            let mut queue = self.notifies.lock();
            let key = queue.key(from, n.id);
            let notify = Notify {
                from: from.to_string(),
                name: n.name,
                msg: n.msg,
                failed: n.failed,
            };
            queue.offer(key, notify, len, limits)
        };
        match ack {
            Ok(NotifyAck::Queued) => {
                if let Some(hook) = &*self.notify_hook.read() {
                    hook();
                }
                Ok(NotifyAck::Queued)
            }
            Ok(other) => {
                tracing::debug!(ack = ?other, "a notification's id was seen before; not queued again");
                Ok(other)
            }
            Err(QueueFull::Count) => Err(RpcError::new(
                hmc_rpc::Status::OVERLOADED,
                format!(
                    "limit `max_pending_notifies` ({}) reached: the receiver has not taken its notifications (get_notifies); retry later, or raise EngineConfig::max_pending_notifies there",
                    limits.max_count
                ),
            )),
            Err(QueueFull::Bytes { waiting }) => Err(RpcError::new(
                hmc_rpc::Status::OVERLOADED,
                format!(
                    "limit `max_pending_notify_bytes` ({}) reached: {waiting} bytes of notifications wait for get_notifies, and this one is {len}; retry later, or raise EngineConfig::max_pending_notify_bytes there",
                    limits.max_bytes
                ),
            )),
        }
    }

    pub(super) fn take_retract(
        &self,
        conn: &hmc_rpc::Connection,
        r: Retract,
    ) -> std::result::Result<NotifyAck, RpcError> {
        let from = sender(conn)?;
        let remember = self.queue_limits().remember;
        let mut queue = self.notifies.lock();
        let key = queue.key(from, r.id);
        Ok(queue.retract(key, remember))
    }
}

/// What [`Engine::on_notify`] keeps.
pub(super) type NotifyHook = std::sync::Arc<dyn Fn() + Send + Sync>;
