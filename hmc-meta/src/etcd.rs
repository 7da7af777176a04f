//! [`EtcdStore`]: members registered in etcd under a lease kept alive by a background
//! task, which also watches the namespace and re-registers after an outage.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, EventType, GetOptions, PutOptions,
    Txn, TxnOp, TxnOpResponse, WatchOptions, WatchResponse,
};
use tokio::sync::{Notify, broadcast};

use crate::EtcdConfig;
use crate::error::{MetaError, Result};
use crate::url::MetadataUrl;
use crate::{BoxFuture, Member, MemberEvent, MemberEvents, MetadataStore};

/// The record format version (first byte of every value).
const FORMAT: u8 = 1;

/// State the background task shares with callers.
struct Shared {
    endpoints: Vec<String>,
    prefix: String,
    name: String,
    address: String,
    config: EtcdConfig,
    /// The encoded value this member publishes.
    value: parking_lot::Mutex<Vec<u8>>,
    /// The key prefix of members' labelled blobs (`<labels_root><name>/<label>`).
    labels_root: String,
    /// Blobs published under labels (encoded), written beside the record under its lease.
    labels: parking_lot::Mutex<BTreeMap<String, Vec<u8>>>,
    /// Whether this member is in the namespace (`set_listed`): while not, the task keeps
    /// its session (and watch) but holds no key.
    listed: std::sync::atomic::AtomicBool,
    /// Wakes the task to write `value`, the labels and the listing again.
    republish: Notify,
    /// The connected client, while a session is up.
    client: parking_lot::Mutex<Option<Client>>,
    /// Members as last seen (listing plus watch), to turn a fresh listing after an outage
    /// into joins and leaves.
    known: parking_lot::Mutex<HashMap<String, Member>>,
    events: broadcast::Sender<MemberEvent>,
    /// Sessions established (1 after start; each re-registration adds one).
    sessions: std::sync::atomic::AtomicU64,
    /// The lease this member's key is held by (0 before the first session): a new session
    /// may take the key over from it (its own, from before an outage), and `close`
    /// deletes the key only while it still holds it.
    lease: std::sync::atomic::AtomicI64,
    /// Set once the watched set reached `max_members` (the warning is logged once).
    over_members: std::sync::atomic::AtomicBool,
}

/// Members in etcd (see the crate documentation). Dropping it stops the background task;
/// the lease then lapses after its TTL (or call [`EtcdStore::close`] to leave at once).
pub struct EtcdStore {
    shared: Arc<Shared>,
    task: tokio::task::AbortHandle,
}

