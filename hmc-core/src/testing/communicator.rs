//! Conformance checks for `Communicator` implementations; each takes fresh `Peers`.

use super::*;

const DEADLINE: Duration = Duration::from_secs(20);

fn deadline() -> Deadline {
    Deadline::after(DEADLINE)
}

type Buf<C, M> = RegisteredBuffer<M, C>;

fn buffer<C: Communicator, M: Memory>(
    p: &Peers<C, M>,
    side: &Arc<C>,
    len: usize,
    access: Access,
    seed: u64,
) -> (Buf<C, M>, Vec<u8>) {
    let buf = RegisteredBuffer::new(p.memory.clone(), side.clone(), len, access)
        .expect("register buffer");
    let bytes = pattern(seed, len);
    buf.write_at(0, &MemSpan::host(&bytes))
        .expect("fill buffer");
    (buf, bytes)
}

fn contents<C: Communicator, M: Memory>(buf: &Buf<C, M>) -> Vec<u8> {
    let mut out = vec![0u8; buf.len()];
    buf.read_at(0, &mut MemSpanMut::host(&mut out))
        .expect("read buffer");
    out
}

fn desc<'a, C: Communicator>(
    local: &'a C::Registration,
    local_offset: usize,
    remote: &'a C::RemoteKey,
    remote_offset: u64,
    len: usize,
) -> TransferDesc<'a, C> {
    TransferDesc::new(local, local_offset, remote, remote_offset, len)
}

async fn connect<C: Communicator, M: Memory>(p: &Peers<C, M>) -> C::Endpoint {
    p.a.connect(&p.b.address(), deadline())
        .await
        .expect("connect a -> b")
}

/// One WRITE then one READ of `len` bytes at odd offsets; the target sees the written
/// bytes the moment WRITE completes, and bytes outside the range keep their values.
pub async fn single_round_trip<C: Communicator, M: Memory>(
    p: Peers<C, M>,
    len: usize,
    offset: usize,
) {
    let ep = connect(&p).await;
    let total = len + offset + 32;
    let (target, before) = buffer(&p, &p.b, total, Access::READ_WRITE, 11);
    let key =
        p.a.import(&ep, &target.export().expect("export"))
            .expect("import");
    let (src, src_bytes) = buffer(&p, &p.a, len + 5, Access::READ, 12);
    let d = [desc::<C>(src.registration(), 5, &key, offset as u64, len)];
    p.a.transfer(&ep, Op::Write, &d, deadline())
        .await
        .expect("write");
    let after = contents(&target);
    assert_same(
        "written bytes at target",
        &after[offset..offset + len],
        &src_bytes[5..5 + len],
    );
    assert_same(
        "target bytes before range",
        &after[..offset],
        &before[..offset],
    );
    assert_same(
        "target bytes after range",
        &after[offset + len..],
        &before[offset + len..],
    );

    let (dst, _) = buffer(&p, &p.a, len + 3, Access::WRITE, 13);
    let d = [desc::<C>(dst.registration(), 3, &key, offset as u64, len)];
    p.a.transfer(&ep, Op::Read, &d, deadline())
        .await
        .expect("read");
    assert_same("read back", &contents(&dst)[3..], &src_bytes[5..5 + len]);
}

/// Zero-length descriptors and empty batches succeed and move nothing.
pub async fn zero_length<C: Communicator, M: Memory>(p: Peers<C, M>) {
    let ep = connect(&p).await;
    let (target, before) = buffer(&p, &p.b, 64, Access::READ_WRITE, 21);
    let key =
        p.a.import(&ep, &target.export().expect("export"))
            .expect("import");
    let (local, _) = buffer(&p, &p.a, 64, Access::READ_WRITE, 22);
    p.a.transfer(&ep, Op::Write, &[], deadline())
        .await
        .expect("empty batch");
    let d = [desc::<C>(local.registration(), 64, &key, 64, 0)];
    p.a.transfer(&ep, Op::Write, &d, deadline())
        .await
        .expect("zero-length write at the end");
    p.a.transfer(&ep, Op::Read, &d, deadline())
        .await
        .expect("zero-length read at the end");
    assert_same("target untouched", &contents(&target), &before);
}

