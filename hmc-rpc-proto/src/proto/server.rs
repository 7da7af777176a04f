//! The server role: [`ServerConn`], the request table of one connection (credits,
//! deadlines, cancel, keepalive probes, refused and abandoned streams, GOAWAY and drain).

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::budget::{Event, HeldBudget, SETTLE_SLACK, SKIPPED_STREAM_COST};
use crate::frame::{Flags, FrameHeader, FrameKind, PayloadMode, Status, check_payload_crc};
use crate::settings::{SETTINGS_METHOD, Settings};

use super::framing::{Framing, Message, Parsed};
use super::{ConnConfig, IdMap, NO_DATA_PLANE_TEXT, StagedPayload, StreamSink, goaway};

/// A call the runtime should run.
#[derive(Clone, Debug)]
pub struct IncomingCall {
    /// Request id (unique on this connection while in flight).
    pub request_id: u64,
    /// Method id.
    pub method_id: u32,
    /// The request payload; for [`PayloadMode::HmcBuffer`], the data-plane descriptor
    /// (the payload itself is pulled one-sided, see `docs/protocol.md`).
    pub payload: Bytes,
    /// How the payload travelled: INLINE, TCP_STREAM (both reassembled into `payload`) or
    /// HMC_BUFFER (`payload` is the descriptor).
    pub mode: PayloadMode,
    /// The payload length the header announced.
    pub payload_len: u64,
    /// Absolute deadline, if the client sent a budget.
    pub deadline: Option<Instant>,
    /// No response is wanted.
    pub one_way: bool,
}

/// What the server core asks of its runtime.
#[derive(Clone, Debug)]
pub enum ServerEvent {
    /// Run this call, then [`ServerConn::respond`].
    Call(IncomingCall),
    /// The call was cancelled or its deadline passed; it has been answered already. Signal
    /// the handler to stop; its result will be dropped.
    Abandon {
        /// The request.
        request_id: u64,
        /// CANCELLED or DEADLINE_EXCEEDED.
        why: Status,
    },
}

pub(super) struct ServerInFlight {
    pub(super) deadline: Option<Instant>,
    pub(super) one_way: bool,
    /// Still receiving its TCP_STREAM payload.
    pub(super) receiving: bool,
    /// Request bytes charged to the connection until the call is answered.
    pub(super) held: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ServerState {
    Open,
    /// GOAWAY(SHUTTING_DOWN) sent: new requests are answered SHUTTING_DOWN.
    Draining,
    /// A GOAWAY closing the connection is queued; close once it is written.
    Closing(String),
}

/// After a peer's FIN, how often the server checks with a PING that the peer is still
/// there while calls run (see [`ServerConn::handle_eof`]).
pub(super) const PROBE_INTERVAL: Duration = Duration::from_millis(500);

/// Chooses a [`StreamSink`] for a streamed request from its method id and payload length
/// (`None`: reassemble in host memory).
pub type SinkFactory = Box<dyn FnMut(u32, u64) -> Option<Box<dyn StreamSink>> + Send>;

/// The server side of one connection.
pub struct ServerConn {
    pub(super) f: Framing,
    pub(super) inflight: IdMap<u64, ServerInFlight>,
    pub(super) deadlines: BTreeSet<(Instant, u64)>,
    pub(super) events: VecDeque<ServerEvent>,
    pub(super) state: ServerState,
    /// HMC_BUFFER requests are passed to the runtime (it has a data plane).
    pub(super) hmc_buffer: bool,
    pub(super) sinks: Option<SinkFactory>,
    /// What sinks made of the requests of calls handed to the runtime, until it takes them.
    pub(super) staged: IdMap<u64, StagedPayload>,
    /// The process-wide budget this connection settles its held bytes with.
    pub(super) budget: Arc<HeldBudget>,
    /// Request bytes of admitted calls not yet answered.
    pub(super) req_held: u64,
    /// Held bytes as last settled with `budget`.
    pub(super) settled: u64,
    /// The last call activity (a REQUEST, DATA or CANCEL received, an answer queued): the
    /// idle timeout counts from here, so PINGs alone do not keep a connection.
    pub(super) last_activity: Instant,
    /// The peer closed its sending side: answer what was received, then close.
    pub(super) peer_closed: bool,
    /// After the peer's FIN, with calls still running: when to send the next PING that
    /// finds out whether the peer still reads (a vanished peer answers it with a reset,
    /// and the runtime's next write fails).
    pub(super) next_probe: Option<Instant>,
    /// Bytes written as of the instant: the write-stall clock.
    pub(super) tx_progress: (u64, Instant),
    /// This server's settings, encoded, when it takes part in the settings exchange.
    pub(super) settings: Option<Bytes>,
    /// What the client said in the exchange.
    pub(super) peer_settings: Option<Settings>,
}

impl ServerConn {
    /// A new connection accepted at `now`, with a process budget of its own (no limit
    /// beyond `max_conn_held_bytes`).
    pub fn new(cfg: ConnConfig, now: Instant) -> Self {
        Self::with_budget(cfg, now, Arc::new(HeldBudget::default()))
    }