impl Drop for EtcdStore {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn encode(address: &str, record: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(5 + address.len() + record.len());
    v.push(FORMAT);
    v.extend_from_slice(&(address.len() as u32).to_le_bytes());
    v.extend_from_slice(address.as_bytes());
    v.extend_from_slice(record);
    v
}

fn decode(name: &str, v: &[u8], max: usize) -> Result<Member> {
    let bad = |why: String| MetaError::BadRecord {
        name: name.to_string(),
        why,
    };
    if v.len() > max {
        return Err(MetaError::Limit {
            limit: "max_value_len",
            value: v.len() as u64,
            max: max as u64,
            hint: "a member published more than this process reads; raise EtcdConfig::max_value_len (engine option max_value_len)",
        });
    }
    if v.first() != Some(&FORMAT) || v.len() < 5 {
        return Err(bad(format!(
            "format {:?}, this build reads {FORMAT}; use matching versions",
            v.first()
        )));
    }
    let n = u32::from_le_bytes(v[1..5].try_into().expect("4 bytes")) as usize;
    let address = v
        .get(5..5 + n)
        .ok_or_else(|| bad("address runs past the value".into()))?;
    let address = std::str::from_utf8(address)
        .map_err(|e| bad(e.to_string()))?
        .to_string();
    Ok(Member {
        name: name.to_string(),
        address,
        record: v[5 + n..].to_vec(),
    })
}

fn check_name(name: &str) -> Result<()> {
    check_part("member name", name)
}

fn check_part(what: &str, part: &str) -> Result<()> {
    if part.is_empty() || part.len() > 255 || part.contains('/') || part.contains('\0') {
        return Err(MetaError::Invalid(format!(
            "{what} `{part}`: use 1-255 bytes without `/`"
        )));
    }
    Ok(())
}

/// A labelled blob as stored: the format byte, then the blob.
fn encode_label(blob: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(1 + blob.len());
    v.push(FORMAT);
    v.extend_from_slice(blob);
    v
}

fn decode_label(name: &str, label: &str, v: &[u8], max: usize) -> Result<Vec<u8>> {
    let bad = |why: String| MetaError::BadRecord {
        name: format!("{name}` label `{label}"),
        why,
    };
    if v.len() > max {
        return Err(MetaError::Limit {
            limit: "max_value_len",
            value: v.len() as u64,
            max: max as u64,
            hint: "the member published a larger blob than this process reads; raise EtcdConfig::max_value_len (engine option max_value_len)",
        });
    }
    match v.split_first() {
        Some((&FORMAT, blob)) => Ok(blob.to_vec()),
        Some((f, _)) => Err(bad(format!("format {f}, this build reads {FORMAT}"))),
        None => Err(bad("empty".into())),
    }
}

impl EtcdStore {
    /// Connects to etcd, registers `name` at `address` with `record` under a lease, and
    /// starts the task that keeps it alive. Fails if etcd cannot be reached within
    /// `lease_ttl` plus three `op_timeout`s (retrying with backoff meanwhile); with
    /// [`MetaError::NameInUse`] if another member still holds `name` after `lease_ttl` plus
    /// `op_timeout` (a holder that died lets go within its lease's TTL, so a restarted
    /// member gets its name back); with [`MetaError::NamespaceFull`] past `max_members`.
    pub async fn start(
        url: &MetadataUrl,
        config: EtcdConfig,
        name: &str,
        address: &str,
        record: Vec<u8>,
    ) -> Result<Self> {
        let MetadataUrl::Etcd { endpoints, .. } = url else {
            return Err(MetaError::Invalid(format!(
                "`{url}` is not an etcd URL; use etcd://host:port/namespace"
            )));
        };
        check_name(name)?;
        let value = encode(address, &record);
        check_len(value.len(), &config)?;
        let (events, _) = broadcast::channel(config.watch_backlog.max(1));
        let shared = Arc::new(Shared {
            endpoints: endpoints.clone(),
            prefix: url.members_prefix(),
            name: name.to_string(),
            address: address.to_string(),
            config,
            value: parking_lot::Mutex::new(value),
            labels_root: url.labels_prefix(),
            labels: parking_lot::Mutex::new(BTreeMap::new()),
            listed: true.into(),
            republish: Notify::new(),
            client: parking_lot::Mutex::new(None),
            known: parking_lot::Mutex::new(HashMap::new()),
            events,
            sessions: 0.into(),
            lease: 0.into(),
            over_members: false.into(),
        });
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(run(shared.clone(), ready_tx)).abort_handle();
        let store = EtcdStore { shared, task };
        // Time to wait out a dead holder's lease (see `run`), then to register.
        let wait = store.shared.config.lease_ttl + store.shared.config.op_timeout * 3;
        match tokio::time::timeout(wait, ready_rx).await {
            Ok(Ok(Ok(()))) => Ok(store),
            // A refusal that waiting will not change (the name is taken, a limit).
            Ok(Ok(Err(e))) => Err(e),
            Ok(Err(_)) => Err(MetaError::Closed),
            Err(_) => Err(store
                .shared
                .unavailable(wait, 1, "registration did not complete")),
        }
    }

    /// This member's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// How many other members this one watches now (at most `max_members`).
    pub fn watched(&self) -> usize {
        self.shared.known.lock().len()
    }

    /// How many times this member has registered (1 after start; one more after each
    /// outage of etcd or lapse of the lease).
    pub fn registrations(&self) -> u64 {
        self.shared
            .sessions
            .load(std::sync::atomic::Ordering::Acquire)
    }
}

fn check_len(len: usize, config: &EtcdConfig) -> Result<()> {
    if len > config.max_value_len {
        return Err(MetaError::Limit {
            limit: "max_value_len",
            value: len as u64,
            max: config.max_value_len as u64,
            hint: "publish less (fewer, larger regions), or raise EtcdConfig::max_value_len (engine option max_value_len) on every member",
        });
    }
    Ok(())
}

impl Shared {
    /// The key of `name`'s blob under `label` (with an empty label: the prefix of all).
    fn label_key(&self, name: &str, label: &str) -> String {
        format!("{}{name}/{label}", self.labels_root)
    }

