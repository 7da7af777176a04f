//! The benchmark report: every bench `cargo xtask bench` runs leaves its rows as JSON in
//! `target/bench-report/data/<bench>.json`, and `--report` (or `cargo xtask report`, from
//! the JSON alone) renders `target/bench-report/index.html` with SVG figures of each
//! benchmark against its peers and the issues' targets.
//!
//! The benches print markdown tables (what docs/benchmarks.md quotes); the [`Recorder`]
//! runs each one with its standard output captured and forwarded, and keeps every table as
//! a [`Table`]: its title (the heading above it), columns, the cells as printed and the
//! number each cell starts with ([`cell_value`]). So one schema covers the Rust benches, the
//! RPC bench binary and the Python bench alike, and nothing is lost that the terminal
//! showed. Long runs show a spinner with the bench's latest line (`indicatif`, on stderr;
//! hidden when stderr is not a terminal or `CI` is set).

mod figures;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, IsTerminal};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::Result;

/// The version of the JSON layout below; bumped when a field changes meaning.
pub const SCHEMA: u32 = 1;

/// One bench's results: `target/bench-report/data/<bench>.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchRecord {
    /// [`SCHEMA`] at the time of writing.
    pub schema: u32,
    /// The name `cargo xtask bench` knows it by (`rpc`, `transfer`, …).
    pub bench: String,
    /// Every command the bench ran, in order.
    pub runs: Vec<Run>,
}

/// One benchmark command and what it printed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Run {
    /// The command line, with the environment variables the bench set before it.
    pub command: String,
    /// Start, seconds since the Unix epoch (UTC).
    pub started_unix_s: u64,
    pub wall_s: f64,
    /// CPUs of the machine, and its 1-minute load average before and after the run (the
    /// machine is often shared: a figure taken under load says so here).
    pub cpus: usize,
    pub load_before: Option<f64>,
    pub load_after: Option<f64>,
    /// Whether the command exited successfully.
    pub ok: bool,
    pub tables: Vec<Table>,
    /// Lines of text outside the tables (reference figures such as iperf3's, notes).
    pub notes: Vec<String>,
}

/// A markdown table a bench printed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Table {
    /// The heading (or the line of text) above the table.
    pub title: String,
    pub columns: Vec<String>,
    /// Cells as printed (ratios, sizes with their unit, `-` for none).
    pub rows: Vec<Vec<String>>,
    /// [`cell_value`] of each cell: the number it starts with, sizes in bytes.
    pub values: Vec<Vec<Option<f64>>>,
}

impl Table {
    /// The index of the column named `name` (exactly, else the first that starts with it).
    pub fn column(&self, name: &str) -> Option<usize> {
        self.columns
            .iter()
            .position(|c| c == name)
            .or_else(|| self.columns.iter().position(|c| c.starts_with(name)))
    }
}

/// The number a cell starts with, whatever follows it (a ratio's `x`, a `%`, a range in
/// parentheses); sizes in `KiB`/`MiB`/`GiB` as bytes; `None` for `-` or a word (the
/// test below lists the cases).
pub fn cell_value(cell: &str) -> Option<f64> {
    let s = cell.trim().replace('*', "");
    let end = s
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_digit() || c == '.' || (i == 0 && c == '-')))
        .map_or(s.len(), |(i, _)| i);
    let n: f64 = s[..end].parse().ok()?;
    let unit = s[end..].trim_start();
    let scale = match unit.split_whitespace().next() {
        Some("KiB") => 1024.0,
        Some("MiB") => 1024.0 * 1024.0,
        Some("GiB") => 1024.0 * 1024.0 * 1024.0,
        _ => 1.0,
    };
    Some(n * scale)
}

fn table_row(line: &str) -> Option<Vec<String>> {
    let t = line.trim();
    let inner = t.strip_prefix('|')?.strip_suffix('|')?;
    Some(inner.split('|').map(|c| c.trim().to_string()).collect())
}