    /// A new connection accepted at `now` that charges what it holds to `budget`, shared
    /// with the server's other connections (see [`crate::budget`]).
    pub fn with_budget(cfg: ConnConfig, now: Instant, budget: Arc<HeldBudget>) -> Self {
        ServerConn {
            f: Framing::new(cfg, now),
            inflight: IdMap::default(),
            deadlines: BTreeSet::new(),
            events: VecDeque::new(),
            state: ServerState::Open,
            hmc_buffer: false,
            sinks: None,
            staged: IdMap::default(),
            budget,
            req_held: 0,
            settled: 0,
            last_activity: now,
            peer_closed: false,
            next_probe: None,
            settings: None,
            peer_settings: None,
            tx_progress: (0, now),
        }
    }

    /// Bytes this connection makes the server hold now: admitted requests until answered,
    /// responses waiting to be written (streamed bodies whole), skipped streams' entries.
    pub fn held_bytes(&self) -> u64 {
        self.req_held + self.f.tx_held() + self.f.skipped_streams() as u64 * SKIPPED_STREAM_COST
    }

    /// Response bytes waiting to be written (queued frames and the rest of every outgoing
    /// stream).
    pub fn tx_backlog(&self) -> u64 {
        self.f.tx_held()
    }

    /// Whether the runtime should read from the socket now: not closing, the peer has not
    /// closed its side, and the answers waiting for it are under `max_tx_backlog`.
    pub fn may_read(&self) -> bool {
        !self.peer_closed
            && !matches!(self.state, ServerState::Closing(_))
            && self.f.tx_held() < self.f.cfg.max_tx_backlog
    }

    /// Books what changed since the last turn: settles the held bytes with the process
    /// budget (in steps of [`SETTLE_SLACK`]) and restarts the write-stall clock when bytes
    /// were written or nothing waits. The runtime calls it once per turn of its loop,
    /// after writing.
    pub fn settle(&mut self, now: Instant) {
        let held = self.held_bytes();
        if held.abs_diff(self.settled) >= SETTLE_SLACK || (held == 0 && self.settled != 0) {
            self.budget.settle(self.settled, held);
            self.settled = held;
        }
        let written = self.f.tx_written;
        if written != self.tx_progress.0 || !self.f.has_tx() {
            self.tx_progress = (written, now);
        }
    }

    /// The peer closed its sending side (a read returned 0). Calls already received are
    /// still answered; request bodies still arriving can never complete and are failed.
    /// Once [`ServerConn::finished`], close the connection.
    pub fn handle_eof(&mut self, now: Instant) {
        if self.peer_closed {
            return;
        }
        self.peer_closed = true;
        // A partial frame can never complete either.
        self.f.in_pos = self.f.in_end;
        self.f.partial_since = None;
        if matches!(self.state, ServerState::Closing(_)) {
            return;
        }
        if !self.inflight.is_empty() || self.f.has_tx() {
            self.budget.bump(Event::HalfClosed);
        }
        let ids: Vec<u64> = self.f.streams_in.keys().copied().collect();
        for id in ids {
            self.f.streams_in.remove(&id);
            self.abandon(
                id,
                Status::CANCELLED,
                "the client closed its sending side before this request's body was complete",
            );
        }
        self.last_activity = now;
        self.next_probe = Some(now + PROBE_INTERVAL);
    }

