//! Starting one call: admission (a known method, a deadline not yet passed, the
//! connection's share, the server's `max_inflight_total`), then one of four ways to run
//! it: an HMC_BUFFER call through the data plane, a device method, an async handler
//! (polled once in place, spawned only if it waits) or a blocking one on the worker pool.
//! Each way either spawns the call (its [`Completion`] comes back through the connection's
//! channel) or answers it at once.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::FutureExt;
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tracing::Instrument;

use super::admit::{self, CountedCall};
use super::{Completion, Shared, panicked, respond_now};
use crate::data_plane::{ConnUse, RunHandler, Served, Work};
use crate::dispatch::{
    CallContext, CancelToken, Connection, DeviceReply, DeviceRequest, DeviceRoute, Handler,
    HandlerResult, RpcError,
};
use crate::frame::{PayloadMode, Status};
use crate::proto::{IdMap, IncomingCall, ServerConn};

/// What holds an admitted call's place in the server's limits until it is answered.
type Permit = crate::metrics::ServerCall<(OwnedSemaphorePermit, CountedCall)>;

/// An admitted call on its way to a handler.
struct Run {
    ctx: CallContext,
    answer: Answer,
}

/// Where an admitted call's answer goes, and what it holds until then.
struct Answer {
    id: u64,
    method: u32,
    permit: Permit,
    /// The handler runs within this span whichever way it runs (crate::trace).
    span: tracing::Span,
    done: mpsc::UnboundedSender<Completion>,
}

impl Answer {
    /// Spawns `work` within the call's span. It runs until it completes, or until `token`
    /// fires and `handler_cancel_grace` passes (its output is then `on_cancel()`: see
    /// [`until_cancelled`]); then `finish` makes the completion of its output, the call's
    /// place in the server's limits is released, and the completion goes back.
    fn spawn<T>(
        self,
        shared: &Shared,
        token: CancelToken,
        work: impl Future<Output = T> + Send + 'static,
        on_cancel: impl FnOnce() -> T + Send + 'static,
        finish: impl FnOnce(u64, u32, T) -> Completion + Send + 'static,
    ) -> Started {
        let Answer {
            id,
            method,
            permit,
            span,
            done,
        } = self;
        let grace = shared.config.handler_cancel_grace;
        let task = async move {
            let out = until_cancelled(work, &token, grace, on_cancel).await;
            let completion = finish(id, method, out);
            drop(permit);
            let _ = done.send(completion);
        };
        tokio::spawn(task.instrument(span));
        Started::Spawned
    }
}

/// How a way of running a call left it.
enum Started {
    /// Handed to a task or a worker: its completion comes through `done`.
    Spawned,
    /// Answered at once (a handler ready when first polled, or one that panicked there).
    Answered(Completion),
    /// Refused after admission.
    Refused(Status, String),
}

impl Completion {
    /// A plain answer (no response in the client's buffer, no fed body).
    fn answer(request_id: u64, method_id: u32, result: HandlerResult) -> Self {
        Completion {
            request_id,
            method_id,
            result,
            in_buffer: None,
            fed: None,
        }
    }
}

/// Starts a call: answers it in place (refusals, handlers ready at once) or hands it to a
/// task or a blocking worker; true in the second case, where its [`Completion`] comes
/// through `done`.
pub(super) fn start_call(
    shared: &Arc<Shared>,
    conn_use: &Arc<ConnUse>,
    conn: &Connection,
    core: &mut ServerConn,
    tokens: &mut IdMap<u64, CancelToken>,
    done: &mpsc::UnboundedSender<Completion>,
    call: IncomingCall,
) -> bool {
    // A fresh clock per call, not one per batch: an inline handler earlier in the batch may
    // have run long, and expired work must not start.
    let now = Instant::now();
    let (id, method) = (call.request_id, call.method_id);
    let Some((handler, permit)) = admit_call(shared, conn, core, &call, now) else {
        return false;
    };
    let cancel = CancelToken::new();
    tokens.insert(id, cancel.clone());
    let run = Run {
        ctx: CallContext {
            connection: conn.clone(),
            request_id: id,
            method_id: method,
            deadline: call.deadline,
            cancel,
        },
        answer: Answer {
            id,
            method,
            permit,
            span: crate::trace::handle(id, method),
            done: done.clone(),
        },
    };
    let started = if call.mode == PayloadMode::HmcBuffer {
        start_buffered(shared, conn_use, handler, run, call)
    } else if let Some(route) = shared.dispatcher.device_route(method).cloned() {
        let request = match core.take_staged(id) {
            Some(staged) => DeviceRequest::Staged(staged),
            None => DeviceRequest::Host(call.payload),
        };
        start_device(shared, route, run, request)
    } else {
        match handler {
            Handler::Async(h) => start_async(shared, h, run, call.payload),
            Handler::Blocking(h) => start_blocking(shared, h, run, call.payload),
        }
    };
    match started {
        Started::Spawned => true,
        Started::Answered(c) => {
            tokens.remove(&id);
            respond_now(core, c, Instant::now());
            false
        }
        Started::Refused(status, why) => {
            tokens.remove(&id);
            refuse(core, id, method, now, status, why);
            false
        }
    }
}

