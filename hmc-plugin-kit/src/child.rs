//! What the runner's child processes do: describe the plugin, run one case (a failure is a panic, reported to the runner between markers on stderr), or serve a region as the peer of a two-process case.

use std::io::Write;
use std::process::{Command, ExitCode};
use std::rc::Rc;
use std::sync::Arc;

use hmc_backend_cpu::HostMemory;
use hmc_core::testing::Peers;
use hmc_core::testing::cases::{self, LocalFuture, PeersFn};
use hmc_core::testing::process::PeerProcess;
use hmc_core::{Access, Communicator, Device, Region};
use hmc_plugin::{Plugin, PluginCommunicator, PluginMemory};

use crate::{Args, abi_checks};

/// Where a failing case's message starts and ends on the child's stderr.
pub const FAILURE_BEGIN: &str = "--- hmc-plugin-kit failure ---";
/// See [`FAILURE_BEGIN`].
pub const FAILURE_END: &str = "--- end of failure ---";

/// Loads the plugin and prints `KEY VALUE` lines the runner reads.
pub fn describe(args: &Args) -> ExitCode {
    match Plugin::load(&args.plugin) {
        Ok(p) => {
            println!("name {}", p.name());
            println!("abi {}.{}", p.abi().0, p.abi().1);
            println!("communicator {}", p.provides_communicator());
            println!("memory {}", p.provides_memory());
            println!("transport {}", p.transport().wire_id());
            if p.provides_communicator() {
                match abi_checks::comm_flags(&args.plugin, args) {
                    Ok(flags) => println!("flags {flags}"),
                    Err(e) => {
                        println!("error {e}");
                        return ExitCode::FAILURE;
                    }
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("error {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs case `name`; exit status 0 when it passed.
pub fn run_one(args: &Args, name: &str) -> ExitCode {
    std::panic::set_hook(Box::new(|info| {
        let payload = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("(a panic without a message)");
        let at = info
            .location()
            .map(|l| format!(" (at {}:{})", l.file(), l.line()))
            .unwrap_or_default();
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "{FAILURE_BEGIN}\n{payload}{at}\n{FAILURE_END}");
    }));
    let (group, case) = name.split_once("::").unwrap_or((name, ""));
    match group {
        "abi" | "plugin" => abi_checks::run(name, args),
        "communicator" => communicator(args, case),
        "process" => process(args, case),
        "memory" => memory(args, case),
        _ => panic!("no case named {name}; --list shows them"),
    }
    ExitCode::SUCCESS
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn plugin(args: &Args) -> Arc<Plugin> {
    Plugin::load(&args.plugin).unwrap_or_else(|e| panic!("{e}"))
}

fn communicator(args: &Args, name: &str) {
    let all = cases::communicator_cases::<PluginCommunicator, HostMemory>();
    let case = all
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no communicator case named {name}"));
    let plugin = plugin(args);
    let config = args.comm_config();
    let peers: PeersFn<PluginCommunicator, HostMemory> = Rc::new(move || {
        let open = |what: &str| {
            Arc::new(
                PluginCommunicator::open(plugin.clone(), &config)
                    .unwrap_or_else(|e| panic!("comm_open ({what}): {e}")),
            )
        };
        let p = Peers {
            a: open("initiator"),
            b: open("target"),
            memory: Arc::new(HostMemory::new()),
        };
        Box::pin(async move { p }) as LocalFuture<_>
    });
    runtime().block_on((case.run)(peers));
}

fn process(args: &Args, name: &str) {
    let all = cases::process_cases::<PluginCommunicator, HostMemory>();
    let case = all
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no process case named {name}"));
    let mut cmd = Command::new(std::env::current_exe().expect("this program's path"));
    cmd.arg("--serve-peer").arg(&args.plugin);
    for c in &args.config {
        cmd.arg("--config").arg(c);
    }
    let rt = runtime();
    let peer = PeerProcess::spawn(cmd);
    let local = Arc::new(
        PluginCommunicator::open(plugin(args), &args.comm_config())
            .unwrap_or_else(|e| panic!("comm_open: {e}")),
    );
    rt.block_on((case.run)(local, Arc::new(HostMemory::new()), peer));
}

fn memory(args: &Args, name: &str) {
    let all = cases::memory_cases::<PluginMemory>();
    let case = all
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no memory case named {name}"));
    let m = PluginMemory::open(plugin(args), &args.memory_config())
        .unwrap_or_else(|e| panic!("memory_open: {e}"));
    (case.run)(&m);
}

/// The peer of a two-process case (`hmc_core::testing::process`'s contract): registers a
/// 1 MiB region for READ and WRITE, prints `ADDRESS DESCRIPTOR_HEX`, serves until killed.
pub fn serve_peer(args: &Args) -> ExitCode {
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        eprintln!("hmc-plugin-kit peer: {what}: {e}");
        ExitCode::FAILURE
    };
    let rt = runtime();
    let _in = rt.enter();
    let plugin = match Plugin::load(&args.plugin) {
        Ok(p) => p,
        Err(e) => return fail("load", &e),
    };
    let comm = match PluginCommunicator::open(plugin, &args.comm_config()) {
        Ok(c) => c,
        Err(e) => return fail("comm_open", &e),
    };
    let memory = vec![0u8; 1 << 20].into_boxed_slice();
    let region = Region {
        device: Device::HOST,
        addr: memory.as_ptr() as u64,
        len: memory.len(),
    };
    // SAFETY: `memory` lives until the process ends, after the registration.
    let reg = match unsafe { comm.register(region, Access::READ_WRITE) } {
        Ok(r) => r,
        Err(e) => return fail("register", &e),
    };
    let hex: String = match comm.export(&reg) {
        Ok(r) => r.encode().iter().map(|b| format!("{b:02x}")).collect(),
        Err(e) => return fail("export", &e),
    };
    println!("{} {hex}", comm.address());
    let _ = std::io::stdout().flush();
    loop {
        std::thread::park();
    }
}