    fn namespace(&self) -> String {
        format!(
            "etcd://{}{}",
            self.endpoints.join(","),
            self.prefix.trim_end_matches("/members/")
        )
    }

    fn namespace_full(&self) -> MetaError {
        MetaError::NamespaceFull {
            namespace: self.namespace(),
            max: self.config.max_members as u64,
        }
    }

    fn unavailable(&self, after: Duration, attempts: u32, why: &str) -> MetaError {
        MetaError::Unavailable {
            endpoints: self.endpoints.join(","),
            after,
            attempts,
            why: why.to_string(),
        }
    }

    fn emit(&self, e: MemberEvent) {
        // No subscriber is fine.
        let _ = self.events.send(e);
    }

    /// Folds a member's new value into `known` and emits the event it amounts to.
    fn saw_put(&self, m: Member) {
        let mut known = self.known.lock();
        let event = match known.get(&m.name) {
            None if known.len() >= self.config.max_members => {
                // The watched set is bounded as a listing is: a member past the limit is
                // not tracked (nor announced), and the limit is named once.
                if !self
                    .over_members
                    .swap(true, std::sync::atomic::Ordering::AcqRel)
                {
                    tracing::warn!(
                        "{} (member `{}` and later ones are not watched)",
                        self.namespace_full(),
                        m.name
                    );
                }
                return;
            }
            None => MemberEvent::Joined(m.clone()),
            Some(old) if *old == m => return,
            Some(_) => MemberEvent::Updated(m.clone()),
        };
        known.insert(m.name.clone(), m);
        drop(known);
        self.emit(event);
    }

    fn saw_delete(&self, name: &str) {
        if self.known.lock().remove(name).is_some() {
            self.emit(MemberEvent::Left {
                name: name.to_string(),
            });
        }
    }

    /// Runs `op` on the session's client, retrying with backoff until `timeout`.
    async fn with_retry<T, F>(&self, timeout: Duration, op: F) -> Result<T>
    where
        F: Fn(Client) -> BoxFuture<'static, Result<T>>,
    {
        let start = tokio::time::Instant::now();
        let mut backoff = self.config.retry_initial;
        let mut attempts = 0;
        loop {
            attempts += 1;
            let client = self.client.lock().clone();
            let why = match client {
                Some(c) => match tokio::time::timeout(self.config.op_timeout, op(c)).await {
                    Ok(Ok(v)) => return Ok(v),
                    Ok(Err(
                        e @ (MetaError::Limit { .. }
                        | MetaError::BadRecord { .. }
                        | MetaError::NamespaceFull { .. }),
                    )) => {
                        return Err(e);
                    }
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => format!("no answer within {:?}", self.config.op_timeout),
                },
                None => "not connected (reconnecting with backoff)".to_string(),
            };
            let elapsed = start.elapsed();
            if elapsed + backoff > timeout {
                return Err(self.unavailable(elapsed, attempts, &why));
            }
            tracing::debug!(%why, ?backoff, "etcd lookup failed; retrying");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(self.config.retry_max);
        }
    }

