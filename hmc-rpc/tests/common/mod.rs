//! What the in-process runtime tests share: the test service's methods, the data-plane
//! fixtures (communicators, payloads, clients) and hand-written frames. (The helpers that
//! run the real binaries live with them, in `hmc-rpc-tools/tests/common`.)

// Each test binary uses part of this module.
#![allow(dead_code)]

pub mod data_plane;
pub mod frames;
pub mod methods;
