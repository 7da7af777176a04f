//! Copy bandwidth of `CudaMemory` beside a plain `cuMemcpy` loop in the same run (H2D, D2H
//! with pinned host memory, and D2D), printed as a markdown table for docs/benchmarks.md.
//!
//! Run on a CUDA machine: `cargo run --release -p hmc-backend-cuda --example cuda_bandwidth
//! [-- <MiB> <iterations>]` (defaults: 256 MiB, 20 iterations). Target: HMC within 95% of
//! the plain loop.

use std::time::Instant;

use cudarc::driver::sys;
use hmc_backend_cuda::CudaMemory;
use hmc_core::{DeviceBuffer, MemSpan, MemSpanMut, Memory};

fn gbps(bytes: usize, iters: usize, secs: f64) -> f64 {
    (bytes * iters) as f64 / secs / 1e9
}

fn check(what: &str, r: sys::CUresult) {
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "{what} failed: {r:?}");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mib: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(256);
    let iters: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(20);
    let len = mib << 20;
    let mem = match CudaMemory::new(0) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("no CUDA device: {e}");
            std::process::exit(2);
        }
    };
    let info = mem.info().expect("device info");
    let pinned = mem.pinned();
    let mut host = pinned.alloc(len).expect("pinned alloc");
    host.as_mut_slice().fill(0x5A);
    let mut a = mem.alloc(len).expect("device alloc");
    let b = mem.alloc(len).expect("device alloc");
    let (ha, da, db) = (host.region().addr, a.region().addr, b.region().addr);

    println!(
        "{} ({} MiB device memory), driver {}, {mib} MiB x {iters}",
        info.name,
        info.total_bytes >> 20,
        info.driver_version
    );
    println!();
    println!("| copy | HMC GB/s | plain cuMemcpy GB/s | HMC / plain |");
    println!("| --- | ---: | ---: | ---: |");
    for dir in ["H2D", "D2H", "D2D"] {
        // Warm up both paths once; HMC's call also makes its context current on this thread,
        // which the plain loop then uses.
        let hmc = |mem: &CudaMemory, host: &mut _, a: &mut _, b: &_| match dir {
            "H2D" => mem.copy(&mut MemSpanMut::of(a), &MemSpan::of(&*host)),
            "D2H" => mem.copy(&mut MemSpanMut::of(host), &MemSpan::of(&*a)),
            _ => mem.copy(&mut MemSpanMut::of(a), &MemSpan::of(b)),
        };
        let plain = || {
            // SAFETY: the addresses are live allocations of `len` bytes in the context HMC
            // made current; the DtoD case is synchronised below before timing ends.
            unsafe {
                match dir {
                    "H2D" => check(
                        "cuMemcpyHtoD",
                        sys::cuMemcpyHtoD_v2(da, ha as *const _, len),
                    ),
                    "D2H" => check("cuMemcpyDtoH", sys::cuMemcpyDtoH_v2(ha as *mut _, da, len)),
                    _ => check("cuMemcpyDtoD", sys::cuMemcpyDtoD_v2(da, db, len)),
                }
            }
        };
        hmc(&mem, &mut host, &mut a, &b).expect("warm-up copy");
        plain();
        let t = Instant::now();
        for _ in 0..iters {
            hmc(&mem, &mut host, &mut a, &b).expect("copy");
        }
        let hmc_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        for _ in 0..iters {
            plain();
        }
        // SAFETY: waits for the current context's work; no pointers involved.
        unsafe { check("cuCtxSynchronize", sys::cuCtxSynchronize()) };
        let plain_s = t.elapsed().as_secs_f64();
        let (h, p) = (gbps(len, iters, hmc_s), gbps(len, iters, plain_s));
        println!("| {dir} | {h:.1} | {p:.1} | {:.0}% |", 100.0 * h / p);
    }
}
