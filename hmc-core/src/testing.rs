//! The backend conformance kit: generic checks that every `Memory` and `Communicator` must pass, and the macros that turn them into rstest cases.
//!
//! A backend crate runs the kit from one of its integration tests:
//!
//! ```ignore
//! // tests/conformance.rs of a Memory backend (dev-dependencies: rstest, hmc-core/testing)
//! hmc_core::memory_conformance!(Some(hmc_backend_cpu::HostMemory::new()));
//!
//! // tests/conformance.rs of a transport (dev-dependencies: rstest, tokio, hmc-core/testing)
//! async fn peers() -> Option<hmc_core::testing::Peers<MyComm, HostMemory>> { todo!("bind two communicators") }
//! hmc_core::communicator_conformance!(peers);
//! ```
//!
//! A factory returning `None` means "no such device or library here": the generated tests
//! then log that they were skipped. Backends also keep a test asserting the `Unavailable`
//! error in that case, so a skip is never silent about why.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::{
    Access, Communicator, ConnBuffer, Deadline, DeviceBuffer, Error, MemSpan, MemSpanMut, Memory,
    Op, RegisteredBuffer, TransferDesc,
};

/// Deterministic test bytes: a xorshift stream seeded by `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// The path of example `name` of the package whose integration test calls this:
/// `target/<profile>/examples/<name>`, beside the test's own `target/<profile>/deps/`.
///
/// `cargo test -p <crate>` and `cargo xtask test` build every example there before the
/// tests run. `cargo test --all-targets` (or `--tests` alone) does not: it builds examples
/// with the test harness, or not at all. The panic message says which command to run.
pub fn example_binary(name: &str) -> std::path::PathBuf {
    let test = std::env::current_exe().expect("the test binary's path");
    let profile = test
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary lives in target/<profile>/deps/");
    let exe = profile.join("examples").join(name);
    assert!(
        exe.exists(),
        "{} is missing: build it with `cargo build --examples -p <this crate>` (what `cargo test \
         -p <this crate>` and `cargo xtask test` do first; `--all-targets` builds examples \
         only as test harnesses)",
        exe.display()
    );
    exe
}

/// Runs example `name` ([`example_binary`]) with `args` and returns its standard output,
/// failing the test with both outputs when it exits unsuccessfully.
pub fn run_example(name: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(example_binary(name))
        .args(args)
        .output()
        .expect("run the example");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "example {name} {args:?}: exit {:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn assert_same(what: &str, got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len(), "{what}: length differs");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!(
            "{what}: first difference at byte {i} of {} (got {:#04x}, want {:#04x})",
            got.len(),
            got[i],
            want[i]
        );
    }
}

/// Checks for [`Memory`] implementations.
pub mod memory;

/// Two communicators and the memory their buffers come from; what a
/// [`communicator_conformance!`](crate::communicator_conformance) factory returns.
pub struct Peers<C: Communicator, M: Memory> {
    /// The initiator.
    pub a: Arc<C>,
    /// The target.
    pub b: Arc<C>,
    /// Allocator for both sides' buffers.
    pub memory: Arc<M>,
}

/// Checks for [`Communicator`] implementations. Each takes fresh [`Peers`].
pub mod communicator;

/// A peer binary in a child process, killed or stopped mid-transfer.
pub mod process;

/// Every case with its name and expected error, for runners that choose at run time.
pub mod cases;

/// Generates the [`Memory`] conformance tests for the backend made by `$make`, an
/// expression of type `Option<M>` (`None`: no such device here; the tests log a skip).
///
/// The calling crate needs `rstest` as a dev-dependency.
#[macro_export]
macro_rules! memory_conformance {
    ($make:expr) => {
        mod memory_conformance {
            #[allow(unused_imports)]
            use super::*;

            macro_rules! mem_or_skip {
                () => {
                    match $make {
                        Some(m) => m,
                        None => {
                            ::std::eprintln!(
                                "memory conformance skipped: the backend reports no device here"
                            );
                            return;
                        }
                    }
                };
            }

            #[::rstest::rstest]
            #[case::one_byte(1, 0)]
            #[case::odd_offset(7, 3)]
            #[case::page(4096, 0)]
            #[case::page_plus_one(4097, 1)]
            #[case::odd_64k(65_537, 4095)]
            #[case::one_mib_unaligned(1 << 20, 17)]
            #[case::sixteen_mib(16 << 20, 0)]
            fn round_trip_at_odd_sizes_and_offsets(#[case] len: usize, #[case] offset: usize) {
                let m = mem_or_skip!();
                $crate::testing::memory::round_trip(&m, len, offset);
            }

            #[::rstest::rstest]
            #[case(1)]
            #[case(4099)]
            #[case(8 << 20)]
            fn device_to_device_copies(#[case] len: usize) {
                let m = mem_or_skip!();
                $crate::testing::memory::device_to_device(&m, len);
            }

            #[test]
            fn zero_length_allocations_and_copies() {
                let m = mem_or_skip!();
                $crate::testing::memory::zero_length(&m);
            }

            #[test]
            fn maximum_size_is_refused_and_large_works() {
                let m = mem_or_skip!();
                $crate::testing::memory::maximum_size(&m, 256 << 20);
            }

            #[test]
            fn out_of_bounds_is_refused() {
                let m = mem_or_skip!();
                $crate::testing::memory::out_of_bounds_refused(&m);
            }

            #[test]
            fn capabilities_match_behaviour() {
                let m = mem_or_skip!();
                $crate::testing::memory::capabilities_match_behaviour(&m);
            }
        }
    };
}

