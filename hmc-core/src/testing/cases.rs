//! The kit as data: every case of `communicator_conformance!`, `memory_conformance!` and the process harness, with its name, what it checks and the error it expects, for runners that pick cases at run time (`hmc-plugin-kit` runs them against a plugin's `.so`).
//!
//! The macros and this table name the same cases; a test below fails when one gains a case
//! the other lacks.

use std::rc::Rc;

use super::process::{self, PeerProcess};
use super::*;

/// A future the runner drives on its own runtime (cases need not be `Send`).
pub type LocalFuture<T> = Pin<Box<dyn Future<Output = T>>>;

/// Makes two fresh, unconnected communicators for one case (a case may ask twice).
pub type PeersFn<C, M> = Rc<dyn Fn() -> LocalFuture<Peers<C, M>>>;

/// What a case is about, for listings and failure reports.
#[derive(Clone, Copy, Debug)]
pub struct About {
    /// What it checks.
    pub checks: &'static str,
    /// The error it expects, or `none`.
    pub expects: &'static str,
}

/// One communicator case: `name` is the macro's test name, with the rstest case after `::`.
pub struct CommunicatorCase<C: Communicator, M: Memory> {
    /// The case's name (`write_then_read_round_trip::one_byte`).
    pub name: String,
    /// What it checks and expects.
    pub about: About,
    /// Runs it; panics on a failure, with what differed.
    pub run: Box<dyn Fn(PeersFn<C, M>) -> LocalFuture<()>>,
}

/// One memory case.
pub struct MemoryCase<M: Memory> {
    /// The case's name (`round_trip_at_odd_sizes_and_offsets::page`).
    pub name: String,
    /// What it checks and expects.
    pub about: About,
    /// Runs it; panics on a failure.
    pub run: Box<dyn Fn(&M)>,
}

/// One two-process case: the peer is a child process the runner starts.
pub struct ProcessCase<C: Communicator, M: Memory> {
    /// The case's name.
    pub name: &'static str,
    /// What it checks and expects.
    pub about: About,
    /// Runs it against the local communicator, its memory and the peer process.
    pub run: fn(Arc<C>, Arc<M>, PeerProcess) -> LocalFuture<()>,
}

const fn about(checks: &'static str, expects: &'static str) -> About {
    About { checks, expects }
}

