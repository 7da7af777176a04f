//! The client's half of the settings exchange (`docs/protocol.md`, "Connection
//! settings"): whether the server on a connection pulls HMC_BUFFER payloads over this
//! client's transport, asked once per connection before the first large call.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use hmc_core::Communicator;

use super::{Body, CallError, CallOptions, Client, Reply};
use crate::data_plane::ClientDataPlane;
use crate::frame::Status;
use crate::settings::{SETTINGS_METHOD, Settings, features};

/// What the settings exchange on a connection found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Negotiated {
    /// Not asked yet.
    Unknown,
    /// A v1 server: it answered UNKNOWN_METHOD.
    V1,
    /// The server's settings.
    Known(Settings),
}

impl<C: Communicator> Client<C> {
    /// What the settings exchange on the current connection found (`Unknown` before it).
    pub(super) fn negotiated_now(&self) -> Negotiated {
        let (asked_on, n) = self.inner.negotiated.lock().clone();
        if asked_on == self.inner.conn_gen.load(Ordering::Acquire) {
            n
        } else {
            Negotiated::Unknown
        }
    }

    /// Whether the server on the current connection pulls HMC_BUFFER payloads over this
    /// client's data plane: asked once per connection with the settings exchange
    /// (`docs/protocol.md`, "Connection settings") before the first large call. A v1
    /// server answers UNKNOWN_METHOD; it is then tried, and its refusal stops HMC_BUFFER
    /// until the next reconnect.
    pub(super) async fn server_takes_buffer(&self, dp: &ClientDataPlane<C>) -> bool {
        let ours = u16::from(dp.comm.transport().wire_id());
        let decide = |n: &Negotiated| match n {
            Negotiated::Known(s) => Some(s.data_planes.contains(&ours)),
            Negotiated::V1 => Some(!self.inner.no_buffer.load(Ordering::Acquire)),
            Negotiated::Unknown => None,
        };
        if let Some(yes) = decide(&self.negotiated_now()) {
            if !yes {
                dp.fell_back();
            }
            return yes;
        }
        let mine = Settings {
            features: features::SETTINGS,
            data_planes: vec![ours],
            data_plane_threshold: Some(dp.config.threshold as u64),
            max_payload_len: Some(self.inner.config.conn.limits.max_payload_len),
            max_inflight: Some(self.inner.config.conn.max_inflight.min(u32::MAX as usize) as u32),
            max_body_len: Some(self.inner.config.conn.limits.max_body_len),
        };
        let opts = CallOptions {
            timeout: Some(self.inner.config.connect_timeout),
            ..CallOptions::default()
        };
        let answer = self
            .call_body(
                SETTINGS_METHOD,
                Body::Payload(Bytes::from(mine.encode())),
                opts,
                // Not the caller's call: its span keeps the caller's request id.
                &tracing::Span::none(),
            )
            .await;
        let found = match answer {
            Ok(Reply::Payload(b)) => match Settings::decode(&b) {
                Ok(s) => Negotiated::Known(s),
                Err(why) => {
                    tracing::warn!(%why, "the server's settings do not decode; treating it as a v1 server");
                    Negotiated::V1
                }
            },
            Err(CallError::Status { status, .. }) if status == Status::UNKNOWN_METHOD => {
                Negotiated::V1
            }
            // No answer now (a lost connection, a deadline): try the data plane as before,
            // and ask again on the next large call.
            _ => return !self.inner.no_buffer.load(Ordering::Acquire),
        };
        let yes = decide(&found).expect("decided");
        if !yes {
            // Once per connection (the exchange is): every large call after it is counted.
            let theirs = match &found {
                Negotiated::Known(s) if s.data_planes.is_empty() => "none".to_string(),
                Negotiated::Known(s) => format!("transport ids {:?}", s.data_planes),
                _ => "unknown".to_string(),
            };
            tracing::warn!(
                server = %self.inner.addr,
                "the server has no data plane of this client's transport (this client's: transport id {ours}; the server's: {theirs}); large payloads go TCP_STREAM on this connection, counted as data-plane fallbacks; start both sides with the same --data-plane"
            );
            dp.fell_back();
        }
        // The answer came on the connection current now (a reconnect in between would
        // have failed the call).
        let conn = self.inner.conn_gen.load(Ordering::Acquire);
        *self.inner.negotiated.lock() = (conn, found);
        yes
    }
}