/// Generates the [`Communicator`] conformance tests. `$peers` is an `async fn() ->
/// Option<Peers<C, M>>` making two fresh, unconnected communicators (`None`: transport
/// not available here; the tests log a skip).
///
/// The calling crate needs `rstest` and `tokio` (features `macros`, `rt-multi-thread`) as
/// dev-dependencies; tests run on a multi-threaded runtime.
///
/// Every case, what it checks, and the [`Error`] it expects (functions of
/// [`testing::communicator`](crate::testing::communicator)):
///
/// | case | checks | expected error |
/// | --- | --- | --- |
/// | `write_then_read_round_trip` | WRITE then READ at odd sizes (1 B to 8 MiB) and offsets; bytes outside the range unchanged | none |
/// | `zero_length_and_empty_batches` | an empty batch and zero-length descriptors at a region's end succeed and move nothing | none |
/// | `batches_move_every_descriptor` | 2 and 257 descriptors of varied sizes, scattered, both directions | none |
/// | `out_of_bounds_is_refused_and_moves_nothing` | descriptors past either end or overflowing, in a batch with a valid one | `OutOfBounds` |
/// | `access_rights_are_enforced` | WRITE to a read-only region, READ of a write-only one | `AccessDenied` |
/// | `stale_and_forged_keys_are_refused` | a deregistered region's key; every key byte changed; another transport's descriptor | `InvalidKey` (stale); `InvalidKey`/`InvalidArgument` at import or any error at transfer (forged); `InvalidArgument` (foreign) |
/// | `forged_keys_with_one_byte_changed_are_refused` | one key byte flipped, each position: the secret is checked, not only a magic | `InvalidKey`/`InvalidArgument` at import, or any error at transfer; no byte moves |
/// | `capabilities_match_behaviour` | memory of an unlisted kind; `rekey` and `alloc_registered` as declared; another communicator's registration | `UnsupportedMemory`; `InvalidArgument` (foreign registration) |
/// | `deadlines_end_transfers` | an expired deadline; 64 MiB in 50 µs (needs checks between chunks); the endpoint recovers | `DeadlineExceeded` |
/// | `dropping_a_transfer_cancels_it` | a READ/WRITE polled once and dropped: the buffer is ours again, the endpoint works | none |
/// | `peer_gone_mid_transfer_is_an_error_not_a_hang` | the target closes mid-transfer | any error but `DeadlineExceeded`, before the deadline |
/// | `initiator_close_ends_its_transfers` | the initiator closes itself mid-transfer | any error but `DeadlineExceeded`, before the deadline |
/// | `deregistration_during_a_transfer_waits_or_fails_cleanly` | the target frees a region a WRITE is filling | none or any error but `DeadlineExceeded`; no crash |
/// | `concurrent_transfers_from_many_tasks` | 8 tasks x 8 WRITE+READ rounds on one endpoint | none |
/// | `notifications_arrive_in_order` | 100 notifications: tags, bytes, sender, order; none pending after | `DeadlineExceeded` (nothing pending) |
/// | `notifications_from_two_senders` | two senders to one receiver: all arrive, in order per sender, with the right `from` | none |
/// | `connecting_to_a_silent_listener_ends_by_the_deadline` | a TCP listener that never answers | any error, by the deadline |
/// | `an_oversized_batch_is_refused` | `max_batch_len + 1` descriptors (skipped without a declared limit) | `LimitExceeded { limit: "max_batch_len" }` |
/// | `an_abandoned_write_lands_nothing_after_settle` | 32 MiB WRITEs dropped mid-way (`dropped`) or ended by a deadline (`deadline`), then `settle`: canaries over the target region still there after a delay; a full WRITE on the endpoint after | `DeadlineExceeded` (`deadline`); `settle` returns `Ok` |
///
/// A transport that cannot make an abandoned WRITE final in some configuration (its
/// `settle` answers an error there by design) says so, and why, with
/// `communicator_conformance!(peers, settle_cannot_confirm = "why")`: that case is then
/// generated `#[ignore]`d with that reason, and still runs under `cargo test -- --ignored`.
#[macro_export]
macro_rules! communicator_conformance {
    ($peers:path $(, settle_cannot_confirm = $why:literal)?) => {
        mod communicator_conformance {
            #[allow(unused_imports)]
            use super::*;
            use $crate::testing::communicator as kit;

            macro_rules! peers_or_skip {
                () => {
                    match $peers().await {
                        Some(p) => p,
                        None => {
                            ::std::eprintln!(
                                "communicator conformance skipped: transport unavailable here"
                            );
                            return;
                        }
                    }
                };
            }

            #[::rstest::rstest]
            #[case::one_byte(1, 0)]
            #[case::odd(7, 3)]
            #[case::page(4096, 0)]
            #[case::odd_64k(65_537, 13)]
            #[case::one_mib(1 << 20, 1)]
            #[case::eight_mib(8 << 20, 0)]
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn write_then_read_round_trip(#[case] len: usize, #[case] offset: usize) {
                kit::single_round_trip(peers_or_skip!(), len, offset).await;
            }

            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn zero_length_and_empty_batches() {
                kit::zero_length(peers_or_skip!()).await;
            }

            #[::rstest::rstest]
            #[case(2)]
            #[case(257)]
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn batches_move_every_descriptor(#[case] count: usize) {
                kit::batch(peers_or_skip!(), count).await;
            }

            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn out_of_bounds_is_refused_and_moves_nothing() {
                kit::out_of_bounds_refused(peers_or_skip!()).await;
            }

            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn access_rights_are_enforced() {
                kit::access_enforced(peers_or_skip!()).await;
            }

            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn stale_and_forged_keys_are_refused() {
                kit::stale_and_forged_keys_refused(peers_or_skip!()).await;
            }

            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn capabilities_match_behaviour() {
                kit::capabilities_match_behaviour(peers_or_skip!()).await;
            }

            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn deadlines_end_transfers() {
                kit::deadline_expiry(peers_or_skip!()).await;
            }

            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn dropping_a_transfer_cancels_it() {
                kit::cancellation(peers_or_skip!()).await;
            }

            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn peer_gone_mid_transfer_is_an_error_not_a_hang() {
                kit::peer_gone(peers_or_skip!()).await;
            }

            #[::rstest::rstest]
            #[case(8, 8)]
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_transfers_from_many_tasks(
                #[case] tasks: usize,
                #[case] rounds: usize,
            ) {
                kit::concurrent(peers_or_skip!(), tasks, rounds).await;
            }

            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn notifications_arrive_in_order() {
                kit::notify_in_order(peers_or_skip!()).await;
            }

            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn forged_keys_with_one_byte_changed_are_refused() {
                kit::forged_key_one_byte(peers_or_skip!()).await;
            }

            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn deregistration_during_a_transfer_waits_or_fails_cleanly() {
                kit::deregistration_during_transfer(peers_or_skip!()).await;
            }

            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn notifications_from_two_senders() {
                let first = peers_or_skip!();
                kit::notify_from_two_senders(first, peers_or_skip!()).await;
            }

            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn initiator_close_ends_its_transfers() {
                kit::initiator_close(peers_or_skip!()).await;
            }

            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn connecting_to_a_silent_listener_ends_by_the_deadline() {
                kit::connect_to_silent_listener(peers_or_skip!()).await;
            }

            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn an_oversized_batch_is_refused() {
                kit::oversized_batch(peers_or_skip!()).await;
            }

            #[::rstest::rstest]
            #[case::dropped(kit::Abandon::Dropped)]
            #[case::deadline(kit::Abandon::Deadline)]
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            $(#[ignore = $why])?
            async fn an_abandoned_write_lands_nothing_after_settle(#[case] how: kit::Abandon) {
                kit::abandoned_write_settles(peers_or_skip!(), how).await;
            }
        }
    };
}
