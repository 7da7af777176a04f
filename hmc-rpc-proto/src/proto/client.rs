//! The client role: [`ClientConn`], the calls of one connection (ids, deadlines,
//! in-flight credits, cancel, streamed and buffer-placed responses, GOAWAY).

use std::collections::{BTreeSet, VecDeque};
use std::time::Instant;

use bytes::Bytes;

use crate::frame::{
    Flags, FrameHeader, FrameKind, INLINE_MAX, PayloadMode, Status, check_payload_crc,
};

use super::framing::{Framing, Message, Parsed};
use super::{ConnConfig, IdMap, IdSet, StagedPayload, StreamSink, budget_us, goaway};

/// What the client core reports to its runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientEvent {
    /// The answer to a call.
    Response {
        /// Which call.
        request_id: u64,
        /// The server's status.
        status: Status,
        /// The payload (for non-OK statuses, the server's explanation).
        payload: Bytes,
    },
    /// The answer to an HMC_BUFFER call whose response the server wrote into the
    /// call's response region (status OK): the first `len` bytes of it are the payload.
    ResponseInBuffer {
        /// Which call.
        request_id: u64,
        /// Bytes written at the start of the response region.
        len: u64,
    },
    /// The call's deadline passed locally; a CANCEL was sent.
    TimedOut {
        /// Which call.
        request_id: u64,
    },
    /// The server will take no new calls on this connection; calls in flight still finish.
    Draining {
        /// The server's reason.
        reason: String,
    },
}

/// Makes the sink of a call's streamed response once its length is known.
pub type ResponseSink = Box<dyn FnOnce(u64) -> Box<dyn StreamSink> + Send>;

/// Why a call could not be started on this connection.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// No credit left.
    #[error(
        "limit `max_inflight_per_conn` reached ({0}); wait for answers or raise ClientConfig::max_inflight"
    )]
    NoCredit(usize),
    /// Payload over `max_payload_len`.
    #[error(
        "limit `max_payload_len` exceeded: {0} > {1}; send less or raise the limit on both peers"
    )]
    TooLarge(u64, u64),
    /// The request id is still in flight (or its cancel not yet acknowledged).
    #[error("request id {0} is already in flight on this connection")]
    DuplicateId(u64),
    /// The connection is closing or draining.
    #[error("connection not usable: {0}")]
    Closed(String),
}

/// What a REQUEST carries.
pub(super) enum Outgoing {
    /// The payload itself (INLINE or TCP_STREAM).
    Payload(Bytes),
    /// Length and data-plane descriptor of an HMC_BUFFER payload.
    Descriptor(u64, Bytes),
    /// A TCP_STREAM payload of this length, fed later in pieces.
    Fed(u64),
}

/// The client side of one connection.
pub struct ClientConn {
    pub(super) f: Framing,
    pub(super) next_id: u64,
    pub(super) pending: IdMap<u64, Option<Instant>>,
    pub(super) deadlines: BTreeSet<(Instant, u64)>,
    /// Responses to these ids are dropped (cancelled or timed out; kept until the server's
    /// own answer arrives so a streamed answer can be discarded).
    pub(super) forgotten: IdSet,
    pub(super) events: VecDeque<ClientEvent>,
    /// Calls sent as HMC_BUFFER (only these may be answered HMC_BUFFER).
    pub(super) buffer_calls: IdSet,
    /// Where a call's streamed OK response goes instead of host memory.
    pub(super) sinks: IdMap<u64, ResponseSink>,
    /// What sinks made of responses delivered, until the runtime takes them.
    pub(super) staged: IdMap<u64, StagedPayload>,
    pub(super) ping_sent: Option<Instant>,
    pub(super) draining: Option<String>,
    pub(super) closed: Option<String>,
}

impl ClientConn {
    /// A new connection established at `now`.
    pub fn new(cfg: ConnConfig, now: Instant) -> Self {
        ClientConn {
            f: Framing::new(cfg, now),
            next_id: 1,
            pending: IdMap::default(),
            deadlines: BTreeSet::new(),
            forgotten: IdSet::default(),
            events: VecDeque::new(),
            buffer_calls: IdSet::default(),
            sinks: IdMap::default(),
            staged: IdMap::default(),
            ping_sent: None,
            draining: None,
            closed: None,
        }
    }

    /// Queues a call with the next free request id; returns the id.
    pub fn start_call(
        &mut self,
        method_id: u32,
        payload: Bytes,
        deadline: Option<Instant>,
        one_way: bool,
        now: Instant,
    ) -> Result<u64, StartError> {
        while self.pending.contains_key(&self.next_id) || self.forgotten.contains(&self.next_id) {
            self.next_id += 1;
        }
        let id = self.next_id;
        self.start_call_with_id(id, method_id, payload, deadline, one_way, now)?;
        self.next_id += 1;
        Ok(id)
    }

