//! The runner: describes the plugin in a child process, picks the cases that apply, runs each in a child process of its own (at most `--jobs` at once, each killed with its process group after `--timeout`), and prints one line per case, each failure with what it expected, and `N passed, M failed`.

use std::collections::VecDeque;
use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitCode, Stdio};
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};

use crate::Args;
use crate::catalogue::{self, Entry, Needs};
use crate::child::{FAILURE_BEGIN, FAILURE_END};

/// What the describe child said about the plugin.
struct Described {
    name: String,
    abi: String,
    /// The ABI minor it declares.
    minor: u32,
    communicator: bool,
    memory: bool,
    transport: u32,
    flags: u32,
}

/// How one case ended.
enum Outcome {
    Passed,
    Failed(String),
}

struct Finished {
    entry: Entry,
    outcome: Outcome,
    took: Duration,
    output: String,
}

/// Runs the kit; the exit status is 0 only when every selected case passed.
pub fn run(args: &Args) -> ExitCode {
    let plugin = args.plugin.display();
    let described = match describe(args) {
        Ok(d) => d,
        Err(e) => {
            println!("hmc-plugin-kit: {plugin}");
            println!("FAIL  abi::loads_through_the_loader");
            println!("        expected: the loader loads it");
            println!("        got:      {e}");
            println!("0 passed, 1 failed");
            return ExitCode::FAILURE;
        }
    };
    let provides = match (described.communicator, described.memory) {
        (true, true) => "a communicator and memory",
        (true, false) => "a communicator",
        _ => "memory",
    };
    println!(
        "hmc-plugin-kit: {plugin}: plugin `{}` (ABI {}; provides {provides}; transport id {})",
        described.name, described.abi, described.transport
    );
    if described.communicator && described.transport < 128 {
        println!(
            "note: transport id {} is below 128, the project's own range: take one of 128-255 \
             unless the plugin speaks that built-in transport's wire exactly (as hmc-plugin's \
             rtcp example, which exports hmc-transport-tcp, does)",
            described.transport
        );
    }
    let same_process = described.flags & hmc_plugin::abi::HMC_CAP_SAME_PROCESS_ONLY != 0;
    let applies = |e: &Entry| match e.needs {
        Needs::Nothing => true,
        Needs::Communicator | Needs::OtherProcesses => described.communicator,
        Needs::Memory => described.memory,
    };
    let (selected, skipped): (Vec<Entry>, Vec<Entry>) = catalogue::entries()
        .into_iter()
        .filter(applies)
        .filter(|e| {
            args.cases.is_empty() || args.cases.iter().any(|p| catalogue::selects(p, &e.name))
        })
        .partition(|e| {
            e.since_minor <= described.minor && !(same_process && e.needs == Needs::OtherProcesses)
        });
    if selected.is_empty() && skipped.is_empty() {
        println!(
            "no case matches {:?} for this plugin; --list shows the cases that apply",
            args.cases
        );
        return ExitCode::from(2);
    }
    if args.list {
        for e in &selected {
            println!(
                "{}\n    checks:   {}\n    expected: {}",
                e.name,
                e.about.checks,
                expected(e.about.expects)
            );
        }
        return ExitCode::SUCCESS;
    }
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get().min(4)))
        .max(1);
    println!("running {} cases, {jobs} at a time", selected.len());
    for e in &skipped {
        println!("skip  {} ({})", e.name, why_skipped(e, &described));
    }
    let finished = run_all(args, selected, jobs);
    let failed = finished
        .iter()
        .filter(|f| matches!(f.outcome, Outcome::Failed(_)))
        .count();
    let skipped = if skipped.is_empty() {
        String::new()
    } else {
        format!(", {} skipped", skipped.len())
    };
    println!(
        "{} passed, {failed} failed{skipped}",
        finished.len() - failed
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Why `e` was not run for the plugin `d` describes.
fn why_skipped(e: &Entry, d: &Described) -> String {
    if e.since_minor > d.minor {
        format!(
            "not promised by ABI {}: the plugin declares that minor, and this rule came with \
             ABI 1.{}; declare 1.{} once the plugin follows it",
            d.abi, e.since_minor, e.since_minor
        )
    } else {
        "the plugin declares HMC_CAP_SAME_PROCESS_ONLY: no peer in another process".into()
    }
}

fn describe(args: &Args) -> Result<Described, String> {
    let out = Command::new(std::env::current_exe().map_err(|e| e.to_string())?)
        .arg("--describe")
        .arg(&args.plugin)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("starting the describe process: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(' ')))
            .map(str::to_string)
    };
    if let Some(e) = field("error") {
        return Err(e);
    }
    if !out.status.success() {
        return Err(format!(
            "loading it killed the process ({}): a crash in its initialisers or \
             hmc_plugin_init",
            status_text(out.status)
        ));
    }
    let missing = || format!("the describe process printed `{text}`");
    let abi = field("abi").ok_or_else(missing)?;
    let minor = abi
        .split_once('.')
        .and_then(|(_, m)| m.parse().ok())
        .ok_or_else(missing)?;
    Ok(Described {
        name: field("name").ok_or_else(missing)?,
        abi,
        minor,
        communicator: field("communicator").is_some_and(|v| v == "true"),
        memory: field("memory").is_some_and(|v| v == "true"),
        transport: field("transport").and_then(|v| v.parse().ok()).unwrap_or(0),
        flags: field("flags").and_then(|v| v.parse().ok()).unwrap_or(0),
    })
}

fn run_all(args: &Args, selected: Vec<Entry>, jobs: usize) -> Vec<Finished> {
    let queue = Mutex::new(VecDeque::from(selected));
    let (tx, rx) = mpsc::channel::<Finished>();
    let mut finished = Vec::new();
    std::thread::scope(|s| {
        for _ in 0..jobs {
            let tx = tx.clone();
            let queue = &queue;
            s.spawn(move || {
                while let Some(entry) = queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front()
                {
                    let _ = tx.send(run_case(args, entry));
                }
            });
        }
        drop(tx);
        for f in rx {
            print_result(args, &f);
            finished.push(f);
        }
    });
    finished
}

/// A case's expected outcome in words: the catalogue says `none` for "no error".
fn expected(expects: &str) -> &str {
    if expects == "none" {
        "success (no error)"
    } else {
        expects
    }
}

fn print_result(args: &Args, f: &Finished) {
    let secs = f.took.as_secs_f64();
    match &f.outcome {
        Outcome::Passed => println!("ok    {} ({secs:.2} s)", f.entry.name),
        Outcome::Failed(why) => {
            println!("FAIL  {} ({secs:.2} s)", f.entry.name);
            println!("        checks:   {}", f.entry.about.checks);
            println!("        expected: {}", expected(f.entry.about.expects));
            let mut lines = why.lines();
            println!("        got:      {}", lines.next().unwrap_or(""));
            for l in lines {
                println!("                  {l}");
            }
            println!(
                "        rerun:    {} {} --case {}",
                std::env::current_exe()
                    .map_or("hmc-plugin-kit".into(), |p| p.display().to_string()),
                args.plugin.display(),
                f.entry.name
            );
        }
    }
    if args.verbose && !f.output.trim().is_empty() {
        for l in f.output.lines() {
            println!("        | {l}");
        }
    }
}

fn run_case(args: &Args, entry: Entry) -> Finished {
    let started = Instant::now();
    let mut cmd = Command::new(std::env::current_exe().expect("this program's path"));
    cmd.arg("--run-one").arg(&entry.name).arg(&args.plugin);
    for c in &args.config {
        cmd.arg("--config").arg(c);
    }
    for c in &args.memory_config {
        cmd.arg("--memory-config").arg(c);
    }
    // Its own process group: a peer process it started goes with it.
    cmd.process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return Finished {
                entry,
                outcome: Outcome::Failed(format!("could not start the case's process: {e}")),
                took: started.elapsed(),
                output: String::new(),
            };
        }
    };
    let pid = child.id() as i32;
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = Vec::new();
            let _ = r.read_to_end(&mut s);
            String::from_utf8_lossy(&s).into_owned()
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("piped")));
    let err = drain(Box::new(child.stderr.take().expect("piped")));
    let limit = args.case_timeout();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() >= limit => break None,
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(_) => break None,
        }
    };
    // SAFETY: kill(2) of the case's process group, which only the case's processes are in.
    unsafe { libc::kill(-pid, libc::SIGKILL) };
    let _ = child.wait();
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    let output = format!("{stdout}{stderr}");
    let outcome = match status {
        Some(s) if s.success() => Outcome::Passed,
        None => Outcome::Failed(format!(
            "did not finish in {} s (--timeout): a call into the plugin blocked, or a transfer \
             never ended{}",
            limit.as_secs(),
            failure_text(&stderr).map_or(String::new(), |t| format!("; it had reported: {t}"))
        )),
        Some(s) => Outcome::Failed(failure_text(&stderr).unwrap_or_else(|| {
            let tail: Vec<&str> = stderr.lines().rev().take(12).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            format!(
                "the case's process ended with {}{}{}",
                status_text(s),
                if s.signal().is_some() {
                    ": a crash, in the plugin or under it; rerun the case alone under gdb \
                     (gdb --args hmc-plugin-kit --run-one CASE PLUGIN)"
                } else {
                    ""
                },
                if tail.is_empty() {
                    String::new()
                } else {
                    format!("\n{}", tail.join("\n"))
                }
            )
        })),
    };
    Finished {
        entry,
        outcome,
        took: started.elapsed(),
        output,
    }
}

/// The failure block a case's panic hook wrote.
fn failure_text(stderr: &str) -> Option<String> {
    let start = stderr.find(FAILURE_BEGIN)? + FAILURE_BEGIN.len();
    let end = stderr[start..]
        .find(FAILURE_END)
        .map_or(stderr.len(), |e| start + e);
    Some(stderr[start..end].trim().to_string())
}

fn status_text(s: std::process::ExitStatus) -> String {
    match (s.code(), s.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => {
            let name = match sig {
                libc::SIGSEGV => " (SIGSEGV)",
                libc::SIGABRT => " (SIGABRT)",
                libc::SIGBUS => " (SIGBUS)",
                libc::SIGILL => " (SIGILL)",
                libc::SIGFPE => " (SIGFPE)",
                libc::SIGKILL => " (SIGKILL)",
                _ => "",
            };
            format!("signal {sig}{name}")
        }
        _ => "an unknown status".into(),
    }
}
