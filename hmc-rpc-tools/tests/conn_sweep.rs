//! `hmc-rpc-bench --conn-sweep` as a user runs it, kept tiny (1, 2 and 4 connections for a
//! fraction of a second each): the step table and the summary, every step answered.

use std::process::Command;

/// The cells of a markdown table row, trimmed.
fn cells(line: &str) -> Vec<&str> {
    line.trim()
        .trim_matches('|')
        .split('|')
        .map(str::trim)
        .collect()
}

#[test]
fn a_tiny_connection_sweep_reports_each_step_and_the_memory_per_connection() {
    let out = Command::new(env!("CARGO_BIN_EXE_hmc-rpc-bench"))
        .args([
            "--conn-sweep",
            "1,2,4",
            "--seconds",
            "0.2",
            "--server-workers",
            "1",
        ])
        .output()
        .expect("running hmc-rpc-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let steps: Vec<Vec<&str>> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("## connection sweep ("))
        .skip_while(|l| !l.starts_with("| connections |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(cells)
        .collect();
    let conns: Vec<&str> = steps.iter().map(|r| r[0]).collect();
    assert_eq!(conns, ["1", "2", "4"], "{stdout}");
    for row in &steps {
        let rps: f64 = row[1].parse().expect("RPC/s");
        assert!(rps > 0.0, "{row:?}");
        // The server's RSS was read before and after: a number, not "-".
        let kib: f64 = row[5].parse().expect("KiB per idle connection");
        assert!(kib >= 0.0, "{row:?}");
    }
    // Shares are of the fastest step, which shows 100%.
    assert!(steps.iter().any(|r| r[4] == "100%"), "{stdout}");
    let summary = stdout
        .lines()
        .skip_while(|l| !l.starts_with("## connection sweep summary"))
        .find(|l| l.starts_with("| ") && !l.starts_with("| peak") && !l.starts_with("| ---"))
        .map(cells)
        .expect("a summary row");
    assert_eq!(summary[5], "4", "most connections: {summary:?}");
    assert_eq!(summary[6], "every listed step ran");
    // No 1,024-connection step in this sweep: no ratio claimed.
    assert_eq!(summary[2], "-");
}
