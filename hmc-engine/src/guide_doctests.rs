//! The user guide's Rust examples (`docs/guide/*.md`), run as this crate's doc tests the way
//! `docs/wire.md`'s examples are decoded by the transports' tests: each page is the doc of
//! an item compiled only under `cargo test --doc`, so a page whose example no longer builds
//! or runs fails the tests. Blocks marked `no_run` need a peer service (etcd) or a device.
#![cfg(doctest)]
