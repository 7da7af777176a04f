//! `hmc-plugin-kit PLUGIN.so`: the conformance kit against a plugin's shared library, through the loader every host uses, for plugin authors who write C, C++ or Rust.
//!
//! It runs every case of hmc-core's communicator and memory kits (whichever the plugin
//! provides), the two-process cases (a peer process of the same plugin SIGKILLed or
//! SIGSTOPped mid-transfer) and checks of the ABI itself (the version handshake, the
//! table size, last-error messages, address text, bounded notification queues). Each case
//! runs in a child process of its own, so a crash or a hang in the plugin is reported as
//! that case's failure, with its signal or the time it ran, and the others still run.
//! It prints one line per case, each failure with what the case expected, and
//! `N passed, M failed`; the exit status is 0 only when nothing failed.

mod abi_checks;
mod catalogue;
mod child;
mod needs;
mod runner;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

/// Command line.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "hmc-plugin-kit",
    about = "Run the HMC conformance kit against a transport or memory plugin (.so)",
    after_help = "Cases: abi::* (the ABI itself), plugin::* (plugin-only rules), communicator::* \
                  and process::* (plugins providing a communicator), memory::* (plugins \
                  providing memory). --case takes a full name, a group (`memory`) or a prefix \
                  ending in `::`. docs/backend-guide.md lists every case and its expected error."
)]
pub struct Args {
    /// The plugin's shared library.
    pub plugin: PathBuf,
    /// Run only these cases (repeatable): a full name, a group, or a prefix ending in `::`.
    #[arg(long = "case", value_name = "NAME")]
    pub cases: Vec<String>,
    /// List the cases that apply to this plugin, with what each expects, and exit.
    #[arg(long)]
    pub list: bool,
    /// A `key=value` line for every communicator the kit opens (after `bind=127.0.0.1`).
    #[arg(long = "config", value_name = "KEY=VALUE")]
    pub config: Vec<String>,
    /// A `key=value` line for the memory backend (after `ordinal=0`).
    #[arg(long = "memory-config", value_name = "KEY=VALUE")]
    pub memory_config: Vec<String>,
    /// Cases run at once, each in its own process (default: the CPUs here, at most 4).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Seconds a case may run before it is killed and reported as hung.
    #[arg(long, default_value_t = 180)]
    pub timeout: u64,
    /// Print every case's own output, not only a failure's.
    #[arg(long, short)]
    pub verbose: bool,
    /// Internal: run one case in this process (the runner's child).
    #[arg(long, hide = true, value_name = "NAME")]
    pub run_one: Option<String>,
    /// Internal: describe the plugin (the runner's first child).
    #[arg(long, hide = true)]
    pub describe: bool,
    /// Internal: serve a 1 MiB region as the peer of a two-process case.
    #[arg(long, hide = true)]
    pub serve_peer: bool,
}

impl Args {
    /// The configuration text of the kit's communicators.
    pub fn comm_config(&self) -> String {
        lines("bind=127.0.0.1", &self.config)
    }

    /// The configuration text of the kit's memory backend.
    pub fn memory_config(&self) -> String {
        lines("ordinal=0", &self.memory_config)
    }

    /// How long a case may run.
    pub fn case_timeout(&self) -> Duration {
        Duration::from_secs(self.timeout)
    }
}

fn lines(first: &str, rest: &[String]) -> String {
    let mut s = format!("{first}\n");
    for l in rest {
        s.push_str(l);
        s.push('\n');
    }
    s
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    if let Some(case) = &args.run_one {
        return child::run_one(&args, case);
    }
    if args.describe {
        return child::describe(&args);
    }
    if args.serve_peer {
        return child::serve_peer(&args);
    }
    runner::run(&args)
}