/// Every case of [`communicator_conformance!`](crate::communicator_conformance), in the
/// macro's order, with the macro's parameters.
pub fn communicator_cases<C: Communicator + 'static, M: Memory + 'static>()
-> Vec<CommunicatorCase<C, M>> {
    use communicator as kit;
    let mut out: Vec<CommunicatorCase<C, M>> = Vec::new();
    let mut one =
        |name: String, about: About, run: Box<dyn Fn(PeersFn<C, M>) -> LocalFuture<()>>| {
            out.push(CommunicatorCase { name, about, run })
        };
    macro_rules! case {
        ($name:expr, $about:expr, |$p:ident| $body:expr) => {
            one(
                $name,
                $about,
                Box::new(move |peers: PeersFn<C, M>| {
                    Box::pin(async move {
                        let $p = peers().await;
                        $body.await
                    })
                }),
            )
        };
    }
    let round_trip = about(
        "WRITE then READ at odd sizes (1 B to 8 MiB) and offsets; bytes outside the range unchanged",
        "none",
    );
    for (label, len, offset) in [
        ("one_byte", 1, 0),
        ("odd", 7, 3),
        ("page", 4096, 0),
        ("odd_64k", 65_537, 13),
        ("one_mib", 1 << 20, 1),
        ("eight_mib", 8 << 20, 0),
    ] {
        case!(
            format!("write_then_read_round_trip::{label}"),
            round_trip,
            |p| kit::single_round_trip(p, len, offset)
        );
    }
    case!(
        "zero_length_and_empty_batches".into(),
        about(
            "an empty batch and zero-length descriptors at a region's end succeed and move nothing",
            "none"
        ),
        |p| kit::zero_length(p)
    );
    for count in [2, 257] {
        case!(
            format!("batches_move_every_descriptor::{count}"),
            about(
                "descriptors of varied sizes, scattered, both directions",
                "none"
            ),
            |p| kit::batch(p, count)
        );
    }
    case!(
        "out_of_bounds_is_refused_and_moves_nothing".into(),
        about(
            "descriptors past either end or overflowing, in a batch with a valid one",
            "OutOfBounds"
        ),
        |p| kit::out_of_bounds_refused(p)
    );
    case!(
        "access_rights_are_enforced".into(),
        about(
            "WRITE to a read-only region, READ of a write-only one",
            "AccessDenied"
        ),
        |p| kit::access_enforced(p)
    );
    case!(
        "stale_and_forged_keys_are_refused".into(),
        about(
            "a deregistered region's key; every key byte changed; another transport's descriptor",
            "InvalidKey (stale); InvalidKey/InvalidArgument at import or any error at transfer \
             (forged); InvalidArgument (foreign)"
        ),
        |p| kit::stale_and_forged_keys_refused(p)
    );
    case!(
        "capabilities_match_behaviour".into(),
        about(
            "memory of an unlisted kind; rekey and alloc_registered as declared; another \
             communicator's registration",
            "UnsupportedMemory; InvalidArgument (foreign registration)"
        ),
        |p| kit::capabilities_match_behaviour(p)
    );
    case!(
        "deadlines_end_transfers".into(),
        about(
            "an expired deadline; 64 MiB in 50 µs (needs checks between chunks); the endpoint \
             recovers",
            "DeadlineExceeded"
        ),
        |p| kit::deadline_expiry(p)
    );
    case!(
        "dropping_a_transfer_cancels_it".into(),
        about(
            "a READ/WRITE polled once and dropped: the buffer is ours again, the endpoint works",
            "none"
        ),
        |p| kit::cancellation(p)
    );
    case!(
        "peer_gone_mid_transfer_is_an_error_not_a_hang".into(),
        about(
            "the target closes mid-transfer",
            "any error but DeadlineExceeded, before the deadline"
        ),
        |p| kit::peer_gone(p)
    );
    case!(
        "concurrent_transfers_from_many_tasks::8x8".into(),
        about("8 tasks x 8 WRITE+READ rounds on one endpoint", "none"),
        |p| kit::concurrent(p, 8, 8)
    );
    case!(
        "notifications_arrive_in_order".into(),
        about(
            "100 notifications: tags, bytes, sender, order; none pending after",
            "DeadlineExceeded (nothing pending)"
        ),
        |p| kit::notify_in_order(p)
    );
    case!(
        "forged_keys_with_one_byte_changed_are_refused".into(),
        about(
            "one key byte flipped, each position: the secret is checked, not only a magic",
            "InvalidKey/InvalidArgument at import, or any error at transfer; no byte moves"
        ),
        |p| kit::forged_key_one_byte(p)
    );
    case!(
        "deregistration_during_a_transfer_waits_or_fails_cleanly".into(),
        about(
            "the target frees a region a WRITE is filling",
            "none or any error but DeadlineExceeded; no crash"
        ),
        |p| kit::deregistration_during_transfer(p)
    );
    one(
        "notifications_from_two_senders".into(),
        about(
            "two senders to one receiver: all arrive, in order per sender, with the right `from`",
            "none",
        ),
        Box::new(|peers: PeersFn<C, M>| {
            Box::pin(async move {
                let first = peers().await;
                kit::notify_from_two_senders(first, peers().await).await
            })
        }),
    );
    case!(
        "initiator_close_ends_its_transfers".into(),
        about(
            "the initiator closes itself mid-transfer",
            "any error but DeadlineExceeded, before the deadline"
        ),
        |p| kit::initiator_close(p)
    );
    case!(
        "connecting_to_a_silent_listener_ends_by_the_deadline".into(),
        about(
            "a TCP listener that never answers",
            "any error, by the deadline"
        ),
        |p| kit::connect_to_silent_listener(p)
    );
    case!(
        "an_oversized_batch_is_refused".into(),
        about(
            "max_batch_len + 1 descriptors (skipped without a declared limit)",
            "LimitExceeded { limit: \"max_batch_len\" }"
        ),
        |p| kit::oversized_batch(p)
    );
    for (label, how) in [
        ("dropped", kit::Abandon::Dropped),
        ("deadline", kit::Abandon::Deadline),
    ] {
        case!(
            format!("{ABANDONED_WRITE}::{label}"),
            about(
                "32 MiB WRITEs abandoned mid-way (future dropped, i.e. transfer_release; or \
                 ended by a deadline), then settle: canaries over the target region still \
                 there after a delay; a full WRITE on the endpoint after",
                "DeadlineExceeded (deadline); settle returns Ok; no byte lands after"
            ),
            |p| kit::abandoned_write_settles(p, how)
        );
    }
    out
}

/// The communicator case of the terminal-state rule (no byte of an abandoned WRITE lands
/// after it ended and `settle` returned), which the plugin ABI states from 1.3 on.
pub const ABANDONED_WRITE: &str = "an_abandoned_write_lands_nothing_after_settle";

