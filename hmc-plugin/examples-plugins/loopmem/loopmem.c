/*
 * loopmem: an HMC transport plugin in plain C (C11, no dependency but libc and pthreads).
 *
 * A host-memory transport between communicators of one process: one-sided READ and WRITE
 * are memcpy in chunks on a worker thread per communicator, so transfers are truly
 * asynchronous (transfer_start returns at once, the eventfd says when to poll), end by
 * their deadline and stop on cancel between chunks, and deregistration waits for copies
 * in flight. Each communicator binds a real Unix socket as its address (so the address
 * names something on this host that belongs to its user), but data never crosses it:
 * connect finds the peer in the process's table, and refuses peers of other processes.
 *
 * The keys carry a random 64-bit secret checked at the target, so a key with any byte
 * changed is refused. Everything shared is guarded by one process-wide mutex; memcpy runs
 * outside it with the target registration pinned.
 *
 * It also provides a memory backend: "device" memory of a third-party device kind that is
 * host memory underneath (malloc and memmove), the smallest thing the memory kit accepts.
 *
 * Built by hmc-plugin's tests with `cc -std=c11 -Wall -Wextra -Werror -shared -fPIC`.
 * The BROKEN_* macros build the deliberately broken variants the tests refuse, and the
 * ones hmc-plugin-kit's tests show failing its cases (BROKEN_CRASH_ON_TRANSFER,
 * BROKEN_HANG_ON_TRANSFER, BROKEN_IGNORES_OUT_SIZE, BROKEN_UNBOUNDED_NOTIFY,
 * BROKEN_LATE_BYTES).
 *
 * When a transfer ends (ABI 1.3): transfer_poll reports a result only once the worker
 * stopped copying (it checks cancel and the deadline between chunks), and
 * transfer_release waits for the chunk in flight, so no byte lands in either side's memory
 * after the end; the copy happens in this process, so endpoint_settle is not needed.
 */
#define _GNU_SOURCE
#include "hmc_plugin.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#ifndef LOOPMEM_NAME
#define LOOPMEM_NAME "loopmem"
#endif

#ifdef TEST_CONSTRUCTOR_MARK
/* Tests only: shows whether the loader ran this library's constructors (it must not for
 * a file it refuses). Writes the file $HMC_TEST_CONSTRUCTOR_MARK when loaded. */
__attribute__((constructor)) static void loopmem_mark_loaded(void) {
    const char *mark = getenv("HMC_TEST_CONSTRUCTOR_MARK");
    if (mark) {
        FILE *f = fopen(mark, "w");
        if (f) {
            fclose(f);
        }
    }
}
#endif
/* A third-party wire number (128-255): see docs/backend-guide.md, "Ids". */
#define LOOPMEM_TRANSPORT_ID 200
#define LOOPMEM_CHUNK (256u * 1024u)
#define LOOPMEM_MAX_NOTIFY_LEN 4096u
#define LOOPMEM_DEFAULT_MAX_PENDING 4096u
#define LOOPMEM_MAX_BATCH 4096u
#define LOOPMEM_KEY_LEN 24u
/* A third-party device kind (128-255) for the memory backend. */
#define LOOPMEM_DEVICE_KIND 200u
#define LOOPMEM_MAX_ALLOC (1ull << 30)
#ifdef BROKEN_LATE_BYTES
/* Broken on purpose: a transfer goes on copying after it was reported ended (released, or
 * past its deadline), the late bytes ABI 1.3 forbids. */
#define LM_STOPS_AT_END 0
#else
#define LM_STOPS_AT_END 1
#endif

static _Thread_local char last_err[512];

static const char *lm_last_error(void) { return last_err; }

static int32_t fail(int32_t code, const char *fmt, ...) {
#ifdef BROKEN_NO_MESSAGE
    (void)fmt;
    last_err[0] = 0;
#else
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_err, sizeof last_err, fmt, ap);
    va_end(ap);
#endif
    return code;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static const HmcHostApi *host_api;

static void lm_log(uint32_t level, const char *msg) {
    if (host_api && host_api->log) host_api->log(level, (const uint8_t *)msg, strlen(msg));
}

struct lm_comm;

struct lm_reg {
    struct lm_comm *owner;
    uint64_t id, secret, addr, len;
    uint32_t access;
    int live, pins;
    struct lm_reg *next;
};

struct lm_note {
    struct lm_note *next;
    uint64_t tag;
    char from[128];
    size_t from_len, len;
    uint8_t msg[];
};

struct lm_xdesc {
    struct lm_reg *local;
    uint64_t local_off, reg_id, secret, remote_off, len;
};