/// A batch of `count` descriptors of varied sizes, scattered over both regions, in both
/// directions, verified byte for byte.
pub async fn batch<C: Communicator, M: Memory>(p: Peers<C, M>, count: usize) {
    let ep = connect(&p).await;
    let sizes: Vec<usize> = (0..count).map(|i| 1 + (i * 7919) % 8191).collect();
    let total: usize = sizes.iter().sum();
    let (target, _) = buffer(&p, &p.b, total, Access::READ_WRITE, 31);
    let key =
        p.a.import(&ep, &target.export().expect("export"))
            .expect("import");
    let (src, src_bytes) = buffer(&p, &p.a, total, Access::READ_WRITE, 32);
    // Local descriptor i takes the i-th chunk; remote descriptor i lands in reverse order.
    let mut local_off = Vec::with_capacity(count);
    let mut acc = 0;
    for s in &sizes {
        local_off.push(acc);
        acc += s;
    }
    let remote_off: Vec<usize> = (0..count)
        .map(|i| total - local_off[i] - sizes[i])
        .collect();
    let d: Vec<_> = (0..count)
        .map(|i| {
            desc::<C>(
                src.registration(),
                local_off[i],
                &key,
                remote_off[i] as u64,
                sizes[i],
            )
        })
        .collect();
    p.a.transfer(&ep, Op::Write, &d, deadline())
        .await
        .expect("batch write");
    let at_target = contents(&target);
    for i in 0..count {
        assert_same(
            "batch element at target",
            &at_target[remote_off[i]..remote_off[i] + sizes[i]],
            &src_bytes[local_off[i]..local_off[i] + sizes[i]],
        );
    }
    let (dst, _) = buffer(&p, &p.a, total, Access::READ_WRITE, 33);
    let d: Vec<_> = (0..count)
        .map(|i| {
            desc::<C>(
                dst.registration(),
                local_off[i],
                &key,
                remote_off[i] as u64,
                sizes[i],
            )
        })
        .collect();
    p.a.transfer(&ep, Op::Read, &d, deadline())
        .await
        .expect("batch read");
    assert_same("batch read back", &contents(&dst), &src_bytes);
}

/// Descriptors past either region's end, or whose offset+len overflows, are refused
/// with `OutOfBounds`, and nothing in the batch moves.
pub async fn out_of_bounds_refused<C: Communicator, M: Memory>(p: Peers<C, M>) {
    let ep = connect(&p).await;
    let (target, before) = buffer(&p, &p.b, 4096, Access::READ_WRITE, 41);
    let key =
        p.a.import(&ep, &target.export().expect("export"))
            .expect("import");
    let (local, local_before) = buffer(&p, &p.a, 4096, Access::READ_WRITE, 42);
    let reg = local.registration();
    let cases = [
        desc::<C>(reg, 0, &key, 4000, 97),
        desc::<C>(reg, 4000, &key, 0, 97),
        desc::<C>(reg, 0, &key, u64::MAX - 1, 2),
        desc::<C>(reg, usize::MAX - 1, &key, 0, 2),
        desc::<C>(reg, 0, &key, 4097, 0),
    ];
    for bad in cases {
        // A valid first element proves the whole batch is refused, not just the bad one.
        let batch = [desc::<C>(reg, 0, &key, 0, 16), bad];
        for op in [Op::Write, Op::Read] {
            let err = p.a.transfer(&ep, op, &batch, deadline()).await;
            assert!(
                matches!(err, Err(Error::OutOfBounds { .. })),
                "{op:?} {bad:?} must be OutOfBounds, got {err:?}"
            );
        }
    }
    assert_same("target after refused batches", &contents(&target), &before);
    assert_same(
        "initiator after refused batches",
        &contents(&local),
        &local_before,
    );
    // The endpoint still works.
    p.a.transfer(
        &ep,
        Op::Read,
        &[desc::<C>(reg, 0, &key, 0, 4096)],
        deadline(),
    )
    .await
    .expect("read after refusals");
}

/// A region exported read-only refuses WRITE; write-only refuses READ; the bytes stay.
pub async fn access_enforced<C: Communicator, M: Memory>(p: Peers<C, M>) {
    let ep = connect(&p).await;
    let (ro, ro_before) = buffer(&p, &p.b, 256, Access::READ, 51);
    let (wo, _) = buffer(&p, &p.b, 256, Access::WRITE, 52);
    let ro_key =
        p.a.import(&ep, &ro.export().expect("export"))
            .expect("import ro");
    let wo_key =
        p.a.import(&ep, &wo.export().expect("export"))
            .expect("import wo");
    let (local, local_before) = buffer(&p, &p.a, 256, Access::READ_WRITE, 53);
    let err =
        p.a.transfer(
            &ep,
            Op::Write,
            &[desc::<C>(local.registration(), 0, &ro_key, 0, 256)],
            deadline(),
        )
        .await;
    assert!(
        matches!(err, Err(Error::AccessDenied(_))),
        "write to read-only: {err:?}"
    );
    let err =
        p.a.transfer(
            &ep,
            Op::Read,
            &[desc::<C>(local.registration(), 0, &wo_key, 0, 256)],
            deadline(),
        )
        .await;
    assert!(
        matches!(err, Err(Error::AccessDenied(_))),
        "read of write-only: {err:?}"
    );
    assert_same("read-only region", &contents(&ro), &ro_before);
    assert_same("local buffer", &contents(&local), &local_before);
    p.a.transfer(
        &ep,
        Op::Read,
        &[desc::<C>(local.registration(), 0, &ro_key, 0, 256)],
        deadline(),
    )
    .await
    .expect("read of read-only");
    p.a.transfer(
        &ep,
        Op::Write,
        &[desc::<C>(local.registration(), 0, &wo_key, 0, 256)],
        deadline(),
    )
    .await
    .expect("write to write-only");
}

