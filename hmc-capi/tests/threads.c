/*
 * Eight threads posting asynchronous transfers on one engine: the even ones wait for each
 * of theirs (hmc_request_wait) and release it; the odd ones post and move on, and the main
 * thread, waiting on the engine's descriptor, collects those with hmc_engine_poll_completed
 * and releases them. Every request also has a callback. Each odd thread's request must be
 * seen on the descriptor exactly once, every callback must run once, and every byte must
 * arrive. Exit status 0 when all of that held.
 */
#include "common.h"

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 8
#define PER_THREAD 40
#define SLICE 4096

static hmc_engine *a;
static char peer[128];
static uint8_t src[THREADS][SLICE];
static uint8_t dst[THREADS][SLICE];
static atomic_int callbacks;
static atomic_int failures;
/* Requests posted by the odd threads, which the main thread releases. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static hmc_request *unwaited[THREADS * PER_THREAD];
static int num_unwaited;

/* Takes `r` out of the odd threads' requests; 0 if it is not one. */
static int take_unwaited(hmc_request *r) {
    int found = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < num_unwaited; i++) {
        if (unwaited[i] == r) {
            unwaited[i] = unwaited[--num_unwaited];
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return found;
}

static void on_done(void *user, hmc_request *req, int status) {
    (void)user;
    (void)req;
    if (status != HMC_OK) {
        atomic_fetch_add(&failures, 1);
    }
    atomic_fetch_add(&callbacks, 1);
}

static void *poster(void *arg) {
    int t = (int)(intptr_t)arg;
    hmc_transfer_args args = HMC_TRANSFER_ARGS_INIT;
    args.callback = on_done;
    for (int i = 0; i < PER_THREAD; i++) {
        if (t % 2 == 0) {
            memset(src[t], (t * PER_THREAD + i) & 0xff, SLICE);
        }
        hmc_xfer_desc d = {(uint64_t)(uintptr_t)src[t], (uint64_t)(uintptr_t)dst[t], SLICE};
        hmc_request *r = NULL;
        pthread_mutex_lock(&lock);
        hmc_status s = hmc_transfer_async(a, peer, HMC_WRITE, &d, 1, 10000, &args, &r);
        if (s == HMC_OK && t % 2 == 1) {
            unwaited[num_unwaited++] = r;
        }
        pthread_mutex_unlock(&lock);
        if (s != HMC_OK) {
            fprintf(stderr, "thread %d: post: %s\n", t, hmc_last_error());
            atomic_fetch_add(&failures, 1);
            return NULL;
        }
        if (t % 2 == 1) {
            continue;
        }
        s = hmc_request_wait(a, r, 10000);
        if (s != HMC_OK || dst[t][SLICE - 1] != src[t][0] ||
            hmc_request_release(a, r) != HMC_OK) {
            fprintf(stderr, "thread %d: wait: %s %s\n", t, hmc_status_name(s), hmc_last_error());
            atomic_fetch_add(&failures, 1);
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    const char *transport = argc > 1 ? argv[1] : "tcp";
    a = test_open("127.0.0.1", transport, NULL, NULL);
    hmc_engine *b = test_open("127.0.0.1:0", transport, NULL, NULL);
    if (hmc_engine_name(b, peer, sizeof peer, NULL) != HMC_OK) {
        return 1;
    }
    hmc_mem_desc d = HMC_MEM_DESC_INIT;
    hmc_mem *ma = NULL, *mb = NULL;
    d.addr = (uint64_t)(uintptr_t)src;
    d.len = sizeof src;
    if (hmc_register_mem(a, &d, &ma) != HMC_OK) {
        return 1;
    }
    d.addr = (uint64_t)(uintptr_t)dst;
    d.len = sizeof dst;
    if (hmc_register_mem(b, &d, &mb) != HMC_OK || hmc_connect(a, peer, 10000) != HMC_OK) {
        fprintf(stderr, "setup: %s\n", hmc_last_error());
        return 1;
    }
    int fd = -1;
    hmc_engine_fd(a, &fd);
    for (int t = 1; t < THREADS; t += 2) {
        memset(src[t], 0x40 + t, SLICE);
    }
    pthread_t threads[THREADS];
    for (int t = 0; t < THREADS; t++) {
        pthread_create(&threads[t], NULL, poster, (void *)(intptr_t)t);
    }
    const int want = THREADS / 2 * PER_THREAD;
    int seen = 0;
    for (int round = 0; round < 3000 && seen < want; round++) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        poll(&p, 1, 10);
        hmc_engine_fd_drain(a);
        hmc_request *done[64];
        size_t n = 0;
        if (hmc_engine_poll_completed(a, done, 64, &n) != HMC_OK) {
            fprintf(stderr, "poll_completed: %s\n", hmc_last_error());
            return 1;
        }
        for (size_t i = 0; i < n; i++) {
            /* An even thread's request is its own to release (it may be gone already). */
            if (!take_unwaited(done[i])) {
                continue;
            }
            seen++;
            if (hmc_request_status(a, done[i], NULL) != HMC_OK ||
                hmc_request_release(a, done[i]) != HMC_OK) {
                fprintf(stderr, "main: %s\n", hmc_last_error());
                atomic_fetch_add(&failures, 1);
            }
        }
    }
    for (int t = 0; t < THREADS; t++) {
        pthread_join(threads[t], NULL);
    }
    for (int i = 0; i < 100 && atomic_load(&callbacks) < THREADS * PER_THREAD; i++) {
        struct pollfd p = {.fd = -1};
        poll(&p, 0, 10);
    }
    for (int t = 1; t < THREADS; t += 2) {
        if (dst[t][0] != 0x40 + t || dst[t][SLICE - 1] != 0x40 + t) {
            fprintf(stderr, "thread %d's bytes did not arrive\n", t);
            atomic_fetch_add(&failures, 1);
        }
    }
    hmc_deregister_mem(a, ma);
    hmc_deregister_mem(b, mb);
    hmc_engine_close(a);
    hmc_engine_close(b);
    printf("threads: %d requests on %d threads over %s: %d of %d unwaited ones seen on the fd, "
           "%d callbacks, %d failures\n",
           THREADS * PER_THREAD, THREADS, transport, seen, want, atomic_load(&callbacks),
           atomic_load(&failures));
    return seen == want && atomic_load(&callbacks) == THREADS * PER_THREAD &&
                   atomic_load(&failures) == 0
               ? 0
               : 1;
}
