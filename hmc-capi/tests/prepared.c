/*
 * Prepared lists and index transfers through the C ABI: strided lists on both sides, a
 * WRITE pairing the entries in reverse with a notification, its end seen on the engine's
 * descriptor, its telemetry, a second post of the same transfer, and the misuses (an
 * index out of range, lists swapped, a list of another engine, a status before the first
 * post, a post after release). Exit status 0 when every expectation held.
 */
#include "common.h"

#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BLOCKS = 8, BLOCK = 1024, STRIDE = 4096, SIZE = BLOCKS * STRIDE };

static int failures = 0;

#define EXPECT(call, want)                                                                   \
    do {                                                                                     \
        hmc_status got_ = (call);                                                            \
        if (got_ != (want)) {                                                                \
            fprintf(stderr, "line %d: %s returned %s, expected %s (%s)\n", __LINE__, #call,  \
                    hmc_status_name(got_), hmc_status_name(want), hmc_last_error());         \
            failures++;                                                                      \
        }                                                                                    \
    } while (0)

static uint8_t src[SIZE], dst[SIZE];

int main(void) {
    hmc_engine *a = test_open("127.0.0.1", "tcp", NULL, NULL), *b = test_open("127.0.0.1:0", "tcp", NULL, NULL);
    char peer[128];
    hmc_engine_name(b, peer, sizeof peer, NULL);
    hmc_mem_desc d = HMC_MEM_DESC_INIT;
    hmc_mem *ma = NULL, *mb = NULL;
    d.addr = (uintptr_t)src;
    d.len = SIZE;
    EXPECT(hmc_register_mem(a, &d, &ma), HMC_OK);
    d.addr = (uintptr_t)dst;
    EXPECT(hmc_register_mem(b, &d, &mb), HMC_OK);
    EXPECT(hmc_connect(a, peer, 5000), HMC_OK);
    for (int i = 0; i < BLOCKS; i++) {
        memset(src + i * STRIDE, 'A' + i, BLOCK);
    }

    hmc_block_desc ls = {(uintptr_t)src, BLOCK, STRIDE, BLOCKS};
    hmc_block_desc rs = {(uintptr_t)dst, BLOCK, STRIDE, BLOCKS};
    hmc_prepped *local = NULL, *remote = NULL, *other = NULL;
    EXPECT(hmc_prep_local(a, &ls, 1, &local), HMC_OK);
    EXPECT(hmc_prep_remote(a, peer, &rs, 1, 5000, &remote), HMC_OK);
    uint64_t n = 0;
    EXPECT(hmc_prepped_len(a, local, &n), HMC_OK);
    if (n != BLOCKS) {
        fprintf(stderr, "the strided list has %llu entries\n", (unsigned long long)n);
        failures++;
    }
    hmc_block_desc outside = {(uintptr_t)dst + SIZE, BLOCK, 0, 1};
    EXPECT(hmc_prep_remote(a, peer, &outside, 1, 5000, &other), HMC_ERR_NOT_REGISTERED);
    hmc_block_desc zero = {(uintptr_t)src, BLOCK, STRIDE, 0};
    EXPECT(hmc_prep_local(a, &zero, 1, &other), HMC_ERR_INVALID_ARGUMENT);

    /* Entry i of the local list to entry BLOCKS-1-i of the remote one, with a notification. */
    uint64_t li[BLOCKS], ri[BLOCKS];
    for (int i = 0; i < BLOCKS; i++) {
        li[i] = (uint64_t)i;
        ri[i] = (uint64_t)(BLOCKS - 1 - i);
    }
    hmc_xfer *x = NULL, *bad = NULL;
    EXPECT(hmc_make_xfer(a, HMC_WRITE, local, li, remote, ri, BLOCKS, "kv-done", "7", 1, &x),
           HMC_OK);
    EXPECT(hmc_xfer_status(a, x, NULL), HMC_ERR_STATE);
    int fd = -1;
    hmc_engine_fd(a, &fd);
    EXPECT(hmc_engine_fd_drain(a), HMC_OK);
    EXPECT(hmc_xfer_post(a, x), HMC_OK);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 5000) != 1) {
        fprintf(stderr, "the post's end did not make the descriptor readable\n");
        failures++;
    }
    EXPECT(hmc_xfer_wait(a, x, 5000), HMC_OK);
    uint32_t state = 9;
    EXPECT(hmc_xfer_status(a, x, &state), HMC_OK);
    for (int i = 0; i < BLOCKS; i++) {
        if (dst[(BLOCKS - 1 - i) * STRIDE] != 'A' + i ||
            dst[(BLOCKS - 1 - i) * STRIDE + BLOCK - 1] != 'A' + i ||
            dst[(BLOCKS - 1 - i) * STRIDE + BLOCK] != 0) {
            fprintf(stderr, "block %d did not land in reverse order\n", i);
            failures++;
        }
    }
    hmc_telemetry t = HMC_TELEMETRY_INIT;
    EXPECT(hmc_xfer_telemetry(a, x, &t), HMC_OK);
    if (state != HMC_REQUEST_COMPLETED || t.bytes != BLOCKS * BLOCK || t.descs != BLOCKS) {
        fprintf(stderr, "state %u, telemetry %llu bytes in %llu runs\n", state,
                (unsigned long long)t.bytes, (unsigned long long)t.descs);
        failures++;
    }
    hmc_notify_list *list = NULL;
    size_t count = 0;
    EXPECT(hmc_get_notifies(b, &list, &count), HMC_OK);
    const hmc_notify *note = NULL;
    if (count != 1 || hmc_notify_list_get(list, 0, &note) != HMC_OK ||
        strcmp(note->name, "kv-done") != 0 || note->msg_len != 1 || note->msg[0] != '7') {
        fprintf(stderr, "%zu notifications after the post\n", count);
        failures++;
    }
    hmc_notify_list_free(list);
    /* The same transfer again. */
    memset(dst, 0, sizeof dst);
    EXPECT(hmc_xfer_post(a, x), HMC_OK);
    EXPECT(hmc_xfer_wait(a, x, 5000), HMC_OK);
    if (dst[0] != 'A' + BLOCKS - 1) {
        fprintf(stderr, "the second post did not move the bytes\n");
        failures++;
    }

    /* Misuses. */
    uint64_t past[1] = {BLOCKS};
    EXPECT(hmc_make_xfer(a, HMC_WRITE, local, past, remote, li, 1, NULL, NULL, 0, &bad),
           HMC_ERR_INVALID_ARGUMENT);
    EXPECT(hmc_make_xfer(a, HMC_WRITE, remote, li, local, ri, 1, NULL, NULL, 0, &bad),
           HMC_ERR_INVALID_ARGUMENT);
    hmc_prepped *b_local = NULL;
    EXPECT(hmc_prep_local(b, &rs, 1, &b_local), HMC_OK);
    EXPECT(hmc_make_xfer(a, HMC_WRITE, b_local, li, remote, ri, 1, NULL, NULL, 0, &bad),
           HMC_ERR_INVALID_ARGUMENT);
    EXPECT(hmc_prepped_release(a, b_local), HMC_ERR_INVALID_ARGUMENT);
    EXPECT(hmc_prepped_release(b, b_local), HMC_OK);
    EXPECT(hmc_xfer_release(a, x), HMC_OK);
    EXPECT(hmc_xfer_post(a, x), HMC_ERR_INVALID_ARGUMENT);
    EXPECT(hmc_xfer_release(a, x), HMC_ERR_INVALID_ARGUMENT);
    EXPECT(hmc_prepped_release(a, local), HMC_OK);
    EXPECT(hmc_prepped_release(a, remote), HMC_OK);
    EXPECT(hmc_deregister_mem(a, ma), HMC_OK);
    EXPECT(hmc_deregister_mem(b, mb), HMC_OK);
    EXPECT(hmc_engine_close(a), HMC_OK);
    EXPECT(hmc_engine_close(b), HMC_OK);
    printf("prepared: %d failed\n", failures);
    return failures == 0 ? 0 : 1;
}