/// Keys of deregistered regions, forged keys and other transports' descriptors are
/// refused with clear errors; nothing is touched and the endpoint keeps working.
pub async fn stale_and_forged_keys_refused<C: Communicator, M: Memory>(p: Peers<C, M>) {
    let ep = connect(&p).await;
    let (local, _) = buffer(&p, &p.a, 128, Access::READ_WRITE, 61);
    let (gone, _) = buffer(&p, &p.b, 128, Access::READ_WRITE, 62);
    let gone_desc = gone.export().expect("export");
    let stale_key =
        p.a.import(&ep, &gone_desc)
            .expect("import before deregistration");
    drop(gone);
    for op in [Op::Write, Op::Read] {
        let err =
            p.a.transfer(
                &ep,
                op,
                &[desc::<C>(local.registration(), 0, &stale_key, 0, 128)],
                deadline(),
            )
            .await;
        assert!(
            matches!(err, Err(Error::InvalidKey(_))),
            "{op:?} with a stale key: {err:?}"
        );
    }
    let mut forged = gone_desc.clone();
    for b in forged.key.iter_mut() {
        *b = b.wrapping_add(0x5b);
    }
    match p.a.import(&ep, &forged) {
        Err(e) => assert!(
            matches!(e, Error::InvalidKey(_) | Error::InvalidArgument(_)),
            "forged key import: {e:?}"
        ),
        Ok(key) => {
            let err =
                p.a.transfer(
                    &ep,
                    Op::Read,
                    &[desc::<C>(local.registration(), 0, &key, 0, 128)],
                    deadline(),
                )
                .await;
            assert!(err.is_err(), "a forged key must not read memory");
        }
    }
    let mut foreign = gone_desc;
    foreign.transport = if p.a.transport() == crate::TransportId::TCP {
        crate::TransportId::UCX
    } else {
        crate::TransportId::TCP
    };
    assert!(
        matches!(p.a.import(&ep, &foreign), Err(Error::InvalidArgument(_))),
        "another transport's descriptor must be refused"
    );
    let (live, live_bytes) = buffer(&p, &p.b, 128, Access::READ, 63);
    let key =
        p.a.import(&ep, &live.export().expect("export"))
            .expect("import live");
    p.a.transfer(
        &ep,
        Op::Read,
        &[desc::<C>(local.registration(), 0, &key, 0, 128)],
        deadline(),
    )
    .await
    .expect("endpoint still usable");
    assert_same("read after refusals", &contents(&local), &live_bytes);
}

/// [`Communicator::capabilities`] agrees with behaviour: it names this transport; memory
/// of a kind it does not list for registration is refused with `UnsupportedMemory`;
/// `rekey` and `alloc_registered` do what it says; and a registration made by another
/// communicator (here another instance of the same transport) is refused by `export`
/// and `rekey`, with an error, not a crash.
pub async fn capabilities_match_behaviour<C: Communicator, M: Memory>(p: Peers<C, M>) {
    let caps = p.a.capabilities();
    assert_eq!(caps.transport, p.a.transport());
    let mut host = vec![0u8; 64];
    let odd_kind = crate::DeviceKind::from_wire_id(250);
    if !caps.local_memory.contains(odd_kind) {
        // Real host bytes under a device label: harmless even if wrongly registered.
        let region = crate::Region {
            device: crate::Device::new(odd_kind, 0),
            addr: host.as_mut_ptr() as u64,
            len: host.len(),
        };
        // SAFETY: `host` outlives the registration, which is dropped at once if made.
        let r = unsafe { p.a.register(region, Access::READ_WRITE) };
        assert!(
            matches!(r, Err(Error::UnsupportedMemory { .. })),
            "memory of an unlisted kind must be refused as UnsupportedMemory: {:?}",
            r.map(drop)
        );
    }
    let (own, _) = buffer(&p, &p.a, 64, Access::READ_WRITE, 111);
    assert_eq!(
        p.a.rekey(own.registration()).expect("rekey"),
        caps.rekey,
        "rekey disagrees with capabilities"
    );
    let fast =
        p.a.alloc_registered(64, Access::READ)
            .expect("alloc_registered");
    assert_eq!(fast.is_some(), caps.alloc_registered);
    let (theirs, _) = buffer(&p, &p.b, 64, Access::READ_WRITE, 112);
    let err = p.a.export(theirs.registration());
    assert!(
        matches!(err, Err(Error::InvalidArgument(_))),
        "exporting another communicator's registration must be refused: {:?}",
        err.map(drop)
    );
    assert!(
        p.a.rekey(theirs.registration()).is_err() || !caps.rekey,
        "rekeying another communicator's registration must be refused"
    );
    p.b.export(theirs.registration())
        .expect("the owner exports it");
}

