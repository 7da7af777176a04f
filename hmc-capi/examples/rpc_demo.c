/*
 * The RPC demo in C, as two processes:
 *
 *   rpc_demo server tcp|unix   serves the demo methods (echo, uppercase, complex) and
 *                              methods written in C below; prints "READY <address>"
 *   rpc_demo client tcp|unix ADDRESS
 *                              calls each of them (sync, async with the completion on the
 *                              client's descriptor, a deadline, a cancel, an error status)
 *                              and checks every answer; then asks the server to stop
 *
 * Exit status 0 when every check passed on both sides.
 */
#include <hmc/hmc.h>

#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { REVERSE = 100, FAIL = 101, SLOW = 102, CANCELS_SEEN = 103, STOP = 104 };

static atomic_int cancels_seen;
static atomic_int stop;

static void die(hmc_status s, const char *what) {
    fprintf(stderr, "%s: %s: %s\n", what, hmc_status_name(s), hmc_last_error());
    exit(1);
}

#define CHECK(call)                \
    do {                           \
        hmc_status s_ = (call);    \
        if (s_ != HMC_OK) {        \
            die(s_, #call);        \
        }                          \
    } while (0)

#define EXPECT(cond)                                                   \
    do {                                                               \
        if (!(cond)) {                                                 \
            fprintf(stderr, "line %d: %s does not hold\n", __LINE__, #cond); \
            exit(1);                                                   \
        }                                                              \
    } while (0)

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- Server: methods in C -------------------------------------------------------- */

static uint32_t reverse(void *user, hmc_rpc_call *call, const uint8_t *req, size_t len) {
    (void)user;
    uint8_t *out = malloc(len > 0 ? len : 1);
    for (size_t i = 0; i < len; i++) {
        out[i] = req[len - 1 - i];
    }
    hmc_status s = hmc_rpc_respond(call, out, len);
    free(out);
    return s == HMC_OK ? HMC_RPC_OK : HMC_RPC_INTERNAL;
}

static uint32_t fail(void *user, hmc_rpc_call *call, const uint8_t *req, size_t len) {
    (void)user;
    (void)req;
    (void)len;
    const char msg[] = "no such thing";
    hmc_rpc_respond(call, msg, strlen(msg));
    return HMC_RPC_APP_STATUS + 7;
}

/* Runs until the client cancels or its deadline passes (or 5 s). */
static uint32_t slow(void *user, hmc_rpc_call *call, const uint8_t *req, size_t len) {
    (void)user;
    (void)req;
    (void)len;
    int64_t left = 0;
    hmc_rpc_call_remaining_ms(call, &left);
    for (int i = 0; i < 500; i++) {
        int cancelled = 0;
        hmc_rpc_call_cancelled(call, &cancelled);
        if (cancelled) {
            atomic_fetch_add(&cancels_seen, 1);
            return HMC_RPC_OK;
        }
        sleep_ms(10);
    }
    return HMC_RPC_OK;
}

static uint32_t count_cancels(void *user, hmc_rpc_call *call, const uint8_t *req, size_t len) {
    (void)user;
    (void)req;
    (void)len;
    int32_t n = atomic_load(&cancels_seen);
    hmc_rpc_respond(call, &n, sizeof n);
    return HMC_RPC_OK;
}

static uint32_t stop_server(void *user, hmc_rpc_call *call, const uint8_t *req, size_t len) {
    (void)user;
    (void)call;
    (void)req;
    (void)len;
    atomic_store(&stop, 1);
    return HMC_RPC_OK;
}

static int server(const char *kind) {
    hmc_rpc_server *srv = NULL;
    hmc_rpc_server_options o = HMC_RPC_SERVER_OPTIONS_INIT;
    o.workers = 4;
    CHECK(hmc_rpc_server_new(&o, &srv));
    CHECK(hmc_rpc_server_register_demo(srv));
    CHECK(hmc_rpc_server_register(srv, REVERSE, reverse, NULL));
    CHECK(hmc_rpc_server_register(srv, FAIL, fail, NULL));
    CHECK(hmc_rpc_server_register(srv, SLOW, slow, NULL));
    CHECK(hmc_rpc_server_register(srv, CANCELS_SEEN, count_cancels, NULL));
    CHECK(hmc_rpc_server_register(srv, STOP, stop_server, NULL));
    char addr[256];
    if (strcmp(kind, "unix") == 0) {
        snprintf(addr, sizeof addr, "unix:///tmp/hmc-rpc-demo-%ld.sock", (long)getpid());
    } else {
        snprintf(addr, sizeof addr, "tcp://127.0.0.1:0");
    }
    CHECK(hmc_rpc_server_start(srv, addr));
    CHECK(hmc_rpc_server_address(srv, addr, sizeof addr, NULL));
    printf("READY %s\n", addr);
    fflush(stdout);
    for (int i = 0; i < 6000 && !atomic_load(&stop); i++) {
        sleep_ms(10);
    }
    CHECK(hmc_rpc_server_close(srv));
    if (strncmp(addr, "unix://", 7) == 0) {
        unlink(addr + 7);
    }
    printf("[server] stopped; saw %d cancelled call(s)\n", atomic_load(&cancels_seen));
    return atomic_load(&stop) ? 0 : 1;
}

/* ---- Client ----------------------------------------------------------------------- */

static atomic_int callbacks;

static void on_done(void *user, hmc_rpc_pending *call, int status) {
    (void)user;
    (void)call;
    if (status == HMC_OK) {
        atomic_fetch_add(&callbacks, 1);
    }
}

static int client(const char *addr) {
    hmc_rpc_client *c = NULL;
    CHECK(hmc_rpc_client_connect(addr, NULL, &c));

    /* echo, raw bytes */
    hmc_bytes *resp = NULL;
    const uint8_t *data = NULL;
    size_t len = 0;
    CHECK(hmc_rpc_call_sync(c, HMC_RPC_DEMO_ECHO, "hello", 5, 5000, &resp, NULL));
    CHECK(hmc_bytes_data(resp, &data, &len));
    EXPECT(len == 5 && memcmp(data, "hello", 5) == 0);
    CHECK(hmc_bytes_free(resp));

    /* uppercase and complex, typed */
    char upper[64];
    CHECK(hmc_rpc_demo_uppercase(c, "hello world", 5000, upper, sizeof upper, NULL));
    EXPECT(strcmp(upper, "HELLO WORLD") == 0);
    int64_t values[] = {3, -1, 4};
    hmc_rpc_complex_result r = HMC_RPC_COMPLEX_RESULT_INIT;
    CHECK(hmc_rpc_demo_complex(c, "pi", values, 3, 5000, &r));
    EXPECT(r.count == 3 && r.sum == 6 && r.has_values && r.min == -1 && r.max == 4);
    printf("[client] echo, uppercase (%s) and complex (sum %lld, mean %.2f) answered\n", upper,
           (long long)r.sum, r.mean);

    /* a method written in C */
    CHECK(hmc_rpc_call_sync(c, REVERSE, "abc", 3, 5000, &resp, NULL));
    CHECK(hmc_bytes_data(resp, &data, &len));
    EXPECT(len == 3 && memcmp(data, "cba", 3) == 0);
    CHECK(hmc_bytes_free(resp));

    /* an error status and its message */
    uint32_t code = 0;
    hmc_status s = hmc_rpc_call_sync(c, FAIL, NULL, 0, 5000, NULL, &code);
    EXPECT(s == HMC_ERR_REMOTE && code == HMC_RPC_APP_STATUS + 7);
    EXPECT(strstr(hmc_last_error(), "no such thing") != NULL);
    s = hmc_rpc_call_sync(c, 9999, NULL, 0, 5000, NULL, &code);
    EXPECT(s == HMC_ERR_REMOTE && code == 1 /* UNKNOWN_METHOD */);

    /* a deadline: the call ends HMC_ERR_DEADLINE and the server's handler sees it */
    s = hmc_rpc_call_sync(c, SLOW, NULL, 0, 200, NULL, NULL);
    EXPECT(s == HMC_ERR_DEADLINE);

    /* async calls, their completions collected on the client's descriptor */
    enum { N = 16 };
    hmc_rpc_pending *calls[N];
    for (int i = 0; i < N; i++) {
        CHECK(hmc_rpc_call_async(c, HMC_RPC_DEMO_ECHO, &i, sizeof i, 5000, on_done, NULL,
                                 &calls[i]));
    }
    int fd = -1;
    CHECK(hmc_rpc_client_fd(c, &fd));
    int seen = 0;
    for (int round = 0; round < 500 && seen < N; round++) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        poll(&p, 1, 10);
        CHECK(hmc_rpc_client_fd_drain(c));
        hmc_rpc_pending *done[N];
        size_t n = 0;
        CHECK(hmc_rpc_client_poll_completed(c, done, N, &n));
        for (size_t k = 0; k < n; k++) {
            CHECK(hmc_rpc_pending_take(c, done[k], &resp, NULL));
            CHECK(hmc_bytes_data(resp, &data, &len));
            int i = -1;
            EXPECT(len == sizeof i);
            memcpy(&i, data, sizeof i);
            EXPECT(i >= 0 && i < N && calls[i] == done[k]);
            CHECK(hmc_bytes_free(resp));
            CHECK(hmc_rpc_pending_release(c, done[k]));
            seen++;
        }
    }
    EXPECT(seen == N);
    for (int i = 0; i < 100 && atomic_load(&callbacks) < N; i++) {
        sleep_ms(10);
    }
    EXPECT(atomic_load(&callbacks) == N);
    printf("[client] %d async echoes seen on the fd, %d callbacks\n", seen, N);

    /* a cancel */
    hmc_rpc_pending *p = NULL;
    CHECK(hmc_rpc_call_async(c, SLOW, NULL, 0, 10000, NULL, NULL, &p));
    EXPECT(hmc_rpc_pending_wait(c, p, 50) == HMC_PENDING);
    CHECK(hmc_rpc_pending_cancel(c, p));
    EXPECT(hmc_rpc_pending_wait(c, p, 5000) == HMC_ERR_CANCELLED);
    CHECK(hmc_rpc_pending_release(c, p));
    EXPECT(hmc_rpc_pending_release(c, p) == HMC_ERR_INVALID_ARGUMENT);

    /* the server saw both the deadline and the cancel */
    int32_t n = 0;
    for (int i = 0; i < 100 && n < 2; i++) {
        CHECK(hmc_rpc_call_sync(c, CANCELS_SEEN, NULL, 0, 5000, &resp, NULL));
        CHECK(hmc_bytes_data(resp, &data, &len));
        EXPECT(len == sizeof n);
        memcpy(&n, data, sizeof n);
        CHECK(hmc_bytes_free(resp));
        sleep_ms(10);
    }
    EXPECT(n == 2);
    printf("[client] a deadline and a cancel, both seen by the server's handler\n");

    CHECK(hmc_rpc_call_sync(c, STOP, NULL, 0, 5000, NULL, NULL));
    CHECK(hmc_rpc_client_close(c));
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "server") == 0) {
        return server(argv[2]);
    }
    if (argc == 4 && strcmp(argv[1], "client") == 0) {
        return client(argv[3]);
    }
    fprintf(stderr, "usage: %s server tcp|unix | client tcp|unix ADDRESS\n", argv[0]);
    return 2;
}