    /// Queues a call under a caller-chosen request id (unique while in flight).
    pub fn start_call_with_id(
        &mut self,
        id: u64,
        method_id: u32,
        payload: Bytes,
        deadline: Option<Instant>,
        one_way: bool,
        now: Instant,
    ) -> Result<(), StartError> {
        self.start_inner(
            id,
            method_id,
            Outgoing::Payload(payload),
            deadline,
            one_way,
            now,
        )
    }

    /// Queues an HMC_BUFFER call: the REQUEST frame carries `descriptor` (the data-plane
    /// descriptor of a `payload_len`-byte payload the server pulls one-sided) as its body.
    /// Its answer is [`ClientEvent::ResponseInBuffer`] or an ordinary
    /// [`ClientEvent::Response`].
    pub fn start_call_in_buffer(
        &mut self,
        id: u64,
        method_id: u32,
        payload_len: u64,
        descriptor: Bytes,
        deadline: Option<Instant>,
        now: Instant,
    ) -> Result<(), StartError> {
        if descriptor.is_empty() || descriptor.len() > self.f.cfg.limits.max_body_len as usize {
            return Err(StartError::TooLarge(
                descriptor.len() as u64,
                self.f.cfg.limits.max_body_len as u64,
            ));
        }
        self.start_inner(
            id,
            method_id,
            Outgoing::Descriptor(payload_len, descriptor),
            deadline,
            false,
            now,
        )?;
        self.buffer_calls.insert(id);
        Ok(())
    }

    /// Queues a call whose `payload_len`-byte TCP_STREAM payload the runtime feeds later,
    /// piece by piece, with [`ClientConn::feed`] (a device payload staged in chunks, the
    /// copy of one chunk overlapping the send of the last). `payload_len` must exceed
    /// [`INLINE_MAX`]. If the producer fails, [`ClientConn::cancel`] the call.
    pub fn start_call_fed(
        &mut self,
        id: u64,
        method_id: u32,
        payload_len: u64,
        deadline: Option<Instant>,
        now: Instant,
    ) -> Result<(), StartError> {
        if payload_len <= INLINE_MAX as u64 {
            return Err(StartError::Closed(format!(
                "a fed payload must be longer than {INLINE_MAX} bytes (got {payload_len}); send it whole"
            )));
        }
        self.start_inner(
            id,
            method_id,
            Outgoing::Fed(payload_len),
            deadline,
            false,
            now,
        )
    }

    /// The next piece of a [`ClientConn::start_call_fed`] payload. False when the call is
    /// gone (cancelled, answered early, connection closed): stop producing.
    pub fn feed(&mut self, request_id: u64, piece: Bytes) -> bool {
        self.f.feed(request_id, piece)
    }

    /// Sends the call's response, if it comes OK as a TCP_STREAM, into the sink `sink`
    /// makes for its length, as it arrives; the [`ClientEvent::Response`] then has an empty payload and the sink's
    /// product is taken with [`ClientConn::take_staged`]. Other answers (INLINE, errors)
    /// arrive as usual and the sink is dropped.
    pub fn set_response_sink(&mut self, request_id: u64, sink: ResponseSink) {
        if self.pending.contains_key(&request_id) {
            self.sinks.insert(request_id, sink);
        }
    }

    /// The response sink's product for a delivered call (once; `None` when the response
    /// came in host memory).
    pub fn take_staged(&mut self, request_id: u64) -> Option<StagedPayload> {
        self.staged.remove(&request_id)
    }

    pub(super) fn start_inner(
        &mut self,
        id: u64,
        method_id: u32,
        out: Outgoing,
        deadline: Option<Instant>,
        one_way: bool,
        now: Instant,
    ) -> Result<(), StartError> {
        if let Some(r) = self.closed.as_ref().or(self.draining.as_ref()) {
            return Err(StartError::Closed(r.clone()));
        }
        if self.pending.len() >= self.f.cfg.max_inflight {
            return Err(StartError::NoCredit(self.f.cfg.max_inflight));
        }
        if self.pending.contains_key(&id) || self.forgotten.contains(&id) {
            return Err(StartError::DuplicateId(id));
        }
        let len = match &out {
            Outgoing::Payload(p) => p.len() as u64,
            Outgoing::Descriptor(len, _) | Outgoing::Fed(len) => *len,
        };
        let max = self.f.cfg.limits.max_payload_len;
        if len > max {
            return Err(StartError::TooLarge(len, max));
        }
        let mut h = FrameHeader::new(FrameKind::Request, id);
        h.method_id = method_id;
        if one_way {
            h.flags = Flags::ONE_WAY;
        }
        if let Some(d) = deadline {
            h.deadline_us = budget_us(d, now);
            if !one_way {
                self.deadlines.insert((d, id));
            }
        }
        match out {
            Outgoing::Payload(payload) => self.f.send_message(h, payload),
            Outgoing::Descriptor(len, desc) => {
                h.mode = PayloadMode::HmcBuffer;
                h.payload_len = len;
                h.body_len = desc.len() as u32;
                self.f.send_frame(&h, &desc);
            }
            Outgoing::Fed(len) => self.f.send_message_fed(h, len as usize),
        }
        if !one_way {
            self.pending.insert(id, deadline);
        }
        Ok(())
    }