    /// Lists the namespace (at most `max_members`), with the revision read at.
    async fn list(&self, c: &mut Client) -> Result<(Vec<Member>, i64)> {
        let max = self.config.max_members;
        let opts = GetOptions::new().with_prefix().with_limit(max as i64 + 1);
        let resp = c
            .get(self.prefix.clone(), Some(opts))
            .await
            .map_err(etcd_err)?;
        if resp.kvs().len() > max {
            return Err(self.namespace_full());
        }
        let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
        let mut out = Vec::with_capacity(resp.kvs().len());
        for kv in resp.kvs() {
            let name = String::from_utf8_lossy(&kv.key()[self.prefix.len()..]).into_owned();
            match decode(&name, kv.value(), self.config.max_value_len) {
                Ok(m) => out.push(m),
                Err(e) => tracing::warn!(error = %e, "skipping a member's record"),
            }
        }
        Ok((out, rev))
    }
}

fn etcd_err(e: etcd_client::Error) -> MetaError {
    MetaError::Unavailable {
        endpoints: String::new(),
        after: Duration::ZERO,
        attempts: 1,
        why: e.to_string(),
    }
}

/// The background task: sessions one after another, with backoff between them.
async fn run(shared: Arc<Shared>, ready: tokio::sync::oneshot::Sender<Result<()>>) {
    let mut ready = Some(ready);
    let mut backoff = shared.config.retry_initial;
    let started = tokio::time::Instant::now();
    // A holder of our name may be a process that died an instant ago (a supervisor's
    // restart): its key goes when its lease lapses, so a start keeps trying that long.
    let holder_may_lapse = shared.config.lease_ttl + shared.config.op_timeout;
    loop {
        match session(&shared, &mut ready, &mut backoff).await {
            Ok(()) => return,
            Err(e @ MetaError::NameInUse { .. })
                if ready.is_some() && started.elapsed() < holder_may_lapse =>
            {
                tracing::info!(error = %e, "waiting for the name's holder to renew or lapse");
            }
            Err(e @ (MetaError::NameInUse { .. } | MetaError::NamespaceFull { .. }))
                if ready.is_some() =>
            {
                // Before the first registration: `start` fails with it.
                if let Some(r) = ready.take() {
                    let _ = r.send(Err(e));
                }
                return;
            }
            Err(e) => {
                *shared.client.lock() = None;
                tracing::warn!(error = %e, ?backoff, endpoints = %shared.endpoints.join(","), "etcd session ended; reconnecting");
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(shared.config.retry_max);
    }
}

/// One session: connect, grant a lease, write this member, list and watch the namespace,
/// renew the lease, until something fails.
async fn session(
    shared: &Arc<Shared>,
    ready: &mut Option<tokio::sync::oneshot::Sender<Result<()>>>,
    backoff: &mut Duration,
) -> Result<()> {
    let cfg = &shared.config;
    let t = cfg.op_timeout;
    let mut s = Session::register(shared).await?;
    let lease = s.lease;
    shared
        .lease
        .store(lease, std::sync::atomic::Ordering::Release);
    let (mut keeper, mut keep_stream) = tokio::time::timeout(t, s.client.lease_keep_alive(lease))
        .await
        .map_err(|_| timed(shared, "keep-alive"))?
        .map_err(etcd_err)?;
    let rev = s.sync_membership(ready).await?;
    let mut watch = s.watch_from(rev + 1).await?;
    *shared.client.lock() = Some(s.client.clone());
    let n = shared
        .sessions
        .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    tracing::info!(name = %shared.name, address = %shared.address, lease, registrations = n + 1, "registered in etcd");
    if let Some(r) = ready.take() {
        let _ = r.send(Ok(()));
    }
    *backoff = cfg.retry_initial;
    let mut tick = tokio::time::interval((cfg.lease_ttl / 3).max(Duration::from_millis(100)));
    // The last answer to a keep-alive; past the TTL without one, the lease may be gone.
    let mut last_renewed = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if last_renewed.elapsed() > cfg.lease_ttl {
                    return Err(timed(shared, "lease renewal"));
                }
                keeper.keep_alive().await.map_err(etcd_err)?;
            }
            m = keep_stream.message() => {
                match m.map_err(etcd_err)? {
                    Some(r) if r.ttl() > 0 => last_renewed = tokio::time::Instant::now(),
                    Some(_) => return Err(MetaError::Unavailable {
                        endpoints: shared.endpoints.join(","),
                        after: cfg.lease_ttl,
                        attempts: 1,
                        why: "our lease expired (etcd did not hear from us within lease_ttl); registering again".into(),
                    }),
                    None => return Err(timed(shared, "keep-alive stream closed")),
                }
            }
            w = watch.message() => {
                match w.map_err(etcd_err)? {
                    Some(resp) => {
                        if on_watch(shared, resp, lease)? && s.held && shared.listed.load(Ordering::Acquire) {
                            s.write_key_back().await?;
                        }
                    }
                    None => return Err(timed(shared, "watch stream closed")),
                }
            }
            _ = shared.republish.notified() => s.republish().await?,
        }
    }
}