fn is_separator(row: &[String]) -> bool {
    !row.is_empty()
        && row
            .iter()
            .all(|c| !c.is_empty() && c.chars().all(|ch| matches!(ch, '-' | ':' | ' ')))
}

/// The markdown tables in a bench's output, and its other non-empty lines.
pub fn parse_output(text: &str) -> (Vec<Table>, Vec<String>) {
    let lines: Vec<&str> = text.lines().collect();
    let (mut tables, mut notes) = (Vec::new(), Vec::new());
    let mut title = String::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim();
        let header = table_row(line);
        let sep = lines.get(i + 1).and_then(|l| table_row(l));
        if let (Some(columns), Some(sep)) = (header, sep)
            && is_separator(&sep)
        {
            i += 2;
            let mut rows = Vec::new();
            while let Some(row) = lines.get(i).and_then(|l| table_row(l)) {
                rows.push(row);
                i += 1;
            }
            let values = rows
                .iter()
                .map(|r: &Vec<String>| r.iter().map(|c| cell_value(c)).collect())
                .collect();
            tables.push(Table {
                title: std::mem::take(&mut title),
                columns,
                rows,
                values,
            });
            continue;
        }
        if let Some(h) = line.strip_prefix('#') {
            title = h.trim_start_matches('#').trim().to_string();
        } else if !line.is_empty() {
            if title.is_empty() {
                title = line.to_string();
            }
            notes.push(line.to_string());
        }
        i += 1;
    }
    (tables, notes)
}

/// Where the report lives: `target/bench-report`.
pub fn report_dir() -> PathBuf {
    crate::root().join("target/bench-report")
}

fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Runs the benches of one `cargo xtask bench` invocation, records what they print and
/// shows progress.
pub struct Recorder {
    dir: PathBuf,
    records: BTreeMap<String, BenchRecord>,
    progress: ProgressBar,
    steps: usize,
}

impl Recorder {
    /// Records into `dir/data` (the report directory).
    pub fn new(dir: PathBuf) -> Self {
        let hidden = std::env::var_os("CI").is_some() || !std::io::stderr().is_terminal();
        let progress = if hidden {
            ProgressBar::hidden()
        } else {
            let p = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            p.set_style(
                ProgressStyle::with_template("{spinner} {elapsed_precise} {prefix}: {wide_msg}")
                    .expect("a valid template"),
            );
            p.enable_steady_tick(Duration::from_millis(200));
            p
        };
        Recorder {
            dir,
            records: BTreeMap::new(),
            progress,
            steps: 0,
        }
    }

    /// Runs a command that is not a benchmark (a build), the progress line out of its way.
    pub fn build(&self, cmd: &mut Command) -> Result {
        self.build_with(|| crate::run(cmd))
    }

    /// Runs `f` (steps that print, such as installs) with the progress line out of its way.
    pub fn build_with<T>(&self, f: impl FnOnce() -> T) -> T {
        self.progress.suspend(f)
    }

    /// Runs benchmark `cmd` of `bench`, forwarding its output, and records its tables in
    /// `data/<bench>.json` (replacing what an earlier invocation recorded for that bench).
    pub fn run(&mut self, bench: &str, cmd: &mut Command) -> Result {
        self.steps += 1;
        self.progress
            .set_prefix(format!("bench {bench} (command {})", self.steps));
        let command = describe(cmd);
        self.progress
            .suspend(|| eprintln!("xtask: running {command}"));
        let (started, t) = (SystemTime::now(), Instant::now());
        let load_before = load_average();
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("could not start {command}: {e}"))?;
        let (out, err) = (child.stdout.take(), child.stderr.take());
        let progress = self.progress.clone();
        let stderr = std::thread::spawn(move || {
            for line in BufReader::new(err.expect("piped"))
                .lines()
                .map_while(|l| l.ok())
            {
                progress.set_message(line.clone());
                progress.suspend(|| eprintln!("{line}"));
            }
        });
        let mut text = String::new();
        for line in BufReader::new(out.expect("piped"))
            .lines()
            .map_while(|l| l.ok())
        {
            self.progress.suspend(|| println!("{line}"));
            text.push_str(&line);
            text.push('\n');
        }
        let _ = stderr.join();
        let status = child
            .wait()
            .map_err(|e| format!("waiting for {command}: {e}"))?;
        let (tables, notes) = parse_output(&text);
        let run = Run {
            command: command.clone(),
            started_unix_s: started
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            wall_s: t.elapsed().as_secs_f64(),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            load_before,
            load_after: load_average(),
            ok: status.success(),
            tables,
            notes,
        };
        let record = self
            .records
            .entry(bench.to_string())
            .or_insert_with(|| BenchRecord {
                schema: SCHEMA,
                bench: bench.to_string(),
                runs: Vec::new(),
            });
        record.runs.push(run);
        save(&self.dir, record)?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("{command} failed with {status}"))
        }
    }

    /// Stops the progress line.
    pub fn finish(&self) {
        self.progress.finish_and_clear();
    }
}