/// Every case of [`memory_conformance!`](crate::memory_conformance), with its parameters.
pub fn memory_cases<M: Memory + 'static>() -> Vec<MemoryCase<M>> {
    let mut out: Vec<MemoryCase<M>> = Vec::new();
    let sizes = about(
        "host to device at an offset and back; bytes around the range unchanged",
        "none",
    );
    for (label, len, offset) in [
        ("one_byte", 1, 0),
        ("odd_offset", 7, 3),
        ("page", 4096, 0),
        ("page_plus_one", 4097, 1),
        ("odd_64k", 65_537, 4095),
        ("one_mib_unaligned", 1 << 20, 17),
        ("sixteen_mib", 16 << 20, 0),
    ] {
        out.push(MemoryCase {
            name: format!("round_trip_at_odd_sizes_and_offsets::{label}"),
            about: sizes,
            run: Box::new(move |m: &M| memory::round_trip(m, len, offset)),
        });
    }
    for len in [1, 4099, 8 << 20] {
        out.push(MemoryCase {
            name: format!("device_to_device_copies::{len}"),
            about: about(
                "device to device copies of one allocation to another",
                "none",
            ),
            run: Box::new(move |m: &M| memory::device_to_device(m, len)),
        });
    }
    type Fixed<M> = (&'static str, About, fn(&M));
    let fixed: [Fixed<M>; 4] = [
        (
            "zero_length_allocations_and_copies",
            about("zero-length allocations and copies succeed", "none"),
            memory::zero_length,
        ),
        (
            "maximum_size_is_refused_and_large_works",
            about(
                "an allocation over max_alloc is refused; 256 MiB works",
                "LimitExceeded or OutOfMemory over max_alloc",
            ),
            |m| memory::maximum_size(m, 256 << 20),
        ),
        (
            "out_of_bounds_is_refused",
            about("copies past an allocation's end", "OutOfBounds"),
            memory::out_of_bounds_refused,
        ),
        (
            "capabilities_match_behaviour",
            about(
                "the declared device and copy kinds match what copies do",
                "Unsupported for what it does not declare",
            ),
            memory::capabilities_match_behaviour,
        ),
    ];
    for (name, about, run) in fixed {
        out.push(MemoryCase {
            name: name.into(),
            about,
            run: Box::new(run),
        });
    }
    out
}

/// The two-process cases of [`process`], each moving 1 MiB per transfer.
pub fn process_cases<C: Communicator + 'static, M: Memory + 'static>() -> Vec<ProcessCase<C, M>> {
    vec![
        ProcessCase {
            name: "a_peer_killed_mid_transfer_fails_it_fast",
            about: about(
                "the peer process is SIGKILLed while WRITEs and READs to it run",
                "any error but DeadlineExceeded, before the deadline; later transfers fail",
            ),
            run: |c, m, peer| Box::pin(process::peer_killed_mid_transfer(c, m, peer, 1 << 20)),
        },
        ProcessCase {
            name: "a_stopped_peer_times_out_and_serves_again_when_resumed",
            about: about(
                "the peer process is SIGSTOPped mid-transfer, then SIGCONTinued",
                "DeadlineExceeded by the deadline; transfers work again after SIGCONT",
            ),
            run: |c, m, peer| Box::pin(process::peer_stopped_mid_transfer(c, m, peer, 1 << 20)),
        },
    ]
}

#[cfg(test)]
mod tests {
    /// The test names inside `macro_rules! $which { ... }` of testing.rs.
    fn macro_tests(which: &str) -> Vec<String> {
        let src = include_str!("../testing.rs");
        let start = src
            .find(&format!("macro_rules! {which}"))
            .expect("the macro");
        let body = &src[start..];
        // The next exported macro ends this one (inner helper macros do not).
        let end = body.find("#[macro_export]").unwrap_or(body.len());
        let body = &body[..end];
        let mut names = Vec::new();
        for line in body.lines() {
            let line = line.trim();
            let rest = line
                .strip_prefix("async fn ")
                .or_else(|| line.strip_prefix("fn "));
            if let Some(rest) = rest {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                names.push(name);
            }
        }
        names
    }

    fn same_tests(macro_names: Vec<String>, table: Vec<String>) {
        let stems: Vec<&str> = table
            .iter()
            .map(|n| n.split("::").next().unwrap())
            .collect();
        for n in &macro_names {
            assert!(
                stems.contains(&n.as_str()),
                "the macro's test `{n}` is not in the case table (testing/cases.rs)"
            );
        }
        for s in &stems {
            assert!(
                macro_names.iter().any(|n| n == s),
                "the case table's `{s}` is not a test of the macro (testing.rs)"
            );
        }
    }

    #[test]
    fn the_table_names_every_case_of_the_macros() {
        use crate::{AnyMemory, NoCommunicator};
        let comm: Vec<String> = super::communicator_cases::<NoCommunicator, AnyMemory>()
            .into_iter()
            .map(|c| c.name)
            .collect();
        same_tests(macro_tests("communicator_conformance"), comm);
        let mem: Vec<String> = super::memory_cases::<AnyMemory>()
            .into_iter()
            .map(|c| c.name)
            .collect();
        same_tests(macro_tests("memory_conformance"), mem);
    }
}