fn refuse(core: &mut ServerConn, id: u64, method: u32, now: Instant, status: Status, why: String) {
    crate::metrics::server_answered(status, 0);
    core.respond(id, method, status, Bytes::from(why), now);
}

/// The call's handler and its place in the server's limits, or `None` when it was
/// refused (and answered): an unknown method, a deadline already passed, a connection
/// over its share, or `max_inflight_total` reached.
fn admit_call(
    shared: &Arc<Shared>,
    conn: &Connection,
    core: &mut ServerConn,
    call: &IncomingCall,
    now: Instant,
) -> Option<(Handler, Permit)> {
    let (id, method) = (call.request_id, call.method_id);
    let refuse = |core: &mut ServerConn, status, why| refuse(core, id, method, now, status, why);
    let Some(handler) = shared.dispatcher.get(method) else {
        let known = shared.dispatcher.method_ids();
        refuse(
            core,
            Status::UNKNOWN_METHOD,
            format!("no method {method} on this server (it serves {known:?})"),
        );
        return None;
    };
    if call.deadline.is_some_and(|d| now >= d) {
        refuse(
            core,
            Status::DEADLINE_EXCEEDED,
            "the deadline passed before the call started".into(),
        );
        return None;
    }
    if let Some(why) = admit::over_share(shared, conn) {
        refuse(core, Status::OVERLOADED, why);
        return None;
    }
    let Ok(permit) = shared.inflight.clone().try_acquire_owned().map(|p| {
        let counted = CountedCall::start(conn, &shared.active);
        crate::metrics::ServerCall::admit((p, counted), call.payload_len)
    }) else {
        refuse(
            core,
            Status::OVERLOADED,
            format!(
                "limit `max_inflight_total` ({}) reached; retry later or raise the server's max_inflight_total",
                shared.config.max_inflight_total
            ),
        );
        return None;
    };
    Some((handler.clone(), permit))
}

/// An HMC_BUFFER call: the data plane pulls its payload one-sided, runs the handler (or
/// the device route) and places the response, in a task.
fn start_buffered(
    shared: &Arc<Shared>,
    conn_use: &Arc<ConnUse>,
    handler: Handler,
    run: Run,
    call: IncomingCall,
) -> Started {
    let Some(dp) = shared.dp.clone() else {
        // The core only passes HMC_BUFFER calls on when a data plane is enabled.
        return Started::Refused(Status::DATA_PLANE, "no data plane configured".into());
    };
    let Run { ctx, answer } = run;
    let method = answer.method;
    let deadline = call
        .deadline
        .map(hmc_core::Deadline::at)
        .unwrap_or_default();
    let token = ctx.cancel.clone();
    let work = match shared.dispatcher.device_route(method) {
        Some(route) => Work::Device(ctx, route.clone()),
        None => Work::Bytes {
            in_place: shared.dispatcher.takes_in_place(method),
            run: runner(shared.clone(), handler, ctx),
        },
    };
    let serving = dp.serve(
        conn_use.clone(),
        call.payload,
        call.payload_len,
        deadline,
        work,
    );
    let on_cancel = || Served::Answer(Err(cancelled()));
    answer.spawn(shared, token, serving, on_cancel, |id, method, served| {
        let (result, in_buffer) = match served {
            Served::Answer(r) => (r, None),
            Served::InBuffer(n) => (Ok(Bytes::new()), Some(n)),
        };
        Completion {
            in_buffer,
            ..Completion::answer(id, method, result)
        }
    })
}

/// A device method: its streamed request is on the device already; its response leaves
/// in chunks.
fn start_device(
    shared: &Arc<Shared>,
    route: Arc<dyn DeviceRoute>,
    run: Run,
    request: DeviceRequest,
) -> Started {
    let Run { ctx, answer } = run;
    let token = ctx.cancel.clone();
    let running = AssertUnwindSafe(route.run(ctx, request)).catch_unwind();
    let on_cancel = || Ok(Err(cancelled()));
    answer.spawn(shared, token, running, on_cancel, |id, method, r| {
        let (result, fed) = match r.unwrap_or_else(|p| Err(panicked(method, p))) {
            Ok(DeviceReply::Host(b)) => (Ok(b), None),
            Ok(DeviceReply::Fed { len, pieces }) => (Ok(Bytes::new()), Some((len, pieces))),
            Err(e) => (Err(e), None),
        };
        Completion {
            fed,
            ..Completion::answer(id, method, result)
        }
    })
}

