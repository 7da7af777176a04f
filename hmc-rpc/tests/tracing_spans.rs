//! Request ids in `tracing` spans on both sides of real connections: every call a client
//! makes is found in the server's handler span under the same request id and the client's
//! own socket address, whichever way the handler runs and the payload travels, so a log
//! line of each side can be joined (`hmc_rpc::trace`'s contract, docs/design.md).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use common::data_plane::tcp_comm;
use hmc_core::Communicator;
use hmc_rpc::{
    Client, ClientConfig, DirectClient, Dispatcher, RpcError, RunningServer, Server, ServerConfig,
    Status,
};
use rstest::rstest;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{Layer, filter::LevelFilter};

/// A span's name and the fields recorded on it so far.
#[derive(Clone, Debug, Default)]
struct SpanFields {
    name: &'static str,
    fields: BTreeMap<String, String>,
}

impl Visit for SpanFields {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.fields
            .insert(field.name().to_string(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.fields.insert(field.name().to_string(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.fields
            .insert(field.name().to_string(), value.to_string());
    }
}

/// What a log line or a closing span saw: its own fields, then each enclosing span's,
/// innermost first.
#[derive(Clone, Debug)]
struct Seen {
    own: SpanFields,
    scope: Vec<SpanFields>,
}

impl Seen {
    /// `field` of the nearest span named `span` in scope.
    fn get(&self, span: &str, field: &str) -> Option<&str> {
        std::iter::once(&self.own)
            .chain(&self.scope)
            .find(|s| s.name == span)
            .and_then(|s| s.fields.get(field))
            .map(String::as_str)
    }
}

/// Every span that closed and every event, with their scopes, resolved when they happen
/// (span ids are reused, so nothing is looked up later).
#[derive(Clone, Default)]
struct Capture {
    closed: Arc<Mutex<Vec<Seen>>>,
    events: Arc<Mutex<Vec<Seen>>>,
}

fn scope_of<S: Subscriber + for<'a> LookupSpan<'a>>(
    span: Option<tracing_subscriber::registry::SpanRef<'_, S>>,
) -> Vec<SpanFields> {
    span.map(|s| {
        s.scope()
            .filter_map(|s| s.extensions().get::<SpanFields>().cloned())
            .collect()
    })
    .unwrap_or_default()
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut f = SpanFields {
            name: attrs.metadata().name(),
            ..Default::default()
        };
        attrs.record(&mut f);
        ctx.span(id).unwrap().extensions_mut().insert(f);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let span = ctx.span(id).unwrap();
        let mut ext = span.extensions_mut();
        values.record(ext.get_mut::<SpanFields>().unwrap());
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut own = SpanFields {
            name: "event",
            ..Default::default()
        };
        event.record(&mut own);
        let scope = scope_of(ctx.event_span(event));
        self.events.lock().unwrap().push(Seen { own, scope });
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let span = ctx.span(&id).unwrap();
        let mut scope = scope_of(Some(span));
        let own = scope.remove(0);
        self.closed.lock().unwrap().push(Seen { own, scope });
    }
}

/// The process's collector (the server's worker threads log too, so it is global).
fn capture() -> &'static Capture {
    static CAPTURE: OnceLock<Capture> = OnceLock::new();
    CAPTURE.get_or_init(|| {
        let c = Capture::default();
        let sub = tracing_subscriber::registry()
            .with(c.clone())
            .with(LevelFilter::DEBUG);
        tracing::subscriber::set_global_default(sub).unwrap();
        c
    })
}

const OK_METHOD: u32 = 1;
const FAILING_METHOD: u32 = 2;
/// The status the failing method answers with.
const APP_STATUS: Status = Status(1001);

#[derive(Clone, Copy, Debug)]
enum HandlerKind {
    /// Ready at once: polled in place on the connection task.
    AsyncReady,
    /// Waits: spawned as a task.
    AsyncWaits,
    /// Runs on the blocking worker pool.
    Blocking,
}

/// A server whose handlers log one line naming `case`; method 2 also fails.
fn dispatcher(case: &'static str, kind: HandlerKind) -> Dispatcher {
    let mut d = Dispatcher::new();
    let answer = move |method: u32, body: Bytes| -> Result<Bytes, RpcError> {
        tracing::info!(case, "handler ran");
        if method == FAILING_METHOD {
            return Err(RpcError::new(APP_STATUS, "failing on purpose"));
        }
        Ok(body)
    };
    for method in [OK_METHOD, FAILING_METHOD] {
        match kind {
            HandlerKind::AsyncReady => {
                d.register_raw(
                    method,
                    move |_ctx, body| async move { answer(method, body) },
                );
            }
            HandlerKind::AsyncWaits => {
                d.register_raw(method, move |_ctx, body| async move {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    answer(method, body)
                });
            }
            HandlerKind::Blocking => {
                d.register_raw_blocking(method, move |_ctx, body| answer(method, body));
            }
        }
    }
    d
}

/// The handlers' log lines for `case`.
fn handler_lines(case: &str) -> Vec<Seen> {
    let events = capture().events.lock().unwrap();
    events
        .iter()
        .filter(|e| e.own.fields.get("case").map(String::as_str) == Some(case))
        .cloned()
        .collect()
}

/// The calls' `(request_id, address)` as the server saw them: from its handlers' log
/// lines for `case`, the handler span's id and the connection span's peer.
fn server_view(case: &str) -> BTreeSet<(String, String)> {
    handler_lines(case)
        .iter()
        .map(|e| {
            let id = e.get("rpc.handle", "request_id").expect("in rpc.handle");
            let peer = e.get("rpc.conn", "peer").expect("in rpc.conn");
            (id.to_string(), peer.to_string())
        })
        .collect()
}

/// The calls' `(request_id, address)` as the client saw them: its `rpc.call` spans to
/// `server`, with the connection's local address.
fn client_view(server: &str) -> BTreeSet<(String, String)> {
    capture()
        .closed
        .lock()
        .unwrap()
        .iter()
        .filter(|s| {
            s.own.name == "rpc.call"
                && s.own.fields.get("server").map(String::as_str) == Some(server)
        })
        .map(|s| {
            let id = s.own.fields.get("request_id").expect("recorded once sent");
            let local = s.own.fields.get("local").cloned().unwrap_or_default();
            (id.clone(), local)
        })
        .collect()
}

/// The client's "call failed" lines to `server`: the request ids they carry.
fn client_failures(server: &str) -> BTreeSet<String> {
    capture()
        .events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.get("rpc.call", "server") == Some(server))
        .filter(|e| e.own.fields.get("message").map(String::as_str) == Some("call failed"))
        .map(|e| e.get("rpc.call", "request_id").unwrap().to_string())
        .collect()
}