    /// Gives the input buffer back to a pool shared by all connections when no received
    /// byte waits in it: call it before waiting for the socket, so that a quiet connection
    /// holds no input buffer.
    pub fn release_input(&mut self) {
        self.f.release_input();
    }

    /// True once the peer closed its side and every call it sent is answered and written.
    pub fn finished(&self) -> bool {
        self.peer_closed && self.inflight.is_empty() && !self.f.has_tx()
    }

    /// Streams the requests `factory` picks into its sinks instead of host memory (the
    /// runtime's device methods). A call so received comes with an empty payload; take its
    /// sink's product with [`ServerConn::take_staged`].
    pub fn set_sink_factory(&mut self, factory: SinkFactory) {
        self.sinks = Some(factory);
    }

    /// The sink's product for a call's request (once; `None` if it was reassembled in host
    /// memory).
    pub fn take_staged(&mut self, request_id: u64) -> Option<StagedPayload> {
        self.staged.remove(&request_id)
    }

    /// Passes HMC_BUFFER requests to the runtime as calls (their payload is the
    /// descriptor) instead of answering them DATA_PLANE: the runtime has a data plane.
    pub fn enable_hmc_buffer(&mut self) {
        self.hmc_buffer = true;
    }

    /// Feeds received bytes.
    pub fn handle_input(&mut self, bytes: &[u8], now: Instant) {
        if matches!(self.state, ServerState::Closing(_)) {
            return;
        }
        self.f.push_input(bytes, now);
        self.process_input(now);
    }

    /// `n` bytes were read where [`ServerConn::read_target`] or [`ServerConn::input_space`]
    /// said.
    pub fn handle_read(&mut self, n: usize, now: Instant) {
        if matches!(self.state, ServerState::Closing(_)) {
            return;
        }
        self.f.commit_read(n, now);
        self.process_input(now);
    }

    pub(super) fn process_input(&mut self, now: Instant) {
        loop {
            match self.f.next_frame(now) {
                Ok(Parsed::Need) => break,
                Ok(Parsed::DirectDone(h, start)) => {
                    let r = self
                        .f
                        .direct_done(h, start)
                        .map(|m| self.on_stream_message(m));
                    if let Err(why) = r {
                        self.close(Status::PROTOCOL, &why);
                        break;
                    }
                }
                Ok(Parsed::Frame(h, body)) => {
                    if let Err(why) = self.on_frame(h, body, now) {
                        self.close(Status::PROTOCOL, &why);
                        break;
                    }
                    if matches!(self.state, ServerState::Closing(_)) {
                        break;
                    }
                }
                Err(e) => {
                    self.close(Status::PROTOCOL, &e.to_string());
                    break;
                }
            }
        }
    }

    pub(super) fn on_frame(
        &mut self,
        h: FrameHeader,
        range: std::ops::Range<usize>,
        now: Instant,
    ) -> Result<(), String> {
        if matches!(
            h.kind,
            FrameKind::Request | FrameKind::Data | FrameKind::Cancel
        ) {
            self.last_activity = now;
        }
        if h.kind == FrameKind::Data {
            return self.on_data(h, range);
        }
        let body = self.f.body(range);
        match h.kind {
            FrameKind::Request => self.on_request(h, body, now),
            FrameKind::Data => unreachable!("handled above"),
            FrameKind::Cancel => {
                self.abandon(h.request_id, Status::CANCELLED, "cancelled by the client");
                // The client sends no DATA for a call after cancelling it (frames queued
                // before the CANCEL arrived before it), so a half-received request's
                // stream is done with.
                self.f.streams_in.remove(&h.request_id);
                Ok(())
            }
            FrameKind::Ping => {
                let pong = FrameHeader::new(FrameKind::Pong, h.request_id);
                self.f.send_frame(&pong, &[]);
                Ok(())
            }
            FrameKind::Pong => Ok(()),
            FrameKind::GoAway => {
                let reason = String::from_utf8_lossy(&body).into_owned();
                tracing::debug!(%reason, "client sent GOAWAY");
                self.state = ServerState::Closing(format!("client went away: {reason}"));
                Ok(())
            }
            FrameKind::Response => Err("a client sent a RESPONSE frame".into()),
        }
    }

