/*
 * Bad input through the C ABI: each misuse is a status and a message, never a crash.
 * Built by `cargo xtask test` with -Wall -Wextra -Werror, then run, and built and run again
 * with -fsanitize=address,undefined. Exit status 0 when every expectation held.
 */
#include "common.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int failures = 0;
static int checks = 0;

/* `call` returns `want`, and a failure leaves a message naming `needle`. */
#define EXPECT(call, want, needle) expect((call), (want), (needle), #call, __LINE__)

static void expect(hmc_status got, hmc_status want, const char *needle, const char *what,
                   int line) {
    checks++;
    const char *msg = hmc_last_error();
    if (got != want) {
        fprintf(stderr, "line %d: %s returned %s, expected %s (last error: %s)\n", line, what,
                hmc_status_name(got), hmc_status_name(want), msg);
        failures++;
        return;
    }
    if (want != HMC_OK && want != HMC_PENDING && needle != NULL && strstr(msg, needle) == NULL) {
        fprintf(stderr, "line %d: %s: message `%s` does not mention `%s`\n", line, what, msg,
                needle);
        failures++;
    }
}

/* The engine a callback tries a blocking call on, and what that call returned. */
static hmc_engine *blocking_target;
static atomic_int blocking_in_callback = HMC_OK;

static void callback(void *user, hmc_request *req, int status) {
    (void)req;
    /* A blocking call on the library's own thread would stall it: refused. */
    atomic_store(&blocking_in_callback, hmc_connect(blocking_target, "127.0.0.1:1", 100));
    atomic_int *seen = user;
    atomic_store(seen, status == HMC_OK ? 1 : 2);
}

