//! [`FaultPlan`]: a spec's decisions, drawn deterministically from its seed, one stream
//! per fault kind, and shared by every clone (the engine and its communicator ask one plan).

use std::sync::Arc;
use std::sync::Once;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::spec::{FaultSpec, NotifySide, Timed, When};

/// splitmix64's increment (the golden ratio in 64 bits).
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// splitmix64's output function.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a of a kind's key: each kind's stream is seeded by the seed and its own name, so
/// a kind added to a spec leaves every other kind's decisions as they were.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The fault kinds that draw decisions, each with its own stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    ConnectRefuse,
    ConnectDelay,
    XferStall,
    XferFail,
    XferCut,
    NotifyDrop,
    NotifyDelay,
    NotifyDup,
    MetaSlow,
    MetaGone,
    RegisterSlow,
}

impl Kind {
    const ALL: [Kind; 11] = [
        Kind::ConnectRefuse,
        Kind::ConnectDelay,
        Kind::XferStall,
        Kind::XferFail,
        Kind::XferCut,
        Kind::NotifyDrop,
        Kind::NotifyDelay,
        Kind::NotifyDup,
        Kind::MetaSlow,
        Kind::MetaGone,
        Kind::RegisterSlow,
    ];

    fn key(self) -> &'static str {
        match self {
            Kind::ConnectRefuse => "connect.refuse",
            Kind::ConnectDelay => "connect.delay",
            Kind::XferStall => "xfer.stall",
            Kind::XferFail => "xfer.fail",
            Kind::XferCut => "xfer.cut",
            Kind::NotifyDrop => "notify.drop",
            Kind::NotifyDelay => "notify.delay",
            Kind::NotifyDup => "notify.dup",
            Kind::MetaSlow => "meta.slow",
            Kind::MetaGone => "meta.gone",
            Kind::RegisterSlow => "register.slow",
        }
    }
}

/// One kind's decisions: the n-th is splitmix64's n-th output from the kind's seed, so
/// the sequence depends on nothing but the seed, the kind and how many came before.
#[derive(Debug)]
struct Stream {
    seed: u64,
    asked: AtomicU64,
}

impl Stream {
    fn fires(&self, when: When) -> bool {
        let n = self.asked.fetch_add(1, Ordering::Relaxed) + 1;
        match when {
            When::Chance(p) => {
                // The top 53 bits as a uniform number in [0, 1).
                let u = (mix(self.seed.wrapping_add(n.wrapping_mul(GAMMA))) >> 11) as f64
                    / (1u64 << 53) as f64;
                u < p
            }
            When::First(k) => n <= k,
            When::After(k) => n > k,
        }
    }
}

/// What happens to a connect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ConnectFault {
    /// Wait this long first (`connect.delay`).
    pub delay: Option<Duration>,
    /// Then fail as refused (`connect.refuse`).
    pub refuse: bool,
}

/// How a transfer ends.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub enum TransferEnd {
    /// As the transport ends it.
    #[default]
    Complete,
    /// Fails before any byte moves (`xfer.fail`).
    Fail,
    /// Moves this share of its bytes, then fails (`xfer.cut`).
    Cut(f64),
}

/// What happens to a transfer.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct TransferFault {
    /// Wait this long first, or until the deadline (`xfer.stall`).
    pub stall: Option<Duration>,
    /// Then end so.
    pub end: TransferEnd,
}

/// What happens to one notification, on the side `notify.at` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotifyFault {
    /// It goes through.
    Deliver,
    /// It is lost (the sender is told it was sent).
    Drop,
    /// It goes through this much later.
    Delay(Duration),
    /// It arrives twice.
    Duplicate,
}

/// What happens to one metadata lookup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetaFault {
    /// It goes through.
    Proceed,
    /// It waits this long first (within the lookup's timeout).
    Slow(Duration),
    /// The service is gone: the lookup fails once its timeout has passed, as with an
    /// unreachable service.
    Gone,
}

#[derive(Debug)]
struct Inner {
    spec: FaultSpec,
    streams: [Stream; Kind::ALL.len()],
}

/// A spec's decisions. Clones share the streams and counts: hand the same plan to the
/// communicator ([`crate::Faulty`]) and to whatever else injects faults (the engine's
/// notifications and metadata lookups), and each decision is drawn once.
///
/// Deterministic: the n-th decision of a kind depends only on the seed, the kind and n.
/// Operations issued concurrently draw in the order they reach the plan.
#[derive(Clone, Debug)]
pub struct FaultPlan(Arc<Inner>);

static ANNOUNCED: Once = Once::new();

