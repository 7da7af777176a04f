//! The `kv_peer` example as a child process: a KV cache in another process, driven by
//! commands (see the example's documentation).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// The byte at `offset` of region `layer` filled with `seed`, as `kv_peer` fills it.
pub fn pattern(seed: u64, layer: u64, offset: u64) -> u8 {
    (offset
        .wrapping_mul(2_654_435_761)
        .wrapping_add(layer.wrapping_mul(40_503))
        .wrapping_add(seed.wrapping_mul(97))
        >> 7) as u8
}

/// A running `kv_peer`.
pub struct KvPeer {
    pub child: Child,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
    /// Its engine name.
    pub name: String,
    /// Its full metadata blob, as printed at start.
    pub blob: Vec<u8>,
    /// Each layer's region address.
    pub addrs: Vec<u64>,
    pub blocks: u64,
    pub block: u64,
}

pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

impl KvPeer {
    /// Starts `kv_peer` with `layers` x `blocks` blocks of `block` bytes over `transport`,
    /// and `extra` flags.
    pub fn spawn(transport: &str, layers: u64, blocks: u64, block: u64, extra: &[&str]) -> KvPeer {
        let mut child = Command::new(super::example("kv_peer"))
            .args(["--transport", transport])
            .args(["--layers", &layers.to_string()])
            .args(["--blocks", &blocks.to_string()])
            .args(["--block", &block.to_string()])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("kv_peer example (built by `cargo test -p hmc-engine`)");
        let stdin = child.stdin.take().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let mut w = line.split_whitespace();
        assert_eq!(w.next(), Some("READY"), "{line}");
        let name = w.next().unwrap().to_string();
        let blob = unhex(w.next().unwrap());
        let addrs = w.map(|a| a.parse().unwrap()).collect();
        KvPeer {
            child,
            stdin,
            out,
            name,
            blob,
            addrs,
            blocks,
            block,
        }
    }

    /// Sends one command and returns its one-line answer.
    pub fn cmd(&mut self, c: &str) -> String {
        writeln!(self.stdin, "{c}").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        assert!(!line.is_empty(), "kv_peer ended during `{c}`");
        line.trim_end().to_string()
    }

    /// Every block's checksum, layer by layer.
    pub fn sums(&mut self) -> Vec<u64> {
        let l = self.cmd("sums");
        l.split_whitespace()
            .skip(1)
            .map(|s| s.parse().unwrap())
            .collect()
    }

    /// Stops the process (SIGSTOP) and returns once it is stopped: `kill` returns before.
    pub fn stop(&self) {
        self.signal(libc::SIGSTOP);
        let stat = format!("/proc/{}/stat", self.child.id());
        let start = std::time::Instant::now();
        loop {
            let s = std::fs::read_to_string(&stat).unwrap();
            // The state follows the parenthesised command name.
            let state = s.rsplit_once(") ").unwrap().1.chars().next().unwrap();
            if state == 'T' {
                return;
            }
            assert!(
                start.elapsed() < std::time::Duration::from_secs(5),
                "state {state}"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Sends `sig` to the process.
    pub fn signal(&self, sig: i32) {
        // SAFETY: a signal to our own child, which has not been reaped (we hold it).
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }
}

impl Drop for KvPeer {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
