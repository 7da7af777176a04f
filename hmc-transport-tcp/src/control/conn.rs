//! A connection's life: attaching an admitted stream as a rank's connection, its reader
//! (filing frames by kind within the queue budgets) and writer tasks, the accept loop, and
//! detaching a connection and purging what a departed rank left unreceived.

use super::hello::handshake;
use super::*;

/// Makes `stream` the connection to `rank` and starts its reader and writer. `first`, when
/// given, is written before any message (the listener's HELLO answer). Refuses a rank that
/// is already connected, atomically with the insertion.
pub(super) fn attach(
    inner: &Arc<Inner>,
    rank: Rank,
    stream: Stream,
    first: Option<Vec<u8>>,
) -> Result<()> {
    inner.state.update(|s| {
        if s.closed {
            return Err(closed());
        }
        if s.peers.contains_key(&rank) {
            return Err(Error::peer(
                format!("rank {rank}"),
                "is already connected; the existing connection is kept",
            ));
        }
        let conn_id = inner.next_conn.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(inner.config.max_send_queue.max(1));
        let (r, w) = tokio::io::split(stream);
        let writer = tokio::spawn(write_loop(inner.clone(), rank, conn_id, w, rx, first));
        let reader = tokio::spawn(read_loop(inner.clone(), rank, conn_id, r));
        s.gone.remove(&rank);
        s.peers.insert(
            rank,
            PeerConn {
                conn_id,
                tx,
                tasks: vec![writer.abort_handle(), reader.abort_handle()],
            },
        );
        Ok(())
    })
}

/// Forgets connection `conn_id` to `rank` (if it is still the current one), records why,
/// and schedules the drop of its unreceived messages.
pub(super) fn detach(inner: &Arc<Inner>, rank: Rank, conn_id: u64, why: String) {
    let left = inner.state.update(|s| {
        if s.peers.get(&rank).is_some_and(|p| p.conn_id == conn_id) {
            let p = s.peers.remove(&rank).expect("checked");
            // Aborting the writer drops the frames queued for the rank.
            p.tasks.iter().for_each(AbortHandle::abort);
            tracing::info!(rank = inner.rank, peer = rank, %why, "control-plane peer left");
            s.record_departure(rank, why, inner.config.max_peers);
            Some(s.departures[&rank])
        } else {
            None
        }
    });
    if let Some(generation) = left {
        schedule_purge(inner, rank, generation);
    }
}

/// Drops the unreceived messages of `rank`, which left (departure `generation`), after
/// `departed_retention`, unless it has come back or left again since.
pub(super) fn schedule_purge(inner: &Arc<Inner>, rank: Rank, generation: u64) {
    let retention = inner.config.departed_retention;
    let purge = move |inner: &Inner| {
        inner.state.update(|s| {
            if s.peers.contains_key(&rank) || s.departures.get(&rank) != Some(&generation) {
                return;
            }
            let (messages, bytes) = s.purge(rank);
            if messages > 0 {
                tracing::info!(
                    rank = inner.rank,
                    peer = rank,
                    messages,
                    bytes,
                    ?retention,
                    "dropped unreceived messages of a departed rank (departed_retention)"
                );
            }
        });
    };
    if retention.is_zero() {
        purge(inner);
    } else {
        let weak = Arc::downgrade(inner);
        tokio::spawn(async move {
            tokio::time::sleep(retention).await;
            if let Some(inner) = weak.upgrade() {
                purge(&inner);
            }
        });
    }
}

pub(super) async fn write_loop(
    inner: Arc<Inner>,
    rank: Rank,
    conn_id: u64,
    mut w: WriteHalf<Stream>,
    mut rx: mpsc::Receiver<Vec<u8>>,
    first: Option<Vec<u8>>,
) {
    let result = async {
        if let Some(bytes) = first {
            w.write_all(&bytes).await?;
        }
        while let Some(frame) = rx.recv().await {
            w.write_all(&frame).await?;
        }
        w.shutdown().await
    }
    .await;
    if let Err(e) = result {
        detach(&inner, rank, conn_id, format!("send failed: {e}"));
    }
}

