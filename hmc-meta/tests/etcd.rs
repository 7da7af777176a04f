//! The etcd store against a real etcd process: registration and lookup by name, joins and
//! leaves, a lease that lapses, etcd killed and restarted, and every limit.

use std::time::{Duration, Instant};

use hmc_meta::testing::EtcdProcess;
use hmc_meta::{EtcdConfig, EtcdStore, MemberEvent, MetaError, MetadataStore, MetadataUrl};

fn config() -> EtcdConfig {
    EtcdConfig {
        lease_ttl: Duration::from_secs(2),
        op_timeout: Duration::from_secs(2),
        retry_initial: Duration::from_millis(50),
        retry_max: Duration::from_millis(500),
        ..EtcdConfig::default()
    }
}

async fn member(url: &MetadataUrl, name: &str, cfg: EtcdConfig) -> EtcdStore {
    EtcdStore::start(
        url,
        cfg,
        name,
        &format!("10.0.0.1:{}", name.len()),
        name.as_bytes().to_vec(),
    )
    .await
    .expect("register in etcd")
}

/// The next event, or a panic naming what was awaited.
async fn next_event(ev: &mut hmc_meta::MemberEvents, within: Duration, what: &str) -> MemberEvent {
    tokio::time::timeout(within, ev.next())
        .await
        .unwrap_or_else(|_| panic!("no event within {within:?} while waiting for {what}"))
        .expect("store open")
        .expect("no lag")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_find_each_other_by_name_and_see_records_change() {
    let etcd = EtcdProcess::start();
    let url = etcd.url("job-a");
    let a = member(&url, "prefill-0", config()).await;
    let b = member(&url, "decode-0", config()).await;
    let found = a
        .resolve("decode-0", Duration::from_secs(5))
        .await
        .unwrap()
        .expect("decode-0 is registered");
    assert_eq!(found.address, "10.0.0.1:8");
    assert_eq!(found.record, b"decode-0");
    assert!(
        a.resolve("nobody", Duration::from_secs(5))
            .await
            .unwrap()
            .is_none()
    );
    let mut names: Vec<String> = a
        .members(Duration::from_secs(5))
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.name)
        .collect();
    names.sort();
    assert_eq!(names, ["decode-0", "prefill-0"]);
    // Another namespace sees none of them.
    let other = member(&etcd.url("job-b"), "x", config()).await;
    assert_eq!(
        other.members(Duration::from_secs(5)).await.unwrap().len(),
        1
    );

    let mut ev = a.subscribe().expect("etcd watches");
    b.publish(b"new table".to_vec()).unwrap();
    match next_event(&mut ev, Duration::from_secs(10), "decode-0's update").await {
        MemberEvent::Updated(m) => assert_eq!(
            (m.name.as_str(), m.record.as_slice()),
            ("decode-0", &b"new table"[..])
        ),
        other => panic!("expected an update, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_deliver_joins_and_leaves() {
    let etcd = EtcdProcess::start();
    let url = etcd.url("scale");
    let a = member(&url, "a", config()).await;
    let mut ev = a.subscribe().unwrap();
    let b = member(&url, "b", config()).await;
    assert!(
        matches!(next_event(&mut ev, Duration::from_secs(10), "b's join").await, MemberEvent::Joined(m) if m.name == "b")
    );
    b.close().await;
    assert_eq!(
        next_event(&mut ev, Duration::from_secs(10), "b's leave").await,
        MemberEvent::Left { name: "b".into() }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_stops_renewing_is_gone_within_its_lease_ttl() {
    let etcd = EtcdProcess::start();
    let url = etcd.url("lapse");
    let a = member(&url, "a", config()).await;
    let mut ev = a.subscribe().unwrap();
    let b = member(&url, "b", config()).await;
    let _ = next_event(&mut ev, Duration::from_secs(10), "b's join").await;
    // Dropping the store stops its keep-alives without deleting its key, as a hung or
    // killed process would.
    let t = Instant::now();
    drop(b);
    let e = next_event(&mut ev, Duration::from_secs(20), "b's lease to lapse").await;
    assert_eq!(e, MemberEvent::Left { name: "b".into() });
    let took = t.elapsed();
    println!("lease_ttl 2 s: b seen gone after {took:?}");
    assert!(
        a.resolve("b", Duration::from_secs(5))
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_down_fails_lookups_clearly_and_etcd_back_re_registers() {
    let mut etcd = EtcdProcess::start();
    let url = etcd.url("outage");
    let a = member(&url, "a", config()).await;
    let b = member(&url, "b", config()).await;
    assert_eq!(a.registrations(), 1);
    etcd.kill();
    let t = Instant::now();
    let e = a.resolve("b", Duration::from_secs(2)).await.unwrap_err();
    assert!(
        matches!(e, MetaError::Unavailable { attempts, .. } if attempts > 1),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains(&etcd.endpoint()) && msg.contains("existing connections keep working"),
        "{msg}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "failed after {:?}",
        t.elapsed()
    );
    // Starting a member while etcd is down fails naming the endpoints.
    let e = EtcdStore::start(&url, config(), "c", "10.0.0.1:1", vec![])
        .await
        .err()
        .expect("no etcd");
    assert!(e.to_string().contains(&etcd.endpoint()), "{e}");

    etcd.restart();
    // A lookup made while etcd comes back retries until it answers.
    let found = a.resolve("b", Duration::from_secs(20)).await.unwrap();
    assert_eq!(found.map(|m| m.address), Some("10.0.0.1:1".to_string()));
    let t = Instant::now();
    while a.registrations() < 2 || b.registrations() < 2 {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "not re-registered: {} {}",
            a.registrations(),
            b.registrations()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Re-registered under fresh leases: both are still there after the old leases' TTL.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(b.members(Duration::from_secs(5)).await.unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_limit_is_named_when_reached() {
    let etcd = EtcdProcess::start();
    let url = etcd.url("limits");
    let small = EtcdConfig {
        max_value_len: 64,
        max_members: 2,
        watch_backlog: 1,
        ..config()
    };
    let a = member(&url, "a", small.clone()).await;
    let e = a.publish(vec![0; 100]).unwrap_err().to_string();
    assert!(e.contains("max_value_len"), "{e}");
    // A peer that publishes more than we read is refused by name.
    let _big = member(
        &url,
        "big",
        EtcdConfig {
            max_value_len: 1 << 20,
            ..config()
        },
    )
    .await;
    _big.publish(vec![1; 1000]).unwrap();
    let t = Instant::now();
    let e = loop {
        match a.resolve("big", Duration::from_secs(5)).await {
            Err(e) => break e.to_string(),
            Ok(_) if t.elapsed() < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Ok(m) => panic!("read an oversized record: {m:?}"),
        }
    };
    assert!(e.contains("max_value_len"), "{e}");
    let _c = member(&url, "c", config()).await;
    let e = a
        .members(Duration::from_secs(5))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("max_members"), "{e}");

    // A subscriber that does not read falls behind its backlog of one event.
    let url = etcd.url("backlog");
    let w = member(&url, "w", small).await;
    let mut ev = w.subscribe().unwrap();
    let _x = member(&url, "x", config()).await;
    let _y = member(&url, "y", config()).await;
    let _z = member(&url, "z", config()).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let e = tokio::time::timeout(Duration::from_secs(5), ev.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert!(e.to_string().contains("watch_backlog"), "{e}");
}

/// A live member's name cannot be taken: a second member of that name is refused at start,
/// naming the holder, and the first keeps it. A member's key deleted or overwritten behind
/// its back (a raw etcd client) is written back; closing deletes the member's own key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_member_keeps_its_name() {
    let etcd = EtcdProcess::start();
    let url = etcd.url("names");
    let a = member(&url, "x", config()).await;
    let e = EtcdStore::start(&url, config(), "x", "10.0.0.9:1", b"imposter".to_vec())
        .await
        .err()
        .expect("the name is taken");
    assert!(matches!(e, MetaError::NameInUse { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("`x`") && msg.contains("10.0.0.1:1") && msg.contains("names"),
        "{msg}"
    );
    let found = a
        .resolve("x", Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(found.address, "10.0.0.1:1", "still the first member's");
    // Behind its back: deleted, then overwritten under another lease.
    let mut raw = etcd_client::Client::connect([etcd.endpoint()], None)
        .await
        .unwrap();
    raw.delete("/names/members/x", None).await.unwrap();
    let t = Instant::now();
    loop {
        if let Ok(Some(m)) = a.resolve("x", Duration::from_secs(5)).await
            && m.address == "10.0.0.1:1"
        {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the deleted key was not written back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let other = raw.lease_grant(30, None).await.unwrap().id();
    raw.put(
        "/names/members/x",
        b"\x01\x0b\x00\x00\x0010.0.0.9:99".to_vec(),
        Some(etcd_client::PutOptions::new().with_lease(other)),
    )
    .await
    .unwrap();
    let t = Instant::now();
    loop {
        if let Ok(Some(m)) = a.resolve("x", Duration::from_secs(5)).await
            && m.address == "10.0.0.1:1"
        {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the overwritten key was not written back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Leaving deletes its own key; the name is free again.
    a.close().await;
    assert!(
        raw.get("/names/members/x", None)
            .await
            .unwrap()
            .kvs()
            .is_empty()
    );
    let b = member(&url, "x", config()).await;
    assert_eq!(b.registrations(), 1);
}

/// Past `max_members` a member cannot start, and says which limit and which namespace;
/// its key does not stay behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_namespace_refuses_a_new_member_by_name() {
    let etcd = EtcdProcess::start();
    let url = etcd.url("full");
    let small = EtcdConfig {
        max_members: 2,
        ..config()
    };
    let _a = member(&url, "a", small.clone()).await;
    let _b = member(&url, "b", small.clone()).await;
    let e = EtcdStore::start(&url, small, "c", "10.0.0.1:3", vec![])
        .await
        .err()
        .expect("over max_members");
    let msg = e.to_string();
    assert!(msg.contains("max_members") && msg.contains("full"), "{msg}");
    let mut raw = etcd_client::Client::connect([etcd.endpoint()], None)
        .await
        .unwrap();
    assert!(
        raw.get("/full/members/c", None)
            .await
            .unwrap()
            .kvs()
            .is_empty()
    );
}

/// The watched set is bounded like a listing: members past `max_members` are not tracked
/// (their records are not held), and the ones within it still are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watched_set_holds_at_most_max_members() {
    let etcd = EtcdProcess::start();
    let url = etcd.url("watched");
    let w = member(
        &url,
        "w",
        EtcdConfig {
            max_members: 3,
            ..config()
        },
    )
    .await;
    let mut ev = w.subscribe().unwrap();
    let mut others = Vec::new();
    for i in 0..6 {
        others.push(member(&url, &format!("m{i}"), config()).await);
    }
    // w itself is not among its own watched members; m0..m2 fill the set.
    let mut joined = Vec::new();
    while let Ok(Some(Ok(MemberEvent::Joined(m)))) =
        tokio::time::timeout(Duration::from_millis(1500), ev.next()).await
    {
        joined.push(m.name);
    }
    assert_eq!(joined, ["m0", "m1", "m2"]);
    assert_eq!(w.watched(), 3);
}

/// A member that died (its task stopped, its lease left to lapse) gives its name back
/// within its lease's TTL: a restart under that name waits for it, then registers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_member_gets_its_name_back_once_the_old_lease_lapses() {
    let etcd = EtcdProcess::start();
    let url = etcd.url("restart");
    let a = member(&url, "x", config()).await;
    drop(a);
    let t = Instant::now();
    let b = EtcdStore::start(&url, config(), "x", "10.0.0.2:1", vec![])
        .await
        .unwrap();
    println!("registered again after {:?}", t.elapsed());
    assert_eq!(b.registrations(), 1);
}

/// Polls `f` until it gives `Some`, or panics naming `what`.
async fn eventually<T, F, Fut>(within: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < end, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labelled_blobs_are_fetched_by_name_and_label_and_go_with_a_withdrawal() {
    let etcd = EtcdProcess::start();
    let url = etcd.url("job-labels");
    let a = member(&url, "prefill-0", config()).await;
    let b = member(&url, "decode-0", config()).await;
    let mut events = b.subscribe().expect("etcd watches");
    let t = Duration::from_secs(5);
    assert_eq!(
        b.fetch_label("prefill-0", "layer-0", t).await.unwrap(),
        None
    );
    a.publish_label("layer-0", b"blocks 0-7".to_vec()).unwrap();
    a.publish_label("layer-1", b"blocks 8-15".to_vec()).unwrap();
    let got = eventually(t, "layer-1 published", || async {
        b.fetch_label("prefill-0", "layer-1", t).await.unwrap()
    })
    .await;
    assert_eq!(got, b"blocks 8-15");
    // Replaced under the same label.
    a.publish_label("layer-0", b"blocks 0-3".to_vec()).unwrap();
    eventually(t, "layer-0 replaced", || async {
        let v = b.fetch_label("prefill-0", "layer-0", t).await.unwrap();
        (v.as_deref() == Some(b"blocks 0-3".as_slice())).then_some(())
    })
    .await;
    // Labels are key parts; blobs are bounded as records are.
    for bad in ["", "a/b"] {
        let e = a.publish_label(bad, vec![1]).unwrap_err();
        assert!(matches!(e, MetaError::Invalid(_)), "{e}");
    }
    let e = a
        .publish_label("big", vec![0; config().max_value_len])
        .unwrap_err();
    assert!(e.to_string().contains("max_value_len"), "{e}");
    // Their count is bounded too: a new label past max_labels is refused naming it, a
    // label already published may still be replaced.
    let max = config().max_labels;
    for i in 2..max {
        a.publish_label(&format!("layer-{i}"), vec![1]).unwrap();
    }
    let e = a.publish_label("one-too-many", vec![1]).unwrap_err();
    assert!(
        matches!(
            e,
            MetaError::Limit {
                limit: "max_labels",
                ..
            }
        ) && e.to_string().contains("max_labels"),
        "{e}"
    );
    a.publish_label("layer-0", b"replaced".to_vec()).unwrap();

    // Withdrawn: watchers see it leave, its record and blobs are gone, the process goes on
    // (its session is kept: no new registration).
    let sessions = a.registrations();
    a.set_listed(false).unwrap();
    loop {
        match next_event(&mut events, t, "prefill-0 leaving").await {
            MemberEvent::Left { name } if name == "prefill-0" => break,
            _ => {}
        }
    }
    assert!(b.resolve("prefill-0", t).await.unwrap().is_none());
    assert_eq!(
        b.fetch_label("prefill-0", "layer-1", t).await.unwrap(),
        None
    );
    // A new record while withdrawn is kept for later, not written.
    a.publish(b"later".to_vec()).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(b.resolve("prefill-0", t).await.unwrap().is_none());

    // Listed again: joins with its latest record; blobs are published anew.
    a.set_listed(true).unwrap();
    loop {
        match next_event(&mut events, t, "prefill-0 joining again").await {
            MemberEvent::Joined(m) if m.name == "prefill-0" => {
                assert_eq!(m.record, b"later");
                break;
            }
            _ => {}
        }
    }
    assert_eq!(
        b.fetch_label("prefill-0", "layer-1", t).await.unwrap(),
        None
    );
    a.publish_label("layer-1", b"again".to_vec()).unwrap();
    eventually(t, "layer-1 published again", || async {
        b.fetch_label("prefill-0", "layer-1", t).await.unwrap()
    })
    .await;
    assert_eq!(a.registrations(), sessions);

    // A member that leaves takes its blobs with it (they live under its lease).
    a.close().await;
    assert_eq!(
        b.fetch_label("prefill-0", "layer-1", t).await.unwrap(),
        None
    );
}