    /// Abandons a call: sends CANCEL, drops its answer when it comes. Idempotent.
    pub fn cancel(&mut self, request_id: u64) {
        if let Some(d) = self.pending.remove(&request_id) {
            if let Some(d) = d {
                self.deadlines.remove(&(d, request_id));
            }
            self.f.drop_out_stream(request_id);
            self.sinks.remove(&request_id);
            self.forgotten.insert(request_id);
            if self.closed.is_none() {
                let c = FrameHeader::new(FrameKind::Cancel, request_id);
                self.f.send_frame(&c, &[]);
            }
        }
    }

    /// Feeds received bytes.
    pub fn handle_input(&mut self, bytes: &[u8], now: Instant) {
        if self.closed.is_some() {
            return;
        }
        self.f.push_input(bytes, now);
        self.process_input(now);
    }

    /// `n` bytes were read where [`ClientConn::read_target`] or [`ClientConn::input_space`]
    /// said.
    pub fn handle_read(&mut self, n: usize, now: Instant) {
        if self.closed.is_some() {
            return;
        }
        self.f.commit_read(n, now);
        self.process_input(now);
    }

    pub(super) fn process_input(&mut self, now: Instant) {
        self.ping_sent = None;
        loop {
            match self.f.next_frame(now) {
                Ok(Parsed::Need) => break,
                Ok(Parsed::DirectDone(h, start)) => {
                    let r = self
                        .f
                        .direct_done(h, start)
                        .map(|m| self.on_stream_message(m));
                    if let Err(why) = r {
                        self.fail(&why, true);
                        break;
                    }
                }
                Ok(Parsed::Frame(h, body)) => {
                    if let Err(why) = self.on_frame(h, body) {
                        self.fail(&why, true);
                        break;
                    }
                    if self.closed.is_some() {
                        break;
                    }
                }
                Err(e) => {
                    self.fail(&e.to_string(), true);
                    break;
                }
            }
        }
    }

    pub(super) fn on_frame(
        &mut self,
        h: FrameHeader,
        range: std::ops::Range<usize>,
    ) -> Result<(), String> {
        let id = h.request_id;
        if h.kind == FrameKind::Data {
            let m = self.f.data_frame(h, range)?;
            self.on_stream_message(m);
            return Ok(());
        }
        let body = self.f.body(range);
        match h.kind {
            FrameKind::Response => {
                if h.mode == PayloadMode::TcpStream {
                    let discard = !self.pending.contains_key(&id);
                    if self.f.streams_in.contains_key(&id) {
                        return Err(format!("second streamed response for request {id}"));
                    }
                    let sink = if h.status == Status::OK {
                        self.sinks.remove(&id).map(|make| make(h.payload_len))
                    } else {
                        None
                    };
                    let now = self.f.last_rx;
                    self.f.open_in_stream(h, discard, sink, now);
                    return Ok(());
                }
                if h.mode == PayloadMode::HmcBuffer {
                    if h.body_len != 0 || h.status != Status::OK {
                        return Err(format!(
                            "HMC_BUFFER response to request {id} with a body or a status other than OK"
                        ));
                    }
                    if !self.buffer_calls.remove(&id) {
                        return Err(format!(
                            "HMC_BUFFER response to request {id}, which was not an HMC_BUFFER call"
                        ));
                    }
                    self.sinks.remove(&id);
                    if let Some(d) = self.pending.remove(&id) {
                        if let Some(d) = d {
                            self.deadlines.remove(&(d, id));
                        }
                        self.events.push_back(ClientEvent::ResponseInBuffer {
                            request_id: id,
                            len: h.payload_len,
                        });
                    } else {
                        self.forgotten.remove(&id);
                    }
                    return Ok(());
                }
                check_payload_crc(id, h.payload_crc, &body).map_err(|e| e.to_string())?;
                self.deliver(h, body);
                Ok(())
            }
            FrameKind::Data => unreachable!("handled above"),
            FrameKind::Ping => {
                let pong = FrameHeader::new(FrameKind::Pong, id);
                self.f.send_frame(&pong, &[]);
                Ok(())
            }
            FrameKind::Pong => Ok(()),
            FrameKind::GoAway => {
                let reason = String::from_utf8_lossy(&body).into_owned();
                if h.status == Status::SHUTTING_DOWN {
                    self.draining = Some(format!("server said: {reason}"));
                    self.events.push_back(ClientEvent::Draining { reason });
                } else {
                    self.fail(
                        &format!("server closed the connection ({}): {reason}", h.status),
                        false,
                    );
                }
                Ok(())
            }
            FrameKind::Request | FrameKind::Cancel => {
                Err(format!("a server sent a {:?} frame", h.kind))
            }
        }
    }