struct lm_xfer {
    struct lm_comm *comm;
    uint64_t peer_id, deadline;
    uint32_t op;
    size_t count;
    struct lm_xdesc *descs;
    int state; /* 0 queued, 1 running, 2 done, 3 never queued */
    int cancel;
    int orphan; /* BROKEN_LATE_BYTES: released while running; the worker frees it */
    int32_t result;
    char err[256];
    struct lm_xfer *next;
};

struct lm_comm {
    uint64_t id;
    char address[128];
    char path[108];
    int listen_fd, efd, closed, stopping;
    size_t max_pending, pending;
    struct lm_reg *regs;
    struct lm_note *notes_head, *notes_tail;
    struct lm_xfer *queue_head, *queue_tail;
    pthread_t worker;
    pthread_cond_t work_cv;
    struct lm_comm *next;
};

struct lm_ep { uint64_t peer_id; };
struct lm_rkey { uint64_t peer_id, reg_id, secret; };

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

/* The socket files of loopmem processes that were killed (a kit case that crashed or hung
 * on purpose) are left in the folder: the first communicator a process opens removes those
 * whose process is gone. */
static pthread_once_t g_sweep_once = PTHREAD_ONCE_INIT;

static void lm_sweep_dead(void) {
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int pid = 0;
        unsigned long long n = 0;
        char tail[8] = {0};
        if (sscanf(e->d_name, "hmc-loopmem-%d-%llu%7s", &pid, &n, tail) != 3 || strcmp(tail, ".sock") != 0)
            continue;
        if (pid <= 0 || pid == (int)getpid() || kill(pid, 0) == 0 || errno != ESRCH) continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_uid == geteuid()) unlink(path);
    }
    closedir(d);
}
static pthread_cond_t g_changed = PTHREAD_COND_INITIALIZER; /* pins dropped, transfers done */
static struct lm_comm *g_comms;
static uint64_t g_next_id = 1;

static struct lm_comm *find_comm(uint64_t id) {
    for (struct lm_comm *c = g_comms; c; c = c->next)
        if (c->id == id) return c;
    return NULL;
}

static struct lm_reg *find_reg(struct lm_comm *c, uint64_t id) {
    for (struct lm_reg *r = c->regs; r; r = r->next)
        if (r->id == id && r->live) return r;
    return NULL;
}

static void signal_fd(int fd) {
    uint64_t one = 1;
    ssize_t n = write(fd, &one, sizeof one);
    (void)n;
}

static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Runs one transfer; called and returns with g_lock held. */
static int32_t run_transfer(struct lm_xfer *x, char *err, size_t errlen) {
    uint32_t need = x->op == HMC_OP_WRITE ? HMC_ACCESS_WRITE : HMC_ACCESS_READ;
    struct lm_comm *t = find_comm(x->peer_id);
    if (!t || t->closed) {
        snprintf(err, errlen, "the peer communicator closed or went away");
        return HMC_ERR_PEER;
    }
    /* Check every descriptor against the target's own table before any byte moves. */
    for (size_t i = 0; i < x->count; i++) {
        struct lm_xdesc *d = &x->descs[i];
        struct lm_reg *r = find_reg(t, d->reg_id);
        if (!r || r->secret != d->secret) {
            snprintf(err, errlen, "descriptor %zu: the key names no live region of the peer "
                     "(deregistered, or forged)", i);
            return HMC_ERR_INVALID_KEY;
        }
        if (!(r->access & need)) {
            snprintf(err, errlen, "descriptor %zu: the region does not allow %s", i,
                     x->op == HMC_OP_WRITE ? "WRITE" : "READ");
            return HMC_ERR_ACCESS_DENIED;
        }
        if (d->remote_off > r->len || d->len > r->len - d->remote_off ||
            d->local_off > d->local->len || d->len > d->local->len - d->local_off) {
            snprintf(err, errlen, "descriptor %zu: [%llu, +%llu) is out of bounds", i,
                     (unsigned long long)d->remote_off, (unsigned long long)d->len);
            return HMC_ERR_OUT_OF_BOUNDS;
        }
    }
    for (size_t i = 0; i < x->count; i++) {
        struct lm_xdesc *d = &x->descs[i];
        for (uint64_t off = 0; off < d->len; off += LOOPMEM_CHUNK) {
#ifdef BROKEN_LATE_BYTES
            struct timespec slow = {0, 200000}; /* a slow link: the late bytes are seen */
            nanosleep(&slow, NULL);
#endif
            /* Between chunks: cancel, deadline, and the peer and region still there. */
            if (LM_STOPS_AT_END && (x->cancel || x->comm->closed)) {
                snprintf(err, errlen, "cancelled");
                return HMC_ERR_CANCELLED;
            }
            if (LM_STOPS_AT_END && x->deadline != HMC_NO_DEADLINE && now_ns() >= x->deadline) {
                snprintf(err, errlen, "the deadline passed after %llu of %llu bytes of "
                         "descriptor %zu", (unsigned long long)off,
                         (unsigned long long)d->len, i);
                return HMC_ERR_DEADLINE;
            }
            t = find_comm(x->peer_id);
            if (!t || t->closed) {
                snprintf(err, errlen, "the peer communicator closed during the transfer");
                return HMC_ERR_PEER;
            }
            struct lm_reg *r = find_reg(t, d->reg_id);
            if (!r) {
                snprintf(err, errlen, "the peer deregistered the region during the transfer");
                return HMC_ERR_INVALID_KEY;
            }
            uint64_t n = d->len - off < LOOPMEM_CHUNK ? d->len - off : LOOPMEM_CHUNK;
            uint8_t *remote = (uint8_t *)(uintptr_t)(r->addr + d->remote_off + off);
            uint8_t *local = (uint8_t *)(uintptr_t)(d->local->addr + d->local_off + off);
            r->pins++;
            pthread_mutex_unlock(&g_lock);
            if (x->op == HMC_OP_WRITE) memcpy(remote, local, n);
            else memcpy(local, remote, n);
            pthread_mutex_lock(&g_lock);
            r->pins--;
            pthread_cond_broadcast(&g_changed);
        }
    }
    return HMC_OK;
}

