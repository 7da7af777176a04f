//! The user guide's Rust examples (`docs/guide/*.md`), run as this crate's doc tests the way
//! `docs/wire.md`'s examples are decoded by the transports' tests: each page is the doc of
//! an item compiled only under `cargo test --doc`, so a page whose example no longer builds
//! or runs fails the tests. Blocks marked `no_run` need a service (etcd) and are compiled
//! only. A page without Rust blocks needs no item here.
#![cfg(doctest)]

#[doc = include_str!("../../docs/guide/choose-a-transport.md")]
struct ChooseATransport;

#[doc = include_str!("../../docs/guide/kv-cache-vram.md")]
struct KvCacheVram;

#[doc = include_str!("../../docs/guide/cluster-etcd.md")]
struct ClusterEtcd;

#[doc = include_str!("../../docs/guide/limits-and-secrets.md")]
struct LimitsAndSecrets;

#[doc = include_str!("../../docs/guide/write-a-backend.md")]
struct WriteABackend;

#[doc = include_str!("../../docs/guide/rust.md")]
struct Rust;