/// An async handler, polled once in place: a handler that is ready at once (echo, small
/// compute) is answered without a task hop; one that waits is spawned with a real waker.
fn start_async(
    shared: &Arc<Shared>,
    h: Arc<crate::dispatch::AsyncFn>,
    run: Run,
    payload: Bytes,
) -> Started {
    let Run { ctx, answer } = run;
    let (id, method) = (answer.id, answer.method);
    let token = ctx.cancel.clone();
    let entered = answer.span.enter();
    let fut = match std::panic::catch_unwind(AssertUnwindSafe(|| h(ctx, payload))) {
        Ok(f) => f,
        Err(p) => {
            drop(answer.permit);
            return Started::Answered(Completion::answer(id, method, Err(panicked(method, p))));
        }
    };
    let mut fut = AssertUnwindSafe(fut).catch_unwind();
    let waker = futures::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    let polled = std::pin::Pin::new(&mut fut).poll(&mut cx);
    drop(entered);
    if let std::task::Poll::Ready(r) = polled {
        let result = r.unwrap_or_else(|p| Err(panicked(method, p)));
        drop(answer.permit);
        return Started::Answered(Completion::answer(id, method, result));
    }
    let on_cancel = || Ok(Err(cancelled()));
    answer.spawn(shared, token, fut, on_cancel, |id, method, r| {
        Completion::answer(id, method, r.unwrap_or_else(|p| Err(panicked(method, p))))
    })
}

/// A blocking handler, on the server's worker pool; refused when the pool's queue is full.
fn start_blocking(
    shared: &Arc<Shared>,
    h: Arc<crate::dispatch::BlockingFn>,
    run: Run,
    payload: Bytes,
) -> Started {
    let Run {
        ctx,
        answer:
            Answer {
                id,
                method,
                permit,
                span,
                done,
            },
    } = run;
    let job = Box::new(move || {
        let _entered = span.enter();
        let result = if ctx.is_cancelled() || ctx.remaining().is_some_and(|r| r.is_zero()) {
            Err(RpcError::new(
                Status::DEADLINE_EXCEEDED,
                "expired before a worker was free",
            ))
        } else {
            std::panic::catch_unwind(AssertUnwindSafe(|| h(&ctx, payload)))
                .unwrap_or_else(|p| Err(panicked(method, p)))
        };
        drop(permit);
        let _ = done.send(Completion::answer(id, method, result));
    });
    match shared.pool.submit(job) {
        Ok(()) => Started::Spawned,
        Err(why) => Started::Refused(Status::OVERLOADED, why),
    }
}

/// Runs a handler's future until it completes; once `token` fires (the call was
/// cancelled, expired or lost its connection), goes on polling it for up to `grace` so
/// that a handler waiting on `ctx.cancel` always sees it and returns, and only then
/// drops it, answering with `on_cancel()`. The handler's own answer after a cancel is
/// used as the completion (the core discards completions of abandoned calls).
async fn until_cancelled<T>(
    fut: impl Future<Output = T>,
    token: &CancelToken,
    grace: Duration,
    on_cancel: impl FnOnce() -> T,
) -> T {
    let mut fut = std::pin::pin!(fut);
    tokio::select! {
        // The handler first: a handler that completes in the same wake-up as the cancel
        // keeps its answer.
        biased;
        r = &mut fut => return r,
        _ = token.cancelled() => {}
    }
    match tokio::time::timeout(grace, fut).await {
        Ok(r) => r,
        Err(_) => {
            tracing::debug!(
                ?grace,
                "a cancelled handler did not return within `handler_cancel_grace`; dropping it"
            );
            on_cancel()
        }
    }
}

fn cancelled() -> RpcError {
    RpcError::new(Status::CANCELLED, "cancelled")
}

/// The handler of an HMC_BUFFER call, run once its payload has been pulled.
fn runner(shared: Arc<Shared>, handler: Handler, ctx: CallContext) -> RunHandler {
    let method = ctx.method_id;
    Box::new(move |payload: Bytes| match handler {
        Handler::Async(h) => Box::pin(async move {
            match std::panic::catch_unwind(AssertUnwindSafe(|| h(ctx, payload))) {
                Ok(f) => AssertUnwindSafe(f)
                    .catch_unwind()
                    .await
                    .unwrap_or_else(|p| Err(panicked(method, p))),
                Err(p) => Err(panicked(method, p)),
            }
        }),
        Handler::Blocking(h) => {
            let (tx, rx) = tokio::sync::oneshot::channel();
            // The worker thread runs it within the call's span (this future's).
            let span = tracing::Span::current();
            let job = Box::new(move || {
                let _entered = span.enter();
                let r = std::panic::catch_unwind(AssertUnwindSafe(|| h(&ctx, payload)))
                    .unwrap_or_else(|p| Err(panicked(method, p)));
                let _ = tx.send(r);
            });
            let submitted = shared.pool.submit(job);
            Box::pin(async move {
                submitted.map_err(|why| RpcError::new(Status::OVERLOADED, why))?;
                rx.await.unwrap_or_else(|_| {
                    Err(RpcError::new(
                        Status::INTERNAL,
                        "the blocking worker ended without an answer",
                    ))
                })
            })
        }
    })
}
