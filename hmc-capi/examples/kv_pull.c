/*
 * A KV-cache pull between a prompt and a decoder process, in LLM-DataDist's model:
 *
 *   kv_pull server TRANSPORT                  the prompt cluster (1): allocates a paged
 *                                             cache of 2 layers (K and V each), fills it,
 *                                             publishes it under a request key and a
 *                                             blocks key; prints "READY <engine name>"
 *   kv_pull client TRANSPORT NAME             the decoder cluster (2): links cluster 1,
 *                                             pulls the whole cache, then three blocks of
 *                                             layer 0 only into other block positions,
 *                                             copies a block locally, is refused a pull
 *                                             into a cache of another layout; checks every
 *                                             byte and tells the prompt it is done
 *
 * Exit status 0 when every check passed on both sides.
 */
#include <hmc/hmc.h>

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PROMPT = 1, DECODER = 2, TENSORS = 4, BLOCKS = 8, ROWS = 16, COLS = 64 };
#define BLOCK_BYTES (ROWS * COLS * 2) /* f16 */
#define TIMEOUT_MS 10000

static const hmc_cache_key REQUEST = {PROMPT, 42, 7, 0};
static const hmc_blocks_key MODEL_BLOCKS = {PROMPT, 7};

static void check(hmc_status s, const char *what) {
    if (s != HMC_OK) {
        fprintf(stderr, "%s: %s: %s\n", what, hmc_status_name(s), hmc_last_error());
        exit(1);
    }
}

static void expect(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "expected: %s\n", what);
        exit(1);
    }
}

static hmc_engine *open_engine(const char *local, const char *transport) {
    hmc_option opts[] = {{"transport", transport}};
    hmc_engine_options o = HMC_ENGINE_OPTIONS_INIT;
    o.options = opts;
    o.num_options = 1;
    hmc_engine *e = NULL;
    check(hmc_engine_open(local, &o, &e), "hmc_engine_open");
    return e;
}

static hmc_cache_desc cache_desc(const uint64_t *shape, uint32_t dtype) {
    hmc_cache_desc d = HMC_CACHE_DESC_INIT;
    d.num_tensors = TENSORS;
    d.dtype = dtype;
    d.num_dims = 3;
    d.shape = shape;
    return d;
}

/* The byte every position of block b of tensor t holds at the prompt. */
static uint8_t pattern(int t, int b) { return (uint8_t)(t * 16 + b + 1); }

static void tensors(hmc_datadist *dd, hmc_kv_cache *c, uint8_t **out) {
    uint64_t addrs[TENSORS];
    size_t n = 0;
    check(hmc_kv_cache_tensor_addrs(dd, c, addrs, TENSORS, &n), "tensor addresses");
    expect(n == TENSORS, "one address per tensor");
    for (int t = 0; t < TENSORS; t++) {
        out[t] = (uint8_t *)(uintptr_t)addrs[t];
    }
}

static int block_is(const uint8_t *tensor, int b, uint8_t v) {
    for (int i = 0; i < BLOCK_BYTES; i++) {
        if (tensor[b * BLOCK_BYTES + i] != v) {
            return 0;
        }
    }
    return 1;
}

static int server(const char *transport) {
    hmc_engine *e = open_engine("127.0.0.1:0", transport);
    hmc_datadist *dd = NULL;
    check(hmc_datadist_new(e, PROMPT, HMC_ROLE_PROMPT, &dd), "hmc_datadist_new");
    const uint64_t shape[3] = {BLOCKS, ROWS, COLS};
    hmc_cache_desc d = cache_desc(shape, HMC_DTYPE_F16);
    hmc_kv_cache *cache = NULL;
    check(hmc_datadist_allocate_cache(dd, &d, &REQUEST, 1, &MODEL_BLOCKS, &cache), "allocate");
    uint8_t *t[TENSORS];
    tensors(dd, cache, t);
    for (int i = 0; i < TENSORS; i++) {
        for (int b = 0; b < BLOCKS; b++) {
            memset(t[i] + b * BLOCK_BYTES, pattern(i, b), BLOCK_BYTES);
        }
    }
    char name[256];
    check(hmc_engine_name(e, name, sizeof name, NULL), "hmc_engine_name");
    printf("READY %s\n", name);
    fflush(stdout);

    int fd = -1, done = 0;
    check(hmc_engine_fd(e, &fd), "hmc_engine_fd");
    for (int round = 0; round < 100 && !done; round++) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        poll(&p, 1, 100);
        check(hmc_engine_fd_drain(e), "drain");
        hmc_notify_list *list = NULL;
        size_t n = 0;
        check(hmc_get_notifies(e, &list, &n), "hmc_get_notifies");
        done = n > 0;
        check(hmc_notify_list_free(list), "hmc_notify_list_free");
    }
    expect(done, "the decoder said it pulled");
    printf("[prompt] the decoder pulled the cache\n");
    check(hmc_datadist_deallocate_cache(dd, cache), "deallocate");
    check(hmc_datadist_close(dd), "hmc_datadist_close");
    check(hmc_engine_close(e), "hmc_engine_close");
    return 0;
}