/// A command as a user would type it: the variables set on it, the program, its arguments.
fn describe(cmd: &Command) -> String {
    let mut parts: Vec<String> = cmd
        .get_envs()
        .filter_map(|(k, v)| Some(format!("{}={}", k.to_str()?, v?.to_str()?)))
        .collect();
    let program = cmd.get_program().to_string_lossy();
    let root = crate::root();
    let program = Path::new(&*program)
        .strip_prefix(&root)
        .map_or(program.to_string(), |p| p.display().to_string());
    parts.push(program);
    parts.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    parts.join(" ")
}

/// Writes `record` as `dir/data/<bench>.json`.
pub fn save(dir: &Path, record: &BenchRecord) -> Result {
    let data = dir.join("data");
    std::fs::create_dir_all(&data).map_err(|e| format!("creating {}: {e}", data.display()))?;
    let path = data.join(format!("{}.json", record.bench));
    let json = serde_json::to_string_pretty(record).map_err(|e| e.to_string())?;
    std::fs::write(&path, json).map_err(|e| format!("writing {}: {e}", path.display()))
}

/// Every record in `dir/data`, by bench name.
pub fn load(dir: &Path) -> Result<Vec<BenchRecord>> {
    let data = dir.join("data");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&data)
        .map_err(|e| {
            format!(
                "no recorded benchmarks in {} ({e}); run `cargo xtask bench <name>` first",
                data.display()
            )
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| {
            let text =
                std::fs::read_to_string(p).map_err(|e| format!("reading {}: {e}", p.display()))?;
            let record: BenchRecord = serde_json::from_str(&text)
                .map_err(|e| format!("{} is not a bench record: {e}", p.display()))?;
            if record.schema != SCHEMA {
                return Err(format!(
                    "{} has schema {} (this xtask reads {SCHEMA}); rerun its bench",
                    p.display(),
                    record.schema
                ));
            }
            Ok(record)
        })
        .collect()
}

/// `cargo xtask report [--record NAME -- COMMAND…] [--copy-figures DIR]`: renders the
/// report from the recorded JSON. `--record` first runs COMMAND (a bench binary with
/// flags of one's own, e.g. a short connection sweep) and appends its tables to bench
/// NAME's record; `--copy-figures` also copies the SVG figures and the page to `DIR` (e.g.
/// docs/report).
pub fn command(args: &[String]) -> Result {
    let dir = report_dir();
    let (args, command) = match args.iter().position(|a| a == "--") {
        Some(i) => (&args[..i], &args[i + 1..]),
        None => (args, &[][..]),
    };
    if let Some(name) = args
        .iter()
        .position(|a| a == "--record")
        .and_then(|i| args.get(i + 1))
    {
        let (program, rest) = command
            .split_first()
            .ok_or("--record NAME needs the command after `--`")?;
        let mut rec = Recorder::new(dir.clone());
        let recorded = load(&dir).unwrap_or_default();
        if let Some(old) = recorded.into_iter().find(|r| &r.bench == name) {
            rec.records.insert(name.clone(), old);
        }
        let mut cmd = Command::new(program);
        cmd.args(rest).current_dir(crate::root());
        let ran = rec.run(name, &mut cmd);
        rec.finish();
        ran?;
    }
    let index = render(&dir)?;
    eprintln!("xtask: report written to {}", index.display());
    if let Some(to) = args
        .iter()
        .position(|a| a == "--copy-figures")
        .and_then(|i| args.get(i + 1))
    {
        let to = crate::root().join(to);
        copy_figures(&dir, &to)?;
        eprintln!("xtask: figures and the page copied to {}", to.display());
    }
    Ok(())
}

