//! Mooncake Transfer Engine beside the engine bench: its target process and an initiator
//! process driven one timed loop at a time (`mooncake_peer.py steps`), so that each cell's
//! rounds alternate between hmc-engine, Mooncake and the TCP floor. The host moves this
//! VM's vCPUs between placements within seconds; rounds taken side by side see the same
//! placement, where one system's whole pass after another's may not.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// The two Mooncake processes, both alive for the whole bench (idle between steps).
pub struct Mooncake {
    target: Child,
    initiator: Child,
    to: Option<ChildStdin>,
    from: BufReader<ChildStdout>,
}

fn script() -> &'static str {
    concat!(env!("CARGO_MANIFEST_DIR"), "/benches/mooncake_peer.py")
}

impl Mooncake {
    /// Starts Mooncake's target (a buffer of `len` bytes) and a stepped initiator that has
    /// already moved one op of each size each way (the handshake and warm-up).
    pub fn start(py: &str, sizes: &[usize], len: usize) -> Result<Mooncake, String> {
        let mut target = Command::new(py)
            .args([script(), "target", &len.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting {py}: {e}"))?;
        let mut line = String::new();
        BufReader::new(target.stdout.take().unwrap())
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() != 3 || f[0] != "READY" {
            let _ = target.kill();
            let _ = target.wait();
            return Err(format!("the Mooncake target said `{}`", line.trim()));
        }
        let sizes_s: Vec<String> = sizes.iter().map(|s| s.to_string()).collect();
        let mut initiator = match Command::new(py)
            .args([script(), "steps", f[1], f[2], &sizes_s.join(",")])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                let _ = target.kill();
                let _ = target.wait();
                return Err(format!("starting the Mooncake initiator: {e}"));
            }
        };
        let mut me = Mooncake {
            to: initiator.stdin.take(),
            from: BufReader::new(initiator.stdout.take().unwrap()),
            target,
            initiator,
        };
        let ready = me.line()?;
        if ready.trim() != "READY" {
            return Err(format!("the Mooncake initiator said `{}`", ready.trim()));
        }
        Ok(me)
    }

    /// The process ids of its target and its initiator (for their CPU time).
    pub fn pids(&self) -> [u32; 2] {
        [self.target.id(), self.initiator.id()]
    }

    fn line(&mut self) -> Result<String, String> {
        let mut line = String::new();
        match self.from.read_line(&mut line) {
            Ok(0) => Err("the Mooncake initiator exited (a transfer failed?)".into()),
            Ok(_) => Ok(line),
            Err(e) => Err(e.to_string()),
        }
    }

    /// One timed loop of sync `write` (else read) ops of `size` bytes for `secs`:
    /// (ops, seconds). The initiator moves one op of warm-up before the loop (the CPU of a
    /// step covers `ops + 1` ops).
    pub fn step(&mut self, write: bool, size: usize, secs: f64) -> Result<(u64, f64), String> {
        let op = if write { "write" } else { "read" };
        let to = self.to.as_mut().ok_or("the Mooncake initiator is closed")?;
        writeln!(to, "{op} {size} {secs}")
            .and_then(|_| to.flush())
            .map_err(|e| format!("the Mooncake initiator: {e}"))?;
        let l = self.line()?;
        // {"system": "mooncake", "op": "write", "size": 4096, "ops": 12500, "secs": 1.0}
        let field = |k: &str| -> Option<&str> {
            let at = l.find(&format!("\"{k}\": "))? + k.len() + 4;
            let rest = &l[at..];
            let end = rest.find([',', '}']).unwrap_or(rest.len());
            Some(rest[..end].trim())
        };
        match (
            field("ops").and_then(|v| v.parse().ok()),
            field("secs").and_then(|v| v.parse().ok()),
        ) {
            (Some(ops), Some(s)) => Ok((ops, s)),
            _ => Err(format!("the Mooncake initiator printed `{}`", l.trim())),
        }
    }
}

impl Drop for Mooncake {
    fn drop(&mut self) {
        drop(self.to.take()); // the initiator ends at the end of its input
        let _ = self.initiator.wait();
        let _ = self.target.kill();
        let _ = self.target.wait();
    }
}