    /// A streamed response is complete (`Some`): deliver it.
    pub(super) fn on_stream_message(&mut self, m: Option<Message>) {
        if let Some(m) = m {
            if let Some(staged) = m.staged
                && self.pending.contains_key(&m.header.request_id)
            {
                self.staged.insert(m.header.request_id, staged);
            }
            self.deliver(m.header, m.payload);
        }
    }

    pub(super) fn deliver(&mut self, h: FrameHeader, payload: Bytes) {
        let id = h.request_id;
        self.buffer_calls.remove(&id);
        self.sinks.remove(&id);
        if let Some(d) = self.pending.remove(&id) {
            if let Some(d) = d {
                self.deadlines.remove(&(d, id));
            }
            self.events.push_back(ClientEvent::Response {
                request_id: id,
                status: h.status,
                payload,
            });
        } else {
            // Late answer to a cancelled or timed-out call, or a refusal of a one-way call.
            self.forgotten.remove(&id);
        }
    }

    /// Next event.
    pub fn poll_event(&mut self) -> Option<ClientEvent> {
        self.events.pop_front()
    }

    /// When [`ClientConn::handle_timeout`] should next run.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut t = self.deadlines.first().map(|(d, _)| *d);
        let ka = self.f.cfg.keepalive_interval;
        let k = if !self.pending.is_empty() {
            Some(match self.ping_sent {
                Some(p) => p + ka,
                None => self.f.last_rx + ka,
            })
        } else {
            None
        };
        for x in [k, self.f.stall_deadline()].into_iter().flatten() {
            t = Some(t.map_or(x, |t| t.min(x)));
        }
        t
    }

    /// Expires deadlines (sending CANCEL) and runs the keepalive.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(&(d, id)) = self.deadlines.first() {
            if d > now {
                break;
            }
            self.cancel(id);
            self.events
                .push_back(ClientEvent::TimedOut { request_id: id });
        }
        if self.closed.is_some() {
            return;
        }
        if self.f.stall_deadline().is_some_and(|t| now >= t) {
            self.fail("the server stalled in the middle of a frame", true);
            return;
        }
        if self.pending.is_empty() {
            self.ping_sent = None;
            return;
        }
        let ka = self.f.cfg.keepalive_interval;
        match self.ping_sent {
            Some(p) if now >= p + ka => {
                self.fail(
                    &format!(
                        "no PONG within `keepalive_interval` ({ka:?}); the server is unreachable"
                    ),
                    true,
                );
            }
            None if now >= self.f.last_rx + ka => {
                let p = FrameHeader::new(FrameKind::Ping, self.next_id);
                self.f.send_frame(&p, &[]);
                self.ping_sent = Some(now);
            }
            _ => {}
        }
    }

    pub(super) fn fail(&mut self, why: &str, send_goaway: bool) {
        if self.closed.is_some() {
            return;
        }
        tracing::debug!(reason = why, "client connection failed");
        self.f.streams_out.clear();
        self.sinks.clear();
        if send_goaway {
            let (h, b) = goaway(Status::PROTOCOL, why);
            self.f.send_frame(&h, &b);
        }
        self.closed = Some(why.to_string());
    }

    /// Closes locally (socket lost); calls in flight are left for the runtime to fail.
    pub fn connection_lost(&mut self, why: &str) {
        if self.closed.is_none() {
            self.closed = Some(why.to_string());
        }
    }

    /// Ids of calls still waiting for an answer.
    pub fn pending_ids(&self) -> Vec<u64> {
        self.pending.keys().copied().collect()
    }

    /// Calls waiting for an answer.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// A TCP_STREAM payload is on its way in either direction (a request still being sent
    /// or a response still arriving).
    pub fn streaming(&self) -> bool {
        !self.f.streams_in.is_empty() || !self.f.streams_out.is_empty()
    }

    /// `Some(reason)` once the connection is unusable.
    pub fn closed_reason(&self) -> Option<&str> {
        self.closed.as_deref()
    }

    /// `Some(reason)` once the server announced a graceful shutdown.
    pub fn draining_reason(&self) -> Option<&str> {
        self.draining.as_deref()
    }
}