static void *worker_main(void *arg) {
    struct lm_comm *c = arg;
    pthread_mutex_lock(&g_lock);
    while (!c->stopping) {
        struct lm_xfer *x = c->queue_head;
        if (!x) {
            pthread_cond_wait(&c->work_cv, &g_lock);
            continue;
        }
        c->queue_head = x->next;
        if (!c->queue_head) c->queue_tail = NULL;
        x->state = 1;
        x->result = run_transfer(x, x->err, sizeof x->err);
        x->state = 2;
        if (x->orphan) { /* BROKEN_LATE_BYTES only */
            free(x->descs);
            free(x);
        }
        pthread_cond_broadcast(&g_changed);
        signal_fd(c->efd);
    }
    pthread_mutex_unlock(&g_lock);
    return NULL;
}

static int32_t lm_comm_open(const uint8_t *config, size_t len, HmcComm **out) {
    struct lm_comm *c = calloc(1, sizeof *c);
    if (!c) return fail(HMC_ERR_OUT_OF_MEMORY, "loopmem: out of memory");
    c->max_pending = LOOPMEM_DEFAULT_MAX_PENDING;
    /* key=value lines; unknown keys are ignored, as the ABI asks. */
    const char *key = "max_pending_notifications=";
    for (size_t i = 0; i < len; i++) {
        size_t k = strlen(key);
        if ((i == 0 || config[i - 1] == '\n') && len - i > k && !memcmp(config + i, key, k))
            c->max_pending = (size_t)strtoull((const char *)config + i + k, NULL, 10);
    }
    c->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    c->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->efd < 0 || c->listen_fd < 0) {
        int e = errno;
        if (c->efd >= 0) close(c->efd);
        if (c->listen_fd >= 0) close(c->listen_fd);
        free(c);
        return fail(HMC_ERR_IO, "loopmem: eventfd/socket: %s", strerror(e));
    }
    pthread_mutex_lock(&g_lock);
    c->id = g_next_id++;
    pthread_mutex_unlock(&g_lock);
    pthread_once(&g_sweep_once, lm_sweep_dead);
    const char *dir = getenv("TMPDIR");
    snprintf(c->path, sizeof c->path, "%s/hmc-loopmem-%d-%llu.sock", dir && *dir ? dir : "/tmp",
             (int)getpid(), (unsigned long long)c->id);
    unlink(c->path);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, c->path, strlen(c->path));
    if (bind(c->listen_fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(c->listen_fd, 1) != 0) {
        int e = errno;
        close(c->efd);
        close(c->listen_fd);
        free(c);
        return fail(HMC_ERR_IO, "loopmem: binding its Unix socket: %s", strerror(e));
    }
    snprintf(c->address, sizeof c->address, "unix://%s", c->path);
    pthread_cond_init(&c->work_cv, NULL);
    if (pthread_create(&c->worker, NULL, worker_main, c) != 0) {
        close(c->efd);
        close(c->listen_fd);
        unlink(c->path);
        free(c);
        return fail(HMC_ERR_IO, "loopmem: cannot start its worker thread");
    }
    pthread_mutex_lock(&g_lock);
    c->next = g_comms;
    g_comms = c;
    pthread_mutex_unlock(&g_lock);
    *out = (HmcComm *)c;
    return HMC_OK;
}

