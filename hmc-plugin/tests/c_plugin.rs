//! The example C plugin (examples-plugins/loopmem, compiled here) through the loader: the hmc-core communicator conformance kit, and the refusal of deliberately broken variants, each with a clear error.

mod common;

use std::sync::Arc;
use std::time::Duration;

use hmc_backend_cpu::HostMemory;
use hmc_core::testing::Peers;
use hmc_core::{Communicator, ConnBuffer, Deadline, Error, MemSpan, MemSpanMut, Op, TransferDesc};
use hmc_plugin::abi::{HMC_PLUGIN_ABI_MAJOR, HMC_PLUGIN_ABI_MINOR};
use hmc_plugin::{Plugin, PluginCommunicator};
use hmc_testshim::pair::{buffers, reach};

mod kit {
    use super::*;

    async fn peers() -> Option<Peers<PluginCommunicator, HostMemory>> {
        Some(Peers {
            a: common::open_loopmem(),
            b: common::open_loopmem(),
            memory: Arc::new(HostMemory::new()),
        })
    }

    hmc_core::communicator_conformance!(peers);
}

#[test]
fn the_plugin_reports_its_name_abi_and_transport_id() {
    let p = common::loopmem();
    assert_eq!(p.name(), "loopmem");
    // Built against the header of this ABI version.
    assert_eq!(p.abi(), (HMC_PLUGIN_ABI_MAJOR, HMC_PLUGIN_ABI_MINOR));
    assert_eq!(p.transport().wire_id(), 200);
    let c = common::open_loopmem();
    assert!(
        c.address().to_string().starts_with("unix://"),
        "{}",
        c.address()
    );
    let caps = c.capabilities();
    assert_eq!(caps.max_batch_len, 4096);
    assert!(caps.notifications);
}

fn load_error(name: &str, defines: &[&str]) -> String {
    let path = common::build_c_plugin(name, defines);
    Plugin::load(&path)
        .expect_err("a broken plugin must be refused")
        .to_string()
}

#[rstest::rstest]
#[case::wrong_struct_size("broken-size", "BROKEN_STRUCT_SIZE", &["struct_size is 40 bytes", "ABI 1.0 needs at least"])]
#[case::null_table("broken-null", "BROKEN_NULL_TABLE", &["filled nothing (struct_size 0)"])]
#[case::failing_init("broken-init", "BROKEN_INIT_FAILS", &["hmc_plugin_init failed with -15 (HMC_ERR_UNAVAILABLE)", "its device is missing"])]
#[case::other_major("broken-major", "BROKEN_MAJOR", &["built for HMC plugin ABI 2.", "this host speaks 1.", "rebuild the plugin"])]
#[case::missing_function("broken-fn", "BROKEN_MISSING_FUNCTION", &["required functions are NULL: transfer_poll"])]
fn broken_plugins_are_refused_with_a_clear_error(
    #[case] name: &str,
    #[case] define: &str,
    #[case] wanted: &[&str],
) {
    let e = load_error(name, &[define]);
    assert!(e.contains(&format!("lib{name}.so")), "names the file: {e}");
    for w in wanted {
        assert!(e.contains(w), "`{w}` missing from: {e}");
    }
}

#[test]
fn a_file_that_is_not_a_plugin_is_refused_and_listed() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("libjunk.so");
    std::fs::write(&junk, b"not an ELF file").unwrap();
    let good = common::build_c_plugin("loopmem", &[]);
    let broken = common::build_c_plugin("broken-init", &["BROKEN_INIT_FAILS"]);
    std::fs::copy(&good, dir.path().join("libloopmem.so")).unwrap();
    std::fs::copy(&broken, dir.path().join("libbroken-init.so")).unwrap();
    let mut d = hmc_plugin::Discovery::search(&hmc_plugin::PluginConfig {
        search_path: vec![dir.path().to_path_buf(), good.clone()],
    });
    // The folder's files wait to be asked for by name; the named file is loaded.
    assert_eq!(d.unloaded.len(), 3, "{}", d.report());
    d.load_all();
    let report = d.report();
    assert_eq!(d.found.len(), 4, "{report}");
    assert_eq!(d.loaded.len(), 1, "{report}");
    assert!(report.contains("loaded  loopmem"), "{report}");
    assert!(report.contains("libjunk.so: cannot be loaded"), "{report}");
    assert!(report.contains("its device is missing"), "{report}");
    // The same name again further down the path: refused as a duplicate, naming the first.
    assert!(
        report.contains("a plugin named `loopmem` was already loaded from"),
        "{report}"
    );
}