    pub(super) fn on_data(
        &mut self,
        h: FrameHeader,
        range: std::ops::Range<usize>,
    ) -> Result<(), String> {
        let m = self.f.data_frame(h, range)?;
        self.on_stream_message(m);
        Ok(())
    }

    /// A streamed request is complete (`Some`): pass it on as a call.
    pub(super) fn on_stream_message(&mut self, m: Option<Message>) {
        if let Some(m) = m {
            let id = m.header.request_id;
            if let Some(e) = self.inflight.get_mut(&id) {
                e.receiving = false;
                if let Some(staged) = m.staged {
                    self.staged.insert(id, staged);
                }
                let call = IncomingCall {
                    request_id: id,
                    method_id: m.header.method_id,
                    mode: PayloadMode::TcpStream,
                    payload_len: m.header.payload_len,
                    payload: m.payload,
                    deadline: e.deadline,
                    one_way: e.one_way,
                };
                self.events.push_back(ServerEvent::Call(call));
            }
        }
    }

    pub(super) fn on_request(
        &mut self,
        h: FrameHeader,
        body: Bytes,
        now: Instant,
    ) -> Result<(), String> {
        let id = h.request_id;
        if self.inflight.contains_key(&id) || self.f.streams_in.contains_key(&id) {
            return Err(format!("duplicate request id {id} while it is in flight"));
        }
        if h.method_id == SETTINGS_METHOD
            && let Some(mine) = self.settings.clone()
        {
            return self.on_settings(h, body, mine);
        }
        // The bytes this request makes us hold until it is answered: its whole body, even
        // while it is still arriving.
        let need = if h.mode == PayloadMode::TcpStream {
            h.payload_len
        } else {
            body.len() as u64
        };
        if let Err((status, why)) = self.check_limits(&h, need) {
            self.refuse(h, status, why, now);
            return Ok(());
        }
        if let Some((status, why)) = self.check_buffer_mode(&h) {
            self.answer(id, h.method_id, status, Bytes::from_static(why.as_bytes()));
            return Ok(());
        }
        self.accept(h, body, need, now)
    }

    /// The limits a request `h` that makes us hold `need` bytes must pass, in order: the
    /// server is not draining, and the payload, the calls in flight, this connection's and
    /// the process's held bytes stay within their limits. `Err`: the answer that refuses
    /// it (a budget refusal is counted).
    #[inline]
    fn check_limits(&self, h: &FrameHeader, need: u64) -> Result<(), (Status, String)> {
        if self.state == ServerState::Draining {
            return Err((
                Status::SHUTTING_DOWN,
                "the server is shutting down; call another server or retry later".to_string(),
            ));
        }
        if h.payload_len > self.f.cfg.limits.max_payload_len {
            let why = format!(
                "limit `max_payload_len` exceeded: {} > {}; raise the server's max_payload_len or send less",
                h.payload_len, self.f.cfg.limits.max_payload_len
            );
            return Err((Status::PAYLOAD_TOO_LARGE, why));
        }
        if self.inflight.len() >= self.f.cfg.max_inflight {
            let why = format!(
                "limit `max_inflight_per_conn` reached ({}); wait for answers or raise the server's ConnConfig::max_inflight",
                self.f.cfg.max_inflight
            );
            return Err((Status::OVERLOADED, why));
        }
        let held = self.held_bytes();
        let conn_limit = self.f.cfg.max_conn_held_bytes;
        if held.saturating_add(need) > conn_limit {
            self.budget.bump(Event::RefusedConnBudget);
            let why = format!(
                "limit `max_conn_held_bytes` ({conn_limit}) reached: this connection's calls and unread answers hold {held} bytes and this request needs {need}; read the answers, wait for calls to finish, or raise the server's ConnConfig::max_conn_held_bytes"
            );
            return Err((Status::OVERLOADED, why));
        }
        let total = self.budget.held().saturating_sub(self.settled) + held;
        if total.saturating_add(need) > self.budget.limit() {
            self.budget.bump(Event::RefusedProcessBudget);
            let why = format!(
                "limit `max_held_bytes` ({}) reached: the server holds {total} bytes for its clients and this request needs {need}; retry later or raise the server's ServerConfig::max_held_bytes",
                self.budget.limit()
            );
            return Err((Status::OVERLOADED, why));
        }
        Ok(())
    }

