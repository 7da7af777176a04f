//! Conformance checks for `Memory` implementations.

use super::*;

fn upload<M: Memory>(mem: &M, buf: &mut M::Buffer, offset: usize, bytes: &[u8]) {
    let mut span = MemSpanMut::of(buf);
    let mut dst = span
        .slice_mut(offset, bytes.len())
        .expect("slice in bounds");
    mem.copy(&mut dst, &MemSpan::host(bytes))
        .expect("host to device copy");
}

fn download<M: Memory>(mem: &M, buf: &M::Buffer, offset: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let src = MemSpan::of(buf)
        .slice(offset, len)
        .expect("slice in bounds");
    mem.copy(&mut MemSpanMut::host(&mut out), &src)
        .expect("device to host copy");
    out
}

/// Host → device at `offset` → host returns the same bytes, and bytes around the
/// written range keep their values.
pub fn round_trip<M: Memory>(mem: &M, len: usize, offset: usize) {
    let total = len + offset + 64;
    let mut buf = mem.alloc(total).expect("alloc");
    assert_eq!(buf.len(), total);
    assert_eq!(buf.region().device, mem.device());
    let background = pattern(1, total);
    upload(mem, &mut buf, 0, &background);
    let data = pattern(len as u64 ^ offset as u64, len);
    upload(mem, &mut buf, offset, &data);
    let all = download(mem, &buf, 0, total);
    assert_same("written range", &all[offset..offset + len], &data);
    assert_same("bytes before", &all[..offset], &background[..offset]);
    assert_same(
        "bytes after",
        &all[offset + len..],
        &background[offset + len..],
    );
}

/// Device → device copies within one device preserve bytes.
pub fn device_to_device<M: Memory>(mem: &M, len: usize) {
    let mut a = mem.alloc(len).expect("alloc a");
    let mut b = mem.alloc(len).expect("alloc b");
    let data = pattern(7, len);
    upload(mem, &mut a, 0, &data);
    mem.copy(&mut MemSpanMut::of(&mut b), &MemSpan::of(&a))
        .expect("device to device copy");
    assert_same("device to device", &download(mem, &b, 0, len), &data);
}

/// Zero-length allocations and copies succeed and move nothing.
pub fn zero_length<M: Memory>(mem: &M) {
    let mut buf = mem.alloc(0).expect("zero-length alloc");
    assert_eq!(buf.len(), 0);
    mem.copy(&mut MemSpanMut::of(&mut buf), &MemSpan::host(&[]))
        .expect("zero-length copy");
    let mut nothing = [0u8; 0];
    mem.copy(&mut MemSpanMut::host(&mut nothing), &MemSpan::of(&buf))
        .expect("zero-length copy back");
}

/// An allocation past the backend's maximum is an error, never an abort; one of
/// `large` bytes succeeds and is usable at both ends.
pub fn maximum_size<M: Memory>(mem: &M, large: usize) {
    assert!(
        mem.alloc(usize::MAX).is_err(),
        "usize::MAX allocation must be refused"
    );
    if mem.max_alloc() < usize::MAX {
        assert!(
            mem.alloc(mem.max_alloc() + 1).is_err(),
            "allocation past max_alloc must be refused"
        );
    }
    let mut buf = mem.alloc(large).expect("large alloc");
    upload(mem, &mut buf, 0, &[0xA5; 4096]);
    upload(mem, &mut buf, large - 4096, &[0x5A; 4096]);
    assert_eq!(download(mem, &buf, 0, 4096), vec![0xA5; 4096]);
    assert_eq!(download(mem, &buf, large - 4096, 4096), vec![0x5A; 4096]);
}

/// Spans past the end are refused; copies of unequal length are refused and move nothing.
pub fn out_of_bounds_refused<M: Memory>(mem: &M) {
    let mut buf = mem.alloc(100).expect("alloc");
    upload(mem, &mut buf, 0, &[9u8; 100]);
    assert!(MemSpan::of(&buf).slice(90, 11).is_err());
    assert!(MemSpan::of(&buf).slice(usize::MAX, 2).is_err());
    assert!(MemSpanMut::of(&mut buf).slice_mut(101, 0).is_err());
    let big = [1u8; 101];
    let err = mem.copy(&mut MemSpanMut::of(&mut buf), &MemSpan::host(&big));
    assert!(
        matches!(err, Err(Error::InvalidArgument(_))),
        "length mismatch must be refused: {err:?}"
    );
    assert_eq!(
        download(mem, &buf, 0, 100),
        vec![9u8; 100],
        "a refused copy moved bytes"
    );
}

/// [`Memory::capabilities`] agrees with behaviour: the device and limit match, and
/// each optional feature the backend does not claim is refused as `Unsupported`; an
/// asynchronous copy it claims moves the bytes.
pub fn capabilities_match_behaviour<M: Memory>(mem: &M) {
    let caps = mem.capabilities();
    assert_eq!(
        caps.device,
        mem.device(),
        "capabilities name another device"
    );
    assert_eq!(caps.max_alloc, mem.max_alloc());
    assert_eq!(caps.host_accessible, mem.device().is_host());
    let data = pattern(5, 4096);
    let mut buf = mem.alloc(4096).expect("alloc");
    {
        let mut dst = MemSpanMut::of(&mut buf);
        let src = MemSpan::host(&data);
        // SAFETY: the future, if any, is driven to completion right here.
        let started = unsafe { mem.copy_async(&mut dst, &src) };
        let fallback = match (caps.async_copy, started) {
            (true, Ok(fut)) => {
                futures::executor::block_on(fut).expect("async copy");
                false
            }
            (false, Err(Error::Unsupported(_))) => true,
            (claimed, other) => panic!(
                "async_copy is {claimed} but copy_async gave {:?}",
                other.map(drop)
            ),
        };
        if fallback {
            mem.copy(&mut dst, &src).expect("copy");
        }
    }
    assert_same("after the copy", &download(mem, &buf, 0, 4096), &data);
    if !caps.dma_buf {
        let r = mem.export_dmabuf(&MemSpan::of(&buf));
        assert!(
            matches!(r, Err(Error::Unsupported(_))),
            "dma_buf is false but export_dmabuf gave {:?}",
            r.map(drop)
        );
    }
    if !caps.ipc {
        let r = mem.export_ipc(&buf);
        assert!(
            matches!(r, Err(Error::Unsupported(_))),
            "ipc is false but export_ipc gave {r:?}"
        );
    }
}