/// A transfer that cannot finish in time ends with `DeadlineExceeded`, promptly.
pub async fn deadline_expiry<C: Communicator, M: Memory>(p: Peers<C, M>) {
    let ep = connect(&p).await;
    let len = 64 << 20;
    let (target, _) = buffer(&p, &p.b, len, Access::READ_WRITE, 71);
    let key =
        p.a.import(&ep, &target.export().expect("export"))
            .expect("import");
    let (local, _) = buffer(&p, &p.a, len, Access::READ_WRITE, 72);
    let d = [desc::<C>(local.registration(), 0, &key, 0, len)];
    let expired = Deadline::after(Duration::ZERO);
    let err = p.a.transfer(&ep, Op::Read, &d, expired).await;
    assert!(
        matches!(err, Err(Error::DeadlineExceeded { .. })),
        "expired deadline: {err:?}"
    );
    let start = Instant::now();
    let err =
        p.a.transfer(
            &ep,
            Op::Write,
            &d,
            Deadline::after(Duration::from_micros(50)),
        )
        .await;
    assert!(
        matches!(err, Err(Error::DeadlineExceeded { .. })),
        "64 MiB in 50 us: {err:?}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "deadline overran by {:?}",
        start.elapsed()
    );
    // The endpoint recovers.
    let small = [desc::<C>(local.registration(), 0, &key, 0, 4096)];
    p.a.transfer(&ep, Op::Read, &small, deadline())
        .await
        .expect("transfer after a deadline");
}

/// Polls a future once and drops it: what a `select!` losing branch does.
struct PollOnce<F>(Option<Pin<Box<F>>>);
impl<F: Future> Future for PollOnce<F> {
    type Output = bool;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<bool> {
        let mut fut = self.0.take().expect("polled after completion");
        Poll::Ready(fut.as_mut().poll(cx).is_ready())
    }
}

/// Dropping a READ mid-flight cancels it: afterwards the local buffer is reusable (not
/// written again) and the endpoint serves new transfers.
pub async fn cancellation<C: Communicator, M: Memory>(p: Peers<C, M>) {
    let ep = connect(&p).await;
    let len = 32 << 20;
    let (target, target_bytes) = buffer(&p, &p.b, len, Access::READ_WRITE, 81);
    let key =
        p.a.import(&ep, &target.export().expect("export"))
            .expect("import");
    let (local, _) = buffer(&p, &p.a, len, Access::READ_WRITE, 82);
    for op in [Op::Read, Op::Write] {
        let d = [desc::<C>(local.registration(), 0, &key, 0, len)];
        let _finished = PollOnce(Some(Box::pin(p.a.transfer(&ep, op, &d, deadline())))).await;
        // After the drop the buffer is ours again: mark it and check nobody writes it.
        let mark = pattern(83, len);
        local
            .write_at(0, &MemSpan::host(&mark))
            .expect("reuse buffer");
        // Round trips on the same endpoint flush whatever the cancelled batch left queued.
        let (probe, _) = buffer(&p, &p.a, 64, Access::READ_WRITE, 84);
        for _ in 0..4 {
            p.a.transfer(
                &ep,
                Op::Read,
                &[desc::<C>(probe.registration(), 0, &key, 0, 64)],
                deadline(),
            )
            .await
            .expect("transfer after cancel");
        }
        assert_same("buffer after cancel", &contents(&local), &mark);
    }
    // A WRITE that was cancelled may have landed partly; restore and verify a full read.
    target
        .write_at(0, &MemSpan::host(&target_bytes))
        .expect("restore target");
    let d = [desc::<C>(local.registration(), 0, &key, 0, len)];
    p.a.transfer(&ep, Op::Read, &d, deadline())
        .await
        .expect("full read after cancels");
    assert_same("read after cancels", &contents(&local), &target_bytes);
}

/// Yields to the executor once.
async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await
}

/// When the target closes mid-transfer, the initiator gets an error well before the
/// deadline, never a hang; new operations on the endpoint fail fast too.
pub async fn peer_gone<C: Communicator, M: Memory>(p: Peers<C, M>) {
    closed_mid_transfer(p, false, (91, 92)).await;
}