/// The error for an etcd request that got no answer within `op_timeout`.
fn timed(shared: &Shared, what: &str) -> MetaError {
    MetaError::Unavailable {
        endpoints: shared.endpoints.join(","),
        after: shared.config.op_timeout,
        attempts: 1,
        why: format!("{what}: no answer"),
    }
}

/// What one session holds: its client, its lease and the member's key under it.
struct Session<'a> {
    shared: &'a Arc<Shared>,
    client: Client,
    lease: i64,
    key: String,
    /// Whether this session holds the member's key (not while withdrawn by `set_listed`).
    held: bool,
    /// The labelled blobs this session wrote, as written.
    written: BTreeMap<String, Vec<u8>>,
}

impl<'a> Session<'a> {
    /// Connects, grants a lease and, while listed, claims the member's name and writes its
    /// labelled blobs under it.
    async fn register(shared: &'a Arc<Shared>) -> Result<Session<'a>> {
        let cfg = &shared.config;
        let t = cfg.op_timeout;
        let opts = ConnectOptions::new()
            .with_connect_timeout(t)
            .with_timeout(t)
            .with_keep_alive(t, t);
        let mut client = tokio::time::timeout(t, Client::connect(&shared.endpoints, Some(opts)))
            .await
            .map_err(|_| timed(shared, "connect"))?
            .map_err(etcd_err)?;
        let ttl = cfg.lease_ttl.as_secs().max(1) as i64;
        let lease = tokio::time::timeout(t, client.lease_grant(ttl, None))
            .await
            .map_err(|_| timed(shared, "lease grant"))?
            .map_err(etcd_err)?
            .id();
        let mut s = Session {
            shared,
            client,
            lease,
            key: format!("{}{}", shared.prefix, shared.name),
            held: shared.listed.load(Ordering::Acquire),
            written: BTreeMap::new(),
        };
        if s.held {
            let claimed = tokio::time::timeout(t, claim(shared, &mut s.client, &s.key, lease))
                .await
                .map_err(|_| timed(shared, "claiming the name"))?;
            if let Err(e) = claimed {
                // The lease would otherwise live on for its TTL, holding nothing.
                s.revoke().await;
                return Err(e);
            }
            s.write_labels().await?;
        }
        Ok(s)
    }

    /// Revokes the lease (its keys go with it), as far as etcd answers in time.
    async fn revoke(&mut self) {
        let t = self.shared.config.op_timeout;
        let _ = tokio::time::timeout(t, self.client.lease_revoke(self.lease)).await;
    }

    /// Writes the labelled blobs that changed since this session last wrote them.
    async fn write_labels(&mut self) -> Result<()> {
        let t = self.shared.config.op_timeout;
        tokio::time::timeout(
            t,
            write_labels(self.shared, &mut self.client, self.lease, &mut self.written),
        )
        .await
        .map_err(|_| timed(self.shared, "put"))?
    }

    /// Lists the namespace and turns the listing into joins and leaves against what was
    /// known (whoever is missing left while this member was away); the revision to watch
    /// from. A namespace already full when this member starts fails the start.
    async fn sync_membership(
        &mut self,
        ready: &Option<tokio::sync::oneshot::Sender<Result<()>>>,
    ) -> Result<i64> {
        let shared = self.shared;
        let t = shared.config.op_timeout;
        let (members, rev) = match tokio::time::timeout(t, shared.list(&mut self.client)).await {
            Err(_) => return Err(timed(shared, "list")),
            Ok(Err(e @ MetaError::NamespaceFull { .. })) if ready.is_some() => {
                // Joining would make one too many: leave again (the key goes with the
                // lease) and let `start` fail naming the limit and the namespace.
                self.revoke().await;
                return Err(e);
            }
            Ok(r) => r?,
        };
        let gone: Vec<String> = {
            let known = shared.known.lock();
            known
                .keys()
                .filter(|k| !members.iter().any(|m| &m.name == *k))
                .cloned()
                .collect()
        };
        for g in gone {
            shared.saw_delete(&g);
        }
        // This member's own key is not among the members it watches (see `on_watch`).
        for m in members.into_iter().filter(|m| m.name != shared.name) {
            shared.saw_put(m);
        }
        Ok(rev)
    }

    /// Watches the namespace from revision `rev`.
    async fn watch_from(&mut self, rev: i64) -> Result<etcd_client::WatchStream> {
        let shared = self.shared;
        let options = WatchOptions::new().with_prefix().with_start_revision(rev);
        tokio::time::timeout(
            shared.config.op_timeout,
            self.client.watch(shared.prefix.clone(), Some(options)),
        )
        .await
        .map_err(|_| timed(shared, "watch"))?
        .map_err(etcd_err)
    }

    /// Our key was deleted, or written under another lease, while ours is live: no member
    /// that claims names (a transaction that refuses a live holder) did that. Write it back.
    async fn write_key_back(&mut self) -> Result<()> {
        let shared = self.shared;
        tracing::warn!(name = %shared.name, "our key in etcd was changed or deleted by someone else; writing it again");
        let value = shared.value.lock().clone();
        let put = self.client.put(
            self.key.clone(),
            value,
            Some(PutOptions::new().with_lease(self.lease)),
        );
        tokio::time::timeout(shared.config.op_timeout, put)
            .await
            .map_err(|_| timed(shared, "put"))?
            .map_err(etcd_err)?;
        Ok(())
    }

    /// Does what `set_listed` and `publish` asked: withdraws the member, lists it again
    /// (claiming the name as a new session would), and writes its labels and record, the
    /// record only while this lease holds the key.
    async fn republish(&mut self) -> Result<()> {
        let shared = self.shared;
        let t = shared.config.op_timeout;
        let (key, lease) = (self.key.clone(), self.lease);
        if !shared.listed.load(Ordering::Acquire) {
            if self.held {
                tokio::time::timeout(t, withdraw(shared, &mut self.client, &key, lease))
                    .await
                    .map_err(|_| timed(shared, "delete"))??;
                self.held = false;
                self.written.clear();
                tracing::info!(name = %shared.name, "withdrawn from etcd");
            }
            return Ok(());
        }
        if !self.held {
            tokio::time::timeout(t, claim(shared, &mut self.client, &key, lease))
                .await
                .map_err(|_| timed(shared, "claiming the name"))??;
            self.held = true;
            tracing::info!(name = %shared.name, "listed in etcd again");
        }
        self.write_labels().await?;
        let txn = Txn::new()
            .when([Compare::lease(key.clone(), CompareOp::Equal, lease)])
            .and_then([TxnOp::put(
                key,
                shared.value.lock().clone(),
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let r = tokio::time::timeout(t, self.client.txn(txn))
            .await
            .map_err(|_| timed(shared, "put"))?
            .map_err(etcd_err)?;
        if !r.succeeded() {
            return Err(shared.unavailable(
                Duration::ZERO,
                1,
                "our key is no longer held by our lease; registering again",
            ));
        }
        Ok(())
    }
}

/// Writes the labelled blobs that differ from what this session wrote (under `lease`).
async fn write_labels(
    shared: &Shared,
    client: &mut Client,
    lease: i64,
    written: &mut BTreeMap<String, Vec<u8>>,
) -> Result<()> {
    let want = shared.labels.lock().clone();
    for (label, value) in &want {
        if written.get(label) != Some(value) {
            let key = shared.label_key(&shared.name, label);
            let opts = PutOptions::new().with_lease(lease);
            client
                .put(key, value.clone(), Some(opts))
                .await
                .map_err(etcd_err)?;
        }
    }
    *written = want;
    Ok(())
}

/// Deletes the member's key (only while `lease` holds it) and its labelled blobs.
async fn withdraw(shared: &Shared, client: &mut Client, key: &str, lease: i64) -> Result<()> {
    let txn = Txn::new()
        .when([Compare::lease(key, CompareOp::Equal, lease)])
        .and_then([TxnOp::delete(key, None)]);
    client.txn(txn).await.map_err(etcd_err)?;
    let prefix = DeleteOptions::new().with_prefix();
    client
        .delete(shared.label_key(&shared.name, ""), Some(prefix))
        .await
        .map_err(etcd_err)?;
    Ok(())
}

/// Takes the member's key for `lease`: creates it if absent, or takes it over from this
/// member's own previous lease (a re-registration after an outage, before that lease
/// lapsed). A key held by any other lease belongs to another live member:
/// [`MetaError::NameInUse`], naming it.
async fn claim(shared: &Shared, client: &mut Client, key: &str, lease: i64) -> Result<()> {
    let value = shared.value.lock().clone();
    let put = || {
        TxnOp::put(
            key,
            value.clone(),
            Some(PutOptions::new().with_lease(lease)),
        )
    };
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([put()])
        .or_else([TxnOp::get(key, None)]);
    let resp = client.txn(txn).await.map_err(etcd_err)?;
    if resp.succeeded() {
        return Ok(());
    }
    let holder = resp.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Get(g) => g.kvs().first().map(|kv| (kv.lease(), kv.value().to_vec())),
        _ => None,
    });
    let previous = shared.lease.load(std::sync::atomic::Ordering::Acquire);
    match holder {
        // Deleted between the two steps: try again from the start.
        None => Err(shared.unavailable(
            Duration::ZERO,
            1,
            "the name's key changed while claiming it",
        )),
        Some((held_by, _)) if previous != 0 && held_by == previous => {
            let txn = Txn::new()
                .when([Compare::lease(key, CompareOp::Equal, previous)])
                .and_then([put()]);
            let resp = client.txn(txn).await.map_err(etcd_err)?;
            if resp.succeeded() {
                Ok(())
            } else {
                Err(shared.unavailable(
                    Duration::ZERO,
                    1,
                    "the name's key changed while taking it over from our previous lease",
                ))
            }
        }
        Some((_, value)) => Err(MetaError::NameInUse {
            name: shared.name.clone(),
            namespace: shared.namespace(),
            holder: decode(&shared.name, &value, usize::MAX)
                .map(|m| m.address)
                .unwrap_or_else(|_| "an unreadable record".into()),
        }),
    }
}

/// Folds a watch response into `known`; `true` when it shows this member's own key
/// deleted or written under another lease than `lease`.
fn on_watch(shared: &Shared, resp: WatchResponse, lease: i64) -> Result<bool> {
    if resp.canceled() {
        return Err(MetaError::Unavailable {
            endpoints: shared.endpoints.join(","),
            after: Duration::ZERO,
            attempts: 1,
            why: format!("watch canceled by etcd: {}", resp.cancel_reason()),
        });
    }
    let mut ours_changed = false;
    for ev in resp.events() {
        let Some(kv) = ev.kv() else { continue };
        let Some(name) = kv.key().get(shared.prefix.len()..) else {
            continue;
        };
        let name = String::from_utf8_lossy(name).into_owned();
        if name == shared.name {
            ours_changed |= match ev.event_type() {
                EventType::Put => kv.lease() != lease,
                EventType::Delete => true,
            };
            continue;
        }
        match ev.event_type() {
            EventType::Put => match decode(&name, kv.value(), shared.config.max_value_len) {
                Ok(m) => shared.saw_put(m),
                Err(e) => tracing::warn!(error = %e, "ignoring a member's record"),
            },
            EventType::Delete => shared.saw_delete(&name),
        }
    }
    Ok(ours_changed)
}

impl MetadataStore for EtcdStore {
    fn describe(&self) -> String {
        format!(
            "etcd://{}{}",
            self.shared.endpoints.join(","),
            self.shared.prefix.trim_end_matches("/members/")
        )
    }

    fn publish(&self, record: Vec<u8>) -> Result<()> {
        let value = encode(&self.shared.address, &record);
        check_len(value.len(), &self.shared.config)?;
        *self.shared.value.lock() = value;
        self.shared.republish.notify_one();
        Ok(())
    }

    fn resolve<'a>(
        &'a self,
        name: &'a str,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Option<Member>>> {
        Box::pin(async move {
            check_name(name)?;
            let key = format!("{}{name}", self.shared.prefix);
            let max = self.shared.config.max_value_len;
            let name = name.to_string();
            self.shared
                .with_retry(timeout, |mut c| {
                    let key = key.clone();
                    let name = name.clone();
                    Box::pin(async move {
                        let resp = c.get(key, None).await.map_err(etcd_err)?;
                        resp.kvs()
                            .first()
                            .map(|kv| decode(&name, kv.value(), max))
                            .transpose()
                    })
                })
                .await
        })
    }

    fn members(&self, timeout: Duration) -> BoxFuture<'_, Result<Vec<Member>>> {
        Box::pin(async move {
            self.shared
                .with_retry(timeout, |mut c| {
                    let shared = self.shared.clone();
                    Box::pin(async move { shared.list(&mut c).await.map(|(m, _)| m) })
                })
                .await
        })
    }

