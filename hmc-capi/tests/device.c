/*
 * CUDA memory through the C ABI, in one process over the TCP transport (device memory
 * staged through host chunks): registered with hmc_register_mem (HMC_MEM_DEVICE), the
 * source of a sync WRITE and the target of an async READ; then a KV cache registered in
 * device memory (hmc_datadist_register_cache) pulled whole into a host cache by another
 * engine. Device memory comes from the CUDA driver API (libcuda.so.1, opened at run time):
 * `cargo xtask test` runs this against the project's CUDA driver ABI shim, a GPU machine
 * against its driver. Exit status 0 when every byte checked.
 */
#include "common.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LEN (256 * 1024)

typedef int (*cu_init_t)(unsigned);
typedef int (*cu_device_get_t)(int *, int);
typedef int (*cu_ctx_retain_t)(void **, int);
typedef int (*cu_ctx_set_t)(void *);
typedef int (*cu_alloc_t)(unsigned long long *, size_t);
typedef int (*cu_copy_htod_t)(unsigned long long, const void *, size_t, void *);
typedef int (*cu_copy_dtoh_t)(void *, unsigned long long, size_t, void *);
typedef int (*cu_stream_t)(void **, unsigned);
typedef int (*cu_sync_t)(void *);

static void *cuda;
static void *stream;

static void *sym(const char *name) {
    void *f = dlsym(cuda, name);
    if (f == NULL) {
        fprintf(stderr, "libcuda.so.1 has no %s\n", name);
        exit(1);
    }
    return f;
}

static void expect(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "expected: %s\n", what);
        exit(1);
    }
}

static unsigned long long device_alloc(size_t n) {
    unsigned long long p = 0;
    expect(((cu_alloc_t)sym("cuMemAlloc_v2"))(&p, n) == 0, "cuMemAlloc");
    return p;
}

static void to_device(unsigned long long d, const void *h, size_t n) {
    expect(((cu_copy_htod_t)sym("cuMemcpyHtoDAsync_v2"))(d, h, n, stream) == 0 &&
               ((cu_sync_t)sym("cuStreamSynchronize"))(stream) == 0,
           "host to device copy");
}

static void from_device(void *h, unsigned long long d, size_t n) {
    expect(((cu_copy_dtoh_t)sym("cuMemcpyDtoHAsync_v2"))(h, d, n, stream) == 0 &&
               ((cu_sync_t)sym("cuStreamSynchronize"))(stream) == 0,
           "device to host copy");
}

static uint8_t host[LEN], back[LEN];