impl FaultPlan {
    /// The plan of `spec`. The first plan of the process logs at warn that faults are on.
    pub fn new(spec: FaultSpec) -> Self {
        ANNOUNCED.call_once(|| {
            tracing::warn!(
                spec = %spec,
                "fault injection is ON: transfers, connects and notifications fail on purpose \
                 (unset HMC_FAULTS, drop the `faults` option or the faulty: prefix to turn it off)"
            );
        });
        let streams = Kind::ALL.map(|k| Stream {
            seed: mix(spec.seed ^ fnv1a(k.key())),
            asked: AtomicU64::new(0),
        });
        FaultPlan(Arc::new(Inner { spec, streams }))
    }

    /// The spec.
    pub fn spec(&self) -> &FaultSpec {
        &self.0.spec
    }

    /// Whether a configured fault fires now (one decision drawn); `false`, drawing
    /// nothing, for a kind the spec leaves off.
    fn fires(&self, kind: Kind, when: Option<When>) -> bool {
        let Some(when) = when else { return false };
        let i = Kind::ALL.iter().position(|k| *k == kind).expect("listed");
        self.0.streams[i].fires(when)
    }

    fn delay(&self, kind: Kind, t: Option<Timed>) -> Option<Duration> {
        let t = t?;
        self.fires(kind, Some(t.when)).then_some(t.delay)
    }

    /// The next connect's faults (initiator side).
    pub fn connect(&self) -> ConnectFault {
        let s = &self.0.spec;
        ConnectFault {
            delay: self.delay(Kind::ConnectDelay, s.connect_delay),
            refuse: self.fires(Kind::ConnectRefuse, s.connect_refuse),
        }
    }

    /// The next transfer's faults (initiator side). `xfer.fail` wins over `xfer.cut`
    /// when both fire; each configured kind draws once per transfer either way.
    pub fn transfer(&self) -> TransferFault {
        let s = &self.0.spec;
        let stall = self.delay(Kind::XferStall, s.xfer_stall);
        let fail = self.fires(Kind::XferFail, s.xfer_fail);
        let cut = s
            .xfer_cut
            .filter(|c| self.fires(Kind::XferCut, Some(c.when)));
        let end = match (fail, cut) {
            (true, _) => TransferEnd::Fail,
            (false, Some(c)) => TransferEnd::Cut(c.fraction),
            (false, None) => TransferEnd::Complete,
        };
        TransferFault { stall, end }
    }

    fn notify(&self) -> NotifyFault {
        let s = &self.0.spec;
        let drop = self.fires(Kind::NotifyDrop, s.notify_drop);
        let delay = self.delay(Kind::NotifyDelay, s.notify_delay);
        let dup = self.fires(Kind::NotifyDup, s.notify_dup);
        match (drop, delay, dup) {
            (true, _, _) => NotifyFault::Drop,
            (false, Some(d), _) => NotifyFault::Delay(d),
            (false, None, true) => NotifyFault::Duplicate,
            (false, None, false) => NotifyFault::Deliver,
        }
    }

    /// What happens to a notification being sent: a decision when `notify.at=sender`
    /// (the default), else [`NotifyFault::Deliver`] without drawing.
    pub fn notify_send(&self) -> NotifyFault {
        match self.0.spec.notify_at {
            NotifySide::Sender => self.notify(),
            NotifySide::Receiver => NotifyFault::Deliver,
        }
    }

    /// What happens to a notification being taken by its receiver: a decision when
    /// `notify.at=receiver`, else [`NotifyFault::Deliver`] without drawing.
    pub fn notify_recv(&self) -> NotifyFault {
        match self.0.spec.notify_at {
            NotifySide::Receiver => self.notify(),
            NotifySide::Sender => NotifyFault::Deliver,
        }
    }

    /// What happens to the next metadata lookup (initiator side). `meta.gone` wins over
    /// `meta.slow`.
    pub fn meta_call(&self) -> MetaFault {
        let s = &self.0.spec;
        let slow = self.delay(Kind::MetaSlow, s.meta_slow);
        if self.fires(Kind::MetaGone, s.meta_gone) {
            return MetaFault::Gone;
        }
        slow.map_or(MetaFault::Proceed, MetaFault::Slow)
    }