/// Copies the figures of the report in `dir` into `to`, beside the page (`to/index.html`,
/// its figures' paths made relative to `to`), leaving other files in `to` alone.
pub fn copy_figures(dir: &Path, to: &Path) -> Result {
    std::fs::create_dir_all(to).map_err(|e| format!("creating {}: {e}", to.display()))?;
    let figures = dir.join("figures");
    for e in std::fs::read_dir(&figures)
        .map_err(|e| format!("reading {}: {e}", figures.display()))?
        .filter_map(|e| e.ok())
    {
        let dest = to.join(e.file_name());
        std::fs::copy(e.path(), &dest)
            .map_err(|err| format!("copying to {}: {err}", dest.display()))?;
    }
    let page = std::fs::read_to_string(dir.join("index.html"))
        .map_err(|e| format!("reading {}: {e}", dir.join("index.html").display()))?;
    let dest = to.join("index.html");
    std::fs::write(&dest, page.replace("src=\"figures/", "src=\""))
        .map_err(|e| format!("writing {}: {e}", dest.display()))
}

/// Renders `dir/index.html` and `dir/figures/*.svg` from `dir/data/*.json`; the page's path.
pub fn render(dir: &Path) -> Result<PathBuf> {
    let records = load(dir)?;
    let figures_dir = dir.join("figures");
    let _ = std::fs::remove_dir_all(&figures_dir);
    std::fs::create_dir_all(&figures_dir)
        .map_err(|e| format!("creating {}: {e}", figures_dir.display()))?;
    let mut html = String::from(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>HMC benchmark report</title><style>\
         body{font-family:sans-serif;max-width:1100px;margin:auto;padding:1em}\
         table{border-collapse:collapse;font-size:13px;margin:0.5em 0 1.5em}\
         td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}\
         th{background:#eee}img{max-width:100%;display:block;margin:1em 0}\
         .meta{color:#555;font-size:13px}</style></head><body>\n\
         <h1>HMC benchmark report</h1>\n<p>Each figure puts a benchmark beside its peer \
         (tonic, iperf3, ucx_perftest, Mooncake, memcpy) from the same run, with the issue's \
         target as a red line or marks. Figures move with the machine's load: each run lists \
         its load average; compare within a figure, not across runs.</p>\n",
    );
    // The page lists every bench and its figures first, then each bench's runs.
    let mut contents = String::from("<ul>\n");
    let mut body = String::new();
    for record in &records {
        let mut titles = Vec::new();
        let html = &mut body;
        html.push_str(&format!("<h2 id=\"{0}\">{0}</h2>\n", escape(&record.bench)));
        for (ri, run) in record.runs.iter().enumerate() {
            html.push_str(&format!(
                "<p class=\"meta\"><code>{}</code><br>{:.0} s from {}{}</p>\n",
                escape(&run.command),
                run.wall_s,
                escape(&run_caption(run)),
                if run.ok {
                    ""
                } else {
                    " — the command failed"
                }
            ));
            for (ti, table) in run.tables.iter().enumerate() {
                for plot in figures::plots_for(&record.bench, run, table) {
                    let name = format!("{}-{ri}-{ti}-{}.svg", record.bench, plot.id);
                    let svg = figures::render_svg(&plot, &run_caption(run))?;
                    let path = figures_dir.join(&name);
                    std::fs::write(&path, svg)
                        .map_err(|e| format!("writing {}: {e}", path.display()))?;
                    html.push_str(&format!(
                        "<img src=\"figures/{name}\" alt=\"{}\">\n",
                        escape(&plot.title)
                    ));
                    titles.push(plot.title);
                }
                html.push_str(&table_html(table));
            }
        }
        contents.push_str(&format!(
            "<li><a href=\"#{0}\">{0}</a>: {1}</li>\n",
            escape(&record.bench),
            if titles.is_empty() {
                "no figure (no table of this bench has one)".to_string()
            } else {
                escape(&titles.join("; "))
            }
        ));
    }
    contents.push_str("</ul>\n");
    html.push_str(&contents);
    html.push_str(&body);
    html.push_str("</body></html>\n");
    let index = dir.join("index.html");
    std::fs::write(&index, html).map_err(|e| format!("writing {}: {e}", index.display()))?;
    Ok(index)
}

/// The line under every figure: when, and how loaded the machine was.
fn run_caption(run: &Run) -> String {
    let loaded = run
        .load_before
        .into_iter()
        .chain(run.load_after)
        .any(|l| l > run.cpus as f64);
    format!(
        "{} UTC, {} CPUs, load average {} to {}{}",
        utc(run.started_unix_s),
        run.cpus,
        run.load_before.map_or("?".into(), |l| format!("{l:.1}")),
        run.load_after.map_or("?".into(), |l| format!("{l:.1}")),
        if loaded {
            ": more runnable work than CPUs (a shared, loaded machine); compare within the figure"
        } else {
            ""
        }
    )
}

fn table_html(t: &Table) -> String {
    let mut h = format!("<h3>{}</h3>\n<table><tr>", escape(&t.title));
    for c in &t.columns {
        h.push_str(&format!("<th>{}</th>", escape(c)));
    }
    h.push_str("</tr>\n");
    for r in &t.rows {
        h.push_str("<tr>");
        for c in r {
            h.push_str(&format!("<td>{}</td>", escape(c)));
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</table>\n");
    h
}

/// Text made safe for HTML and SVG.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// `YYYY-MM-DD HH:MM` of a Unix time (UTC), without a date crate.
pub fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let (h, m) = ((secs % 86_400) / 3600, (secs % 3600) / 60);
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    format!("{y:04}-{mo:02}-{d:02} {h:02}:{m:02}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    pub(super) const RPC_OUTPUT: &str = "\
## hmc-rpc echo vs tonic (same run)

| payload | clients | in flight | hmc RPC/s | tonic RPC/s | RPC/s ratio |
| --- | --- | --- | --- | --- | --- |
| 64 B | 1 | 1 | 20000 | 9000 | 2.22x |
| 64 B | 8 | 8 | 400000 | 50000 | 8.00x |
| 4 KiB | 8 | 8 | 200000 | - | - |

host c2c ns: a note
";

    /// Every bench's output in the layout it prints (`report/fixtures/`).
    pub(super) const FIXTURES: &[(&str, &str)] = &[
        ("transfer", include_str!("report/fixtures/transfer.md")),
        ("ucx", include_str!("report/fixtures/ucx.md")),
        ("shm", include_str!("report/fixtures/shm.md")),
        ("rdma", include_str!("report/fixtures/rdma.md")),
        ("plugin", include_str!("report/fixtures/plugin.md")),
        ("python", include_str!("report/fixtures/python.md")),
        ("engine", include_str!("report/fixtures/engine.md")),
    ];

    #[rstest]
    #[case("8.79x", Some(8.79))]
    #[case("55%", Some(55.0))]
    #[case("12.3 (10–14)", Some(12.3))]
    #[case("4 KiB", Some(4096.0))]
    #[case("1 MiB", Some(1_048_576.0))]
    #[case("64 B", Some(64.0))]
    #[case("-1.5", Some(-1.5))]
    #[case("-", None)]
    #[case("Write", None)]
    fn cells_read_as_the_number_they_start_with(#[case] cell: &str, #[case] v: Option<f64>) {
        assert_eq!(cell_value(cell), v);
    }

    #[test]
    fn markdown_tables_are_parsed_with_their_heading_and_notes() {
        let (tables, notes) = parse_output(RPC_OUTPUT);
        assert_eq!(tables.len(), 1);
        let t = &tables[0];
        assert_eq!(t.title, "hmc-rpc echo vs tonic (same run)");
        assert_eq!(t.columns[3], "hmc RPC/s");
        assert_eq!(t.rows.len(), 3);
        assert_eq!(t.rows[1][5], "8.00x");
        assert_eq!(t.values[1][5], Some(8.0));
        assert_eq!(t.values[2][4], None);
        assert_eq!(t.column("tonic"), Some(4));
        assert_eq!(notes, ["host c2c ns: a note"]);
    }

    #[test]
    fn a_table_without_a_heading_takes_the_line_above_as_its_title() {
        let (tables, notes) =
            parse_output("iperf3: 3.0 GB/s\n\n| size | GB/s |\n| ---: | ---: |\n| 4 KiB | 1.5 |\n");
        assert_eq!(tables[0].title, "iperf3: 3.0 GB/s");
        assert_eq!(tables[0].values, [[Some(4096.0), Some(1.5)]]);
        assert_eq!(notes, ["iperf3: 3.0 GB/s"]);
    }

    fn record() -> BenchRecord {
        let (tables, notes) = parse_output(RPC_OUTPUT);
        BenchRecord {
            schema: SCHEMA,
            bench: "rpc".into(),
            runs: vec![Run {
                command: "UCX_TLS=tcp target/release/hmc-rpc-bench --seconds 0.5".into(),
                started_unix_s: 1_796_162_400,
                wall_s: 12.5,
                cpus: 2,
                load_before: Some(3.5),
                load_after: None,
                ok: true,
                tables,
                notes,
            }],
        }
    }

    #[test]
    fn a_record_round_trips_through_its_json_file() {
        let dir = tempfile::tempdir().unwrap();
        let rec = record();
        save(dir.path(), &rec).unwrap();
        let text = std::fs::read_to_string(dir.path().join("data/rpc.json")).unwrap();
        // The layout other tools read: named fields, cells as printed, values as numbers.
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["schema"], SCHEMA);
        assert_eq!(v["runs"][0]["tables"][0]["rows"][1][3], "400000");
        assert_eq!(v["runs"][0]["tables"][0]["values"][1][3], 400000.0);
        assert!(v["runs"][0]["tables"][0]["values"][2][4].is_null());
        assert_eq!(load(dir.path()).unwrap(), vec![rec]);
    }

    #[test]
    fn a_record_of_another_schema_is_refused_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let mut rec = record();
        rec.schema = SCHEMA + 1;
        save(dir.path(), &rec).unwrap();
        let err = load(dir.path()).unwrap_err();
        assert!(err.contains("rerun its bench"), "{err}");
        let empty = tempfile::tempdir().unwrap();
        assert!(
            load(empty.path())
                .unwrap_err()
                .contains("cargo xtask bench")
        );
    }

    #[test]
    fn the_report_renders_from_recorded_json_alone() {
        let dir = tempfile::tempdir().unwrap();
        save(dir.path(), &record()).unwrap();
        let index = render(dir.path()).unwrap();
        let html = std::fs::read_to_string(index).unwrap();
        let svgs: Vec<String> = std::fs::read_dir(dir.path().join("figures"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(!svgs.is_empty());
        for name in &svgs {
            assert!(html.contains(&format!("src=\"figures/{name}\"")), "{name}");
        }
        // The tables are in the page, escaped.
        assert!(html.contains("<td>8.00x</td>"));
        assert!(html.contains("UCX_TLS=tcp target/release/hmc-rpc-bench"));
        assert!(html.contains("12 s from 2026-12-01 22:00 UTC, 2 CPUs, load average 3.5 to ?"));
        assert!(html.contains("a shared, loaded machine"));
    }

    #[test]
    fn every_bench_round_trips_and_the_page_lists_each_with_its_figures() {
        let dir = tempfile::tempdir().unwrap();
        let mut records = vec![record()];
        for (bench, text) in FIXTURES {
            let mut rec = record();
            rec.bench = bench.to_string();
            (rec.runs[0].tables, rec.runs[0].notes) = parse_output(text);
            records.push(rec);
        }
        for rec in &records {
            save(dir.path(), rec).unwrap();
        }
        let mut loaded = load(dir.path()).unwrap();
        loaded.sort_by(|a, b| a.bench.cmp(&b.bench));
        records.sort_by(|a, b| a.bench.cmp(&b.bench));
        assert_eq!(loaded, records);
        let html = std::fs::read_to_string(render(dir.path()).unwrap()).unwrap();
        let contents = &html[..html.find("<h2").expect("a section per bench")];
        for rec in &records {
            let b = &rec.bench;
            assert!(
                contents.contains(&format!("<li><a href=\"#{b}\">{b}</a>: ")),
                "{b}"
            );
            assert!(html.contains(&format!("<h2 id=\"{b}\">")), "{b}");
            let svgs: Vec<String> = std::fs::read_dir(dir.path().join("figures"))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&format!("{b}-0-")))
                .collect();
            assert!(!svgs.is_empty(), "no figure of {b}");
            for name in svgs {
                assert!(html.contains(&format!("src=\"figures/{name}\"")), "{name}");
            }
        }
        // The contents name each figure by its title.
        assert!(contents.contains("One-sided TCP transfers (target in another process) vs iperf3"));
    }

    #[test]
    fn copied_figures_sit_beside_a_page_that_finds_them() {
        let dir = tempfile::tempdir().unwrap();
        save(dir.path(), &record()).unwrap();
        render(dir.path()).unwrap();
        let to = tempfile::tempdir().unwrap();
        std::fs::write(to.path().join("README.md"), "kept").unwrap();
        copy_figures(dir.path(), to.path()).unwrap();
        let page = std::fs::read_to_string(to.path().join("index.html")).unwrap();
        assert!(!page.contains("figures/"));
        let mut srcs = 0;
        for src in page.split("src=\"").skip(1) {
            let name = &src[..src.find('"').unwrap()];
            assert!(to.path().join(name).is_file(), "{name}");
            srcs += 1;
        }
        assert!(srcs > 0);
        assert_eq!(
            std::fs::read_to_string(to.path().join("README.md")).unwrap(),
            "kept"
        );
    }

    #[test]
    fn a_caption_says_when_the_machine_was_loaded() {
        let mut run = record().runs.remove(0);
        assert!(run_caption(&run).contains("a shared, loaded machine"));
        run.load_before = Some(0.5);
        assert!(
            !run_caption(&run).contains("loaded"),
            "{}",
            run_caption(&run)
        );
    }

    #[test]
    fn utc_dates_are_civil_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00");
        assert_eq!(utc(1_796_162_400 + 3_660), "2026-12-01 23:01");
    }

    #[test]
    fn a_recorded_command_keeps_its_tables_and_its_exit_status() {
        let dir = tempfile::tempdir().unwrap();
        let mut rec = Recorder::new(dir.path().to_path_buf());
        let mut ok = Command::new("sh");
        ok.args([
            "-c",
            "echo '## t'; echo '| a | b |'; echo '| - | - |'; echo '| 1 | 2 |'",
        ]);
        rec.run("tiny", &mut ok).unwrap();
        let mut bad = Command::new("sh");
        bad.args(["-c", "echo oops >&2; exit 3"]);
        assert!(rec.run("tiny", &mut bad).is_err());
        rec.finish();
        let got = load(dir.path()).unwrap();
        let runs = &got[0].runs;
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0].tables[0].rows, [["1", "2"]]);
        assert!(runs[0].ok && !runs[1].ok);
        assert!(runs[1].command.starts_with("sh -c"), "{}", runs[1].command);
    }
}