int main(void) {
    EXPECT((hmc_status)(hmc_api_version() >> 16 == HMC_API_VERSION_MAJOR ? HMC_OK
                                                                          : HMC_ERR_INTERNAL),
           HMC_OK, NULL);
    if (strcmp(hmc_status_name(HMC_ERR_DEADLINE), "HMC_ERR_DEADLINE") != 0 ||
        strcmp(hmc_status_name(999), "HMC_UNKNOWN_STATUS") != 0) {
        fprintf(stderr, "hmc_status_name\n");
        failures++;
    }

    /* Options: an unknown key, a bad value, a wrong struct_size, NULL outputs. */
    hmc_engine *e = NULL;
    hmc_option unknown[] = {{"max_region", "1"}};
    hmc_engine_options o = HMC_ENGINE_OPTIONS_INIT;
    o.options = unknown;
    o.num_options = 1;
    EXPECT(hmc_engine_open("127.0.0.1", &o, &e), HMC_ERR_INVALID_ARGUMENT,
           "unknown option `max_region`");
    hmc_option badval[] = {{"max_regions", "many"}};
    o.options = badval;
    EXPECT(hmc_engine_open("127.0.0.1", &o, &e), HMC_ERR_INVALID_ARGUMENT, "max_regions");
    hmc_option nullkey[] = {{NULL, "x"}};
    o.options = nullkey;
    EXPECT(hmc_engine_open("127.0.0.1", &o, &e), HMC_ERR_INVALID_ARGUMENT, "option key");
    o.options = NULL;
    o.num_options = 3;
    EXPECT(hmc_engine_open("127.0.0.1", &o, &e), HMC_ERR_INVALID_ARGUMENT, "options");
    o.num_options = 0;
    o.struct_size = 4;
    EXPECT(hmc_engine_open("127.0.0.1", &o, &e), HMC_ERR_STRUCT_SIZE, "struct_size");
    EXPECT(hmc_engine_open(NULL, NULL, &e), HMC_ERR_INVALID_ARGUMENT, "local_engine");
    EXPECT(hmc_engine_open("127.0.0.1", NULL, NULL), HMC_ERR_INVALID_ARGUMENT, "out");
    EXPECT(hmc_engine_open("not an address", NULL, &e), HMC_ERR_INVALID_ARGUMENT,
           "not an engine address");
    /* A newer program's longer struct whose extra fields are unset still works. */
    struct {
        hmc_engine_options base;
        uint64_t newer_field;
    } longer = {HMC_ENGINE_OPTIONS_INIT, 0};
    longer.base.struct_size = sizeof longer;
    hmc_engine *e2 = NULL;
    EXPECT(hmc_engine_open("127.0.0.1", &longer.base, &e2), HMC_OK, NULL);
    EXPECT(hmc_engine_close(e2), HMC_OK, NULL);
    longer.newer_field = 7;
    EXPECT(hmc_engine_open("127.0.0.1", &longer.base, &e2), HMC_ERR_STRUCT_SIZE,
           "link the libhmc");

    /* NULL and made-up handles. */
    EXPECT(hmc_engine_close(NULL), HMC_ERR_INVALID_ARGUMENT, "NULL");
    EXPECT(hmc_engine_close((hmc_engine *)(uintptr_t)0x1234), HMC_ERR_INVALID_ARGUMENT,
           "no handle this library made");
    int fd = -1;
    EXPECT(hmc_engine_fd(NULL, &fd), HMC_ERR_INVALID_ARGUMENT, "NULL");

    hmc_engine *a = test_open("127.0.0.1:0", "tcp", "max_descs_per_transfer", "1024");
    hmc_engine *b = test_open("127.0.0.1:0", "tcp", "max_descs_per_transfer", "1024");
    char name_b[128];
    size_t len = 0;
    EXPECT(hmc_engine_name(b, NULL, 0, &len), HMC_ERR_BUFFER_TOO_SMALL, "buffer");
    if (len == 0 || len >= sizeof name_b) {
        fprintf(stderr, "name length %zu\n", len);
        failures++;
    }
    EXPECT(hmc_engine_name(b, name_b, len, &len), HMC_ERR_BUFFER_TOO_SMALL, "buffer");
    EXPECT(hmc_engine_name(b, name_b, sizeof name_b, NULL), HMC_OK, NULL);
    EXPECT(hmc_engine_fd(a, NULL), HMC_ERR_INVALID_ARGUMENT, "`fd` is NULL");

    /* Registration: zero, huge, unmapped, wrapping, unknown kinds, wrong struct_size. */
    static uint8_t src[8192], dst[8192];
    hmc_mem *m = NULL;
    hmc_mem_desc d = HMC_MEM_DESC_INIT;
    d.addr = (uint64_t)(uintptr_t)src;
    d.len = 0;
    EXPECT(hmc_register_mem(a, &d, &m), HMC_ERR_INVALID_ARGUMENT, "0 bytes");
    d.len = UINT64_MAX;
    EXPECT(hmc_register_mem(a, &d, &m), HMC_ERR_INVALID_ARGUMENT, "len");
    d.len = (uint64_t)1 << 46;
    EXPECT(hmc_register_mem(a, &d, &m), HMC_ERR_INVALID_ARGUMENT, "mapped");
    d.addr = 4096;
    d.len = 4096;
    EXPECT(hmc_register_mem(a, &d, &m), HMC_ERR_INVALID_ARGUMENT, "mapped");
    d.addr = (uint64_t)(uintptr_t)src;
    d.mem_type = 7;
    EXPECT(hmc_register_mem(a, &d, &m), HMC_ERR_INVALID_ARGUMENT, "mem_type");
    d.mem_type = HMC_MEM_DEVICE;
    d.device_kind = 42;
    EXPECT(hmc_register_mem(a, &d, &m), HMC_ERR_INVALID_ARGUMENT, "device_kind");
    d.mem_type = HMC_MEM_HOST;
    d.device_kind = 0;
    d.flags = 8;
    EXPECT(hmc_register_mem(a, &d, &m), HMC_ERR_INVALID_ARGUMENT, "flags");
    d.flags = 0;
    d.struct_size = 8;
    EXPECT(hmc_register_mem(a, &d, &m), HMC_ERR_STRUCT_SIZE, "hmc_mem_desc.struct_size");
    d.struct_size = sizeof d;
    EXPECT(hmc_register_mem(a, NULL, &m), HMC_ERR_INVALID_ARGUMENT, "hmc_mem_desc");
    EXPECT(hmc_register_mem(a, &d, NULL), HMC_ERR_INVALID_ARGUMENT, "out");
    d.len = sizeof src;
    hmc_mem *ma = NULL, *mb = NULL;
    EXPECT(hmc_register_mem(a, &d, &ma), HMC_OK, NULL);
    EXPECT(hmc_register_mem(a, &d, &m), HMC_ERR_INVALID_ARGUMENT, "overlaps");
    hmc_mem_desc db = HMC_MEM_DESC_INIT;
    db.addr = (uint64_t)(uintptr_t)dst;
    db.len = sizeof dst;
    EXPECT(hmc_register_mem(b, &db, &mb), HMC_OK, NULL);
    /* A registration of one engine given to another. */
    EXPECT(hmc_deregister_mem(a, mb), HMC_ERR_INVALID_ARGUMENT, "belongs to engine");

    /* Transfers before connecting, with bad descriptors, ops and counts. */
    hmc_xfer_desc x = {(uint64_t)(uintptr_t)src, (uint64_t)(uintptr_t)dst, 4096};
    EXPECT(hmc_transfer_sync(a, name_b, HMC_WRITE, &x, 1, 1000), HMC_ERR_NOT_CONNECTED,
           "connect first");
    EXPECT(hmc_connect(a, "127.0.0.1:1", 500), HMC_ERR_UNAVAILABLE, NULL);
    EXPECT(hmc_connect(a, NULL, 500), HMC_ERR_INVALID_ARGUMENT, "remote_engine");
    EXPECT(hmc_connect(a, name_b, 5000), HMC_OK, NULL);
    EXPECT(hmc_connect(a, name_b, 5000), HMC_ERR_ALREADY_CONNECTED, "already connected");
    EXPECT(hmc_transfer_sync(a, name_b, 9, &x, 1, 1000), HMC_ERR_INVALID_ARGUMENT, "op 9");
    EXPECT(hmc_transfer_sync(a, name_b, HMC_WRITE, &x, 0, 1000), HMC_ERR_INVALID_ARGUMENT,
           "0 descriptors");
    EXPECT(hmc_transfer_sync(a, name_b, HMC_WRITE, NULL, 1, 1000), HMC_ERR_INVALID_ARGUMENT,
           "descs");
    EXPECT(hmc_transfer_sync(a, name_b, HMC_WRITE, &x, SIZE_MAX, 1000), HMC_ERR_LIMIT,
           "max_descs_per_transfer");
    hmc_xfer_desc outside = x;
    outside.remote_addr += sizeof dst;
    EXPECT(hmc_transfer_sync(a, name_b, HMC_WRITE, &outside, 1, 1000), HMC_ERR_NOT_REGISTERED,
           "register");
    /* Lengths whose sum overflows 64 bits (found by the capi_calls fuzz target). */
    hmc_xfer_desc two_huge[2] = {x, x};
    two_huge[0].len = two_huge[1].len = (uint64_t)1 << 63;
    EXPECT(hmc_transfer_sync(a, name_b, HMC_WRITE, two_huge, 2, 1000), HMC_ERR_INVALID_ARGUMENT,
           "add up past 2^64");
    hmc_request *never = NULL;
    EXPECT(hmc_transfer_async(a, name_b, HMC_READ, two_huge, 2, 1000, NULL, &never),
           HMC_ERR_INVALID_ARGUMENT, "add up past 2^64");
    hmc_xfer_desc huge = x;
    huge.len = UINT64_MAX;
    EXPECT(hmc_transfer_sync(a, name_b, HMC_WRITE, &huge, 1, 1000), HMC_ERR_NOT_REGISTERED,
           NULL);
    memset(src, 0x5a, sizeof src);
    EXPECT(hmc_transfer_sync(a, name_b, HMC_WRITE, &x, 1, 5000), HMC_OK, NULL);
    if (memcmp(dst, src, 4096) != 0) {
        fprintf(stderr, "the WRITE did not arrive\n");
        failures++;
    }

    /* Requests: wrong struct_size of args, a request on another engine, double release,
     * a callback, cancel of an ended request. */
    hmc_request *r = NULL;
    hmc_transfer_args args = HMC_TRANSFER_ARGS_INIT;
    args.struct_size = 1;
    EXPECT(hmc_transfer_async(a, name_b, HMC_READ, &x, 1, 5000, &args, &r), HMC_ERR_STRUCT_SIZE,
           "hmc_transfer_args");
    atomic_int seen = 0;
    blocking_target = a;
    args.struct_size = sizeof args;
    args.callback = callback;
    args.user_data = &seen;
    EXPECT(hmc_transfer_async(a, name_b, HMC_READ, &x, 1, 5000, &args, &r), HMC_OK, NULL);
    EXPECT(hmc_request_wait(a, r, 5000), HMC_OK, NULL);
    uint32_t state = 99;
    EXPECT(hmc_request_status(a, r, &state), HMC_OK, NULL);
    if (state != HMC_REQUEST_COMPLETED) {
        fprintf(stderr, "state %u\n", state);
        failures++;
    }
    EXPECT(hmc_request_status(b, r, &state), HMC_ERR_INVALID_ARGUMENT, "belongs to engine");
    EXPECT(hmc_request_status(a, (hmc_request *)ma, &state), HMC_ERR_INVALID_ARGUMENT,
           "memory registration handle");
    EXPECT(hmc_request_cancel(a, r), HMC_OK, NULL);
    EXPECT(hmc_request_status(a, r, NULL), HMC_OK, NULL);
    hmc_telemetry t = HMC_TELEMETRY_INIT;
    EXPECT(hmc_request_telemetry(a, r, &t), HMC_OK, NULL);
    if (t.bytes != 4096 || t.descs != 1) {
        fprintf(stderr, "telemetry: %llu bytes, %llu descs\n", (unsigned long long)t.bytes,
                (unsigned long long)t.descs);
        failures++;
    }
    t.struct_size = 3;
    EXPECT(hmc_request_telemetry(a, r, &t), HMC_ERR_STRUCT_SIZE, "hmc_telemetry");
    EXPECT(hmc_request_release(a, r), HMC_OK, NULL);
    EXPECT(hmc_request_release(a, r), HMC_ERR_INVALID_ARGUMENT, "closed or released");
    EXPECT(hmc_request_wait(a, r, 10), HMC_ERR_INVALID_ARGUMENT, "closed or released");
    /* The callback ran (it may run just after the wait returned). */
    for (int i = 0; i < 100 && atomic_load(&seen) == 0; i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (atomic_load(&seen) != 1) {
        fprintf(stderr, "callback saw %d\n", atomic_load(&seen));
        failures++;
    }
    EXPECT((hmc_status)atomic_load(&blocking_in_callback), HMC_ERR_STATE, NULL);
    /* A READ into read-only registered memory is refused before a byte moves. */
    static uint8_t ro[4096];
    hmc_mem_desc dro = HMC_MEM_DESC_INIT;
    dro.addr = (uint64_t)(uintptr_t)ro;
    dro.len = sizeof ro;
    dro.flags = HMC_MEM_READ_ONLY;
    hmc_mem *mro = NULL;
    EXPECT(hmc_register_mem(a, &dro, &mro), HMC_OK, NULL);
    hmc_xfer_desc into_ro = {(uint64_t)(uintptr_t)ro, (uint64_t)(uintptr_t)dst, 4096};
    EXPECT(hmc_transfer_sync(a, name_b, HMC_READ, &into_ro, 1, 1000), HMC_ERR_INVALID_ARGUMENT,
           NULL);
    EXPECT(hmc_deregister_mem(a, mro), HMC_OK, NULL);

    /* Notifications: NULL pieces, an over-long one, a list freed twice. */
    EXPECT(hmc_send_notify(a, name_b, NULL, "x", 1, 1000), HMC_ERR_INVALID_ARGUMENT, "name");
    EXPECT(hmc_send_notify(a, name_b, "n", NULL, 5, 1000), HMC_ERR_INVALID_ARGUMENT, "msg");
    EXPECT(hmc_send_notify(a, name_b, "n", src, (size_t)1 << 40, 1000), HMC_ERR_LIMIT,
           "max_notify_len");
    EXPECT(hmc_send_notify(a, name_b, "hello", "world", 5, 5000), HMC_OK, NULL);
    hmc_notify_list *list = NULL;
    size_t n = 0;
    EXPECT(hmc_get_notifies(b, &list, NULL), HMC_ERR_INVALID_ARGUMENT, "count");
    EXPECT(hmc_get_notifies(b, &list, &n), HMC_OK, NULL);
    const hmc_notify *note = NULL;
    if (n != 1) {
        fprintf(stderr, "%zu notifications\n", n);
        failures++;
    } else {
        EXPECT(hmc_notify_list_get(list, 0, &note), HMC_OK, NULL);
        if (strcmp(note->name, "hello") != 0 || note->msg_len != 5 ||
            memcmp(note->msg, "world", 5) != 0 || note->failed != NULL) {
            fprintf(stderr, "notification %s\n", note->name);
            failures++;
        }
    }
    EXPECT(hmc_notify_list_get(list, 5, &note), HMC_ERR_INVALID_ARGUMENT, "past the list");
    EXPECT(hmc_notify_list_free(list), HMC_OK, NULL);
    EXPECT(hmc_notify_list_free(list), HMC_ERR_INVALID_ARGUMENT, "closed or released");

    /* Metadata blobs. */
    EXPECT(hmc_local_metadata(b, NULL, 0, &len), HMC_ERR_BUFFER_TOO_SMALL, "metadata");
    EXPECT(hmc_add_remote(a, src, 0, 1000, NULL, 0, NULL), HMC_ERR_INVALID_ARGUMENT, "empty");
    memset(src, 0x5a, 64);
    EXPECT(hmc_add_remote(a, src, 64, 1000, NULL, 0, NULL), HMC_ERR_INVALID_ARGUMENT,
           "not a usable metadata blob");
    /* A real blob adds the peer under its name, which hmc_remove_remote takes. */
    hmc_engine *c = test_open("127.0.0.1", "tcp", "max_descs_per_transfer", "1024");
    static uint8_t blob[1 << 16];
    size_t blob_len = 0;
    EXPECT(hmc_local_metadata(b, blob, sizeof blob, &blob_len), HMC_OK, NULL);
    char added[128];
    EXPECT(hmc_add_remote(c, blob, blob_len, 5000, added, sizeof added, NULL), HMC_OK, NULL);
    if (strcmp(added, name_b) != 0) {
        fprintf(stderr, "the blob added `%s`, not `%s`\n", added, name_b);
        failures++;
    }
    EXPECT(hmc_remove_remote(c, added), HMC_OK, NULL);
    EXPECT(hmc_engine_close(c), HMC_OK, NULL);

    /* KV: unknown role and dtype, a NULL shape, a cache of another service, a double
     * deallocation, a pull from a cluster not linked. */
    hmc_datadist *dd = NULL, *dd2 = NULL;
    EXPECT(hmc_datadist_new(a, 1, 9, &dd), HMC_ERR_INVALID_ARGUMENT, "role");
    EXPECT(hmc_datadist_new(a, 1, HMC_ROLE_DECODER, &dd), HMC_OK, NULL);
    EXPECT(hmc_datadist_new(b, 2, HMC_ROLE_PROMPT, &dd2), HMC_OK, NULL);
    const uint64_t shape[2] = {4, 256};
    hmc_cache_desc cd = HMC_CACHE_DESC_INIT;
    cd.num_tensors = 2;
    cd.num_dims = 2;
    cd.dtype = 99;
    cd.shape = shape;
    hmc_kv_cache *kc = NULL, *kc2 = NULL;
    EXPECT(hmc_datadist_allocate_cache(dd, &cd, NULL, 0, NULL, &kc), HMC_ERR_INVALID_ARGUMENT,
           "dtype");
    cd.dtype = HMC_DTYPE_U8;
    cd.shape = NULL;
    EXPECT(hmc_datadist_allocate_cache(dd, &cd, NULL, 0, NULL, &kc), HMC_ERR_INVALID_ARGUMENT,
           "shape");
    cd.shape = shape;
    cd.num_dims = 1000;
    EXPECT(hmc_datadist_allocate_cache(dd, &cd, NULL, 0, NULL, &kc), HMC_ERR_LIMIT,
           "dimensions");
    cd.num_dims = 2;
    EXPECT(hmc_datadist_allocate_cache(dd, &cd, NULL, 0, NULL, &kc), HMC_OK, NULL);
    EXPECT(hmc_datadist_allocate_cache(dd2, &cd, NULL, 0, NULL, &kc2), HMC_OK, NULL);
    hmc_cache_key key = {2, 1, 1, 0};
    EXPECT(hmc_datadist_pull_cache(dd, &key, kc, 1000), HMC_ERR_NOT_CONNECTED,
           "link_clusters first");
    EXPECT(hmc_datadist_pull_cache(dd, &key, kc2, 1000), HMC_ERR_INVALID_ARGUMENT,
           "belongs to");
    EXPECT(hmc_datadist_pull_cache(dd, NULL, kc, 1000), HMC_ERR_INVALID_ARGUMENT, "src");
    uint64_t blk[1] = {9};
    EXPECT(hmc_datadist_copy_blocks(dd, kc, blk, blk, 1), HMC_ERR_INVALID_ARGUMENT, NULL);
    EXPECT(hmc_datadist_deallocate_cache(dd, kc), HMC_OK, NULL);
    EXPECT(hmc_datadist_deallocate_cache(dd, kc), HMC_ERR_INVALID_ARGUMENT,
           "closed or released");
    EXPECT(hmc_datadist_close(dd2), HMC_OK, NULL);
    EXPECT(hmc_kv_cache_tensor_addrs(dd2, kc2, NULL, 0, &len), HMC_ERR_INVALID_ARGUMENT,
           "closed or released");

    /* Close: handles of the engine die with it. */
    EXPECT(hmc_disconnect(a, name_b), HMC_OK, NULL);
    EXPECT(hmc_deregister_mem(b, mb), HMC_OK, NULL);
    EXPECT(hmc_deregister_mem(b, mb), HMC_ERR_INVALID_ARGUMENT, "closed or released");
    EXPECT(hmc_engine_close(a), HMC_OK, NULL);
    EXPECT(hmc_engine_close(a), HMC_ERR_INVALID_ARGUMENT, "closed or released");
    EXPECT(hmc_deregister_mem(a, ma), HMC_ERR_INVALID_ARGUMENT, "closed or released");
    EXPECT(hmc_transfer_sync(a, name_b, HMC_WRITE, &x, 1, 1000), HMC_ERR_INVALID_ARGUMENT,
           "closed or released");
    EXPECT(hmc_engine_close(b), HMC_OK, NULL);
    /* A service whose engine was closed. */
    EXPECT(hmc_datadist_link(dd, 2, name_b, 1000), HMC_ERR_INVALID_ARGUMENT,
           "closed or released");
    EXPECT(hmc_datadist_close(dd), HMC_OK, NULL);

    /* RPC: NULL handlers, late registration, bad addresses, closed and wrong-kind handles,
     * a double free, pending calls of another client. */
    hmc_rpc_server *srv = NULL;
    hmc_rpc_server_options so = HMC_RPC_SERVER_OPTIONS_INIT;
    so.struct_size = 2;
    EXPECT(hmc_rpc_server_new(&so, &srv), HMC_ERR_STRUCT_SIZE, "hmc_rpc_server_options");
    EXPECT(hmc_rpc_server_new(NULL, &srv), HMC_OK, NULL);
    EXPECT(hmc_rpc_server_register(srv, 7, NULL, NULL), HMC_ERR_INVALID_ARGUMENT, "handler");
    EXPECT(hmc_rpc_server_register_demo(srv), HMC_OK, NULL);
    char rpc_addr[128];
    EXPECT(hmc_rpc_server_address(srv, rpc_addr, sizeof rpc_addr, NULL), HMC_ERR_STATE,
           "not running");
    EXPECT(hmc_rpc_server_start(srv, "nowhere"), HMC_ERR_INVALID_ARGUMENT, "RPC address");
    EXPECT(hmc_rpc_server_start(srv, "tcp://127.0.0.1:0"), HMC_OK, NULL);
    EXPECT(hmc_rpc_server_start(srv, "tcp://127.0.0.1:0"), HMC_ERR_STATE, "already started");
    EXPECT(hmc_rpc_server_register_demo(srv), HMC_ERR_STATE, "before hmc_rpc_server_start");
    EXPECT(hmc_rpc_server_address(srv, rpc_addr, sizeof rpc_addr, NULL), HMC_OK, NULL);
    hmc_rpc_client *cl = NULL, *cl2 = NULL;
    EXPECT(hmc_rpc_client_connect("tcp://127.0.0.1:1", NULL, &cl), HMC_ERR_UNAVAILABLE, NULL);
    EXPECT(hmc_rpc_client_connect(rpc_addr, NULL, NULL), HMC_ERR_INVALID_ARGUMENT, "out");
    EXPECT(hmc_rpc_client_connect(rpc_addr, NULL, &cl), HMC_OK, NULL);
    EXPECT(hmc_rpc_client_connect(rpc_addr, NULL, &cl2), HMC_OK, NULL);
    EXPECT(hmc_rpc_call_sync((hmc_rpc_client *)srv, 1, "x", 1, 1000, NULL, NULL),
           HMC_ERR_INVALID_ARGUMENT, "RPC server handle");
    EXPECT(hmc_rpc_call_sync(cl, 1, NULL, 4, 1000, NULL, NULL), HMC_ERR_INVALID_ARGUMENT,
           "request");
    hmc_bytes *bytes = NULL;
    EXPECT(hmc_rpc_call_sync(cl, 1, "x", 1, 1000, &bytes, NULL), HMC_OK, NULL);
    EXPECT(hmc_bytes_free(bytes), HMC_OK, NULL);
    EXPECT(hmc_bytes_free(bytes), HMC_ERR_INVALID_ARGUMENT, "closed or released");
    const uint8_t *bdata = NULL;
    EXPECT(hmc_bytes_data(bytes, &bdata, &len), HMC_ERR_INVALID_ARGUMENT, "closed or released");
    hmc_rpc_pending *pend = NULL;
    EXPECT(hmc_rpc_call_async(cl, 1, "x", 1, 1000, NULL, NULL, &pend), HMC_OK, NULL);
    EXPECT(hmc_rpc_pending_wait(cl2, pend, 10), HMC_ERR_INVALID_ARGUMENT, "belongs to");
    EXPECT(hmc_rpc_pending_wait(cl, pend, 5000), HMC_OK, NULL);
    EXPECT(hmc_rpc_pending_release(cl, pend), HMC_OK, NULL);
    EXPECT(hmc_rpc_pending_release(cl, pend), HMC_ERR_INVALID_ARGUMENT, "closed or released");
    hmc_rpc_complex_result cr = HMC_RPC_COMPLEX_RESULT_INIT;
    cr.struct_size = 1;
    EXPECT(hmc_rpc_demo_complex(cl, "x", NULL, 0, 1000, &cr), HMC_ERR_STRUCT_SIZE,
           "hmc_rpc_complex_result");
    EXPECT(hmc_rpc_demo_uppercase(cl, "abc", 1000, rpc_addr, 2, &len), HMC_ERR_BUFFER_TOO_SMALL,
           "buffer");
    EXPECT(hmc_rpc_client_close(cl), HMC_OK, NULL);
    EXPECT(hmc_rpc_call_sync(cl, 1, "x", 1, 1000, NULL, NULL), HMC_ERR_INVALID_ARGUMENT,
           "closed or released");
    EXPECT(hmc_rpc_client_close(cl2), HMC_OK, NULL);
    EXPECT(hmc_rpc_server_close(srv), HMC_OK, NULL);
    EXPECT(hmc_rpc_server_close(srv), HMC_ERR_INVALID_ARGUMENT, "closed or released");

    printf("bad_input: %d checks, %d failed\n", checks, failures);
    return failures == 0 ? 0 : 1;
}