    /// An HMC_BUFFER request `h` this connection cannot serve: one without its descriptor,
    /// or any while no data plane is enabled. `Some`: the answer that refuses it.
    #[inline]
    fn check_buffer_mode(&self, h: &FrameHeader) -> Option<(Status, &'static str)> {
        if h.mode != PayloadMode::HmcBuffer {
            return None;
        }
        if h.body_len == 0 {
            return Some((
                Status::BAD_PAYLOAD,
                "an HMC_BUFFER request needs its data-plane descriptor as the body",
            ));
        }
        (!self.hmc_buffer).then_some((Status::DATA_PLANE, NO_DATA_PLANE_TEXT))
    }

    /// Answers request `h` with the refusal `status` and `why`. A refused body is still read
    /// (and dropped) to keep the connection in step; each such stream costs an entry, so
    /// they are bounded like calls: past that bound the connection closes instead.
    fn refuse(&mut self, h: FrameHeader, status: Status, why: String, now: Instant) {
        if h.mode == PayloadMode::TcpStream {
            let skipped = self.f.skipped_streams();
            if skipped >= self.f.cfg.max_inflight {
                let why = format!(
                    "limit `max_inflight_per_conn` ({}) reached by refused request bodies still unfinished; send or CANCEL their DATA before new calls",
                    self.f.cfg.max_inflight
                );
                self.close_counted(Event::ClosedSkippedStreams, Status::OVERLOADED, &why);
                return;
            }
            self.f.open_in_stream(h, true, None, now);
        }
        self.answer(h.request_id, h.method_id, status, Bytes::from(why));
    }

    /// Takes request `h` in, holding `need` bytes until it is answered: an INLINE or
    /// HMC_BUFFER request becomes a call now, a streamed one once its body is in.
    #[inline]
    fn accept(
        &mut self,
        h: FrameHeader,
        body: Bytes,
        need: u64,
        now: Instant,
    ) -> Result<(), String> {
        let id = h.request_id;
        let streaming = h.mode == PayloadMode::TcpStream;
        let deadline =
            (h.deadline_us != 0).then(|| now + Duration::from_micros(h.deadline_us.into()));
        let one_way = h.flags.contains(Flags::ONE_WAY);
        if let Some(d) = deadline {
            self.deadlines.insert((d, id));
        }
        self.inflight.insert(
            id,
            ServerInFlight {
                deadline,
                one_way,
                receiving: streaming,
                held: need,
            },
        );
        self.req_held += need;
        if streaming {
            let sink = self
                .sinks
                .as_mut()
                .and_then(|make| make(h.method_id, h.payload_len));
            self.f.open_in_stream(h, false, sink, now);
        } else {
            if h.mode == PayloadMode::Inline {
                check_payload_crc(id, h.payload_crc, &body).map_err(|e| e.to_string())?;
            }
            self.events.push_back(ServerEvent::Call(IncomingCall {
                request_id: id,
                method_id: h.method_id,
                mode: h.mode,
                payload_len: h.payload_len,
                payload: body,
                deadline,
                one_way,
            }));
        }
        Ok(())
    }

    /// The settings exchange: answered here, outside the request table and the handlers.
    fn on_settings(&mut self, h: FrameHeader, body: Bytes, mine: Bytes) -> Result<(), String> {
        let id = h.request_id;
        if h.mode != PayloadMode::Inline {
            if h.mode == PayloadMode::TcpStream {
                // Keep the connection in step: its DATA is read and dropped.
                self.f.open_in_stream(h, true, None, self.last_activity);
            }
            let why = "the settings request is sent INLINE";
            self.answer(
                id,
                h.method_id,
                Status::BAD_PAYLOAD,
                Bytes::from_static(why.as_bytes()),
            );
            return Ok(());
        }
        check_payload_crc(id, h.payload_crc, &body).map_err(|e| e.to_string())?;
        let one_way = h.flags.contains(Flags::ONE_WAY);
        match Settings::decode(&body) {
            Ok(peer) => {
                self.peer_settings = Some(peer);
                if !one_way {
                    self.answer(id, h.method_id, Status::OK, mine);
                }
            }
            Err(why) if !one_way => {
                self.answer(id, h.method_id, Status::BAD_PAYLOAD, Bytes::from(why));
            }
            Err(_) => {}
        }
        Ok(())
    }

