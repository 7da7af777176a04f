//! The layering rules as a check: which workspace crates a crate's `[dependencies]` may
//! name (dev-dependencies are free: tests may reach across layers), and that the sans-IO
//! protocol crate opens no socket.
//!
//! The layers, bottom up: `hmc-core` (the traits; depends on no other crate of ours);
//! backends and transports (on the core and `hmc-transport-kit`, never on the RPC runtime); the RPC
//! runtime (on the core and its protocol, never on a transport: it is generic over
//! `C: Communicator`); the engine, the tools and the Python package on top (the engine not
//! on the tools crate, whose binaries it would drag in, and on no transport crate: it opens
//! them through `hmc-transports`, so that it builds with any one of them).

use std::path::Path;

/// One rule: crates whose name starts with `krate` must not depend on crates starting
/// with any of `forbidden`, and why.
pub struct Rule {
    pub krate: &'static str,
    pub forbidden: &'static [&'static str],
    pub why: &'static str,
}

pub const RULES: &[Rule] = &[
    Rule {
        krate: "hmc-core",
        forbidden: &["hmc-"],
        why: "the core defines the traits every other crate implements or uses; it reaches none of them",
    },
    Rule {
        krate: "hmc-backend-",
        forbidden: &["hmc-transport", "hmc-rpc", "hmc-engine", "hmc-plugin"],
        why: "a device backend allocates and copies memory; transports and runtimes build on it, not it on them",
    },
    Rule {
        krate: "hmc-transport-",
        forbidden: &["hmc-rpc", "hmc-engine", "hmc-plugin", "hmc-transport-"],
        why: "a transport stands alone on the core (and hmc-transport-kit); the runtimes above choose it",
    },
    Rule {
        krate: "hmc-rpc-proto",
        forbidden: &["hmc-transport-kit", "hmc-transport", "hmc-rpc-tools"],
        why: "the protocol crate is sans-IO: it turns bytes into events and owns no socket",
    },
    Rule {
        krate: "hmc-transports",
        forbidden: &["hmc-rpc", "hmc-engine", "hmc-meta", "hmc-py"],
        why: "the transport chooser sits on the transports and the plugin host; the runtimes above call it",
    },
    Rule {
        krate: "hmc-rpc",
        forbidden: &["hmc-transport", "hmc-engine", "hmc-rpc-tools"],
        why: "the RPC runtime is generic over `C: Communicator`; the binaries pick transports",
    },
    Rule {
        krate: "hmc-engine",
        forbidden: &["hmc-rpc-tools", "hmc-py", "hmc-transport-"],
        why: "the engine is a library that opens its transports through hmc-transports (so it \
              builds with any one of them); the tools crate's binaries and the Python package sit on it",
    },
];

/// Crates that hold shared helpers the transports and the RPC runtime may use although
/// their names match a forbidden prefix; a rule that names one exactly still forbids it
/// (the sans-IO protocol crate must not reach the socket kit).
const SHARED: &[&str] = &["hmc-transport-kit"];

/// The workspace crates named in the `[dependencies]` section of `manifest`.
pub fn dependencies(manifest: &str) -> Vec<String> {
    all_dependencies(manifest)
        .into_iter()
        .filter(|d| d.starts_with("hmc-"))
        .collect()
}

/// Every crate named in the `[dependencies]` section of `manifest` (including optional
/// ones: a feature may turn them on).
pub fn all_dependencies(manifest: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_deps = false;
    for line in manifest.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            in_deps = t == "[dependencies]";
            continue;
        }
        if in_deps && t.chars().next().is_some_and(|c| c.is_ascii_alphabetic()) {
            let name: String = t
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '-' || *c == '_')
                .collect();
            out.push(name);
        }
    }
    out
}

/// Problems with `krate`'s dependencies `deps`.
pub fn check_crate(krate: &str, deps: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    for rule in RULES.iter().filter(|r| krate.starts_with(r.krate)) {
        // `hmc-rpc` rules are for the runtime, not for `hmc-rpc-proto`/`-tools`, which
        // have their own.
        if rule.krate == "hmc-rpc" && krate != "hmc-rpc" {
            continue;
        }
        for d in deps {
            let named = rule.forbidden.contains(&d.as_str());
            if d == krate || (SHARED.contains(&d.as_str()) && !named) {
                continue;
            }
            if rule.forbidden.iter().any(|f| d.starts_with(f)) {
                problems.push(format!(
                    "{krate}/Cargo.toml: depends on {d}, across a layer: {}",
                    rule.why
                ));
            }
        }
    }
    problems
}

/// Paths whose use means I/O: sockets, an async runtime or an event loop.
const IO_PATHS: &[&str] = &["std::net", "unix::net", "tokio::", "mio::", "socket2::"];

/// Crates a sans-IO crate must not depend on.
const IO_CRATES: &[&str] = &["tokio", "mio", "socket2", "hmc-transport-"];

/// Source lines of the sans-IO protocol crate that name a socket or an async runtime.
fn proto_io(root: &Path) -> Vec<String> {
    let mut files = Vec::new();
    super::rust_files(&root.join("hmc-rpc-proto/src"), &mut files);
    let mut problems = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if IO_PATHS.iter().any(|w| code.contains(w)) {
                problems.push(format!(
                    "{}:{}: the sans-IO protocol crate names a socket or runtime",
                    f.strip_prefix(root).unwrap_or(&f).display(),
                    i + 1
                ));
            }
        }
    }
    problems
}

/// Every layering problem of the workspace at `root`.
pub fn problems(root: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let mut crates: Vec<_> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("hmc-"))
        .collect();
    crates.sort_by_key(|e| e.file_name());
    for e in crates {
        let Ok(manifest) = std::fs::read_to_string(e.path().join("Cargo.toml")) else {
            continue;
        };
        let name = e.file_name().to_string_lossy().into_owned();
        problems.extend(check_crate(&name, &dependencies(&manifest)));
    }
    problems.extend(proto_io(root));
    let proto = std::fs::read_to_string(root.join("hmc-rpc-proto/Cargo.toml")).unwrap_or_default();
    problems.extend(check_sans_io("hmc-rpc-proto", &all_dependencies(&proto)));
    problems
}

/// Problems with the dependencies of a sans-IO crate: none may do I/O.
pub fn check_sans_io(krate: &str, deps: &[String]) -> Vec<String> {
    deps.iter()
        .filter(|d| IO_CRATES.iter().any(|io| d.starts_with(io)))
        .map(|d| {
            format!(
                "{krate}/Cargo.toml: depends on {d}; the protocol crate is sans-IO (bytes in, \
                 events out): sockets and runtimes belong in hmc-rpc"
            )
        })
        .collect()
}