    fn publish_label(&self, label: &str, blob: Vec<u8>) -> Result<()> {
        check_part("label", label)?;
        let value = encode_label(&blob);
        check_len(value.len(), &self.shared.config)?;
        let mut labels = self.shared.labels.lock();
        let max = self.shared.config.max_labels;
        if !labels.contains_key(label) && labels.len() >= max {
            return Err(MetaError::Limit {
                limit: "max_labels",
                value: labels.len() as u64 + 1,
                max: max as u64,
                hint: "publish fewer labels (one blob can hold many regions), or raise EtcdConfig::max_labels (engine option max_labels)",
            });
        }
        labels.insert(label.to_string(), value);
        drop(labels);
        self.shared.republish.notify_one();
        Ok(())
    }

    fn fetch_label<'a>(
        &'a self,
        name: &'a str,
        label: &'a str,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Option<Vec<u8>>>> {
        Box::pin(async move {
            check_name(name)?;
            check_part("label", label)?;
            let key = self.shared.label_key(name, label);
            let max = self.shared.config.max_value_len;
            let (name, label) = (name.to_string(), label.to_string());
            self.shared
                .with_retry(timeout, |mut c| {
                    let (key, name, label) = (key.clone(), name.clone(), label.clone());
                    Box::pin(async move {
                        let resp = c.get(key, None).await.map_err(etcd_err)?;
                        resp.kvs()
                            .first()
                            .map(|kv| decode_label(&name, &label, kv.value(), max))
                            .transpose()
                    })
                })
                .await
        })
    }

    fn set_listed(&self, listed: bool) -> Result<()> {
        if !listed {
            // NIXL's invalidation: the blobs go with the record, and are published anew.
            self.shared.labels.lock().clear();
        }
        self.shared.listed.store(listed, Ordering::Release);
        self.shared.republish.notify_one();
        Ok(())
    }

    fn subscribe(&self) -> Option<MemberEvents> {
        Some(MemberEvents {
            rx: self.shared.events.subscribe(),
            backlog: self.shared.config.watch_backlog,
        })
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.task.abort();
            let client = self.shared.client.lock().take();
            let lease = self.shared.lease.load(std::sync::atomic::Ordering::Acquire);
            if let Some(mut c) = client
                && lease != 0
            {
                // Only while our lease still holds it: a key another member took (after
                // ours lapsed) is theirs.
                let key = format!("{}{}", self.shared.prefix, self.shared.name);
                let txn = Txn::new()
                    .when([Compare::lease(key.clone(), CompareOp::Equal, lease)])
                    .and_then([TxnOp::delete(key, None)]);
                let _ = tokio::time::timeout(self.shared.config.op_timeout, c.txn(txn)).await;
                let _ = tokio::time::timeout(self.shared.config.op_timeout, c.lease_revoke(lease))
                    .await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_bad_ones_are_named() {
        let v = encode("127.0.0.1:7000", b"table");
        let m = decode("a", &v, 1 << 20).unwrap();
        assert_eq!(m.address, "127.0.0.1:7000");
        assert_eq!(m.record, b"table");
        let e = decode("a", &v, 4).unwrap_err().to_string();
        assert!(e.contains("max_value_len"), "{e}");
        let e = decode("a", b"\x02xxxx", 1 << 20).unwrap_err().to_string();
        assert!(e.contains("record of `a`"), "{e}");
        let mut short = encode("127.0.0.1:7000", b"");
        short.truncate(8);
        assert!(decode("a", &short, 1 << 20).is_err());
    }

    #[test]
    fn member_names_without_slashes_only() {
        assert!(check_name("prefill-0").is_ok());
        assert!(check_name("a/b").is_err());
        assert!(check_name("").is_err());
    }
}