    /// Takes part in the settings exchange with `settings` (see [`crate::settings`]);
    /// without it, a settings request goes to the handlers like any call (a v1 server).
    pub fn set_settings(&mut self, settings: &Settings) {
        self.settings = Some(Bytes::from(settings.encode()));
    }

    /// What the client said in the settings exchange, if it took part.
    pub fn peer_settings(&self) -> Option<&Settings> {
        self.peer_settings.as_ref()
    }

    /// Queues a response outside the request table (refusals).
    pub(super) fn answer(&mut self, id: u64, method: u32, status: Status, payload: Bytes) {
        let mut h = FrameHeader::new(FrameKind::Response, id);
        h.method_id = method;
        h.status = status;
        self.f.send_message(h, payload);
    }

    pub(super) fn abandon(&mut self, id: u64, why: Status, text: &str) {
        let Some(e) = self.inflight.remove(&id) else {
            return; // already answered: cancel is idempotent
        };
        self.req_held -= e.held;
        if let Some(d) = e.deadline {
            self.deadlines.remove(&(d, id));
        }
        if e.receiving
            && let Some(s) = self.f.streams_in.get_mut(&id)
        {
            s.discard = true;
            s.buf = Vec::new();
            s.sink = None;
        }
        self.staged.remove(&id);
        if !e.one_way {
            self.answer(id, 0, why, Bytes::from(text.to_string()));
        }
        self.events.push_back(ServerEvent::Abandon {
            request_id: id,
            why,
        });
    }

    /// The runtime's answer to a call. Dropped when the call was already answered
    /// (cancelled or timed out); replaced by DEADLINE_EXCEEDED when it comes too late.
    pub fn respond(
        &mut self,
        request_id: u64,
        method_id: u32,
        status: Status,
        payload: Bytes,
        now: Instant,
    ) {
        self.staged.remove(&request_id);
        let Some(e) = self.inflight.remove(&request_id) else {
            return;
        };
        self.req_held -= e.held;
        self.last_activity = now;
        let mut status = status;
        let mut payload = payload;
        if let Some(d) = e.deadline {
            self.deadlines.remove(&(d, request_id));
            if now >= d {
                status = Status::DEADLINE_EXCEEDED;
                payload = Bytes::from_static(b"the handler finished after the call's deadline");
            }
        }
        if e.one_way {
            return;
        }
        let mut h = FrameHeader::new(FrameKind::Response, request_id);
        h.method_id = method_id;
        h.status = status;
        self.f.send_message(h, payload);
    }

    /// Answers a call OK with a `total`-byte TCP_STREAM response whose bytes the runtime
    /// feeds with [`ServerConn::feed`] as it produces them (a device buffer staged out in
    /// chunks). True when the answer is on its way; false when the call was already
    /// answered, is one-way, or finished after its deadline (answered DEADLINE_EXCEEDED
    /// instead): then the runtime stops producing. `total` must exceed [`INLINE_MAX`](crate::frame::INLINE_MAX).
    pub fn respond_fed(
        &mut self,
        request_id: u64,
        method_id: u32,
        total: u64,
        now: Instant,
    ) -> bool {
        if !self.take_in_time(request_id, method_id, now) {
            return false;
        }
        self.staged.remove(&request_id);
        let mut h = FrameHeader::new(FrameKind::Response, request_id);
        h.method_id = method_id;
        h.status = Status::OK;
        self.f.send_message_fed(h, total as usize);
        true
    }

    /// The next piece of a [`ServerConn::respond_fed`] response. False when the stream is
    /// gone (the connection is closing): stop producing.
    pub fn feed(&mut self, request_id: u64, piece: Bytes) -> bool {
        self.f.feed(request_id, piece)
    }

