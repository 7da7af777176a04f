//! The demo service of the server binary: `echo` (1), `uppercase` (2) and `complex` (3).
//! The method ids and types live in [`hmc_rpc_proto::demo`] and are re-exported here.

use bytes::Bytes;

pub use hmc_rpc_proto::demo::{COMPLEX, ComplexRequest, ComplexResponse, ECHO, UPPERCASE};

use crate::dispatch::{Dispatcher, RpcError};

/// Registers the three demo methods.
pub fn register_demo(d: &mut Dispatcher) -> &mut Dispatcher {
    // Echo keeps nothing past the call, so it takes its request in place.
    d.register_raw_in_place(ECHO, |_ctx, b: Bytes| async move { Ok(b) })
        .register(UPPERCASE, |_ctx, s: String| async move {
            Ok::<_, RpcError>(s.to_uppercase())
        })
        .register(COMPLEX, |_ctx, r: ComplexRequest| async move {
            Ok::<_, RpcError>(ComplexResponse::compute(&r))
        })
}