/// The server's request ids of failed calls for `case` (method 2).
fn server_failures(case: &str) -> BTreeSet<String> {
    handler_lines(case)
        .iter()
        .filter(|e| e.get("rpc.handle", "method") == Some(&FAILING_METHOD.to_string()))
        .map(|e| e.get("rpc.handle", "request_id").unwrap().to_string())
        .collect()
}

async fn serve(case: &'static str, kind: HandlerKind, data_plane: bool) -> RunningServer {
    let s = Server::new(dispatcher(case, kind), ServerConfig::default());
    let addr = "tcp://127.0.0.1:0".parse().unwrap();
    if data_plane {
        s.with_data_plane(tcp_comm()).bind(&addr).await.unwrap()
    } else {
        s.bind(&addr).await.unwrap()
    }
}

fn assert_joined(case: &str, server: &RunningServer, calls: usize) {
    let addr = server.local_addr().to_string();
    let client = client_view(&addr);
    let served = server_view(case);
    assert_eq!(client.len(), calls, "{client:?}");
    assert!(
        client
            .iter()
            .all(|(_, local)| local.starts_with("127.0.0.1:")),
        "{client:?}"
    );
    assert_eq!(client, served, "client spans vs. server handler lines");
    let failed = client_failures(&addr);
    assert!(!failed.is_empty());
    assert_eq!(failed, server_failures(case));
}