pub(super) async fn read_loop(
    inner: Arc<Inner>,
    rank: Rank,
    conn_id: u64,
    mut r: ReadHalf<Stream>,
) {
    let config = &inner.config;
    let max_frame = config.max_frame_len;
    let max_queued = config.max_queued_per_peer.max(1);
    let mut warned_kinds = HashSet::new();
    let why = loop {
        let mut len = [0u8; 4];
        if let Err(e) = r.read_exact(&mut len).await {
            break if crate::net::is_disconnect(&e) {
                "the peer closed the connection".to_string()
            } else {
                format!("receive failed: {e}")
            };
        }
        let len = u32::from_be_bytes(len) as usize;
        if len < 2 || len - 2 > max_frame {
            tracing::warn!(
                rank = inner.rank,
                peer = rank,
                len,
                max_frame,
                "control-plane peer sent an oversized or empty frame; disconnecting it"
            );
            break format!(
                "protocol violation: a frame of {len} bytes is outside 2..={} \
                 (max_frame_len {max_frame}); both peers must use the same max_frame_len",
                max_frame + 2
            );
        }
        // Backpressure: read the body only once it fits the receive budgets.
        let body = len - 2;
        let mut warned = false;
        let room = inner
            .state
            .wait(
                Deadline::after(FOREVER),
                "control-plane backpressure",
                |s| {
                    let q = s.queued.get(&rank).copied().unwrap_or_default();
                    let peer_fits = q.messages < max_queued
                        && (q.bytes == 0 || q.bytes + body <= config.max_queued_bytes_per_peer);
                    let total_fits =
                        s.queued_bytes == 0 || s.queued_bytes + body <= config.max_queued_bytes;
                    if !total_fits && peer_fits && !warned {
                        warned = true;
                        tracing::warn!(
                            rank = inner.rank,
                            peer = rank,
                            queued_bytes = s.queued_bytes,
                            max_queued_bytes = config.max_queued_bytes,
                            "control-plane receive budget full (max_queued_bytes): not reading \
                             this peer until the application receives; raise \
                             ControlPlaneConfig::max_queued_bytes if this is expected"
                        );
                    }
                    (s.closed || (peer_fits && total_fits)).then_some(Ok(()))
                },
            )
            .await;
        if room.is_err() {
            break "the receive queue stayed full".to_string();
        }
        let mut frame = vec![0u8; len];
        if let Err(e) = r.read_exact(&mut frame).await {
            break format!("receive failed mid-frame: {e}");
        }
        let kind = u16::from_be_bytes([frame[0], frame[1]]);
        frame.drain(..2);
        let kept = inner.state.update(|s| {
            if !s.kinds.contains(&kind) {
                s.dropped_unknown_kind += 1;
                return false;
            }
            let q = s.queued.entry(rank).or_default();
            q.messages += 1;
            q.bytes += frame.len();
            s.queued_bytes += frame.len();
            s.inbox.entry((rank, kind)).or_default().push_back(frame);
            true
        });
        if !kept && warned_kinds.len() < 64 && warned_kinds.insert(kind) {
            tracing::warn!(
                rank = inner.rank,
                peer = rank,
                kind,
                "dropping control-plane messages of a kind nobody receives (register it with \
                 ControlPlane::register_kind); further ones of this kind from this peer are \
                 dropped silently"
            );
        }
    };
    detach(&inner, rank, conn_id, why);
}

pub(super) async fn accept_loop(inner: Arc<Inner>, listener: Listener) {
    loop {
        match listener.accept().await {
            Ok(stream) => {
                tokio::spawn(handshake(inner.clone(), stream));
            }
            Err(e) => {
                // Out of file descriptors and the like: keep serving, but do not spin.
                tracing::warn!(rank = inner.rank, error = %e, "control-plane accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
