//! `cargo xtask`: the workspace's build, test, demo and benchmark driver.
fn main() {}
