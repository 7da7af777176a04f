//! `cargo xtask features`: the engine built with each ONE of its transport features
//! (`cargo check -p hmc-engine --no-default-features --features X` for X in tcp, ucx, shm,
//! rdma, plugin), and with none, which must build too (an engine over the embedder's own
//! communicator; its `initialize_with` names the features to turn on). A warning from a
//! workspace crate in any of these builds fails the step as an error would: code that one
//! feature set leaves unused is what this catches first.
//!
//! `cargo xtask test` runs it after the tidy checks: on the 2-core CI-class machine the six
//! checks took seconds on a warm target and under 3 minutes from an empty one when this
//! step was added. Should they grow past a few minutes warm, take it out of `test` and say
//! so in the usage text.

use std::process::Command;
use std::time::Instant;

use crate::Result;

/// The engine's transport features, each checked alone.
pub const TRANSPORTS: &[&str] = &["tcp", "ucx", "shm", "rdma", "plugin"];

/// `cargo xtask features`: takes no arguments.
pub fn command(args: &[String]) -> Result {
    if let Some(extra) = args.first() {
        return Err(format!(
            "features takes no arguments (got `{extra}`): it checks hmc-engine with each of \
             {} alone, and with none",
            TRANSPORTS.join(", ")
        ));
    }
    run()
}

/// Runs every check, then reports each one that failed (all of them, not the first).
pub fn run() -> Result {
    let mut failed = Vec::new();
    let sets = TRANSPORTS.iter().map(|t| Some(*t)).chain([None]);
    for feature in sets {
        let what = feature.map_or("no transport".to_string(), |f| format!("--features {f}"));
        let started = Instant::now();
        match check(feature) {
            Ok(()) => eprintln!(
                "xtask: features: hmc-engine with {what}: ok ({:.1} s)",
                started.elapsed().as_secs_f64()
            ),
            Err(why) => {
                eprintln!("xtask: features: hmc-engine with {what}: FAILED\n{why}");
                failed.push(what);
            }
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "hmc-engine does not build cleanly with {} (output above); each transport is a \
             feature the engine must build with alone: gate what needs one with \
             #[cfg(feature = \"…\")], and take transport defaults from hmc_transports::Defaults",
            failed.join("; ")
        ))
    }
}

/// The cargo command that checks the engine with `feature` alone (`None`: no transport).
fn command_for(feature: Option<&str>) -> Command {
    let mut cmd = crate::cargo();
    cmd.args(["check", "-p", "hmc-engine", "--no-default-features"]);
    if let Some(f) = feature {
        cmd.args(["--features", f]);
    }
    cmd
}

/// Runs one check: an error holds cargo's output when it fails or a workspace crate warns.
fn check(feature: Option<&str>) -> Result {
    let mut cmd = command_for(feature);
    let out = cmd
        .output()
        .map_err(|e| format!("could not start {cmd:?}: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!("{cmd:?} failed with {}:\n{stderr}", out.status));
    }
    let warned = workspace_warnings(&stderr);
    if !warned.is_empty() {
        return Err(format!(
            "{cmd:?} warned in {}:\n{stderr}",
            warned.join(", ")
        ));
    }
    Ok(())
}

/// The workspace crates that cargo's output says warned (`warning: `hmc-x` (lib) generated
/// N warnings`; cargo repeats these for cached builds, so a warm target still reports them).
fn workspace_warnings(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("warning: `")?;
            let (krate, tail) = rest.split_once('`')?;
            (tail.contains(" generated ") && (krate.starts_with("hmc-") || krate == "xtask"))
                .then(|| krate.to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_of_workspace_crates_are_found_and_others_ignored() {
        let out = "\
    Checking hmc-transports v0.1.0 (/w/hmc-transports)
warning: unused import: `std::net::SocketAddr`
warning: `hmc-transports` (lib) generated 1 warning (run `cargo fix --lib -p hmc-transports` to apply 1 suggestion)
warning: `tokio` (lib) generated 2 warnings
warning: `hmc-engine` (lib) generated 3 warnings
    Finished `dev` profile [unoptimized + debuginfo] target(s) in 6.82s";
        assert_eq!(workspace_warnings(out), ["hmc-transports", "hmc-engine"]);
        assert!(workspace_warnings("    Finished `dev` profile").is_empty());
    }

    #[test]
    fn each_transport_is_checked_alone_and_none_without_features() {
        let args = |c: Command| {
            c.get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            args(command_for(Some("shm"))),
            [
                "check",
                "-p",
                "hmc-engine",
                "--no-default-features",
                "--features",
                "shm"
            ]
        );
        assert!(!args(command_for(None)).iter().any(|a| a == "--features"));
    }

    /// Every engine feature that turns on a transport of hmc-transports is checked alone,
    /// so a transport added later is not left out of this step.
    #[test]
    fn every_transport_feature_of_the_engine_is_checked() {
        let manifest = std::fs::read_to_string(crate::root().join("hmc-engine/Cargo.toml"))
            .expect("hmc-engine's manifest");
        let features = manifest
            .split("[features]")
            .nth(1)
            .and_then(|s| s.split("\n[").next())
            .expect("a [features] section");
        let mut transports: Vec<&str> = features
            .lines()
            .filter(|l| l.contains("\"hmc-transports/"))
            .filter_map(|l| l.split('=').next())
            .map(str::trim)
            .collect();
        transports.sort_unstable();
        let mut checked = TRANSPORTS.to_vec();
        checked.sort_unstable();
        assert_eq!(transports, checked);
    }
}