    /// Applies the next metadata decision ([`FaultPlan::meta_call`]) to a lookup that may
    /// take `timeout`: waits what `meta.slow` says and answers `Ok(left)`, the time the
    /// lookup has left; under `meta.gone`, or a slowness past `timeout`, waits the whole
    /// `timeout` (as with an unreachable service) and answers which fault it was. One
    /// rule for every metadata path that injects these faults.
    pub async fn meta_lookup(&self, timeout: Duration) -> Result<Duration, &'static str> {
        match self.meta_call() {
            MetaFault::Proceed => Ok(timeout),
            MetaFault::Slow(d) if d < timeout => {
                tracing::debug!(delay = ?d, "injected fault: slow metadata lookup");
                tokio::time::sleep(d).await;
                Ok(timeout - d)
            }
            MetaFault::Slow(_) => {
                tokio::time::sleep(timeout).await;
                Err("the metadata service was slower than the timeout (`meta.slow`)")
            }
            MetaFault::Gone => {
                tracing::debug!("injected fault: metadata service gone");
                tokio::time::sleep(timeout).await;
                Err("the metadata service is gone (`meta.gone`)")
            }
        }
    }

    /// How long the next registration waits first (local side), if it does.
    pub fn register(&self) -> Option<Duration> {
        self.delay(Kind::RegisterSlow, self.0.spec.register_slow)
    }

    /// `disconnect.after`: operations an endpoint completes before its peer is lost.
    pub fn disconnect_after(&self) -> Option<u64> {
        self.0.spec.disconnect_after
    }

    /// `restart.after`: operations an endpoint completes before its peer restarts.
    pub fn restart_after(&self) -> Option<u64> {
        self.0.spec.restart_after
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(text: &str) -> FaultPlan {
        FaultPlan::new(text.parse().unwrap())
    }

    fn connects(p: &FaultPlan, n: usize) -> Vec<bool> {
        (0..n).map(|_| p.connect().refuse).collect()
    }

    #[test]
    fn the_same_seed_gives_the_same_decisions_and_another_seed_others() {
        let a = connects(&plan("seed=7;connect.refuse=0.5"), 64);
        let b = connects(&plan("seed=7;connect.refuse=0.5"), 64);
        let c = connects(&plan("seed=8;connect.refuse=0.5"), 64);
        assert_eq!(a, b);
        assert_ne!(a, c);
        // About half fire.
        let fired = a.iter().filter(|f| **f).count();
        assert!((16..=48).contains(&fired), "{fired} of 64");
    }

    #[test]
    fn adding_a_kind_leaves_the_others_decisions_alone() {
        let alone = plan("seed=3;xfer.fail=0.3");
        let with_more = plan("seed=3;xfer.stall=1ms@0.5;xfer.cut=0.5@0.5;xfer.fail=0.3");
        for i in 0..200 {
            let a = alone.transfer().end == TransferEnd::Fail;
            let b = with_more.transfer().end == TransferEnd::Fail;
            assert_eq!(a, b, "decision {i}");
        }
    }

    #[test]
    fn clones_share_one_sequence() {
        let p = plan("seed=5;xfer.fail=first:2");
        let q = p.clone();
        assert_eq!(p.transfer().end, TransferEnd::Fail);
        assert_eq!(q.transfer().end, TransferEnd::Fail);
        assert_eq!(p.transfer().end, TransferEnd::Complete);
    }

    #[rstest::rstest]
    #[case::first("first:2", [true, true, false, false, false])]
    #[case::after("after:3", [false, false, false, true, true])]
    #[case::always("1", [true; 5])]
    #[case::never("0", [false; 5])]
    fn counted_whens_fire_on_schedule(#[case] when: &str, #[case] want: [bool; 5]) {
        let p = plan(&format!("connect.refuse={when}"));
        assert_eq!(connects(&p, 5), want);
    }

    #[test]
    fn notification_faults_act_on_the_side_asked_and_in_order_of_precedence() {
        let p = plan("notify.drop=first:1;notify.delay=5ms@first:2;notify.dup=first:3");
        assert_eq!(
            p.notify_recv(),
            NotifyFault::Deliver,
            "sender side by default"
        );
        assert_eq!(p.notify_send(), NotifyFault::Drop);
        assert_eq!(
            p.notify_send(),
            NotifyFault::Delay(Duration::from_millis(5))
        );
        assert_eq!(p.notify_send(), NotifyFault::Duplicate);
        assert_eq!(p.notify_send(), NotifyFault::Deliver);
        let r = plan("notify.at=receiver;notify.dup=1");
        assert_eq!(r.notify_send(), NotifyFault::Deliver);
        assert_eq!(r.notify_recv(), NotifyFault::Duplicate);
    }

    #[test]
    fn metadata_and_registration_decisions() {
        let p = plan("meta.slow=7ms;meta.gone=after:2;register.slow=3ms@first:1");
        assert_eq!(p.meta_call(), MetaFault::Slow(Duration::from_millis(7)));
        assert_eq!(p.meta_call(), MetaFault::Slow(Duration::from_millis(7)));
        assert_eq!(p.meta_call(), MetaFault::Gone);
        assert_eq!(p.register(), Some(Duration::from_millis(3)));
        assert_eq!(p.register(), None);
        let empty = plan("");
        assert_eq!(empty.meta_call(), MetaFault::Proceed);
        assert_eq!(empty.transfer(), TransferFault::default());
        assert_eq!(empty.connect(), ConnectFault::default());
    }
}