/// `tasks` concurrent futures, each with its own slice of one target region, each
/// running `rounds` WRITE+READ pairs, all verified.
pub async fn concurrent<C: Communicator, M: Memory>(p: Peers<C, M>, tasks: usize, rounds: usize) {
    let ep = connect(&p).await;
    let slice = 64 * 1024 + 3;
    let (target, _) = buffer(&p, &p.b, slice * tasks, Access::READ_WRITE, 101);
    let key =
        p.a.import(&ep, &target.export().expect("export"))
            .expect("import");
    let work = (0..tasks).map(|t| {
        let (p, ep, key) = (&p, &ep, &key);
        async move {
            let (src, _) = buffer(p, &p.a, slice, Access::READ_WRITE, 0);
            let (dst, _) = buffer(p, &p.a, slice, Access::READ_WRITE, 0);
            for r in 0..rounds {
                let bytes = pattern((t * 1000 + r) as u64, slice);
                src.write_at(0, &MemSpan::host(&bytes)).expect("fill");
                let off = (t * slice) as u64;
                p.a.transfer(
                    ep,
                    Op::Write,
                    &[desc::<C>(src.registration(), 0, key, off, slice)],
                    deadline(),
                )
                .await
                .expect("concurrent write");
                p.a.transfer(
                    ep,
                    Op::Read,
                    &[desc::<C>(dst.registration(), 0, key, off, slice)],
                    deadline(),
                )
                .await
                .expect("concurrent read");
                assert_same("concurrent round", &contents(&dst), &bytes);
            }
        }
    });
    futures::future::join_all(work).await;
}

/// Notifications arrive with their tag and bytes, in send order, from the right peer.
pub async fn notify_in_order<C: Communicator, M: Memory>(p: Peers<C, M>) {
    let ep = connect(&p).await;
    for i in 0..100u64 {
        let msg = pattern(i, (i as usize * 37) % 1000);
        p.a.notify(&ep, i, &msg, deadline()).await.expect("notify");
    }
    for i in 0..100u64 {
        let n =
            p.b.recv_notification(deadline())
                .await
                .expect("receive notification");
        assert_eq!(n.tag, i, "notifications out of order");
        assert_eq!(n.msg, pattern(i, (i as usize * 37) % 1000));
        assert_eq!(n.from, p.a.address());
    }
    let err =
        p.b.recv_notification(Deadline::after(Duration::from_millis(50)))
            .await;
    assert!(
        matches!(err, Err(Error::DeadlineExceeded { .. })),
        "no notification pending: {err:?}"
    );
}

/// Keys with exactly one byte changed (each position, up to 64 spread over the key) are
/// refused: at `import` with `InvalidKey`/`InvalidArgument`, or at `transfer` with an
/// error; no byte of the target or the initiator changes. A transport whose key carries a
/// fixed magic but never checks its secret fails here.
pub async fn forged_key_one_byte<C: Communicator, M: Memory>(p: Peers<C, M>) {
    let ep = connect(&p).await;
    let (target, target_bytes) = buffer(&p, &p.b, 256, Access::READ_WRITE, 121);
    let (local, local_bytes) = buffer(&p, &p.a, 256, Access::READ_WRITE, 122);
    let good = target.export().expect("export");
    let n = good.key.len();
    let step = n.div_ceil(64).max(1);
    for i in (0..n).step_by(step) {
        for flip in [0x01u8, 0x80] {
            let mut forged = good.clone();
            forged.key[i] ^= flip;
            let key = match p.a.import(&ep, &forged) {
                Ok(key) => key,
                Err(e) => {
                    assert!(
                        matches!(e, Error::InvalidKey(_) | Error::InvalidArgument(_)),
                        "key byte {i} ^ {flip:#x} refused at import with {e:?}; want InvalidKey or InvalidArgument"
                    );
                    continue;
                }
            };
            for op in [Op::Read, Op::Write] {
                let d = [desc::<C>(local.registration(), 0, &key, 0, 256)];
                let r = p.a.transfer(&ep, op, &d, deadline()).await;
                assert!(
                    r.is_err(),
                    "a key with byte {i} ^ {flip:#x} must not {op:?} the region"
                );
            }
        }
    }
    assert_same(
        "target after forged keys",
        &contents(&target),
        &target_bytes,
    );
    assert_same(
        "initiator after forged keys",
        &contents(&local),
        &local_bytes,
    );
    let key = p.a.import(&ep, &good).expect("the genuine key");
    let d = [desc::<C>(local.registration(), 0, &key, 0, 256)];
    p.a.transfer(&ep, Op::Read, &d, deadline())
        .await
        .expect("the genuine key still works");
}