    /// The producer of a [`ServerConn::respond_fed`] response failed after its header went
    /// out. The stream cannot be completed with correct bytes, so the connection closes
    /// with GOAWAY(INTERNAL) naming `why`; the client fails its calls, never reading
    /// wrong data.
    pub fn abort_fed(&mut self, request_id: u64, why: &str) {
        self.close(
            Status::INTERNAL,
            &format!("the response to request {request_id} could not be produced: {why}"),
        );
    }

    /// Answers an HMC_BUFFER call whose `len`-byte response the runtime has already
    /// written into the client's response region: a RESPONSE with mode HMC_BUFFER, no
    /// body. Like [`ServerConn::respond`], ignored for calls already answered, and
    /// DEADLINE_EXCEEDED when it comes too late.
    pub fn respond_in_buffer(&mut self, request_id: u64, method_id: u32, len: u64, now: Instant) {
        if !self.take_in_time(request_id, method_id, now) {
            return;
        }
        let mut h = FrameHeader::new(FrameKind::Response, request_id);
        h.method_id = method_id;
        h.status = Status::OK;
        h.mode = PayloadMode::HmcBuffer;
        h.payload_len = len;
        self.f.send_frame(&h, &[]);
    }

    /// Takes call `request_id` out of the request table for an OK answer whose body goes
    /// apart from [`ServerConn::respond`] (fed, or in the client's buffer): false when it
    /// was already answered, or is one-way or late (then answered as `respond` does).
    #[inline]
    fn take_in_time(&mut self, request_id: u64, method_id: u32, now: Instant) -> bool {
        let Some(e) = self.inflight.get(&request_id) else {
            return false;
        };
        if e.one_way || e.deadline.is_some_and(|d| now >= d) {
            let why = Bytes::from_static(b"the handler finished after the call's deadline");
            self.respond(request_id, method_id, Status::DEADLINE_EXCEEDED, why, now);
            return false;
        }
        if let Some(d) = e.deadline {
            self.deadlines.remove(&(d, request_id));
        }
        let held = e.held;
        self.inflight.remove(&request_id);
        self.req_held -= held;
        self.last_activity = now;
        true
    }

    /// Next event for the runtime.
    pub fn poll_event(&mut self) -> Option<ServerEvent> {
        self.events.pop_front()
    }

    /// When [`ServerConn::handle_timeout`] should next run.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut t = self.deadlines.first().map(|(d, _)| *d);
        let mut take = |x: Option<Instant>| {
            if let Some(x) = x {
                t = Some(t.map_or(x, |t| t.min(x)));
            }
        };
        take(self.f.stall_deadline());
        if self.f.has_tx() {
            take(Some(self.tx_progress.1 + self.f.cfg.write_stall_timeout));
        }
        take(self.stream_idle_deadline());
        if self.idle_applies() {
            take(Some(self.last_activity + self.f.cfg.idle_timeout));
        }
        if !self.inflight.is_empty() {
            take(self.next_probe);
        }
        t
    }

    /// The idle timeout runs while nothing is in flight, no body is arriving and the
    /// connection is open.
    pub(super) fn idle_applies(&self) -> bool {
        self.inflight.is_empty() && self.f.streams_in.is_empty() && self.state == ServerState::Open
    }

    /// When the quietest incoming stream passes `stream_idle_timeout`.
    pub(super) fn stream_idle_deadline(&self) -> Option<Instant> {
        self.f
            .streams_in
            .values()
            .map(|s| s.last_data)
            .min()
            .map(|t| t + self.f.cfg.stream_idle_timeout)
    }

    /// Fails request streams that sent no DATA for `stream_idle_timeout` and forgets
    /// skipped ones as quiet.
    pub(super) fn expire_streams(&mut self, now: Instant) {
        let idle = self.f.cfg.stream_idle_timeout;
        let stalled: Vec<(u64, bool)> = self
            .f
            .streams_in
            .iter()
            .filter(|(_, s)| now >= s.last_data + idle)
            .map(|(id, s)| (*id, s.discard))
            .collect();
        for (id, skipped) in stalled {
            self.f.streams_in.remove(&id);
            if !skipped {
                self.budget.bump(Event::StreamStalled);
                let why = format!(
                    "the request body stalled: no DATA for `stream_idle_timeout` ({idle:?}); send whole bodies promptly or raise the server's ConnConfig::stream_idle_timeout"
                );
                self.abandon(id, Status::DEADLINE_EXCEEDED, &why);
            }
        }
    }

