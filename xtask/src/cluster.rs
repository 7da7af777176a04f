//! `cargo xtask cluster-test`: several "hosts" on one machine (network namespaces joined by
//! veth pairs through a bridge in a switch namespace), etcd in one, an engine serving a
//! buffer in another and an engine pulling it by name in a third, and faults injected
//! while bytes move: a link set down and up, the serving process SIGKILLed and restarted
//! under its name, its host's address changed (the serving process restarted at the new
//! address, as a supervisor would, and found there through etcd), SIGSTOPped and continued,
//! etcd killed and restarted, and a slow link (`tc tbf`). Each fault prints a figure: time
//! to detect, transfers failed cleanly, resumed, bytes verified. Needs root (skipped with a
//! message otherwise).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::Result;

/// The lease TTL the engines run with: a peer cut off is gone within about this long.
const LEASE_MS: u64 = 2000;

/// Runs `ip`/`tc`/`kill` and fails with its stderr.
fn sh(args: &[&str]) -> Result {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args[0]))?;
    if !out.status.success() {
        return Err(format!(
            "`{}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// `etcd` on `PATH`, or how to install it.
pub(crate) fn etcd_binary() -> Result<PathBuf> {
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("etcd"))
                .find(|p| p.is_file())
        })
        .ok_or_else(|| "no etcd: apt-get install etcd-server (cargo xtask deps)".to_string())
}

/// The arguments of a one-member etcd at `ip` keeping its data in `dir`, with the short
/// election timings that let 1-second leases be granted.
pub(crate) fn etcd_args(dir: &Path, ip: &str, client_port: u16, peer_port: u16) -> Vec<String> {
    let client = format!("http://{ip}:{client_port}");
    let peer = format!("http://{ip}:{peer_port}");
    vec![
        "--name=hmc".to_string(),
        format!("--data-dir={}", dir.join("etcd").display()),
        format!("--listen-client-urls={client}"),
        format!("--advertise-client-urls={client}"),
        format!("--listen-peer-urls={peer}"),
        format!("--initial-advertise-peer-urls={peer}"),
        format!("--initial-cluster=hmc={peer}"),
        "--heartbeat-interval=50".into(),
        "--election-timeout=500".into(),
    ]
}

/// Namespaces `<p>-sw` (the bridge) and `<p>-h1..hN`, host i at `10.<net>.0.i/24`; all
/// deleted on drop.
struct Net {
    prefix: String,
    subnet: String,
    hosts: usize,
}