/// The target drops (deregisters and frees) a region while a large WRITE into it runs:
/// the drop waits until no peer can touch the memory, the transfer completes or fails
/// (`InvalidKey`, `Peer`, `Cancelled`; not by its deadline), nothing crashes, and the
/// endpoint serves a new region afterwards.
pub async fn deregistration_during_transfer<C: Communicator, M: Memory>(p: Peers<C, M>) {
    let ep = connect(&p).await;
    let len = 64 << 20;
    let (target, _) = buffer(&p, &p.b, len, Access::READ_WRITE, 131);
    let key =
        p.a.import(&ep, &target.export().expect("export"))
            .expect("import");
    let (local, _) = buffer(&p, &p.a, len, Access::READ_WRITE, 132);
    let limit = Duration::from_secs(20);
    let start = Instant::now();
    let write = async {
        let d = [desc::<C>(local.registration(), 0, &key, 0, len)];
        p.a.transfer(&ep, Op::Write, &d, Deadline::after(limit))
            .await
    };
    let dropper = async move {
        for _ in 0..20 {
            yield_now().await;
        }
        drop(target);
    };
    let (result, ()) = futures::join!(write, dropper);
    if let Err(e) = &result {
        assert!(
            !matches!(e, Error::DeadlineExceeded { .. }),
            "deregistration must end the transfer, not its deadline: {e}"
        );
    }
    assert!(
        start.elapsed() < limit,
        "the transfer outlived its deadline"
    );
    let (fresh, fresh_bytes) = buffer(&p, &p.b, 4096, Access::READ, 133);
    let key =
        p.a.import(&ep, &fresh.export().expect("export"))
            .expect("import a new region");
    let d = [desc::<C>(local.registration(), 0, &key, 0, 4096)];
    p.a.transfer(&ep, Op::Read, &d, deadline())
        .await
        .expect("the endpoint serves a new region");
    assert_same(
        "read after deregistration",
        &contents(&local)[..4096],
        &fresh_bytes,
    );
}

/// Two senders (the initiators of two fresh pairs) notify one receiver: every message
/// arrives once, in order per sender, with its sender's address.
pub async fn notify_from_two_senders<C: Communicator, M: Memory>(
    p: Peers<C, M>,
    other: Peers<C, M>,
) {
    let receiver = &p.b;
    let senders = [&p.a, &other.a];
    let mut eps = Vec::new();
    for s in senders {
        eps.push(
            s.connect(&receiver.address(), deadline())
                .await
                .expect("connect to the receiver"),
        );
    }
    let per = 50u64;
    let sends = senders
        .iter()
        .zip(&eps)
        .enumerate()
        .map(|(k, (s, ep))| async move {
            for i in 0..per {
                let msg = pattern(k as u64 * 1000 + i, 1 + (i as usize * 13) % 200);
                s.notify(ep, i, &msg, deadline()).await.expect("notify");
                yield_now().await;
            }
        });
    futures::future::join_all(sends).await;
    let mut next = [0u64; 2];
    for _ in 0..2 * per {
        let n = receiver
            .recv_notification(deadline())
            .await
            .expect("receive notification");
        let k = senders
            .iter()
            .position(|s| s.address() == n.from)
            .unwrap_or_else(|| panic!("a notification from an unknown sender {}", n.from));
        assert_eq!(n.tag, next[k], "sender {k}'s notifications out of order");
        let want = pattern(k as u64 * 1000 + n.tag, 1 + (n.tag as usize * 13) % 200);
        assert_eq!(n.msg, want, "sender {k}'s message {} differs", n.tag);
        next[k] += 1;
    }
    assert_eq!(next, [per, per]);
}

/// The initiator closes itself while its transfers run: they end with an error well
/// before their deadline (`Closed`, `Cancelled` or `Peer`), never a hang, and later calls
/// on it fail fast.
pub async fn initiator_close<C: Communicator, M: Memory>(p: Peers<C, M>) {
    closed_mid_transfer(p, true, (141, 142)).await;
}

/// Connecting to a TCP listener that accepts and never answers ends by the deadline with
/// an error (for a transport that connects lazily: the first notification does), never
/// a hang.
pub async fn connect_to_silent_listener<C: Communicator, M: Memory>(p: Peers<C, M>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a silent listener");
    let addr = crate::PeerAddr::Tcp(listener.local_addr().expect("its address"));
    let limit = Duration::from_millis(500);
    let slack = Duration::from_secs(3);
    let start = Instant::now();
    let result = match p.a.connect(&addr, Deadline::after(limit)).await {
        Err(e) => Err(e),
        Ok(ep) => p.a.notify(&ep, 1, b"anyone?", Deadline::after(limit)).await,
    };
    assert!(
        result.is_err(),
        "a silent listener cannot be a working peer"
    );
    assert!(
        start.elapsed() < limit * 2 + slack,
        "a silent listener held the caller for {:?}",
        start.elapsed()
    );
    drop(listener);
}

