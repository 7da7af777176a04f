//! `hmc-rpc-bench --conn-sweep` as a user runs it, kept tiny (1, 2 and 4 connections for a
//! fraction of a second each): the step table, the summary and the raw tokio echo
//! baseline (`--sweep-raw`), every step answered.

use std::process::Command;

/// The cells of a markdown table row, trimmed.
fn cells(line: &str) -> Vec<&str> {
    line.trim()
        .trim_matches('|')
        .split('|')
        .map(str::trim)
        .collect()
}

/// The rows of the first table after the heading that starts with `heading`.
fn rows<'a>(stdout: &'a str, heading: &str) -> Vec<Vec<&'a str>> {
    stdout
        .lines()
        .skip_while(|l| !l.starts_with(heading))
        .skip_while(|l| !l.starts_with("| connections |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(cells)
        .collect()
}

/// The connection counts of a table's rows, each row's rate (its second cell) checked to
/// be a positive number.
fn counts_with_rates<'a>(rows: &[Vec<&'a str>]) -> Vec<&'a str> {
    for row in rows {
        let rate: f64 = row[1].parse().expect("a rate");
        assert!(rate > 0.0, "{row:?}");
    }
    rows.iter().map(|r| r[0]).collect()
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
            "--sweep-raw",
        ])
        .output()
        .expect("running hmc-rpc-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let steps = rows(&stdout, "## connection sweep (");
    assert_eq!(counts_with_rates(&steps), ["1", "2", "4"], "{stdout}");
    for row in &steps {
        // Both processes' CPU time was read around the load: a number, not "-" (it counts
        // in 10 ms ticks, so a starved tiny step may read 0).
        let cpu: f64 = row[5].parse().expect("CPU us per call");
        assert!(cpu >= 0.0, "{row:?}");
        // The server's RSS was read before and after: a number, not "-".
        let kib: f64 = row[6].parse().expect("KiB per idle connection");
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
    // The raw baseline ran the same steps on its own echo server, verified.
    let raw = rows(&stdout, "## raw tokio TCP echo baseline");
    assert_eq!(counts_with_rates(&raw), ["1", "2", "4"], "{stdout}");
    assert_eq!(
        raw[0][4], "1.00x",
        "the first step against itself: {stdout}"
    );
}