/// A folder on the search path: only the file named after the plugin asked for is
/// loaded. Beside it lies a library whose constructor aborts the process: were it loaded,
/// this test would not finish.
#[test]
fn a_folders_plugins_are_loaded_by_name_only() {
    let dir = tempfile::tempdir().unwrap();
    let boom = dir.path().join("boom.c");
    std::fs::write(
        &boom,
        "#include <stdlib.h>\n__attribute__((constructor)) static void boom(void) { abort(); }\n",
    )
    .unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = std::process::Command::new(&cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(dir.path().join("libboom.so"))
        .arg(&boom)
        .status()
        .unwrap();
    assert!(built.success());
    std::fs::copy(
        common::build_c_plugin("loopmem", &[]),
        dir.path().join("libloopmem.so"),
    )
    .unwrap();
    std::fs::write(dir.path().join("libmislabelled.so"), b"").unwrap();
    let registry = hmc_plugin::TransportRegistry::discover(&hmc_plugin::PluginConfig {
        search_path: vec![dir.path().to_path_buf()],
    });
    let names = registry.names();
    assert!(
        names.contains(&"boom".to_string()) && names.contains(&"loopmem".to_string()),
        "{names:?}"
    );
    let report = registry.report();
    assert!(report.contains("waiting boom"), "{report}");
    let comm = registry
        .open(
            "loopmem",
            &hmc_plugin::OpenOptions::new([127, 0, 0, 1].into()),
        )
        .expect("loopmem by name");
    drop(comm);
    let d = registry.discovery();
    assert_eq!(d.loaded.len(), 1, "{}", d.report());
    assert!(d.rejected.is_empty(), "{}", d.report());
    assert!(
        d.unloaded.iter().any(|(n, _)| n == "boom"),
        "{}",
        d.report()
    );
}

/// A plugin whose dependency is missing is refused with dlerror()'s text (the library it
/// needs) and the command that lists what is missing.
#[test]
fn a_missing_dependency_is_named_with_dlerror_and_ldd() {
    let dir = tempfile::tempdir().unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let src = dir.path().join("dep.c");
    std::fs::write(&src, "int hmc_test_dep(void) { return 1; }\n").unwrap();
    let ok = std::process::Command::new(&cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(dir.path().join("libhmcdep.so"))
        .arg(&src)
        .status()
        .unwrap();
    assert!(ok.success());
    let user = dir.path().join("user.c");
    std::fs::write(
        &user,
        "int hmc_test_dep(void);\nint hmc_plugin_init(void) { return hmc_test_dep(); }\n",
    )
    .unwrap();
    let ok = std::process::Command::new(&cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(dir.path().join("libneedsdep.so"))
        .arg(&user)
        .arg("-L")
        .arg(dir.path())
        .arg("-lhmcdep")
        .status()
        .unwrap();
    assert!(ok.success());
    std::fs::remove_file(dir.path().join("libhmcdep.so")).unwrap();
    let e = Plugin::load(&dir.path().join("libneedsdep.so"))
        .expect_err("its dependency is gone")
        .to_string();
    assert!(
        e.contains("libhmcdep.so: cannot open shared object file"),
        "{e}"
    );
    assert!(e.contains("ldd -r "), "{e}");
}

/// A folder's file must hold the plugin its name promises.
#[test]
fn a_folder_file_named_for_another_plugin_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        common::build_c_plugin("loopmem", &[]),
        dir.path().join("libother.so"),
    )
    .unwrap();
    let mut d = hmc_plugin::Discovery::search(&hmc_plugin::PluginConfig {
        search_path: vec![dir.path().to_path_buf()],
    });
    assert!(d.load("other").is_none());
    let report = d.report();
    assert!(
        report.contains("named for plugin `other` but holds plugin `loopmem`")
            && report.contains("rename it libloopmem.so"),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_without_a_message_is_named_as_such() {
    let path = common::build_c_plugin("broken-nomsg", &["BROKEN_NO_MESSAGE"]);
    let p = Plugin::load(&path).unwrap();
    let c = PluginCommunicator::open(p, "bind=127.0.0.1\n").unwrap();
    let e = c
        .connect(
            &"unix:///nonexistent.sock".parse().unwrap(),
            Deadline::default(),
        )
        .await
        .expect_err("no such peer");
    assert!(matches!(e, Error::Peer { .. }), "{e:?}");
    let s = e.to_string();
    assert!(
        s.contains("connect returned -7 (HMC_ERR_PEER) without a message")
            && s.contains("must set its last-error string"),
        "{s}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_the_plugin_never_completes_ends_at_its_deadline() {
    let path = common::build_c_plugin("broken-hang", &["BROKEN_NEVER_COMPLETES"]);
    let p = Plugin::load(&path).unwrap();
    let a = Arc::new(PluginCommunicator::open(p.clone(), "").unwrap());
    let b = Arc::new(PluginCommunicator::open(p, "").unwrap());
    let (target, local) = buffers(&Arc::new(HostMemory::new()), &a, &b, 4096);
    let (ep, key) = reach(&a, &b, &target).await;
    let d = [TransferDesc::<PluginCommunicator> {
        local: hmc_core::ConnBuffer::registration(&local),
        local_offset: 0,
        remote: &key,
        remote_offset: 0,
        len: 4096,
    }];
    let start = std::time::Instant::now();
    let e = a
        .transfer(
            &ep,
            Op::Write,
            &d,
            Deadline::after(Duration::from_millis(200)),
        )
        .await
        .expect_err("never completes");
    assert!(
        matches!(e, Error::DeadlineExceeded { during, .. } if during.contains("did not end by its deadline")),
        "{e:?}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_batch_is_refused_naming_the_declared_limit() {
    let a = common::open_loopmem();
    let b = common::open_loopmem();
    let (target, local) = buffers(&Arc::new(HostMemory::new()), &a, &b, 64);
    let (ep, key) = reach(&a, &b, &target).await;
    let one = TransferDesc::<PluginCommunicator> {
        local: hmc_core::ConnBuffer::registration(&local),
        local_offset: 0,
        remote: &key,
        remote_offset: 0,
        len: 1,
    };
    let batch = vec![one; 4097];
    let e = a
        .transfer(&ep, Op::Write, &batch, Deadline::default())
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::LimitExceeded {
                limit: "max_batch_len",
                value: 4097,
                max: 4096,
                ..
            }
        ),
        "{e:?}"
    );
}

/// Outside any runtime the host watches the plugin's eventfd from a thread of its own:
/// a plain executor drives transfers, notifications and deadlines.
#[test]
fn a_host_without_tokio_moves_bytes_and_meets_deadlines() {
    let a = common::open_loopmem();
    let b = common::open_loopmem();
    let (target, local) = buffers(&Arc::new(HostMemory::new()), &a, &b, 1 << 20);
    hmc_core::ConnBuffer::write_at(&local, 0, &hmc_core::MemSpan::host(&vec![9u8; 1 << 20]))
        .unwrap();
    futures::executor::block_on(async {
        let (ep, key) = reach(&a, &b, &target).await;
        let d = [TransferDesc::<PluginCommunicator> {
            local: hmc_core::ConnBuffer::registration(&local),
            local_offset: 0,
            remote: &key,
            remote_offset: 0,
            len: 1 << 20,
        }];
        a.transfer(&ep, Op::Write, &d, Deadline::default())
            .await
            .unwrap();
        a.notify(&ep, 5, b"done", Deadline::default())
            .await
            .unwrap();
        let n = b.recv_notification(Deadline::default()).await.unwrap();
        assert_eq!((n.tag, n.msg.as_slice()), (5, &b"done"[..]));
        let start = std::time::Instant::now();
        let e = b
            .recv_notification(Deadline::after(Duration::from_millis(100)))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::DeadlineExceeded { .. }), "{e:?}");
        assert!(start.elapsed() < Duration::from_secs(3));
    });
    let mut back = vec![0u8; 1 << 20];
    hmc_core::ConnBuffer::read_at(&target, 0, &mut hmc_core::MemSpanMut::host(&mut back)).unwrap();
    assert!(back.iter().all(|b| *b == 9));
}

/// The C plugin's memory backend through the loader: the hmc-core memory kit.
mod memory_kit {
    hmc_core::memory_conformance!(Some(
        hmc_plugin::PluginMemory::open(crate::common::loopmem(), "ordinal=3\n")
            .expect("open loopmem memory")
    ));
}

#[test]
fn the_memory_backend_reports_its_device_and_refuses_foreign_copies() {
    use hmc_core::{Device, DeviceKind, MemSpan, MemSpanMut, Memory};
    let m = hmc_plugin::PluginMemory::open(common::loopmem(), "ordinal=3\n").unwrap();
    assert_eq!(m.device(), Device::new(DeviceKind::from_wire_id(200), 3));
    assert_eq!(m.max_alloc(), 1 << 30);
    let mut buf = m.alloc(16).unwrap();
    let other = m.alloc(16).unwrap();
    // A span labelled with another ordinal of the same kind is refused by the host check.
    let foreign = hmc_core::Region {
        device: Device::new(DeviceKind::from_wire_id(200), 4),
        ..hmc_core::DeviceBuffer::region(&other)
    };
    // SAFETY: the span is never dereferenced: the copy is refused before any byte moves.
    let src = unsafe { MemSpan::from_region(foreign) };
    let e = m.copy(&mut MemSpanMut::of(&mut buf), &src).unwrap_err();
    assert!(matches!(e, Error::Unsupported(_)), "{e:?}");
    // A communicator-only request of a memory-capable plugin still works, and the report
    // says what it provides.
    let d = hmc_plugin::Discovery::search(&hmc_plugin::PluginConfig {
        search_path: vec![common::build_c_plugin("loopmem", &[])],
    });
    assert!(
        d.report().contains("communicator and memory"),
        "{}",
        d.report()
    );
}

/// A plugin anyone but root or this user could have changed is refused before it is
/// opened (OpenSSH's StrictModes rule), naming the file and the reason; its constructors
/// never run. So is a plugin named like a built-in transport.
#[rstest::rstest]
#[case::group_writable_file(0o664, 0o755, None, "writable by its group")]
#[case::world_writable_file(0o646, 0o755, None, "writable by others")]
#[case::world_writable_folder(0o644, 0o777, None, "its folder")]
#[case::owned_by_another_user(0o644, 0o755, Some(65534), "owned by uid 65534")]
fn plugins_others_could_change_are_refused_unopened(
    #[case] file_mode: u32,
    #[case] dir_mode: u32,
    #[case] owner: Option<u32>,
    #[case] wanted: &str,
) {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if owner.is_some() && euid != 0 {
        eprintln!("skipped: needs root to give a file to another user");
        return;
    }
    // One case at a time: the constructor reads one process-wide variable.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("plugins");
    std::fs::create_dir(&folder).unwrap();
    let built = common::build_c_plugin("marked", &["TEST_CONSTRUCTOR_MARK"]);
    let file = folder.join("libmarked.so");
    std::fs::copy(&built, &file).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(file_mode)).unwrap();
    std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(dir_mode)).unwrap();
    if let Some(uid) = owner {
        std::os::unix::fs::chown(&file, Some(uid), Some(uid)).unwrap();
    }
    let mark = dir.path().join("constructor-ran");
    // SAFETY: no other thread of this binary reads or writes this variable (only these
    // cases, one at a time, and the plugin's constructor on this thread).
    unsafe { std::env::set_var("HMC_TEST_CONSTRUCTOR_MARK", &mark) };
    let mut d = hmc_plugin::Discovery::search(&hmc_plugin::PluginConfig {
        search_path: vec![folder.clone()],
    });
    // The listing (`--list-transports`) already says refused, and why: the rule needs no
    // load, so the file is not shown as waiting to be loaded.
    let listed = d.report();
    assert!(
        !listed.contains("waiting") && listed.contains("refused") && listed.contains(wanted),
        "{listed}"
    );
    assert!(d.load("marked").is_none(), "{}", d.report());
    assert!(d.loaded.is_empty(), "{}", d.report());
    let report = d.report();
    assert!(
        report.contains("libmarked.so: not loaded") && report.contains(wanted),
        "{report}"
    );
    assert!(!mark.exists(), "the refused plugin's constructor ran");
    // The same file, made safe, loads (and its constructor runs then).
    std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o755)).unwrap();
    if owner.is_some() {
        std::os::unix::fs::chown(&file, Some(0), Some(0)).unwrap();
    }
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).unwrap();
    let fresh = folder.join(format!("libmarked-{}.so", wanted.len()));
    std::fs::rename(&file, &fresh).unwrap();
    Plugin::load(&fresh).unwrap();
    assert!(mark.exists(), "a loaded plugin's constructor runs");
    std::fs::remove_file(&mark).unwrap();
}