    /// Expires deadlines, stalled frames and idle connections.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(&(d, id)) = self.deadlines.first() {
            if d > now {
                break;
            }
            self.abandon(
                id,
                Status::DEADLINE_EXCEEDED,
                "the call's deadline passed before it completed",
            );
        }
        if matches!(self.state, ServerState::Closing(_)) {
            return;
        }
        if self.f.stall_deadline().is_some_and(|t| now >= t) {
            let why = format!(
                "an incomplete frame stalled for longer than `frame_timeout` ({:?}); send whole frames",
                self.f.cfg.frame_timeout
            );
            self.close(Status::PROTOCOL, &why);
            return;
        }
        if self.f.has_tx() && now >= self.tx_progress.1 + self.f.cfg.write_stall_timeout {
            let why = format!(
                "the client read none of its answers for `write_stall_timeout` ({:?}); read answers as they come or raise the server's ConnConfig::write_stall_timeout",
                self.f.cfg.write_stall_timeout
            );
            self.close_counted(Event::ClosedWriteStall, Status::OVERLOADED, &why);
            return;
        }
        if self.stream_idle_deadline().is_some_and(|t| now >= t) {
            self.expire_streams(now);
        }
        if let Some(t) = self.next_probe
            && now >= t
            && !self.inflight.is_empty()
        {
            // A peer that only closed its sending side ignores or answers this; one that
            // is gone resets the connection, which fails the next write.
            let ping = FrameHeader::new(FrameKind::Ping, 0);
            self.f.send_frame(&ping, &[]);
            self.next_probe = Some(now + PROBE_INTERVAL);
        }
        if self.idle_applies() && now >= self.last_activity + self.f.cfg.idle_timeout {
            let why = format!(
                "idle for `idle_timeout` ({:?}); reconnect to call again",
                self.f.cfg.idle_timeout
            );
            self.close_counted(Event::ClosedIdle, Status::OK, &why);
        }
    }

    /// Starts a graceful shutdown: sends GOAWAY(SHUTTING_DOWN); calls in flight finish,
    /// new ones are answered SHUTTING_DOWN.
    pub fn begin_shutdown(&mut self) {
        if self.state == ServerState::Open {
            let (h, b) = goaway(
                Status::SHUTTING_DOWN,
                "server shutting down: calls in flight finish, new calls are refused",
            );
            self.f.send_frame(&h, &b);
            self.state = ServerState::Draining;
        }
    }

    /// Closes the connection for a limit or timeout that `event` counts.
    fn close_counted(&mut self, event: Event, status: Status, why: &str) {
        self.budget.bump(event);
        self.close(status, why);
    }

    pub(super) fn close(&mut self, status: Status, why: &str) {
        if matches!(self.state, ServerState::Closing(_)) {
            return;
        }
        tracing::debug!(%status, reason = why, "closing connection with GOAWAY");
        let (h, b) = goaway(status, why);
        self.f.send_frame(&h, &b);
        self.f.streams_out.clear();
        self.f.streams_in.clear();
        self.state = ServerState::Closing(why.to_string());
        let ids: Vec<u64> = self.inflight.keys().copied().collect();
        self.req_held = 0;
        for id in ids {
            self.inflight.remove(&id);
            self.events.push_back(ServerEvent::Abandon {
                request_id: id,
                why: Status::CANCELLED,
            });
        }
        self.deadlines.clear();
    }

    /// Calls admitted and not yet answered.
    pub fn inflight_len(&self) -> usize {
        self.inflight.len()
    }

    /// `Some(reason)` once the connection should be closed after flushing.
    pub fn close_reason(&self) -> Option<&str> {
        match &self.state {
            ServerState::Closing(r) => Some(r),
            _ => None,
        }
    }

    /// True when draining and every call has been answered.
    pub fn drained(&self) -> bool {
        self.state == ServerState::Draining && self.inflight.is_empty()
    }
}

impl Drop for ServerConn {
    fn drop(&mut self) {
        self.f.release_input();
        // Whatever this connection still held is no longer held.
        self.budget.settle(self.settled, 0);
    }
}
