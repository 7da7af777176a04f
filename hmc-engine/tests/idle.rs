//! An idle engine costs no CPU: two engines with a shared secret, over each transport an
//! engine opens by name, connected to each other with memory registered, use (almost) no
//! CPU while nothing moves. Alone in its test binary, so that the process's CPU time is
//! theirs.

mod common;

use std::time::Duration;

use common::{engine_from, register_as};
use hmc_engine::Access;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_engines_use_no_cpu() {
    let dir = tempfile_dir();
    let secret = dir.join("secret");
    std::fs::write(&secret, "an-idle-test-secret-0123").unwrap();
    let mut engines = Vec::new();
    let mem = vec![0u8; 1 << 16];
    for transport in ["tcp", "shm", "auto"] {
        let o = [
            ("transport", transport),
            ("auth_secret_file", secret.to_str().unwrap()),
        ];
        let (a, b) = (engine_from(&o).await, engine_from(&o).await);
        // `mem` outlives the engines (dropped after them, at the end).
        register_as(&b, &mem, Access::READ);
        a.connect(b.name(), Duration::from_secs(10)).await.unwrap();
        engines.push((a, b));
    }
    // Let connection set-up settle, then measure two idle seconds.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (before, _) = hmc_bench_kit::sweep::proc_cpu_us(None).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (after, _) = hmc_bench_kit::sweep::proc_cpu_us(None).unwrap();
    let used_ms = (after - before) / 1000.0;
    // Ticks are 10 ms; a few are the runtime's and the kernel's own bookkeeping.
    assert!(
        used_ms <= 60.0,
        "six idle engines used {used_ms} ms of CPU in 2 s"
    );
    drop(engines);
    drop(mem);
}

fn tempfile_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("hmc-idle-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