static int client(const char *transport, const char *prompt) {
    hmc_engine *e = open_engine("127.0.0.1", transport);
    hmc_datadist *dd = NULL;
    check(hmc_datadist_new(e, DECODER, HMC_ROLE_DECODER, &dd), "hmc_datadist_new");
    check(hmc_datadist_link(dd, PROMPT, prompt, TIMEOUT_MS), "hmc_datadist_link");

    /* The whole cache. */
    const uint64_t shape[3] = {BLOCKS, ROWS, COLS};
    hmc_cache_desc d = cache_desc(shape, HMC_DTYPE_F16);
    hmc_kv_cache *whole = NULL;
    check(hmc_datadist_allocate_cache(dd, &d, NULL, 0, NULL, &whole), "allocate");
    check(hmc_datadist_pull_cache(dd, &REQUEST, whole, TIMEOUT_MS), "pull_cache");
    uint8_t *t[TENSORS];
    tensors(dd, whole, t);
    for (int i = 0; i < TENSORS; i++) {
        for (int b = 0; b < BLOCKS; b++) {
            expect(block_is(t[i], b, pattern(i, b)), "every block of the whole cache");
        }
    }
    printf("[decoder] pulled the whole cache: %d tensors x %d blocks checked\n", TENSORS,
           BLOCKS);

    /* Blocks 5, 6, 7 of layer 0 (tensors 0 and 1) into blocks 0, 1, 2 of a smaller cache. */
    const uint64_t small_shape[3] = {4, ROWS, COLS};
    hmc_cache_desc ds = cache_desc(small_shape, HMC_DTYPE_F16);
    hmc_kv_cache *small = NULL;
    check(hmc_datadist_allocate_cache(dd, &ds, NULL, 0, NULL, &small), "allocate small");
    const uint64_t src[3] = {5, 6, 7}, dst[3] = {0, 1, 2};
    hmc_kv_layers layer0 = HMC_KV_LAYERS_INIT;
    layer0.layer_begin = 0;
    layer0.layer_end = 1;
    check(hmc_datadist_pull_blocks(dd, &MODEL_BLOCKS, small, src, dst, 3, &layer0, TIMEOUT_MS),
          "pull_blocks");
    tensors(dd, small, t);
    for (int i = 0; i < TENSORS; i++) {
        for (int k = 0; k < 3; k++) {
            expect(block_is(t[i], (int)dst[k], i < 2 ? pattern(i, (int)src[k]) : 0),
                   "layer 0's blocks arrived, layer 1's did not move");
        }
    }
    /* A local copy: block 2 to block 3. */
    const uint64_t from[1] = {2}, to[1] = {3};
    check(hmc_datadist_copy_blocks(dd, small, from, to, 1), "copy_blocks");
    expect(block_is(t[0], 3, pattern(0, 7)), "the copied block");
    printf("[decoder] pulled 3 blocks of layer 0 and copied one locally: checked\n");

    /* A cache of another layout is refused, naming both sides. */
    hmc_cache_desc df = cache_desc(shape, HMC_DTYPE_F32);
    hmc_kv_cache *other = NULL;
    check(hmc_datadist_allocate_cache(dd, &df, NULL, 0, NULL, &other), "allocate f32");
    hmc_status s = hmc_datadist_pull_cache(dd, &REQUEST, other, TIMEOUT_MS);
    expect(s == HMC_ERR_INVALID_ARGUMENT && strstr(hmc_last_error(), "dtype local F32") != NULL,
           "a layout mismatch names both dtypes");

    check(hmc_send_notify(e, prompt, "pulled", "", 0, TIMEOUT_MS), "notify");
    check(hmc_datadist_deallocate_cache(dd, other), "deallocate");
    check(hmc_datadist_deallocate_cache(dd, small), "deallocate");
    check(hmc_datadist_deallocate_cache(dd, whole), "deallocate");
    check(hmc_datadist_unlink(dd, PROMPT), "unlink");
    check(hmc_datadist_close(dd), "hmc_datadist_close");
    check(hmc_engine_close(e), "hmc_engine_close");
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "server") == 0) {
        return server(argv[2]);
    }
    if (argc == 4 && strcmp(argv[1], "client") == 0) {
        return client(argv[2], argv[3]);
    }
    fprintf(stderr, "usage: %s server TRANSPORT | client TRANSPORT PROMPT_ENGINE\n", argv[0]);
    return 2;
}
