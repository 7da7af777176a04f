//! Notifications exactly once or an error, tried on the wire: a peer that is not an engine
//! plays a sender whose messages are duplicated, delayed past a failure notice, or
//! retracted, against a real engine's metadata service over TCP. (`notify_order.rs` checks
//! that every post of a transfer delivers its notification once, engine to engine.)

mod common;

use common::wire::{METHOD_NOTIFY, METHOD_RETRACT, NotifyAck, NotifyMsg, Retract, named_client};
use hmc_engine::{Engine, EngineConfig};

async fn engine() -> Engine<hmc_core::AnyCommunicator> {
    let config = EngineConfig {
        transport: "tcp".parse().unwrap(),
        ..EngineConfig::default()
    };
    Engine::initialize_with("127.0.0.1", config).await.unwrap()
}

async fn sender(target: &str) -> hmc_rpc::Client {
    named_client(target, "127.0.0.1:1").await
}

fn msg(seq: u64, body: &str, failed: Option<&str>) -> NotifyMsg {
    NotifyMsg {
        from: "ignored".into(),
        name: "kv".into(),
        msg: body.as_bytes().to_vec(),
        failed: failed.map(str::to_string),
        id: (42, seq),
    }
}

async fn send(rpc: &hmc_rpc::Client, m: &NotifyMsg) -> NotifyAck {
    rpc.call_typed(METHOD_NOTIFY, m).await.unwrap()
}

fn bodies(target: &Engine<hmc_core::AnyCommunicator>) -> Vec<(String, bool)> {
    target
        .get_notifies()
        .into_iter()
        .map(|n| (String::from_utf8(n.msg).unwrap(), n.failed.is_some()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicated_notification_is_delivered_once_waiting_or_taken() {
    let target = engine().await;
    let rpc = sender(target.name()).await;
    assert_eq!(send(&rpc, &msg(1, "a", None)).await, NotifyAck::Queued);
    assert_eq!(send(&rpc, &msg(1, "a", None)).await, NotifyAck::Duplicate);
    assert_eq!(bodies(&target), [("a".to_string(), false)]);
    assert_eq!(send(&rpc, &msg(1, "a", None)).await, NotifyAck::Duplicate);
    assert!(target.get_notifies().is_empty());
    // The same number from a reconnected sender (a new connection, the same name) is the
    // same send.
    let again = sender(target.name()).await;
    assert_eq!(send(&again, &msg(1, "a", None)).await, NotifyAck::Duplicate);
    assert!(target.get_notifies().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_notice_replaces_its_waiting_notification_and_ends_the_id() {
    let target = engine().await;
    let rpc = sender(target.name()).await;
    send(&rpc, &msg(1, "one", None)).await;
    send(&rpc, &msg(2, "two", None)).await;
    // The sender saw no answer for 1 and reported its transfer failed.
    assert_eq!(
        send(&rpc, &msg(1, "one", Some("no answer"))).await,
        NotifyAck::Queued
    );
    assert_eq!(
        bodies(&target),
        [("one".to_string(), true), ("two".to_string(), false)]
    );
    // A copy of 1 delayed on the wire arrives now: dropped.
    assert_eq!(send(&rpc, &msg(1, "one", None)).await, NotifyAck::Retracted);
    // A failure notice for what the program already took says so, and adds nothing.
    assert_eq!(
        send(&rpc, &msg(2, "two", Some("late"))).await,
        NotifyAck::AlreadyTaken
    );
    assert!(target.get_notifies().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retracted_notification_is_never_delivered() {
    let target = engine().await;
    let rpc = sender(target.name()).await;
    send(&rpc, &msg(5, "x", None)).await;
    let ack: NotifyAck = rpc
        .call_typed(METHOD_RETRACT, &Retract { id: (42, 5) })
        .await
        .unwrap();
    assert_eq!(ack, NotifyAck::Retracted);
    assert!(target.get_notifies().is_empty());
    // Retracted before it arrived (the sender gave up on a delayed message).
    let ack: NotifyAck = rpc
        .call_typed(METHOD_RETRACT, &Retract { id: (42, 6) })
        .await
        .unwrap();
    assert_eq!(ack, NotifyAck::Retracted);
    assert_eq!(send(&rpc, &msg(6, "y", None)).await, NotifyAck::Retracted);
    assert!(target.get_notifies().is_empty());
    // Too late once taken.
    send(&rpc, &msg(7, "z", None)).await;
    assert_eq!(bodies(&target).len(), 1);
    let ack: NotifyAck = rpc
        .call_typed(METHOD_RETRACT, &Retract { id: (42, 7) })
        .await
        .unwrap();
    assert_eq!(ack, NotifyAck::AlreadyTaken);
    // Another connection cannot retract this sender's notifications: ids are per sender
    // name, and it names itself otherwise.
    send(&rpc, &msg(8, "w", None)).await;
    let other = named_client(target.name(), "127.0.0.1:2").await;
    let _: NotifyAck = other
        .call_typed(METHOD_RETRACT, &Retract { id: (42, 8) })
        .await
        .unwrap();
    assert_eq!(bodies(&target), [("w".to_string(), false)]);
}
