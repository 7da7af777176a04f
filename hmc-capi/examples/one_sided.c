/*
 * The one-sided sample in C, as two processes:
 *
 *   one_sided server TRANSPORT           prints "READY <engine name> <buffer address>",
 *                                        then waits for the client's notification
 *   one_sided client TRANSPORT NAME ADDR READs the server's buffer and checks it, then
 *                                        WRITEs a new value (asynchronously, its completion
 *                                        seen on the engine's descriptor) and notifies
 *
 * The server checks that the WRITE arrived before exiting. TRANSPORT is tcp or shm (or
 * any transport the engine knows). Exit status 0 when every check passed.
 */
#include <hmc/hmc.h>

#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LEN 4096
#define TIMEOUT_MS 10000

static int check(hmc_status s, const char *what) {
    if (s != HMC_OK) {
        fprintf(stderr, "%s: %s: %s\n", what, hmc_status_name(s), hmc_last_error());
        exit(1);
    }
    return 0;
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

static hmc_mem *register_host(hmc_engine *e, void *buf, size_t len) {
    hmc_mem_desc d = HMC_MEM_DESC_INIT;
    d.addr = (uint64_t)(uintptr_t)buf;
    d.len = len;
    hmc_mem *m = NULL;
    check(hmc_register_mem(e, &d, &m), "hmc_register_mem");
    return m;
}

static int all_equal(const uint8_t *b, size_t len, uint8_t v) {
    for (size_t i = 0; i < len; i++) {
        if (b[i] != v) {
            fprintf(stderr, "byte %zu is %u, expected %u\n", i, b[i], v);
            return 0;
        }
    }
    return 1;
}

static int server(const char *transport) {
    hmc_engine *e = open_engine("127.0.0.1:0", transport);
    static uint8_t buf[LEN];
    memset(buf, 0x11, sizeof buf);
    hmc_mem *m = register_host(e, buf, sizeof buf);
    char name[256];
    check(hmc_engine_name(e, name, sizeof name, NULL), "hmc_engine_name");
    printf("READY %s %" PRIu64 "\n", name, (uint64_t)(uintptr_t)buf);
    fflush(stdout);

    /* Wait on the engine's descriptor for the client's notification. */
    int fd = -1;
    check(hmc_engine_fd(e, &fd), "hmc_engine_fd");
    int got = 0;
    for (int round = 0; round < 100 && !got; round++) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        poll(&p, 1, 100);
        check(hmc_engine_fd_drain(e), "hmc_engine_fd_drain");
        hmc_notify_list *list = NULL;
        size_t n = 0;
        check(hmc_get_notifies(e, &list, &n), "hmc_get_notifies");
        for (size_t i = 0; i < n; i++) {
            const hmc_notify *note = NULL;
            check(hmc_notify_list_get(list, i, &note), "hmc_notify_list_get");
            printf("[server] notification `%s` from %s: %.*s\n", note->name, note->from,
                   (int)note->msg_len, (const char *)note->msg);
            got = strcmp(note->name, "written") == 0;
        }
        check(hmc_notify_list_free(list), "hmc_notify_list_free");
    }
    if (!got) {
        fprintf(stderr, "[server] no notification within 10 s\n");
        return 1;
    }
    if (!all_equal(buf, sizeof buf, 0x22)) {
        return 1;
    }
    printf("[server] the client's WRITE arrived: every byte checked\n");
    check(hmc_deregister_mem(e, m), "hmc_deregister_mem");
    check(hmc_engine_close(e), "hmc_engine_close");
    return 0;
}

static int client(const char *transport, const char *remote, uint64_t remote_addr) {
    hmc_engine *e = open_engine("127.0.0.1", transport);
    static uint8_t buf[LEN];
    hmc_mem *m = register_host(e, buf, sizeof buf);
    check(hmc_connect(e, remote, TIMEOUT_MS), "hmc_connect");

    /* READ the server's buffer. */
    hmc_xfer_desc d = {(uint64_t)(uintptr_t)buf, remote_addr, LEN};
    check(hmc_transfer_sync(e, remote, HMC_READ, &d, 1, TIMEOUT_MS), "READ");
    if (!all_equal(buf, sizeof buf, 0x11)) {
        return 1;
    }
    printf("[client] READ %d bytes: every byte checked\n", LEN);

    /* WRITE a new value, asynchronously; its end is seen on the engine's descriptor. */
    memset(buf, 0x22, sizeof buf);
    hmc_request *req = NULL;
    check(hmc_transfer_async(e, remote, HMC_WRITE, &d, 1, TIMEOUT_MS, NULL, &req), "WRITE");
    int fd = -1;
    check(hmc_engine_fd(e, &fd), "hmc_engine_fd");
    size_t done = 0;
    for (int round = 0; round < 100 && done == 0; round++) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        poll(&p, 1, 100);
        check(hmc_engine_fd_drain(e), "hmc_engine_fd_drain");
        hmc_request *ended[4];
        check(hmc_engine_poll_completed(e, ended, 4, &done), "hmc_engine_poll_completed");
        if (done == 1 && ended[0] != req) {
            fprintf(stderr, "[client] another request completed\n");
            return 1;
        }
    }
    check(hmc_request_status(e, req, NULL), "the WRITE's status");
    hmc_telemetry t = HMC_TELEMETRY_INIT;
    check(hmc_request_telemetry(e, req, &t), "hmc_request_telemetry");
    printf("[client] WRITE %" PRIu64 " bytes in %" PRIu64 " us (completion seen on the fd)\n",
           t.bytes, t.duration_ns / 1000);
    check(hmc_request_release(e, req), "hmc_request_release");

    const char msg[] = "0x22 everywhere";
    check(hmc_send_notify(e, remote, "written", msg, strlen(msg), TIMEOUT_MS), "notify");
    check(hmc_disconnect(e, remote), "hmc_disconnect");
    check(hmc_deregister_mem(e, m), "hmc_deregister_mem");
    check(hmc_engine_close(e), "hmc_engine_close");
    return 0;
}

int main(int argc, char **argv) {
    if (hmc_api_version() >> 16 != HMC_API_VERSION_MAJOR) {
        fprintf(stderr, "libhmc API %u.%u, built for %d.%d\n", hmc_api_version() >> 16,
                hmc_api_version() & 0xffff, HMC_API_VERSION_MAJOR, HMC_API_VERSION_MINOR);
        return 1;
    }
    if (argc == 3 && strcmp(argv[1], "server") == 0) {
        return server(argv[2]);
    }
    if (argc == 5 && strcmp(argv[1], "client") == 0) {
        return client(argv[2], argv[3], strtoull(argv[4], NULL, 10));
    }
    fprintf(stderr, "usage: %s server TRANSPORT | client TRANSPORT NAME ADDR\n", argv[0]);
    return 2;
}