/// A batch longer than [`crate::CommCapabilities::max_batch_len`] is refused with
/// `LimitExceeded` naming `max_batch_len`, and moves nothing. Skipped (with a note) for a
/// transport that declares no batch limit.
pub async fn oversized_batch<C: Communicator, M: Memory>(p: Peers<C, M>) {
    let max = p.a.capabilities().max_batch_len;
    if max >= 1 << 20 {
        eprintln!("oversized batch: skipped, the transport declares no batch limit ({max})");
        return;
    }
    let ep = connect(&p).await;
    let (target, before) = buffer(&p, &p.b, 64, Access::READ_WRITE, 151);
    let key =
        p.a.import(&ep, &target.export().expect("export"))
            .expect("import");
    let (local, _) = buffer(&p, &p.a, 64, Access::READ_WRITE, 152);
    let batch = vec![desc::<C>(local.registration(), 0, &key, 0, 1); max + 1];
    let err = p.a.transfer(&ep, Op::Write, &batch, deadline()).await;
    assert!(
        matches!(
            err,
            Err(Error::LimitExceeded {
                limit: "max_batch_len",
                ..
            })
        ),
        "a batch of max_batch_len + 1 must be LimitExceeded(max_batch_len): {err:?}"
    );
    assert_same(
        "target after an oversized batch",
        &contents(&target),
        &before,
    );
}

/// Transfers of 64 MiB run while one side closes (`close_initiator`: `p.a`, else `p.b`):
/// they end with an error well before their deadline, and the endpoint fails fast after.
async fn closed_mid_transfer<C: Communicator, M: Memory>(
    p: Peers<C, M>,
    close_initiator: bool,
    seeds: (u64, u64),
) {
    let who = if close_initiator {
        "a closed initiator"
    } else {
        "a closed peer"
    };
    let ep = connect(&p).await;
    let len = 64 << 20;
    let (target, _) = buffer(&p, &p.b, len, Access::READ_WRITE, seeds.0);
    let key =
        p.a.import(&ep, &target.export().expect("export"))
            .expect("import");
    let (local, _) = buffer(&p, &p.a, len, Access::READ_WRITE, seeds.1);
    let limit = Duration::from_secs(20);
    let start = Instant::now();
    let transfers = async {
        let d = [desc::<C>(local.registration(), 0, &key, 0, len)];
        let mut last = Ok(());
        for i in 0..64 {
            let op = if i % 2 == 0 { Op::Write } else { Op::Read };
            last = p.a.transfer(&ep, op, &d, Deadline::after(limit)).await;
            if last.is_err() {
                break;
            }
        }
        last
    };
    let closer = async {
        for _ in 0..50 {
            yield_now().await;
        }
        if close_initiator {
            p.a.close();
        } else {
            p.b.close();
        }
    };
    let (result, ()) = futures::join!(transfers, closer);
    let err = result.expect_err(&format!("transfers with {who} must fail"));
    assert!(
        !matches!(err, Error::DeadlineExceeded { .. }),
        "{who} must fail the transfers, not time them out: {err}"
    );
    assert!(start.elapsed() < limit, "error came after the deadline");
    let d = [desc::<C>(local.registration(), 0, &key, 0, 16)];
    let again =
        p.a.transfer(&ep, Op::Read, &d, Deadline::after(Duration::from_secs(5)))
            .await;
    assert!(again.is_err(), "a transfer with {who} must fail");
    drop(target);
}

/// How [`abandoned_write_settles`] gives up on a WRITE mid-way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Abandon {
    /// Its `transfer` future is dropped (a cancel; a plugin's `transfer_release`).
    Dropped,
    /// It ends by its own deadline (`DeadlineExceeded`).
    Deadline,
}

impl Abandon {
    fn how(self) -> &'static str {
        match self {
            Abandon::Dropped => "its future dropped",
            Abandon::Deadline => "its deadline",
        }
    }
}

/// Waits `d` without blocking the executor's thread (the kit runs on any executor): a
/// thread of its own sleeps and wakes the task.
async fn pause(d: Duration) {
    let (tx, rx) = futures::channel::oneshot::channel::<()>();
    std::thread::spawn(move || {
        std::thread::sleep(d);
        let _ = tx.send(());
    });
    let _ = rx.await;
}