#[test]
fn a_plugin_named_like_a_built_in_transport_is_refused() {
    for name in ["tcp", "shm"] {
        let e = load_error(name, &[]);
        assert!(
            e.contains(&format!("named `{name}`, the name of a built-in transport")),
            "{e}"
        );
    }
}

/// Plugins of older minors still load and move bytes; `settle` answers `Ok` for one that
/// declares ABI 1.3 (loopmem copies in the process, so a transfer's end is final by
/// itself), and `Unsupported`, naming the declared minor, for one that declares 1.1 or 1.2,
/// which never promised that no byte of a WRITE lands at the target after its end.
#[rstest::rstest]
#[case::abi_1_1("old-1-1", Some("DECLARE_ABI_MINOR=1"), 1)]
#[case::abi_1_2("old-1-2", Some("DECLARE_ABI_MINOR=2"), 2)]
#[case::abi_1_3("loopmem", None, 3)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn older_minors_load_and_settle_says_what_they_promised(
    #[case] name: &str,
    #[case] define: Option<&str>,
    #[case] minor: u32,
) {
    let path = common::build_c_plugin(name, define.as_slice());
    let p = Plugin::load(&path).unwrap_or_else(|e| panic!("a 1.{minor} plugin must load: {e}"));
    assert_eq!(p.abi(), (HMC_PLUGIN_ABI_MAJOR, minor));
    let a = Arc::new(PluginCommunicator::open(p.clone(), "").unwrap());
    let b = Arc::new(PluginCommunicator::open(p, "").unwrap());
    let (target, local) = buffers(&Arc::new(HostMemory::new()), &a, &b, 4096);
    local.write_at(0, &MemSpan::host(&[7u8; 4096])).unwrap();
    let (ep, key) = reach(&a, &b, &target).await;
    let d = [TransferDesc::new(local.registration(), 0, &key, 0, 4096)];
    a.transfer(&ep, Op::Write, &d, Deadline::default())
        .await
        .unwrap();
    let mut got = vec![0u8; 4096];
    target.read_at(0, &mut MemSpanMut::host(&mut got)).unwrap();
    assert!(got.iter().all(|b| *b == 7));
    let settled = a.settle(&ep, Deadline::default()).await;
    match (minor, settled) {
        (3, Ok(())) => {}
        (1 | 2, Err(Error::Unsupported(msg))) => {
            assert!(msg.contains(&format!("ABI 1.{minor}")), "{msg}");
            assert!(msg.contains("rebuild the plugin against ABI 1.3"), "{msg}");
        }
        (_, other) => panic!("settle of a 1.{minor} plugin: {other:?}"),
    }
}
