//! iperf3 on loopback as a bench's reference: one TCP stream, or one each way at once
//! (`--bidir`, the shape of an echo: as many bytes back as out), its rate over the bytes
//! its server received and the CPU time of its two processes ([`crate::cpu`]: both are
//! this process's children, reaped before the reading, so `RUSAGE_CHILDREN` holds them).
//!
//! ```no_run
//! use hmc_bench_kit::iperf3::{self, Direction};
//! let r = iperf3::run(3, Direction::Both).expect("iperf3 installed");
//! println!("{:.2} GB/s moved, {:?} CPU-s/GiB", r.gbs, r.cpu_s_per_gib);
//! ```

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::cpu::{self, Process, ProcessCpu};

/// Which way the bytes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Client to server (iperf3's default).
    One,
    /// Both ways at once on two streams (`--bidir`): what an echo moves.
    Both,
}

/// One iperf3 run's figures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Iperf {
    /// Bytes received, every direction, per second of the run, in GB (10^9).
    pub gbs: f64,
    /// Bytes received, every direction.
    pub bytes: u64,
    /// CPU-seconds per GiB received of client and server together (`None` where the
    /// children's accounting could not be read).
    pub cpu_s_per_gib: Option<f64>,
}

/// iperf3 on loopback for `secs` seconds (up to three tries), or why there is none.
pub fn run(secs: u32, direction: Direction) -> Result<Iperf, String> {
    let mut why = String::new();
    for _attempt in 0..3 {
        match run_once(secs, direction) {
            Ok(r) => return Ok(r),
            Err(e) => why = e,
        }
    }
    Err(why)
}

/// Kills and reaps the one-off server when dropped.
struct Reaper(Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn run_once(secs: u32, direction: Direction) -> Result<Iperf, String> {
    let cpu = ProcessCpu::start(&[Process::WaitedChildren]);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port()
        .to_string();
    let server = Command::new("iperf3")
        .args(["-s", "-1", "-p", &port])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(Reaper)
        .map_err(|e| {
            format!("iperf3 not runnable ({e}); install it with apt-get install iperf3")
        })?;
    // The one-off server must not see a probe connection, so give it time to listen.
    std::thread::sleep(Duration::from_millis(300));
    let mut client = Command::new("iperf3");
    client.args([
        "-c",
        "127.0.0.1",
        "-p",
        &port,
        "-t",
        &secs.to_string(),
        "-J",
    ]);
    if direction == Direction::Both {
        client.arg("--bidir");
    }
    let out = client.output().map_err(|e| e.to_string())?;
    drop(server);
    let used = cpu.used();
    let text = String::from_utf8_lossy(&out.stdout);
    let parsed = if out.status.success() {
        received(&text, direction)
    } else {
        None
    };
    let (bytes, seconds) = parsed.ok_or_else(|| {
        format!(
            "iperf3 gave no result (exit {}): {}",
            out.status,
            text.chars().take(300).collect::<String>()
        )
    })?;
    Ok(Iperf {
        gbs: bytes as f64 / seconds.max(f64::MIN_POSITIVE) / 1e9,
        bytes,
        cpu_s_per_gib: used.and_then(|u| cpu::cpu_s_per_gib(u, bytes)),
    })
}

/// Bytes received and the run's seconds from iperf3's `-J` output: `end.sum_received`, plus
/// `end.sum_received_bidir_reverse` for [`Direction::Both`] (`None` when one is missing).
fn received(json: &str, direction: Direction) -> Option<(u64, f64)> {
    // Only the `end` object has these sums (the intervals' are `sum` and
    // `sum_bidir_reverse`).
    let field = |sum: &str, name: &str| {
        let after = json.split(&format!("\"{sum}\":")).nth(1)?;
        let obj = &after[..after.find('}')?];
        obj.split(&format!("\"{name}\":"))
            .nth(1)?
            .split([',', '}'])
            .next()?
            .trim()
            .parse::<f64>()
            .ok()
    };
    let mut bytes = field("sum_received", "bytes")?;
    let seconds = field("sum_received", "seconds")?;
    if direction == Direction::Both {
        bytes += field("sum_received_bidir_reverse", "bytes")?;
    }
    Some((bytes as u64, seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape of iperf3 3.12's `-J --bidir` output, trimmed to what is read (every sum
    /// has an `end` key, as the top level's object).
    const BIDIR: &str = r#"{"start":{},"intervals":[{"sum":{"bytes":1,"seconds":1.0},"sum_bidir_reverse":{"bytes":2}}],
"end":{"streams":[],"sum_sent":{"start":0,"end":2.0,"seconds":2.0,"bytes":900,"bits_per_second":3600},
"sum_received":{"start":0,"end":2.0,"seconds":2.0,"bytes":800,"bits_per_second":3200},
"sum_sent_bidir_reverse":{"start":0,"seconds":2.0,"bytes":700},
"sum_received_bidir_reverse":{"start":0,"seconds":2.0,"bytes":600,"bits_per_second":2400,"end":2.0},
"cpu_utilization_percent":{"host_total":45.0}}}"#;

    #[test]
    fn both_directions_add_the_reverse_stream_received_bytes() {
        assert_eq!(received(BIDIR, Direction::Both), Some((1400, 2.0)));
        assert_eq!(received(BIDIR, Direction::One), Some((800, 2.0)));
    }

    #[test]
    fn output_without_the_sums_is_no_result() {
        assert_eq!(
            received(r#"{"error":"unable to connect"}"#, Direction::One),
            None
        );
        let one_way = BIDIR.replace("sum_received_bidir_reverse", "x");
        assert_eq!(received(&one_way, Direction::Both), None);
        assert_eq!(received(&one_way, Direction::One), Some((800, 2.0)));
    }

    #[test]
    #[ignore = "runs iperf3 for a second (apt-get install iperf3)"]
    fn a_loopback_run_moves_bytes_both_ways() {
        let one = run(1, Direction::One).expect("iperf3 installed");
        let both = run(1, Direction::Both).expect("iperf3 installed");
        assert!(one.gbs > 0.0 && both.gbs > 0.0);
        assert!(both.cpu_s_per_gib.is_some_and(|c| c > 0.0), "{both:?}");
    }
}