/// Starts a WRITE of `d` and gives up on it after `cut` (`how`); `true` when it was still
/// running then, `false` when it finished first.
async fn abandon_one<C: Communicator>(
    c: &C,
    ep: &C::Endpoint,
    d: &[TransferDesc<'_, C>],
    how: Abandon,
    cut: Duration,
) -> bool {
    match how {
        Abandon::Dropped => {
            let write = Box::pin(c.transfer(ep, Op::Write, d, deadline()));
            match futures::future::select(write, Box::pin(pause(cut))).await {
                futures::future::Either::Left((r, _)) => {
                    r.expect("a WRITE that finished before it was dropped");
                    false
                }
                futures::future::Either::Right((_, write)) => {
                    drop(write);
                    true
                }
            }
        }
        Abandon::Deadline => match c.transfer(ep, Op::Write, d, Deadline::after(cut)).await {
            Ok(()) => false,
            Err(e) if e.is_deadline() => true,
            Err(e) => panic!("a WRITE with a {cut:?} deadline: {e}"),
        },
    }
}

/// WRITEs of 32 MiB abandoned mid-way (`how`), each followed by [`Communicator::settle`]:
/// once `settle` returned `Ok`, canaries written over the whole target region are all
/// still there after a delay, that is, no byte of the WRITE landed after its end (the
/// target dropped what it still held or received). Then a full WRITE on the same
/// endpoint lands every byte. The cuts are fractions of a full WRITE's time, measured on
/// the same endpoint after a warm-up WRITE and lowered whenever a WRITE finishes before
/// its cut, so that a loaded machine (slower WRITEs, later wake-ups) and a fast one
/// both cut them mid-way; rounds go on until four were cut mid-way (at most 24 rounds).
pub async fn abandoned_write_settles<C: Communicator, M: Memory>(p: Peers<C, M>, how: Abandon) {
    const LEN: usize = 32 << 20;
    /// Rounds cut mid-way that the case wants, and the most it tries for them.
    const WANT: u32 = 4;
    const ROUNDS: u32 = 24;
    const CANARY: u8 = 0xC5;
    /// Long enough for anything a target still held or received to have landed.
    const LATER: Duration = Duration::from_millis(200);
    let ep = connect(&p).await;
    let (target, _) = buffer(&p, &p.b, LEN, Access::READ_WRITE, 161);
    let key =
        p.a.import(&ep, &target.export().expect("export"))
            .expect("import");
    let (src, src_bytes) = buffer(&p, &p.a, LEN, Access::READ, 162);
    let d = [desc::<C>(src.registration(), 0, &key, 0, LEN)];
    let canaries = vec![CANARY; LEN];
    // The first WRITE on an endpoint may pay for its wire-up (UCX binds lazily), so it
    // is not the one timed.
    p.a.transfer(&ep, Op::Write, &d, deadline())
        .await
        .expect("a first, full WRITE (warming the endpoint)");
    let start = Instant::now();
    p.a.transfer(&ep, Op::Write, &d, deadline())
        .await
        .expect("a second, full WRITE (timed for the cuts)");
    let mut full = start.elapsed();
    let mut abandoned = 0;
    let mut cuts = Vec::new();
    for round in 0..ROUNDS {
        if abandoned >= WANT {
            break;
        }
        // 5% to 55% of a full WRITE's time, cycling.
        let cut = full
            .mul_f64(0.05 + 0.1 * f64::from(round % 6))
            .max(Duration::from_micros(50));
        cuts.push(cut);
        let started = Instant::now();
        if !abandon_one(&*p.a, &ep, &d, how, cut).await {
            // It finished before its cut: a full WRITE is faster than timed, so later
            // cuts follow the faster time.
            full = full.min(started.elapsed());
            continue;
        }
        abandoned += 1;
        if let Err(e) = p.a.settle(&ep, deadline()).await {
            panic!(
                "round {round}: settle after a WRITE ended by {}: {e}; with a live, healthy \
                 target it must confirm that no more of the WRITE lands",
                how.how()
            );
        }
        target
            .write_at(0, &MemSpan::host(&canaries))
            .expect("canaries at the target");
        pause(LATER).await;
        let now = contents(&target);
        if let Some(i) = now.iter().position(|b| *b != CANARY) {
            let landed = now.iter().filter(|b| **b != CANARY).count();
            panic!(
                "round {round}: {landed} bytes of a WRITE ended by {} landed at the target \
                 after settle returned (the first at byte {i}); once a transfer ended and \
                 settle returned, no byte of it may land: the target must drop what it still \
                 holds or receives for a transfer it ended",
                how.how()
            );
        }
    }
    assert!(
        abandoned > 0,
        "none of {} WRITEs of 32 MiB was still running when it was abandoned (a full one took \
         {full:?}; cut after {cuts:?}): the case checked nothing",
        cuts.len()
    );
    p.a.transfer(&ep, Op::Write, &d, deadline())
        .await
        .expect("a WRITE on the endpoint after the abandoned ones");
    assert_same(
        "the target after a full WRITE that followed the abandoned ones",
        &contents(&target),
        &src_bytes,
    );
}
