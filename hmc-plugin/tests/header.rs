//! The checked-in C header: regenerated from src/abi.rs by cbindgen (the test fails on drift; `HMC_BLESS_HEADER=1` rewrites it), and compiled as C11 and C++17 with `-Wall -Werror`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn generate() -> String {
    let dir = crate_dir();
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut out = Vec::new();
    cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/abi.rs"))
        .generate()
        .expect("cbindgen generates the header from src/abi.rs")
        .write(&mut out);
    String::from_utf8(out).expect("UTF-8 header")
}

#[test]
fn header_is_generated_from_abi_rs() {
    let path = crate_dir().join("include/hmc_plugin.h");
    let fresh = generate();
    if std::env::var_os("HMC_BLESS_HEADER").is_some() {
        std::fs::write(&path, &fresh).expect("write header");
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == fresh,
        "include/hmc_plugin.h differs from what cbindgen generates from src/abi.rs; \
         regenerate it with `HMC_BLESS_HEADER=1 cargo test -p hmc-plugin --test header` \
         and commit it (an ABI change appends fields and bumps HMC_PLUGIN_ABI_MINOR)"
    );
}

fn compile(compiler: &str, std: &str, source: &Path, out: &Path) {
    let output = Command::new(compiler)
        .args([std, "-Wall", "-Wextra", "-Werror", "-pedantic", "-c"])
        .arg("-I")
        .arg(crate_dir().join("include"))
        .arg(source)
        .arg("-o")
        .arg(out)
        .output()
        .unwrap_or_else(|e| panic!("running {compiler}: {e}"));
    assert!(
        output.status.success(),
        "{compiler} {std} rejects hmc_plugin.h:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[rstest::rstest]
#[case::c11("cc", "-std=c11", "c")]
#[case::cxx17("c++", "-std=c++17", "cpp")]
fn header_compiles_without_warnings(#[case] compiler: &str, #[case] std: &str, #[case] ext: &str) {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join(format!("use.{ext}"));
    // Uses every table and the entry point's type, so a broken declaration fails here.
    std::fs::write(
        &source,
        r#"#include "hmc_plugin.h"
static int32_t fake_init(uint32_t major, uint32_t minor, const HmcHostApi *host,
                         HmcPluginApi *out, size_t out_size) {
    (void)minor; (void)host;
    if (major != HMC_PLUGIN_ABI_MAJOR || out_size < sizeof(HmcTableHeader)) return HMC_ERR_VERSION;
    out->header.struct_size = sizeof(HmcTableHeader);
    return HMC_OK;
}
int uses_everything(void);
int uses_everything(void) {
    HmcPluginInitFn init = fake_init;
    HmcPluginApi api;
    HmcCommCaps caps;
    HmcNotification n;
    HmcTransferDesc d;
    HmcRemoteDesc r;
    HmcRegion g;
    (void)caps; (void)n; (void)d; (void)r; (void)g;
    return init(HMC_PLUGIN_ABI_MAJOR, HMC_PLUGIN_ABI_MINOR, 0, &api, sizeof api) == HMC_OK
        && api.header.struct_size == sizeof(HmcTableHeader);
}
"#,
    )
    .unwrap();
    compile(compiler, std, &source, &dir.path().join("use.o"));
}
