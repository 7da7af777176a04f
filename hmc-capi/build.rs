//! Link arguments of `libhmc.so`: its SONAME carries the API's major version, and the
//! version script exports only the `hmc_*` functions (the Rust runtime's symbols stay
//! local), as a C library's users expect.

fn main() {
    let map = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("hmc.map");
    println!("cargo:rerun-if-changed={}", map.display());
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libhmc.so.0");
        println!(
            "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
            map.display()
        );
    }
}