int main(void) {
    cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (cuda == NULL) {
        fprintf(stderr, "libcuda.so.1 cannot be opened: %s\n", dlerror());
        return 1;
    }
    int dev = 0;
    void *ctx = NULL;
    expect(((cu_init_t)sym("cuInit"))(0) == 0 &&
               ((cu_device_get_t)sym("cuDeviceGet"))(&dev, 0) == 0 &&
               ((cu_ctx_retain_t)sym("cuDevicePrimaryCtxRetain"))(&ctx, dev) == 0 &&
               ((cu_ctx_set_t)sym("cuCtxSetCurrent"))(ctx) == 0 &&
               ((cu_stream_t)sym("cuStreamCreate"))(&stream, 1) == 0,
           "CUDA device 0 opens");

    hmc_engine *a = test_open("127.0.0.1:0", "tcp", NULL, NULL), *b = test_open("127.0.0.1:0", "tcp", NULL, NULL);
    char peer[128];
    test_check(hmc_engine_name(b, peer, sizeof peer, NULL), "name");

    /* Device memory at a, host memory at b. */
    unsigned long long d = device_alloc(LEN);
    for (size_t i = 0; i < LEN; i++) {
        back[i] = (uint8_t)(i * 7 + 1);
    }
    to_device(d, back, LEN);
    hmc_mem_desc md = HMC_MEM_DESC_INIT;
    md.addr = d;
    md.len = LEN;
    md.mem_type = HMC_MEM_DEVICE;
    md.device_kind = HMC_DEVICE_CUDA;
    md.device_id = 0;
    hmc_mem *mdev = NULL, *mhost = NULL;
    test_check(hmc_register_mem(a, &md, &mdev), "register device memory");
    hmc_mem_desc mh = HMC_MEM_DESC_INIT;
    mh.addr = (uintptr_t)host;
    mh.len = LEN;
    test_check(hmc_register_mem(b, &mh, &mhost), "register host memory");
    test_check(hmc_connect(a, peer, 5000), "connect");

    /* Device -> peer host (sync WRITE), then peer host -> device (async READ). */
    hmc_xfer_desc x = {d, (uintptr_t)host, LEN};
    test_check(hmc_transfer_sync(a, peer, HMC_WRITE, &x, 1, 10000), "WRITE from device memory");
    expect(memcmp(host, back, LEN) == 0, "the device's bytes arrived at the peer");
    for (size_t i = 0; i < LEN; i++) {
        host[i] = (uint8_t)(i * 13 + 5);
    }
    hmc_request *r = NULL;
    test_check(hmc_transfer_async(a, peer, HMC_READ, &x, 1, 10000, NULL, &r), "READ into device");
    test_check(hmc_request_wait(a, r, 10000), "wait");
    test_check(hmc_request_release(a, r), "release");
    memset(back, 0, LEN);
    from_device(back, d, LEN);
    expect(memcmp(host, back, LEN) == 0, "the peer's bytes arrived in device memory");
    printf("device: %d KiB WRITE from and READ into CUDA memory over tcp: checked\n", LEN / 1024);

    /* A KV cache in device memory at a, pulled whole into a host cache at b. */
    hmc_datadist *prompt = NULL, *decoder = NULL;
    test_check(hmc_datadist_new(a, 1, HMC_ROLE_PROMPT, &prompt), "datadist");
    test_check(hmc_datadist_new(b, 2, HMC_ROLE_DECODER, &decoder), "datadist");
    const uint64_t shape[2] = {4, 1024};
    hmc_cache_desc cd = HMC_CACHE_DESC_INIT;
    cd.mem_type = HMC_MEM_DEVICE;
    cd.device_kind = HMC_DEVICE_CUDA;
    cd.num_tensors = 2;
    cd.dtype = HMC_DTYPE_U8;
    cd.num_dims = 2;
    cd.shape = shape;
    unsigned long long t0 = device_alloc(4096), t1 = device_alloc(4096);
    memset(back, 0xa1, 4096);
    to_device(t0, back, 4096);
    memset(back, 0xb2, 4096);
    to_device(t1, back, 4096);
    const uint64_t addrs[2] = {t0, t1};
    const hmc_cache_key key = {1, 9, 1, 0};
    hmc_kv_cache *dc = NULL, *hc = NULL;
    test_check(hmc_datadist_register_cache(prompt, &cd, addrs, &key, 1, NULL, &dc), "register cache");
    char name_a[128];
    test_check(hmc_engine_name(a, name_a, sizeof name_a, NULL), "name");
    test_check(hmc_datadist_link(decoder, 1, name_a, 5000), "link");
    cd.mem_type = HMC_MEM_HOST;
    cd.device_kind = 0;
    test_check(hmc_datadist_allocate_cache(decoder, &cd, NULL, 0, NULL, &hc), "host cache");
    test_check(hmc_datadist_pull_cache(decoder, &key, hc, 10000), "pull from device cache");
    uint64_t got[2];
    size_t n = 0;
    test_check(hmc_kv_cache_tensor_addrs(decoder, hc, got, 2, &n), "addresses");
    const uint8_t *h0 = (const uint8_t *)(uintptr_t)got[0];
    const uint8_t *h1 = (const uint8_t *)(uintptr_t)got[1];
    expect(h0[0] == 0xa1 && h0[4095] == 0xa1 && h1[0] == 0xb2 && h1[4095] == 0xb2,
           "the device cache's tensors arrived");
    printf("device: a KV cache in CUDA memory pulled into a host cache: checked\n");
    test_check(hmc_datadist_deallocate_cache(decoder, hc), "deallocate");
    test_check(hmc_datadist_deallocate_cache(prompt, dc), "deallocate");
    test_check(hmc_datadist_close(decoder), "close");
    test_check(hmc_datadist_close(prompt), "close");
    test_check(hmc_deregister_mem(a, mdev), "deregister");
    test_check(hmc_deregister_mem(b, mhost), "deregister");
    test_check(hmc_engine_close(a), "close");
    test_check(hmc_engine_close(b), "close");
    return 0;
}
