//! The HMC RPC measurements: pipelined echo clients (with and without a data plane) and
//! the blocking `DirectClient`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hmc_core::{Communicator, PeerAddr};
use hmc_rpc::{Client, ClientConfig, ClientDataPlane, DirectClient, NoDataPlane, demo};

use crate::measure::{Cell, cell_from};

pub(crate) async fn bench_hmc(
    addr: &PeerAddr,
    size: usize,
    clients: usize,
    depth: usize,
    secs: f64,
    stream_crc: bool,
) -> Result<Cell, String> {
    bench_hmc_dp::<NoDataPlane>(addr, size, clients, depth, secs, stream_crc, None).await
}

pub(crate) async fn bench_hmc_dp<C: Communicator>(
    addr: &PeerAddr,
    size: usize,
    clients: usize,
    depth: usize,
    secs: f64,
    stream_crc: bool,
    // The data plane, and whether request bodies are built in its request buffers.
    dp: Option<(Arc<ClientDataPlane<C>>, bool)>,
) -> Result<Cell, String> {
    let in_place = dp
        .as_ref()
        .filter(|(_, in_place)| *in_place)
        .map(|(dp, _)| dp.clone());
    let dp = dp.map(|(dp, _)| dp);
    let mut config = ClientConfig::default();
    config.conn.stream_crc = stream_crc;
    match dp {
        None => {
            let mut conns = Vec::new();
            for _ in 0..clients {
                conns.push(
                    Client::connect(addr, config.clone())
                        .await
                        .map_err(|e| e.to_string())?,
                );
            }
            bench_conns(conns, size, depth, secs, "hmc-rpc", None).await
        }
        Some(dp) => {
            let mut conns = Vec::new();
            for _ in 0..clients {
                conns.push(
                    Client::connect(addr, config.clone())
                        .await
                        .map_err(|e| e.to_string())?
                        .with_client_data_plane(dp.clone()),
                );
            }
            bench_conns(conns, size, depth, secs, "hmc-rpc-buffer", in_place).await
        }
    }
}

pub(crate) async fn bench_conns<C: Communicator>(
    conns: Vec<Client<C>>,
    size: usize,
    depth: usize,
    secs: f64,
    system: &'static str,
    in_place: Option<Arc<ClientDataPlane<C>>>,
) -> Result<Cell, String> {
    let clients = conns.len();
    let template: Arc<Vec<u8>> = Arc::new((0..size).map(|i| (i % 251) as u8).collect());
    // Warm up each connection.
    for c in &conns {
        c.call(demo::ECHO, Bytes::from(template.to_vec()))
            .await
            .map_err(|e| e.to_string())?;
    }
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for (ci, c) in conns.iter().enumerate() {
        for d in 0..depth {
            let c = c.clone();
            let template = template.clone();
            let in_place = in_place.clone();
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut n: u64 = ((ci * 1000 + d) as u64) << 32;
                while Instant::now() < end {
                    n += 1;
                    // A fresh, numbered body per call (one copy, as tonic's client makes).
                    let stamp = n.to_be_bytes();
                    let k = stamp.len().min(template.len());
                    let body = match &in_place {
                        Some(dp) => {
                            // For this connection's server: where the transport cannot
                            // rekey (`auto` over UCX), a buffer that server had is lent
                            // again instead of a fresh registration per call.
                            let mut rb = dp
                                .request_buffer_for(size, c.server_addr())
                                .map_err(|e| e.to_string())?;
                            let b = rb.as_mut_slice();
                            b.copy_from_slice(&template);
                            b[..k].copy_from_slice(&stamp[..k]);
                            rb.freeze()
                        }
                        None => {
                            let mut body = template.to_vec();
                            body[..k].copy_from_slice(&stamp[..k]);
                            Bytes::from(body)
                        }
                    };
                    let t = Instant::now();
                    let r = c
                        .call(demo::ECHO, body.clone())
                        .await
                        .map_err(|e| e.to_string())?;
                    lat.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
                    if r[..] != body[..] {
                        return Err(format!("response {n} differs from its request"));
                    }
                }
                Ok::<_, String>(lat)
            }));
        }
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.map_err(|e| e.to_string())??);
    }
    let el = start.elapsed().as_secs_f64();
    Ok(cell_from(system, size, clients, depth, all, el))
}

/// One call at a time through [`DirectClient`] (the caller's thread writes and sleeps in
/// `read`, no runtime), same numbered, verified bodies as the other hmc-rpc cells.
pub(crate) fn bench_direct(addr: &PeerAddr, size: usize, secs: f64) -> Result<Cell, String> {
    let c = DirectClient::connect(addr, ClientConfig::default()).map_err(|e| e.to_string())?;
    let template: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    c.call(demo::ECHO, template.clone())
        .map_err(|e| e.to_string())?;
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let mut lat = Vec::new();
    let mut n: u64 = 0;
    while Instant::now() < end {
        n += 1;
        let mut body = template.clone();
        let stamp = n.to_be_bytes();
        let k = stamp.len().min(size);
        body[..k].copy_from_slice(&stamp[..k]);
        let body = Bytes::from(body);
        let t = Instant::now();
        let r = c
            .call(demo::ECHO, body.clone())
            .map_err(|e| e.to_string())?;
        lat.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
        if r != body {
            return Err(format!(
                "direct client: response {n} differs from its request"
            ));
        }
    }
    Ok(cell_from(
        "hmc-rpc-direct",
        size,
        1,
        1,
        lat,
        start.elapsed().as_secs_f64(),
    ))
}