impl Net {
    fn new(hosts: usize) -> Result<Net> {
        let id = std::process::id() % 10_000;
        let net = Net {
            prefix: format!("hc{id}"),
            subnet: format!("10.{}.{}", 100 + id % 100, id / 100 % 250),
            hosts,
        };
        let sw = net.sw();
        sh(&["ip", "netns", "add", &sw])?;
        sh(&["ip", "-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        sh(&["ip", "-n", &sw, "link", "set", "br0", "up"])?;
        for i in 1..=hosts {
            let ns = net.ns(i);
            let port = net.port(i);
            sh(&["ip", "netns", "add", &ns])?;
            sh(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
            sh(&[
                "ip", "-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", "eth0",
                "netns", &ns,
            ])?;
            sh(&["ip", "-n", &sw, "link", "set", &port, "master", "br0"])?;
            sh(&["ip", "-n", &sw, "link", "set", &port, "up"])?;
            let addr = format!("{}/24", net.ip(i));
            sh(&["ip", "-n", &ns, "addr", "add", &addr, "dev", "eth0"])?;
            sh(&["ip", "-n", &ns, "link", "set", "eth0", "up"])?;
        }
        Ok(net)
    }
    fn sw(&self) -> String {
        format!("{}-sw", self.prefix)
    }
    fn ns(&self, i: usize) -> String {
        format!("{}-h{i}", self.prefix)
    }
    /// The bridge's end of host i's veth pair.
    fn port(&self, i: usize) -> String {
        format!("{}p{i}", self.prefix)
    }
    fn ip(&self, i: usize) -> String {
        format!("{}.{i}", self.subnet)
    }
    /// Replaces host i's address `from` by `to` (both in the /24): sockets bound to `from`
    /// reach nothing from then on.
    fn readdress(&self, i: usize, from: &str, to: &str) -> Result {
        let ns = self.ns(i);
        sh(&[
            "ip",
            "-n",
            &ns,
            "addr",
            "del",
            &format!("{from}/24"),
            "dev",
            "eth0",
        ])?;
        sh(&[
            "ip",
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{to}/24"),
            "dev",
            "eth0",
        ])
    }
    fn link(&self, i: usize, up: bool) -> Result {
        let state = if up { "up" } else { "down" };
        sh(&["ip", "-n", &self.sw(), "link", "set", &self.port(i), state])
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for i in 1..=self.hosts {
            let _ = sh(&["ip", "netns", "del", &self.ns(i)]);
        }
        let _ = sh(&["ip", "netns", "del", &self.sw()]);
    }
}

/// A process in a namespace whose stdout lines arrive with the time they were read.
struct Proc {
    child: Child,
    lines: mpsc::Receiver<(Instant, String)>,
}

impl Proc {
    fn spawn(ns: &str, bin: &Path, args: &[String], log: &Path) -> Result<Proc> {
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(bin)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(
                std::fs::File::create(log)
                    .map(Stdio::from)
                    .unwrap_or_else(|_| Stdio::null()),
            )
            .spawn()
            .map_err(|e| format!("{}: {e}", bin.display()))?;
        let out = child.stdout.take().expect("piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
                if tx.send((Instant::now(), line)).is_err() {
                    return;
                }
            }
        });
        Ok(Proc { child, lines: rx })
    }

    /// Waits for a line starting with `prefix`; lines before it are returned too.
    fn wait(&self, prefix: &str, within: Duration) -> Result<(Instant, String, Vec<String>)> {
        let end = Instant::now() + within;
        let mut seen = Vec::new();
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((t, l)) if l.starts_with(prefix) => return Ok((t, l, seen)),
                Ok((_, l)) => seen.push(l),
                Err(_) => {
                    return Err(format!(
                        "no `{prefix}` line within {within:?} (saw {} lines, last {:?})",
                        seen.len(),
                        seen.last()
                    ));
                }
            }
        }
    }

    /// Lines that arrived until now.
    fn drain(&self) -> Vec<String> {
        self.lines.try_iter().map(|(_, l)| l).collect()
    }

    fn signal(&self, sig: &str) -> Result {
        sh(&["kill", &format!("-{sig}"), &self.child.id().to_string()])
    }

    fn stop(mut self) -> Vec<String> {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
        self.drain()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Everything a run needs: the network, etcd, the target and the puller.
struct Cluster {
    net: Net,
    node: PathBuf,
    etcd_bin: PathBuf,
    dir: PathBuf,
    url: String,
    etcd: Option<Proc>,
    target: Option<Proc>,
    /// The target host's address now (it changes in the address fault).
    target_ip: String,
}

impl Cluster {
    fn start_etcd(&mut self) -> Result {
        let ip = self.net.ip(1);
        let args = etcd_args(&self.dir, &ip, 2379, 2380);
        let log = self.dir.join("etcd.log");
        self.etcd = Some(Proc::spawn(&self.net.ns(1), &self.etcd_bin, &args, &log)?);
        // Ready when its client port answers.
        let start = Instant::now();
        while Command::new("ip")
            .args(["netns", "exec", &self.net.ns(2), "bash", "-c"])
            .arg(format!("exec 3<>/dev/tcp/{ip}/2379"))
            .stderr(Stdio::null())
            .status()
            .map(|s| !s.success())
            .unwrap_or(true)
        {
            if start.elapsed() > Duration::from_secs(30) {
                return Err("etcd did not start within 30 s (see etcd.log)".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    fn start_target(&mut self) -> Result {
        let args: Vec<String> = [
            "serve",
            "--metadata",
            &self.url,
            "--name",
            "target",
            "--ip",
            &self.target_ip,
            "--mib",
            "16",
            "--lease-ttl-ms",
            &LEASE_MS.to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let p = Proc::spawn(
            &self.net.ns(2),
            &self.node,
            &args,
            &self.dir.join("target.log"),
        )?;
        let (_, ready, _) = p.wait("READY", Duration::from_secs(30))?;
        // `READY <name> <data-plane address>`: at the host's address of now.
        if !ready.contains(&format!("//{}:", self.target_ip)) {
            return Err(format!("the target is not at {}: {ready}", self.target_ip));
        }
        self.target = Some(p);
        Ok(())
    }

    fn target(&self) -> &Proc {
        self.target.as_ref().expect("the target runs")
    }
}

/// One fault's figure.
struct Figure {
    fault: &'static str,
    detect_ms: Option<u128>,
    failed: usize,
    resumed_ms: Option<u128>,
    oks_during: usize,
}

/// Injects a fault that should fail the puller's transfer and recover: `inject`, wait for
/// the FAIL, `recover`, wait for RESUMED and a good round after it.
fn fail_and_recover(
    c: &mut Cluster,
    pull: &Proc,
    fault: &'static str,
    inject: impl FnOnce(&mut Cluster) -> Result,
    hold: Duration,
    recover: impl FnOnce(&mut Cluster) -> Result,
) -> Result<Figure> {
    pull.drain();
    let t0 = Instant::now();
    inject(c)?;
    let (t_fail, line, _) = pull.wait("FAIL", Duration::from_secs(30))?;
    println!("  {fault}: {line}");
    let detect = t_fail - t0;
    std::thread::sleep(hold.saturating_sub(t0.elapsed()));
    let t1 = Instant::now();
    recover(c)?;
    let (t_res, _, _) = pull.wait("RESUMED", Duration::from_secs(60))?;
    pull.wait("OK", Duration::from_secs(30))?;
    Ok(Figure {
        fault,
        detect_ms: Some(detect.as_millis()),
        failed: 1,
        resumed_ms: Some(t_res.saturating_duration_since(t1).as_millis()),
        oks_during: 0,
    })
}

/// Counts good rounds over `d`; fails on a FAIL line.
fn rounds_over(pull: &Proc, d: Duration) -> Result<usize> {
    pull.drain();
    std::thread::sleep(d);
    let lines = pull.drain();
    if let Some(f) = lines.iter().find(|l| l.starts_with("FAIL")) {
        return Err(format!("a transfer failed where none should: {f}"));
    }
    Ok(lines.iter().filter(|l| l.starts_with("OK")).count())
}

/// Builds the engine's `cluster_node` example (debug) and says where it is.
pub(crate) fn cargo_build_node(root: &Path) -> Result<PathBuf> {
    crate::run(crate::cargo().args(["build", "-p", "hmc-engine", "--example", "cluster_node"]))?;
    Ok(root.join("target/debug/examples/cluster_node"))
}

/// `cargo xtask cluster-test [--quick]`: `--quick` injects the link fault, the SIGKILL and
/// the address change only (what `cargo xtask test` runs).
pub fn run(root: &Path, quick: bool) -> Result {
    if let Some(why) = namespaces_unusable() {
        println!("cluster-test: skipped ({why})");
        return Ok(());
    }
    let mut c = Cluster::start(root)?;
    let pull = c.start_puller()?;
    let mut figures = core_faults(&mut c, &pull)?;
    if !quick {
        figures.extend(long_faults(&mut c, &pull)?);
    }
    report(&figures, pull)?;
    let _ = std::fs::remove_dir_all(&c.dir);
    Ok(())
}

/// Why this machine cannot run the cluster (not root, no `ip netns`, namespaces refused),
/// or `None`.
fn namespaces_unusable() -> Option<String> {
    if !crate::is_root() {
        return Some("needs root to create network namespaces".into());
    }
    if Command::new("ip")
        .args(["netns", "list"])
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        return Some(
            "`ip netns` is unavailable here: install iproute2, or the kernel/container refuses network namespaces"
                .into(),
        );
    }
    // Listing works without the right to create; try it.
    let probe = format!("hc{}-probe", std::process::id() % 10_000);
    if let Err(e) = sh(&["ip", "netns", "add", &probe]) {
        return Some(format!("cannot create a network namespace here: {e}"));
    }
    let _ = sh(&["ip", "netns", "del", &probe]);
    None
}

impl Cluster {
    /// Three hosts in namespaces, etcd on the first and the target engine on the second.
    fn start(root: &Path) -> Result<Cluster> {
        let etcd_bin = etcd_binary()?;
        let node = cargo_build_node(root)?;
        let dir = std::env::temp_dir().join(format!("hmc-cluster-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let net = Net::new(3)?;
        let url = format!("etcd://{}:2379/cluster", net.ip(1));
        println!(
            "cluster-test: hosts {} (etcd), {} (target), {} (puller) in namespaces {}-*; logs in {}",
            net.ip(1),
            net.ip(2),
            net.ip(3),
            net.prefix,
            dir.display()
        );
        let mut c = Cluster {
            target_ip: net.ip(2),
            net,
            node,
            etcd_bin,
            dir,
            url,
            etcd: None,
            target: None,
        };
        c.start_etcd()?;
        c.start_target()?;
        Ok(c)
    }

    /// The puller on the third host, attached to the target by name and through its first
    /// good round.
    fn start_puller(&self) -> Result<Proc> {
        let pull_args: Vec<String> = [
            "pull",
            "--metadata",
            &self.url,
            "--peer",
            "target",
            "--ip",
            &self.net.ip(3),
            "--lease-ttl-ms",
            &LEASE_MS.to_string(),
            "--timeout-ms",
            "60000",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let pull = Proc::spawn(
            &self.net.ns(3),
            &self.node,
            &pull_args,
            &self.dir.join("pull.log"),
        )?;
        pull.wait("ATTACHED", Duration::from_secs(30))?;
        pull.wait("OK", Duration::from_secs(30))?;
        Ok(pull)
    }
}

/// The faults of every run: a link down, the target killed and restarted, the target's
/// address changed.
fn core_faults(c: &mut Cluster, pull: &Proc) -> Result<Vec<Figure>> {
    let mut figures = Vec::new();
    figures.push(fail_and_recover(
        c,
        pull,
        "link down 4 s",
        |c| c.net.link(2, false),
        Duration::from_secs(4),
        |c| c.net.link(2, true),
    )?);
    figures.push(fail_and_recover(
        c,
        pull,
        "SIGKILL, restart as `target`",
        |c| {
            drop(c.target.take());
            Ok(())
        },
        Duration::ZERO,
        |c| c.start_target(),
    )?);
    // The target's host gets another address: what the target listens on reaches nothing,
    // and its transfer in flight can only end by its lease. A supervisor restarts it at the
    // new address (an engine's listeners are bound to the address it was started with),
    // and the puller finds it there by name: the old address exists nowhere any more.
    figures.push(fail_and_recover(
        c,
        pull,
        "address changed, restarted at it",
        |c| {
            let new = c.net.ip(if c.target_ip == c.net.ip(2) { 12 } else { 2 });
            c.net.readdress(2, &c.target_ip, &new)?;
            c.target_ip = new;
            drop(c.target.take());
            Ok(())
        },
        Duration::from_secs(3),
        |c| c.start_target(),
    )?);
    Ok(figures)
}

/// The faults of a full run: the target stopped, etcd down, a slow link.
fn long_faults(c: &mut Cluster, pull: &Proc) -> Result<Vec<Figure>> {
    let mut figures = vec![fail_and_recover(
        c,
        pull,
        "SIGSTOP 4 s, SIGCONT",
        |c| c.target().signal("STOP"),
        Duration::from_secs(4),
        |c| c.target().signal("CONT"),
    )?];
    // etcd down: bytes keep moving on the connection made before.
    drop(c.etcd.take());
    let during = rounds_over(pull, Duration::from_secs(4))?;
    c.start_etcd()?;
    let after = rounds_over(pull, Duration::from_secs(4))?;
    if during == 0 || after == 0 {
        return Err(format!(
            "etcd outage: {during} rounds during, {after} after"
        ));
    }
    figures.push(Figure {
        fault: "etcd killed 4 s, restarted",
        detect_ms: None,
        failed: 0,
        resumed_ms: None,
        oks_during: during,
    });
    // A slow link: the target's egress (the data read) limited by tc tbf.
    let fast = rounds_over(pull, Duration::from_secs(3))?;
    let ns = c.net.ns(2);
    sh(&[
        "ip", "netns", "exec", &ns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate",
        "200mbit", "burst", "256kb", "latency", "100ms",
    ])?;
    let slow = rounds_over(pull, Duration::from_secs(4))?;
    sh(&[
        "ip", "netns", "exec", &ns, "tc", "qdisc", "del", "dev", "eth0", "root",
    ])?;
    println!(
        "  slow link (tbf 200 mbit): {fast} rounds of 16 MiB in 3 s before, {slow} in 4 s with it"
    );
    figures.push(Figure {
        fault: "slow link, tc tbf 200 mbit",
        detect_ms: None,
        failed: 0,
        resumed_ms: None,
        oks_during: slow,
    });
    Ok(figures)
}

/// Stops the puller, prints the table, and checks its summary: every round verified, and
/// exactly the expected transfers failed cleanly and resumed.
fn report(figures: &[Figure], pull: Proc) -> Result {
    let rest = pull.stop();
    let summary = rest
        .iter()
        .find(|l| l.starts_with("SUMMARY"))
        .cloned()
        .ok_or("the puller printed no SUMMARY")?;
    let expected_failures: usize = figures.iter().map(|f| f.failed).sum();
    println!(
        "\n| fault | time to detect | transfers failed cleanly | resumed after recovery | good rounds during |"
    );
    println!("| --- | --- | --- | --- | --- |");
    for f in figures {
        let ms = |v: Option<u128>| v.map(|v| format!("{v} ms")).unwrap_or_else(|| "-".into());
        println!(
            "| {} | {} | {} | {} | {} |",
            f.fault,
            ms(f.detect_ms),
            f.failed,
            ms(f.resumed_ms),
            f.oks_during
        );
    }
    println!("\npuller: {summary} (lease_ttl {LEASE_MS} ms; every round's checksum verified)");
    let failed_ok = summary.contains(&format!("failed={expected_failures} "))
        && summary.contains(&format!("resumed={expected_failures} "));
    if !failed_ok {
        return Err(format!(
            "expected {expected_failures} clean failures, each resumed: {summary}"
        ));
    }
    Ok(())
}