static void lm_comm_close(HmcComm *comm) {
    struct lm_comm *c = (struct lm_comm *)comm;
    pthread_mutex_lock(&g_lock);
    c->closed = 1;
    pthread_mutex_unlock(&g_lock);
    signal_fd(c->efd);
}

static void lm_comm_destroy(HmcComm *comm) {
    struct lm_comm *c = (struct lm_comm *)comm;
    pthread_mutex_lock(&g_lock);
    c->closed = 1;
    c->stopping = 1;
    pthread_cond_signal(&c->work_cv);
    pthread_mutex_unlock(&g_lock);
    pthread_join(c->worker, NULL);
    pthread_mutex_lock(&g_lock);
    for (struct lm_comm **p = &g_comms; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    pthread_mutex_unlock(&g_lock);
    while (c->notes_head) {
        struct lm_note *n = c->notes_head;
        c->notes_head = n->next;
        free(n);
    }
    while (c->regs) {
        struct lm_reg *r = c->regs;
        c->regs = r->next;
        free(r);
    }
    pthread_cond_destroy(&c->work_cv);
    close(c->listen_fd);
    unlink(c->path);
    close(c->efd);
    free(c);
}

static int32_t lm_comm_event_fd(HmcComm *comm) { return ((struct lm_comm *)comm)->efd; }

static int32_t write_out(const void *src, size_t n, uint8_t *buf, size_t cap, size_t *len) {
    *len = n;
    if (n > cap) return fail(HMC_ERR_TOO_SMALL, "loopmem: %zu bytes needed, %zu given", n, cap);
    memcpy(buf, src, n);
    return HMC_OK;
}

static int32_t lm_comm_address(HmcComm *comm, uint8_t *buf, size_t cap, size_t *len) {
    struct lm_comm *c = (struct lm_comm *)comm;
    return write_out(c->address, strlen(c->address), buf, cap, len);
}

static int32_t lm_comm_capabilities(HmcComm *comm, HmcCommCaps *out) {
    (void)comm;
    HmcCommCaps caps;
    memset(&caps, 0, sizeof caps);
    /* Peers are communicators of this process only (see the file's opening comment). */
    caps.flags = HMC_CAP_NOTIFICATIONS | HMC_CAP_SAME_PROCESS_ONLY;
    caps.max_notification_len = LOOPMEM_MAX_NOTIFY_LEN;
    caps.max_transfer_len = UINT64_MAX;
    caps.max_batch_len = LOOPMEM_MAX_BATCH;
    caps.local_kinds[0] = 1;  /* host memory only */
    caps.remote_kinds[0] = 1;
    size_t room = out->struct_size < sizeof caps ? out->struct_size : sizeof caps;
    caps.struct_size = room;
    memcpy(out, &caps, room);
    return HMC_OK;
}

static int32_t lm_connect(HmcComm *comm, const uint8_t *addr, size_t addr_len, uint64_t deadline_ns,
                          HmcEndpoint **out) {
    struct lm_comm *c = (struct lm_comm *)comm;
    (void)deadline_ns;
    pthread_mutex_lock(&g_lock);
    struct lm_comm *peer = NULL;
    for (struct lm_comm *p = g_comms; p; p = p->next)
        if (strlen(p->address) == addr_len && !memcmp(p->address, addr, addr_len)) peer = p;
    int closed = c->closed;
    pthread_mutex_unlock(&g_lock);
    if (closed) return fail(HMC_ERR_CLOSED, "loopmem: this communicator was closed");
    if (!peer || peer->closed)
        return fail(HMC_ERR_PEER, "loopmem: no open loopmem communicator listens at %.*s in this "
                    "process (loopmem reaches only communicators of its own process)",
                    (int)addr_len, (const char *)addr);
    struct lm_ep *ep = malloc(sizeof *ep);
    if (!ep) return fail(HMC_ERR_OUT_OF_MEMORY, "loopmem: out of memory");
    ep->peer_id = peer->id;
    *out = (HmcEndpoint *)ep;
    return HMC_OK;
}

static void lm_endpoint_release(HmcComm *comm, HmcEndpoint *ep) {
    (void)comm;
    free(ep);
}

static int32_t lm_register(HmcComm *comm, const HmcRegion *region, uint32_t access, HmcReg **out) {
    struct lm_comm *c = (struct lm_comm *)comm;
    if (region->device_kind != 0)
        return fail(HMC_ERR_UNSUPPORTED_MEMORY, "loopmem moves host memory only (device kind %u)",
                    region->device_kind);
    struct lm_reg *r = calloc(1, sizeof *r);
    if (!r) return fail(HMC_ERR_OUT_OF_MEMORY, "loopmem: out of memory");
    if (getrandom(&r->secret, sizeof r->secret, 0) != sizeof r->secret) {
        free(r);
        return fail(HMC_ERR_IO, "loopmem: getrandom failed");
    }
    r->owner = c;
    r->addr = region->addr;
    r->len = region->len;
    r->access = access;
    r->live = 1;
    pthread_mutex_lock(&g_lock);
    r->id = g_next_id++;
    r->next = c->regs;
    c->regs = r;
    pthread_mutex_unlock(&g_lock);
    *out = (HmcReg *)r;
    return HMC_OK;
}

static void lm_deregister(HmcComm *comm, HmcReg *reg) {
    struct lm_comm *c = (struct lm_comm *)comm;
    struct lm_reg *r = (struct lm_reg *)reg;
    pthread_mutex_lock(&g_lock);
    r->live = 0; /* no new copy starts on it */
    while (r->pins) pthread_cond_wait(&g_changed, &g_lock); /* copies in flight end */
    for (struct lm_reg **p = &c->regs; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            break;
        }
    pthread_mutex_unlock(&g_lock);
    free(r);
}

static int32_t lm_export_key(HmcComm *comm, HmcReg *reg, uint8_t *buf, size_t cap, size_t *len) {
    struct lm_comm *c = (struct lm_comm *)comm;
    struct lm_reg *r = (struct lm_reg *)reg;
    if (r->owner != c)
        return fail(HMC_ERR_INVALID_ARGUMENT, "loopmem: the registration belongs to another communicator");
    uint8_t key[LOOPMEM_KEY_LEN];
    put_u64(key, c->id);
    put_u64(key + 8, r->id);
    put_u64(key + 16, r->secret);
    return write_out(key, sizeof key, buf, cap, len);
}

static int32_t lm_import(HmcComm *comm, HmcEndpoint *ep, const HmcRemoteDesc *desc, HmcRemoteKey **out) {
    (void)comm;
    struct lm_ep *e = (struct lm_ep *)ep;
    if (desc->key_len != LOOPMEM_KEY_LEN)
        return fail(HMC_ERR_INVALID_KEY, "loopmem: a key is %u bytes, not %zu", LOOPMEM_KEY_LEN, desc->key_len);
    if (get_u64(desc->key) != e->peer_id)
        return fail(HMC_ERR_INVALID_KEY, "loopmem: the key is not one of this endpoint's peer");
    struct lm_rkey *k = malloc(sizeof *k);
    if (!k) return fail(HMC_ERR_OUT_OF_MEMORY, "loopmem: out of memory");
    k->peer_id = e->peer_id;
    k->reg_id = get_u64(desc->key + 8);
    k->secret = get_u64(desc->key + 16);
    *out = (HmcRemoteKey *)k;
    return HMC_OK;
}

static void lm_remote_key_release(HmcComm *comm, HmcRemoteKey *key) {
    (void)comm;
    free(key);
}

static int32_t lm_transfer_start(HmcComm *comm, HmcEndpoint *ep, uint32_t op, const HmcTransferDesc *descs,
                                 size_t count, uint64_t deadline_ns, HmcTransfer **out) {
    struct lm_comm *c = (struct lm_comm *)comm;
    struct lm_ep *e = (struct lm_ep *)ep;
    if (op != HMC_OP_READ && op != HMC_OP_WRITE) return fail(HMC_ERR_INVALID_ARGUMENT, "loopmem: op %u", op);
#ifdef BROKEN_CRASH_ON_TRANSFER
    raise(SIGSEGV);
#endif
#ifdef BROKEN_HANG_ON_TRANSFER
    for (;;) pause(); /* blocks the host's thread: no deadline reaches it */
#endif
    if (count > LOOPMEM_MAX_BATCH)
        return fail(HMC_ERR_LIMIT, "max_batch_len: %zu > %u; loopmem takes at most that many descriptors per batch: split it",
                    count, LOOPMEM_MAX_BATCH);
    struct lm_xfer *x = calloc(1, sizeof *x);
    if (!x || (count && !(x->descs = calloc(count, sizeof *x->descs)))) {
        free(x);
        return fail(HMC_ERR_OUT_OF_MEMORY, "loopmem: out of memory");
    }
    x->comm = c;
    x->peer_id = e->peer_id;
    x->op = op;
    x->count = count;
    x->deadline = deadline_ns;
    for (size_t i = 0; i < count; i++) {
        struct lm_reg *local = (struct lm_reg *)descs[i].local;
        struct lm_rkey *k = (struct lm_rkey *)descs[i].remote;
        if (local->owner != c || k->peer_id != e->peer_id) {
            free(x->descs);
            free(x);
            return fail(HMC_ERR_INVALID_ARGUMENT, "loopmem: descriptor %zu names a handle of another "
                        "communicator or endpoint", i);
        }
        x->descs[i] = (struct lm_xdesc){local, descs[i].local_offset, k->reg_id, k->secret,
                                        descs[i].remote_offset, descs[i].len};
    }
    pthread_mutex_lock(&g_lock);
    if (c->closed) {
        pthread_mutex_unlock(&g_lock);
        free(x->descs);
        free(x);
        return fail(HMC_ERR_CLOSED, "loopmem: this communicator was closed");
    }
#ifdef BROKEN_NEVER_COMPLETES
    x->state = 3; /* accepted, never run: the host must end it at its deadline */
#else
    if (c->queue_tail) c->queue_tail->next = x;
    else c->queue_head = x;
    c->queue_tail = x;
    pthread_cond_signal(&c->work_cv);
#endif
    pthread_mutex_unlock(&g_lock);
    *out = (HmcTransfer *)x;
    return HMC_OK;
}

static int32_t lm_transfer_poll(HmcComm *comm, HmcTransfer *t) {
    (void)comm;
    struct lm_xfer *x = (struct lm_xfer *)t;
    pthread_mutex_lock(&g_lock);
    int state = x->state;
    int32_t result = x->result;
    pthread_mutex_unlock(&g_lock);
#ifdef BROKEN_LATE_BYTES
    if (state != 2 && x->deadline != HMC_NO_DEADLINE && now_ns() >= x->deadline)
        return fail(HMC_ERR_DEADLINE, "loopmem (broken on purpose): the deadline passed; the copy goes on");
#endif
    if (state != 2) return HMC_PENDING;
    if (result != HMC_OK) return fail(result, "loopmem: %s", x->err);
    return HMC_OK;
}

static void lm_transfer_release(HmcComm *comm, HmcTransfer *t) {
    struct lm_comm *c = (struct lm_comm *)comm;
    struct lm_xfer *x = (struct lm_xfer *)t;
    pthread_mutex_lock(&g_lock);
    x->cancel = 1;
    if (x->state == 0) { /* still queued: unlink it */
        struct lm_xfer *prev = NULL;
        for (struct lm_xfer *q = c->queue_head; q; prev = q, q = q->next)
            if (q == x) {
                if (prev) prev->next = x->next;
                else c->queue_head = x->next;
                if (c->queue_tail == x) c->queue_tail = prev;
                break;
            }
    } else {
#ifdef BROKEN_LATE_BYTES
        if (x->state == 1) { /* returns while the copy goes on */
            x->orphan = 1;
            pthread_mutex_unlock(&g_lock);
            return;
        }
#endif
        while (x->state == 1) pthread_cond_wait(&g_changed, &g_lock); /* stops at a chunk edge */
    }
    pthread_mutex_unlock(&g_lock);
    free(x->descs);
    free(x);
}

static int32_t lm_notify(HmcComm *comm, HmcEndpoint *ep, uint64_t tag, const uint8_t *msg, size_t len,
                         uint64_t deadline_ns) {
    struct lm_comm *c = (struct lm_comm *)comm;
    struct lm_ep *e = (struct lm_ep *)ep;
    (void)deadline_ns;
    if (len > LOOPMEM_MAX_NOTIFY_LEN)
        return fail(HMC_ERR_LIMIT, "max_notification_len: %zu > %u; loopmem notifications are at most that many bytes",
                    len, LOOPMEM_MAX_NOTIFY_LEN);
    struct lm_note *n = malloc(sizeof *n + len);
    if (!n) return fail(HMC_ERR_OUT_OF_MEMORY, "loopmem: out of memory");
    n->next = NULL;
    n->tag = tag;
    n->len = len;
    if (len) memcpy(n->msg, msg, len);
    n->from_len = strlen(c->address);
    memcpy(n->from, c->address, n->from_len);
    pthread_mutex_lock(&g_lock);
    struct lm_comm *t = find_comm(e->peer_id);
    int32_t code = HMC_OK;
    if (c->closed) code = fail(HMC_ERR_CLOSED, "loopmem: this communicator was closed");
    else if (!t || t->closed) code = fail(HMC_ERR_PEER, "loopmem: the peer communicator closed or went away");
#if defined(LIMIT_MESSAGE_FREE_TEXT)
    /* A plugin of ABI 1.1 or before, when HMC_ERR_LIMIT's message was free text. */
    else if (t->pending >= t->max_pending)
        code = fail(HMC_ERR_LIMIT, "loopmem: the peer's notification queue is full (%zu pending)",
                    t->pending);
#elif !defined(BROKEN_UNBOUNDED_NOTIFY)
    else if (t->pending >= t->max_pending)
        code = fail(HMC_ERR_LIMIT, "max_pending_notifications: %zu > %zu; the loopmem peer holds "
                    "that many unreceived notifications: it must receive some first, or raise the "
                    "limit with max_pending_notifications=N in its configuration",
                    t->pending + 1, t->max_pending);
#endif
    if (code != HMC_OK) {
        pthread_mutex_unlock(&g_lock);
        free(n);
        return code;
    }
    if (t->notes_tail) t->notes_tail->next = n;
    else t->notes_head = n;
    t->notes_tail = n;
    t->pending++;
    signal_fd(t->efd);
    pthread_mutex_unlock(&g_lock);
    return HMC_OK;
}

static int32_t lm_recv_notification(HmcComm *comm, HmcNotification *out) {
    struct lm_comm *c = (struct lm_comm *)comm;
    pthread_mutex_lock(&g_lock);
    struct lm_note *n = c->notes_head;
    if (!n) {
        int closed = c->closed;
        pthread_mutex_unlock(&g_lock);
        return closed ? fail(HMC_ERR_CLOSED, "loopmem: this communicator was closed") : HMC_PENDING;
    }
    out->tag = n->tag;
    out->from_len = n->from_len;
    out->msg_len = n->len;
    if (n->from_len > out->from_cap || n->len > out->msg_cap) {
        pthread_mutex_unlock(&g_lock);
        return fail(HMC_ERR_TOO_SMALL, "loopmem: the notification needs larger buffers");
    }
    c->notes_head = n->next;
    if (!c->notes_head) c->notes_tail = NULL;
    c->pending--;
    pthread_mutex_unlock(&g_lock);
    memcpy(out->from, n->from, n->from_len);
    if (n->len) memcpy(out->msg, n->msg, n->len);
    free(n);
    return HMC_OK;
}

/* The memory backend: one device per open; buffers are host memory underneath. */
struct lm_mem { uint32_t ordinal; };
struct lm_buf { void *bytes; };

static int32_t lm_memory_open(const uint8_t *config, size_t len, HmcMemory **out) {
    struct lm_mem *m = calloc(1, sizeof *m);
    if (!m) return fail(HMC_ERR_OUT_OF_MEMORY, "loopmem: out of memory");
    const char *key = "ordinal=";
    size_t k = strlen(key);
    for (size_t i = 0; i < len; i++)
        if ((i == 0 || config[i - 1] == '\n') && len - i > k && !memcmp(config + i, key, k))
            m->ordinal = (uint32_t)strtoul((const char *)config + i + k, NULL, 10);
    *out = (HmcMemory *)m;
    return HMC_OK;
}

static void lm_memory_destroy(HmcMemory *mem) { free(mem); }

static int32_t lm_memory_info(HmcMemory *mem, HmcMemoryInfo *out) {
    HmcMemoryInfo info;
    memset(&info, 0, sizeof info);
    info.device_kind = LOOPMEM_DEVICE_KIND;
    info.device_ordinal = ((struct lm_mem *)mem)->ordinal;
    info.max_alloc = LOOPMEM_MAX_ALLOC;
    size_t room = out->struct_size < sizeof info ? out->struct_size : sizeof info;
    info.struct_size = room;
    memcpy(out, &info, room);
    return HMC_OK;
}

static int32_t lm_memory_alloc(HmcMemory *mem, uint64_t len, HmcBuffer **out, uint64_t *addr) {
    (void)mem;
    if (len > LOOPMEM_MAX_ALLOC)
        return fail(HMC_ERR_OUT_OF_MEMORY, "loopmem: %llu bytes is over its max_alloc", (unsigned long long)len);
    struct lm_buf *b = malloc(sizeof *b);
    if (!b || !(b->bytes = malloc(len ? (size_t)len : 1))) {
        free(b);
        return fail(HMC_ERR_OUT_OF_MEMORY, "loopmem: cannot allocate %llu bytes", (unsigned long long)len);
    }
    *addr = (uint64_t)(uintptr_t)b->bytes;
    *out = (HmcBuffer *)b;
    return HMC_OK;
}

static void lm_memory_free(HmcMemory *mem, HmcBuffer *buf) {
    (void)mem;
    struct lm_buf *b = (struct lm_buf *)buf;
    free(b->bytes);
    free(b);
}

static int32_t lm_memory_copy(HmcMemory *mem, const HmcRegion *dst, const HmcRegion *src) {
    uint32_t own = ((struct lm_mem *)mem)->ordinal;
    const HmcRegion *r[2] = {dst, src};
    for (int i = 0; i < 2; i++)
        if (r[i]->device_kind != 0 && (r[i]->device_kind != LOOPMEM_DEVICE_KIND || r[i]->device_ordinal != own))
            return fail(HMC_ERR_UNSUPPORTED, "loopmem: a copy touches another device");
    if (dst->len != src->len) return fail(HMC_ERR_INVALID_ARGUMENT, "loopmem: copy lengths differ");
    memmove((void *)(uintptr_t)dst->addr, (const void *)(uintptr_t)src->addr, (size_t)dst->len);
    return HMC_OK;
}

int32_t hmc_plugin_init(uint32_t host_abi_major, uint32_t host_abi_minor, const HmcHostApi *host,
                        HmcPluginApi *out, size_t out_size);

int32_t hmc_plugin_init(uint32_t host_abi_major, uint32_t host_abi_minor, const HmcHostApi *host,
                        HmcPluginApi *out, size_t out_size) {
    (void)host_abi_minor;
    if (out_size < sizeof(HmcTableHeader)) return fail(HMC_ERR_TOO_SMALL, "loopmem: table too small");
#ifdef BROKEN_NULL_TABLE
    (void)host_abi_major;
    (void)host;
    (void)out;
    return HMC_OK; /* fills nothing */
#else
    HmcPluginApi api;
    memset(&api, 0, sizeof api);
    api.header.struct_size = sizeof api;
    api.header.abi_major = HMC_PLUGIN_ABI_MAJOR;
    api.header.abi_minor = HMC_PLUGIN_ABI_MINOR;
#ifdef DECLARE_ABI_MINOR
    api.header.abi_minor = DECLARE_ABI_MINOR;
#if DECLARE_ABI_MINOR < 3
    /* As if built against an older header: its table ends before ABI 1.3's field. */
    api.header.struct_size = offsetof(HmcPluginApi, endpoint_settle);
#endif
#endif
#ifdef BROKEN_MAJOR
    api.header.abi_major = HMC_PLUGIN_ABI_MAJOR + 1;
#endif
    api.header.name = LOOPMEM_NAME;
    api.header.capabilities = HMC_PLUGIN_PROVIDES_COMMUNICATOR | HMC_PLUGIN_PROVIDES_MEMORY;
    api.transport_id = LOOPMEM_TRANSPORT_ID;
    api.last_error = lm_last_error;
    api.comm_open = lm_comm_open;
    api.comm_close = lm_comm_close;
    api.comm_destroy = lm_comm_destroy;
    api.comm_event_fd = lm_comm_event_fd;
    api.comm_address = lm_comm_address;
    api.comm_capabilities = lm_comm_capabilities;
    api.connect = lm_connect;
    api.endpoint_release = lm_endpoint_release;
    api.register_mem = lm_register;
    api.deregister = lm_deregister;
    api.export_key = lm_export_key;
    api.rekey = NULL; /* keys cannot be revoked while registered */
    api.import = lm_import;
    api.remote_key_release = lm_remote_key_release;
    api.transfer_start = lm_transfer_start;
    api.transfer_poll = lm_transfer_poll;
    api.transfer_release = lm_transfer_release;
    api.notify = lm_notify;
    api.recv_notification = lm_recv_notification;
    api.memory_open = lm_memory_open;
    api.memory_destroy = lm_memory_destroy;
    api.memory_info = lm_memory_info;
    api.memory_alloc = lm_memory_alloc;
    api.memory_free = lm_memory_free;
    api.memory_copy = lm_memory_copy;
#ifdef BROKEN_STRUCT_SIZE
    api.header.struct_size = sizeof(HmcTableHeader) + 8; /* claims a truncated table */
#endif
#ifdef BROKEN_MISSING_FUNCTION
    api.transfer_poll = NULL;
#endif
    size_t n = out_size < sizeof api ? out_size : sizeof api;
#ifdef BROKEN_IGNORES_OUT_SIZE
    n = sizeof api; /* writes past what an older host offered */
#endif
    if (api.header.struct_size > n) api.header.struct_size = n;
    memcpy(out, &api, n);
    if (host_abi_major != HMC_PLUGIN_ABI_MAJOR)
        return fail(HMC_ERR_VERSION, "loopmem speaks HMC plugin ABI %u, the host %u", HMC_PLUGIN_ABI_MAJOR,
                    host_abi_major);
    host_api = host;
#ifdef BROKEN_INIT_FAILS
    return fail(HMC_ERR_UNAVAILABLE, "loopmem (broken on purpose) cannot initialise: its device "
                "is missing; install it or remove this plugin from HMC_PLUGIN_PATH");
#else
    lm_log(HMC_LOG_DEBUG, "loopmem initialised");
    return HMC_OK;
#endif
#endif
}