#[rstest]
#[case::async_ready_inline("async-ready-inline", HandlerKind::AsyncReady, 100, false)]
#[case::async_waits_streamed("async-waits-streamed", HandlerKind::AsyncWaits, 100 << 10, false)]
#[case::blocking("blocking", HandlerKind::Blocking, 100, false)]
#[case::blocking_over_the_data_plane("blocking-hmc-buffer", HandlerKind::Blocking, 100 << 10, true)]
#[case::async_over_the_data_plane("async-hmc-buffer", HandlerKind::AsyncWaits, 100 << 10, true)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_client_call_is_found_under_the_same_request_id_in_the_server_handler_span(
    #[case] case: &'static str,
    #[case] kind: HandlerKind,
    #[case] len: usize,
    #[case] data_plane: bool,
) {
    capture();
    let server = serve(case, kind, data_plane).await;
    let client = Client::connect(server.local_addr(), ClientConfig::default())
        .await
        .unwrap();
    if data_plane {
        let client = client.with_data_plane(tcp_comm());
        six_calls(&client, len).await;
        assert!(client.data_plane_stats().unwrap().buffer_calls >= 5);
    } else {
        six_calls(&client, len).await;
    }
    assert_joined(case, &server, 6);
    server.shutdown().await;
}

/// Six calls of `len` bytes in flight together, the fourth one failing.
async fn six_calls<C: Communicator>(client: &Client<C>, len: usize) {
    let payload = Bytes::from(vec![7u8; len]);
    let calls = (0..6).map(|i| {
        let p = payload.clone();
        async move {
            let method = if i == 3 { FAILING_METHOD } else { OK_METHOD };
            (method, client.call(method, p).await)
        }
    });
    for (method, r) in futures::future::join_all(calls).await {
        match method {
            OK_METHOD => assert_eq!(r.unwrap().len(), len),
            _ => assert_eq!(r.unwrap_err().status(), Some(APP_STATUS)),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_direct_client_records_the_request_id_the_server_handles() {
    capture();
    const CASE: &str = "direct-client";
    let server = serve(CASE, HandlerKind::AsyncReady, false).await;
    let addr = server.local_addr().clone();
    tokio::task::spawn_blocking(move || {
        let c = DirectClient::connect(&addr, ClientConfig::default()).unwrap();
        for method in [OK_METHOD, FAILING_METHOD, OK_METHOD] {
            let _ = c.call(method, "x");
        }
    })
    .await
    .unwrap();
    assert_joined(CASE, &server, 3);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_a_unix_socket_the_request_id_joins_and_the_peer_is_named_by_uid() {
    capture();
    const CASE: &str = "unix-socket";
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("unix://{}/rpc.sock", dir.path().display())
        .parse()
        .unwrap();
    let server = Server::new(
        dispatcher(CASE, HandlerKind::AsyncReady),
        ServerConfig::default(),
    )
    .bind(&addr)
    .await
    .unwrap();
    let client = Client::connect(server.local_addr(), ClientConfig::default())
        .await
        .unwrap();
    for _ in 0..2 {
        client.call(OK_METHOD, "x").await.unwrap();
    }
    let ids = |v: BTreeSet<(String, String)>| -> BTreeSet<String> {
        v.into_iter().map(|(id, _)| id).collect()
    };
    let served = server_view(CASE);
    let uid = own_uid();
    assert!(
        served
            .iter()
            .all(|(_, peer)| *peer == format!("unix uid={uid}")),
        "{served:?}"
    );
    let client_calls = client_view(&server.local_addr().to_string());
    assert_eq!(client_calls.len(), 2);
    assert!(client_calls.iter().all(|(_, local)| local.is_empty()));
    assert_eq!(ids(client_calls), ids(served));
    server.shutdown().await;
}

/// This process's uid, as the kernel reports it.
fn own_uid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|r| r.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap()
}
