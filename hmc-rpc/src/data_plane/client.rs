//! The client half of the data plane: [`ClientDataPlane`], pooled registered buffers
//! lent per call (request and response regions) and the descriptor that names them.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use hmc_core::{Access, Communicator, Error, PeerAddr, Result};

use super::descriptor::BufferDescriptor;
use super::{Counters, DataPlaneConfig, DataPlaneStats};
use crate::pool::{BufferPool, LentBuffers, PooledBuffer, RequestBuffer, mark_lent};

/// The client half of HMC_BUFFER: the communicator and its buffer pool. Share one among
/// clients ([`crate::Client::with_client_data_plane`]) so that reconnecting clients reuse
/// the same registered buffers.
pub struct ClientDataPlane<C: Communicator> {
    pub(crate) comm: Arc<C>,
    /// Request buffers, exported READ only; key-scoped (see [`BufferPool::key_scoped`]).
    pub(super) req_pool: BufferPool<C>,
    /// Response buffers, exported WRITE only; key-scoped.
    pub(super) resp_pool: BufferPool<C>,
    pub(crate) config: DataPlaneConfig,
    pub(super) counters: Counters,
    pub(super) lent: Arc<LentBuffers>,
}

/// The buffers of one HMC_BUFFER call. Returned to the pool once the server answered OK;
/// discarded (deregistered, so the server's key dies) otherwise, because a server that
/// gave up may still have a transfer in flight.
pub(crate) struct PreparedCall<C: Communicator> {
    pub(crate) descriptor: Bytes,
    pub(super) request: Option<PooledBuffer<C>>,
    /// The caller's [`RequestBuffer`] lent as the request: its discard flag.
    pub(super) lent: Option<Arc<std::sync::atomic::AtomicBool>>,
    pub(super) response: Option<PooledBuffer<C>>,
    pub(super) settled: bool,
}

impl<C: Communicator> PreparedCall<C> {
    /// The server answered OK with its response in our region: the bytes, no copy.
    pub(crate) fn take_response(mut self, len: u64) -> Result<Bytes> {
        self.settled = true;
        let resp = self.response.take().ok_or_else(|| {
            Error::Protocol("HMC_BUFFER response to a call that lent no response region".into())
        })?;
        // The call is over: the server's WRITE key must not reach the bytes the caller now
        // holds. Where the transport cannot rekey, only this server holds a live key (the
        // buffer is quarantined to it when it returns to the pool).
        if let Err(e) = resp.revoke_keys() {
            // Not lent on with a live key: deregistered (the key dies) after a copy.
            tracing::debug!(error = %e, "rekeying the response buffer failed; copying the response");
            let out = Bytes::copy_from_slice(resp.as_slice(len as usize)?);
            resp.discard();
            return Ok(out);
        }
        resp.into_bytes(len as usize)
    }

    /// The server answered OK with the response inline or streamed.
    pub(crate) fn settle(mut self) {
        self.settled = true;
    }
}

impl<C: Communicator> Drop for PreparedCall<C> {
    fn drop(&mut self) {
        if !self.settled {
            if let Some(b) = self.request.take() {
                b.discard();
            }
            if let Some(d) = self.lent.take() {
                d.store(true, Ordering::Release);
            }
            if let Some(b) = self.response.take() {
                b.discard();
            }
        }
    }
}

impl<C: Communicator> ClientDataPlane<C> {
    /// A data plane over `comm` with an empty pool.
    pub fn new(comm: Arc<C>, config: DataPlaneConfig) -> Self {
        ClientDataPlane {
            req_pool: BufferPool::key_scoped(comm.clone(), Access::READ, config.pool),
            resp_pool: BufferPool::key_scoped(comm.clone(), Access::WRITE, config.pool),
            comm,
            config,
            counters: Counters::default(),
            lent: Arc::default(),
        }
    }

    /// A pooled registered buffer of `len` bytes to write a request payload into, for
    /// calls without the copy into a pooled buffer (see [`RequestBuffer`]). Fails like
    /// the pool does ([`Error::LimitExceeded`] naming `max_pool_bytes`). Where the
    /// transport cannot rekey, only a buffer no peer holds a live key of is lent (possibly
    /// a fresh registration); [`ClientDataPlane::request_buffer_for`] reuses one of the
    /// same server's.
    pub fn request_buffer(&self, len: usize) -> Result<RequestBuffer<C>> {
        Ok(RequestBuffer::new(
            self.req_pool.acquire(len)?,
            len,
            self.lent.clone(),
        ))
    }

    /// [`ClientDataPlane::request_buffer`] for calls to the server at `server` only: where
    /// the transport cannot rekey, a pooled buffer last lent to that server may be reused
    /// (one lent to another server never is), so the pool need not register a fresh one.
    /// Lending it to another server's call is safe but retires it when it returns.
    pub fn request_buffer_for(&self, len: usize, server: &PeerAddr) -> Result<RequestBuffer<C>> {
        Ok(RequestBuffer::new(
            self.req_pool
                .acquire_for(len, Some(crate::pool::peer_tag(server)))?,
            len,
            self.lent.clone(),
        ))
    }

    /// Lends `payload` itself when it is a frozen [`RequestBuffer`] of this data plane,
    /// else copies it into a pooled buffer; and lends a response region of `response_len`
    /// bytes (0: none), for a call to the server tagged `peer` ([`crate::pool::peer_tag`]
    /// of its address). Fails (and the caller falls back to TCP_STREAM) when the pool
    /// cannot lend.
    pub(crate) fn prepare(
        &self,
        payload: &[u8],
        response_len: usize,
        peer: u64,
    ) -> Result<PreparedCall<C>> {
        let lent = self.lent.find(payload);
        let r = (|| {
            let (request, export) = match &lent {
                Some(l) => {
                    mark_lent(&l.mark, peer);
                    (None, l.export.clone())
                }
                None => {
                    let request = self.req_pool.acquire_for(payload.len(), Some(peer))?;
                    request.fill(payload)?;
                    mark_lent(request.mark(), peer);
                    let export = request.export();
                    (Some(request), export)
                }
            };
            let response = if response_len > 0 {
                let b = self.resp_pool.acquire_for(response_len, Some(peer))?;
                mark_lent(b.mark(), peer);
                Some(b)
            } else {
                None
            };
            let desc = BufferDescriptor {
                reply_to: self.comm.address(),
                request: export,
                response: response.as_ref().map(|b| b.export()),
            };
            Ok(PreparedCall {
                descriptor: Bytes::from(desc.encode()),
                request,
                lent: None,
                response,
                settled: true,
            })
        })();
        match r {
            Ok(mut p) => {
                p.settled = false;
                if let Some(l) = lent {
                    p.lent = Some(l.discard);
                    Counters::bump(&self.counters.lent_requests);
                }
                Counters::bump(&self.counters.buffer_calls);
                Ok(p)
            }
            Err(e) => {
                Counters::bump(&self.counters.fallbacks);
                Err(e)
            }
        }
    }

    /// A large call that went TCP_STREAM because the server has no data plane of this
    /// client's transport.
    pub(crate) fn fell_back(&self) {
        Counters::bump(&self.counters.fallbacks);
    }

    pub(crate) fn failed(&self) {
        Counters::bump(&self.counters.failures);
    }

    pub(crate) fn responded_in_buffer(&self) {
        Counters::bump(&self.counters.buffer_responses);
    }

    /// Counters (shared by every client using this data plane); `pool` sums the request
    /// and response pools.
    pub fn stats(&self) -> DataPlaneStats {
        self.counters
            .stats(self.req_pool.stats().plus(self.resp_pool.stats()))
    }
}
