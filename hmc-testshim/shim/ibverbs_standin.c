/*
 * A user-space stand-in for rdma-core's libibverbs.so.1, compiled at test time.
 *
 * It is written against the installed <infiniband/verbs.h> (libibverbs-dev), so every
 * struct it hands out has the real layout: a real struct ibv_context whose ops table
 * carries post_send/post_recv/poll_cq/req_notify_cq, so the caller's inline dispatch
 * (qp->context->ops.post_send) runs for real.
 *
 * The "NIC" is per process: one fake device (hmcfake0, port 1, Ethernet link layer, a
 * RoCE v1 GID at index 0 and a RoCE v2 IPv4-mapped GID at index 1, both ending in the
 * process id). Its responder listens on the abstract Unix socket named from the GID
 * ("\0hmc-fake-ibv-<last 4 GID bytes>") and serves RDMA READ/WRITE requests of other
 * processes' (or this process's) QPs straight from and into this process's registered
 * memory. Each QP has an engine thread that executes its send queue in order over its
 * own connection to the remote NIC.
 *
 * Enforced as the hardware would: modify_qp transitions and attribute masks (RC), path
 * MTU against the port, PSNs, the MR table (distinct lkey/rkey, access rights, PD,
 * bounds: violations complete with IBV_WC_REM_ACCESS_ERR and the responder QP goes to
 * ERR), flush errors for every outstanding WR once a QP is in ERR, completion events
 * through the channel fd after req_notify_cq.
 *
 * Fault injection (environment, read when a device is opened):
 *   HMC_FAKE_IBV_DEVICES=0     ibv_get_device_list fails with ENOSYS (no RDMA stack)
 *   HMC_FAKE_IBV_MAX_MSG=N     the port's max_msg_sz (longer WRs: IBV_WC_LOC_LEN_ERR)
 *   HMC_FAKE_IBV_ACTIVE_MTU=M  the port's active_mtu (enum ibv_mtu, default 5 = 4096)
 *   HMC_FAKE_IBV_DMABUF=eopnotsupp  ibv_reg_dmabuf_mr(fd -1) says EOPNOTSUPP, not EBADF
 *   HMC_FAKE_IBV_RETRY_MS=N    how long a dead peer takes to become IBV_WC_RETRY_EXC_ERR
 *
 * Test control: hmc_fake_ibv_live("qps"|"mrs"|"cqs"|"contexts"|"pds"|"channels").
 */
#define _GNU_SOURCE
#include <infiniband/verbs.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#undef ibv_reg_mr
#undef ibv_reg_mr_iova
#undef ibv_query_port

#define MAX_SGE 16
#define MAX_QP_WR 4096
#define MAX_CQE 65536
#define MAX_RD_ATOM 16
#define CHUNK (256 * 1024)
#define MAGIC 0x48464942u /* "HFIB" */

enum { ST_OK = 0, ST_NOQP = 1, ST_ACCESS = 2, ST_INVREQ = 3 };
enum { OP_WRITE = 1, OP_READ = 2 };

struct wire_req {
    uint32_t magic, op, src_qpn, dst_qpn, psn, rkey, len, pad;
    uint64_t raddr;
    uint8_t src_gid[16];
};

/* The NIC's threads run this library's code: never let a dlclose unmap it. */
__attribute__((constructor)) static void pin_library(void) {
    Dl_info info;
    if (dladdr((void *)pin_library, &info) && info.dli_fname)
        dlopen(info.dli_fname, RTLD_NOW | RTLD_NODELETE | RTLD_NOLOAD);
}

/* ---------- process-wide state ---------- */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_inited;
static uint32_t g_max_msg = 1u << 30;
static enum ibv_mtu g_active_mtu = IBV_MTU_4096;
static int g_dmabuf_eopnotsupp;
static int g_retry_ms = 200;
static union ibv_gid g_gid[2];
static uint32_t g_next_qpn = 0x100;
static uint32_t g_next_key = 1;
static int g_listen_fd = -1;
static struct ibv_device g_device;
static struct ibv_device *g_list[2];
static long g_live_qps, g_live_mrs, g_live_cqs, g_live_ctx, g_live_pds, g_live_channels;

struct fake_mr {
    struct ibv_mr mr;
    int access;
    char *host;          /* where byte iova `mr.addr` lives in this process */
    void *mapping;       /* dmabuf mapping to unmap, if any */
    size_t maplen;
    int busy;            /* responder threads using it */
    struct fake_mr *next;
};
static struct fake_mr *g_mrs;

struct swr {
    uint64_t wr_id;
    int opcode, signaled, num_sge;
    uint64_t raddr;
    uint32_t rkey;
    struct ibv_sge sge[MAX_SGE];
};

struct fake_cq {
    struct ibv_cq cq;
    pthread_mutex_t lk;
    struct ibv_wc *ring;
    int cap, head, count, armed;
};

struct fake_channel {
    struct ibv_comp_channel ch;
    int wfd;
};

struct fake_qp {
    struct ibv_qp qp;
    pthread_mutex_t lk;
    pthread_cond_t cv;
    int state, stop, busy, sock;
    /* Bumped when the QP leaves RTR/RTS for RESET or ERR: a WRITE the responder accepted
     * under an older incarnation lands no more of its bytes, as a NIC drops the packets
     * of a QP that is no longer ready. */
    uint64_t incarnation;
    /* Requests its responder is serving (under g_lock): destroy waits for them. */
    int serving;
    int port, sgid_index, access, mtu, timeout, retry_cnt, rnr_retry, rd_atomic, dest_rd_atomic;
    uint32_t dest_qpn, expected_psn, next_psn;
    union ibv_gid dgid;
    struct swr *sq;
    int sq_cap, sq_head, sq_count;
    pthread_t engine;
    struct fake_qp *next;
};
static struct fake_qp *g_qps;

static void read_env(void) {
    const char *v;
    if ((v = getenv("HMC_FAKE_IBV_MAX_MSG")) && atol(v) > 0) g_max_msg = (uint32_t)atol(v);
    if ((v = getenv("HMC_FAKE_IBV_ACTIVE_MTU")) && atoi(v) >= 1 && atoi(v) <= 5)
        g_active_mtu = (enum ibv_mtu)atoi(v);
    if ((v = getenv("HMC_FAKE_IBV_DMABUF")) && strcmp(v, "eopnotsupp") == 0) g_dmabuf_eopnotsupp = 1;
    if ((v = getenv("HMC_FAKE_IBV_RETRY_MS")) && atoi(v) >= 0) g_retry_ms = atoi(v);
}

static void sock_name(const uint8_t *gid, struct sockaddr_un *sa, socklen_t *len) {
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    int n = snprintf(sa->sun_path + 1, sizeof(sa->sun_path) - 1, "hmc-fake-ibv-%02x%02x%02x%02x",
                     gid[12], gid[13], gid[14], gid[15]);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

static int io_all(int fd, void *buf, size_t len, int writing) {
    char *p = buf;
    while (len > 0) {
        ssize_t n = writing ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* ---------- completion queues and channels ---------- */

static void cq_push(struct fake_cq *cq, const struct ibv_wc *wc) {
    pthread_mutex_lock(&cq->lk);
    if (cq->count == cq->cap) {
        fprintf(stderr, "ibverbs stand-in: CQ overrun (%d entries), completion lost\n", cq->cap);
        pthread_mutex_unlock(&cq->lk);
        return;
    }
    cq->ring[(cq->head + cq->count) % cq->cap] = *wc;
    cq->count++;
    int fire = cq->armed && cq->cq.channel;
    cq->armed = 0;
    pthread_mutex_unlock(&cq->lk);
    if (fire) {
        struct fake_channel *ch = (struct fake_channel *)cq->cq.channel;
        struct ibv_cq *p = &cq->cq;
        if (write(ch->wfd, &p, sizeof(p)) != sizeof(p))
            fprintf(stderr, "ibverbs stand-in: completion event lost\n");
    }
}

static int fake_poll_cq(struct ibv_cq *ibcq, int n, struct ibv_wc *wc) {
    struct fake_cq *cq = (struct fake_cq *)ibcq;
    int got = 0;
    pthread_mutex_lock(&cq->lk);
    while (got < n && cq->count > 0) {
        wc[got++] = cq->ring[cq->head];
        cq->head = (cq->head + 1) % cq->cap;
        cq->count--;
    }
    pthread_mutex_unlock(&cq->lk);
    return got;
}

static int fake_req_notify_cq(struct ibv_cq *ibcq, int solicited_only) {
    struct fake_cq *cq = (struct fake_cq *)ibcq;
    (void)solicited_only;
    if (!ibcq->channel) return EINVAL;
    pthread_mutex_lock(&cq->lk);
    cq->armed = 1;
    pthread_mutex_unlock(&cq->lk);
    return 0;
}

struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *ctx) {
    struct fake_channel *ch = calloc(1, sizeof(*ch));
    int fds[2];
    if (!ch || pipe2(fds, O_CLOEXEC) != 0) {
        free(ch);
        errno = ENOMEM;
        return NULL;
    }
    ch->ch.context = ctx;
    ch->ch.fd = fds[0];
    ch->wfd = fds[1];
    pthread_mutex_lock(&g_lock);
    g_live_channels++;
    pthread_mutex_unlock(&g_lock);
    return &ch->ch;
}

int ibv_destroy_comp_channel(struct ibv_comp_channel *c) {
    struct fake_channel *ch = (struct fake_channel *)c;
    close(ch->ch.fd);
    close(ch->wfd);
    free(ch);
    pthread_mutex_lock(&g_lock);
    g_live_channels--;
    pthread_mutex_unlock(&g_lock);
    return 0;
}

int ibv_get_cq_event(struct ibv_comp_channel *c, struct ibv_cq **cq, void **cq_context) {
    struct ibv_cq *p;
    ssize_t n = read(c->fd, &p, sizeof(p));
    if (n != sizeof(p)) return -1; /* errno from read: EAGAIN on a non-blocking fd */
    *cq = p;
    *cq_context = p->cq_context;
    return 0;
}

void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int n) {
    pthread_mutex_lock(&((struct fake_cq *)cq)->lk);
    cq->comp_events_completed += n;
    pthread_mutex_unlock(&((struct fake_cq *)cq)->lk);
}

struct ibv_cq *ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
                             struct ibv_comp_channel *channel, int comp_vector) {
    (void)comp_vector;
    if (cqe < 1 || cqe > MAX_CQE) {
        errno = EINVAL;
        return NULL;
    }
    struct fake_cq *cq = calloc(1, sizeof(*cq));
    if (!cq || !(cq->ring = calloc((size_t)cqe, sizeof(struct ibv_wc)))) {
        free(cq);
        errno = ENOMEM;
        return NULL;
    }
    cq->cap = cqe;
    cq->cq.context = ctx;
    cq->cq.channel = channel;
    cq->cq.cq_context = cq_context;
    cq->cq.cqe = cqe;
    pthread_mutex_init(&cq->lk, NULL);
    pthread_mutex_init(&cq->cq.mutex, NULL);
    pthread_cond_init(&cq->cq.cond, NULL);
    pthread_mutex_lock(&g_lock);
    g_live_cqs++;
    pthread_mutex_unlock(&g_lock);
    return &cq->cq;
}

int ibv_destroy_cq(struct ibv_cq *ibcq) {
    struct fake_cq *cq = (struct fake_cq *)ibcq;
    pthread_mutex_lock(&g_lock);
    for (struct fake_qp *q = g_qps; q; q = q->next)
        if (q->qp.send_cq == ibcq || q->qp.recv_cq == ibcq) {
            pthread_mutex_unlock(&g_lock);
            return EBUSY;
        }
    g_live_cqs--;
    pthread_mutex_unlock(&g_lock);
    free(cq->ring);
    free(cq);
    return 0;
}

/* ---------- the responder: serves remote READ/WRITE from this process's memory ---------- */

static struct fake_mr *find_mr_locked(uint32_t key, int remote) {
    for (struct fake_mr *m = g_mrs; m; m = m->next)
        if ((remote ? m->mr.rkey : m->mr.lkey) == key) return m;
    return NULL;
}

static void qp_to_err_locked(struct fake_qp *q) {
    pthread_mutex_lock(&q->lk);
    q->incarnation++;
    q->state = IBV_QPS_ERR;
    q->qp.state = IBV_QPS_ERR;
    if (q->sock >= 0) shutdown(q->sock, SHUT_RDWR);
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->lk);
}

static void *serve_conn(void *arg) {
    int fd = (int)(intptr_t)arg;
    struct wire_req r;
    static __thread char piece[64 << 10];
    while (io_all(fd, &r, sizeof(r), 0) == 0) {
        if (r.magic != MAGIC) break;
        uint32_t status = ST_OK;
        uint64_t inc = 0;
        struct fake_mr *mr = NULL;
        pthread_mutex_lock(&g_lock);
        struct fake_qp *q = g_qps;
        while (q && q->qp.qp_num != r.dst_qpn) q = q->next;
        if (!q) {
            status = ST_NOQP;
        } else {
            pthread_mutex_lock(&q->lk);
            int st = q->state;
            inc = q->incarnation;
            int peer_ok = q->dest_qpn == r.src_qpn && memcmp(q->dgid.raw, r.src_gid, 16) == 0;
            int psn_ok = ((q->expected_psn ^ r.psn) & 0xffffff) == 0;
            pthread_mutex_unlock(&q->lk);
            /* Packets for a QP that is not ready, not connected to the sender, or out of
             * sequence are dropped, as on the wire: the requester retries, then gives up. */
            if ((st != IBV_QPS_RTR && st != IBV_QPS_RTS) || !peer_ok || !psn_ok) status = ST_NOQP;
        }
        if (status == ST_OK && r.len > g_max_msg) status = ST_INVREQ;
        if (status == ST_OK) {
            int need = r.op == OP_WRITE ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ;
            mr = find_mr_locked(r.rkey, 1);
            if (!mr || mr->mr.pd != q->qp.pd || !(mr->access & need) || !(q->access & need) ||
                r.raddr < (uint64_t)(uintptr_t)mr->mr.addr ||
                r.raddr - (uint64_t)(uintptr_t)mr->mr.addr > mr->mr.length ||
                (uint64_t)r.len > mr->mr.length - (r.raddr - (uint64_t)(uintptr_t)mr->mr.addr))
                status = ST_ACCESS;
        }
        if (status == ST_ACCESS || status == ST_INVREQ) qp_to_err_locked(q);
        if (status == ST_OK) {
            mr->busy++;
            q->serving++;
            pthread_mutex_lock(&q->lk);
            q->expected_psn = (q->expected_psn + 1) & 0xffffff;
            pthread_mutex_unlock(&q->lk);
        }
        pthread_mutex_unlock(&g_lock);
        int broken = io_all(fd, &status, sizeof(status), 1);
        if (status == ST_OK) {
            char *at = mr->host + (r.raddr - (uint64_t)(uintptr_t)mr->mr.addr);
            uint32_t ack = ST_OK;
            if (r.op == OP_READ) {
                if (!broken) broken = io_all(fd, at, r.len, 1);
            } else {
                /* A WRITE lands piece by piece, each only while the QP is still the one
                 * that accepted it (the copy under its lock, so a reset that returned
                 * saw every piece before it land): the rest of the data is drained and
                 * dropped, as a NIC drops packets for a QP that left RTR/RTS. */
                for (uint32_t off = 0; !broken && off < r.len;) {
                    uint32_t n = r.len - off < sizeof(piece) ? r.len - off : (uint32_t)sizeof(piece);
                    broken = io_all(fd, piece, n, 0);
                    if (broken) break;
                    pthread_mutex_lock(&q->lk);
                    if (q->incarnation == inc && (q->state == IBV_QPS_RTR || q->state == IBV_QPS_RTS))
                        memcpy(at + off, piece, n);
                    else
                        ack = ST_NOQP;
                    pthread_mutex_unlock(&q->lk);
                    off += n;
                }
            }
            if (!broken && r.op == OP_WRITE) broken = io_all(fd, &ack, sizeof(ack), 1);
            pthread_mutex_lock(&g_lock);
            mr->busy--;
            q->serving--;
            pthread_cond_broadcast(&g_cv);
            pthread_mutex_unlock(&g_lock);
        }
        if (broken) break;
    }
    close(fd);
    return NULL;
}

static void *listen_loop(void *arg) {
    (void)arg;
    for (;;) {
        int fd = accept4(g_listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            return NULL;
        }
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &a, serve_conn, (void *)(intptr_t)fd) != 0) close(fd);
        pthread_attr_destroy(&a);
    }
}

/* Starts the NIC once per process: GIDs from the pid, the responder's socket. */
static int nic_start_locked(void) {
    if (g_inited) return 0;
    read_env();
    uint32_t pid = (uint32_t)getpid();
    memset(g_gid, 0, sizeof(g_gid));
    g_gid[0].raw[0] = 0xfe;
    g_gid[0].raw[1] = 0x80;
    g_gid[1].raw[10] = 0xff;
    g_gid[1].raw[11] = 0xff;
    for (int i = 0; i < 2; i++) {
        g_gid[i].raw[12] = (uint8_t)(10 + ((pid >> 24) & 0x7f)); /* 10.x.y.z style for v2 */
        g_gid[i].raw[13] = (uint8_t)(pid >> 16);
        g_gid[i].raw[14] = (uint8_t)(pid >> 8);
        g_gid[i].raw[15] = (uint8_t)pid;
    }
    struct sockaddr_un sa;
    socklen_t len;
    sock_name(g_gid[1].raw, &sa, &len);
    g_listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (g_listen_fd < 0 || bind(g_listen_fd, (struct sockaddr *)&sa, len) != 0 ||
        listen(g_listen_fd, 128) != 0) {
        int e = errno;
        if (g_listen_fd >= 0) close(g_listen_fd);
        g_listen_fd = -1;
        return e ? e : EIO;
    }
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &a, listen_loop, NULL);
    pthread_attr_destroy(&a);
    if (rc != 0) return rc;
    g_inited = 1;
    return 0;
}

/* ---------- the requester: one engine thread per QP executes its send queue ---------- */

static void complete(struct fake_qp *q, const struct swr *w, int status, uint32_t bytes) {
    if (status == IBV_WC_SUCCESS && !w->signaled) return;
    struct ibv_wc wc;
    memset(&wc, 0, sizeof(wc));
    wc.wr_id = w->wr_id;
    wc.status = (enum ibv_wc_status)status;
    wc.opcode = w->opcode == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE;
    wc.byte_len = status == IBV_WC_SUCCESS ? bytes : 0;
    wc.qp_num = q->qp.qp_num;
    cq_push((struct fake_cq *)q->qp.send_cq, &wc);
}

static int in_err(struct fake_qp *q) {
    pthread_mutex_lock(&q->lk);
    int e = q->state == IBV_QPS_ERR || q->stop;
    pthread_mutex_unlock(&q->lk);
    return e;
}

/* A dead or silent peer: the requester retries for a while, then reports RETRY_EXC. */
static int retry_exceeded(struct fake_qp *q) {
    for (int waited = 0; waited < g_retry_ms; waited += 5) {
        if (in_err(q)) return IBV_WC_WR_FLUSH_ERR;
        usleep(5000);
    }
    return IBV_WC_RETRY_EXC_ERR;
}

static void drop_sock(struct fake_qp *q) {
    pthread_mutex_lock(&q->lk);
    if (q->sock >= 0) close(q->sock);
    q->sock = -1;
    pthread_mutex_unlock(&q->lk);
}

static int execute(struct fake_qp *q, struct swr *w, uint32_t *bytes) {
    uint64_t total = 0;
    char *local[MAX_SGE];
    struct fake_mr *lmr[MAX_SGE];
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < w->num_sge; i++) {
        struct fake_mr *m = find_mr_locked(w->sge[i].lkey, 0);
        uint64_t off = w->sge[i].addr - (uint64_t)(uintptr_t)(m ? m->mr.addr : 0);
        if (!m || m->mr.pd != q->qp.pd || w->sge[i].addr < (uint64_t)(uintptr_t)m->mr.addr ||
            off > m->mr.length || w->sge[i].length > m->mr.length - off ||
            (w->opcode == IBV_WR_RDMA_READ && !(m->access & IBV_ACCESS_LOCAL_WRITE))) {
            pthread_mutex_unlock(&g_lock);
            return IBV_WC_LOC_PROT_ERR;
        }
        local[i] = m->host + off;
        lmr[i] = m;
        m->busy++;
        total += w->sge[i].length;
    }
    pthread_mutex_unlock(&g_lock);
    int status = IBV_WC_SUCCESS;
    if (total > g_max_msg) {
        status = IBV_WC_LOC_LEN_ERR;
        goto out;
    }
    pthread_mutex_lock(&q->lk);
    int fd = q->sock;
    pthread_mutex_unlock(&q->lk);
    if (fd < 0) {
        struct sockaddr_un sa;
        socklen_t len;
        sock_name(q->dgid.raw, &sa, &len);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&sa, len) != 0) {
            if (fd >= 0) close(fd);
            status = retry_exceeded(q);
            goto out;
        }
        pthread_mutex_lock(&q->lk);
        q->sock = fd;
        if (q->state == IBV_QPS_ERR) shutdown(fd, SHUT_RDWR);
        pthread_mutex_unlock(&q->lk);
    }
    struct wire_req r;
    memset(&r, 0, sizeof(r));
    r.magic = MAGIC;
    r.op = w->opcode == IBV_WR_RDMA_READ ? OP_READ : OP_WRITE;
    r.src_qpn = q->qp.qp_num;
    r.dst_qpn = q->dest_qpn;
    r.psn = q->next_psn;
    r.rkey = w->rkey;
    r.len = (uint32_t)total;
    r.raddr = w->raddr;
    memcpy(r.src_gid, g_gid[q->sgid_index].raw, 16);
    uint32_t st;
    if (io_all(fd, &r, sizeof(r), 1) != 0 || io_all(fd, &st, sizeof(st), 0) != 0) {
        drop_sock(q);
        status = in_err(q) ? IBV_WC_WR_FLUSH_ERR : retry_exceeded(q);
        goto out;
    }
    if (st == ST_NOQP) {
        drop_sock(q);
        status = retry_exceeded(q);
        goto out;
    }
    if (st == ST_ACCESS || st == ST_INVREQ) {
        status = st == ST_ACCESS ? IBV_WC_REM_ACCESS_ERR : IBV_WC_REM_INV_REQ_ERR;
        goto out;
    }
    /* Move the bytes in chunks, stopping as soon as the QP is moved to ERR. */
    for (int i = 0; i < w->num_sge && status == IBV_WC_SUCCESS; i++) {
        for (uint32_t done = 0; done < w->sge[i].length;) {
            uint32_t n = w->sge[i].length - done < CHUNK ? w->sge[i].length - done : CHUNK;
            if (in_err(q) || io_all(fd, local[i] + done, n, r.op == OP_WRITE) != 0) {
                drop_sock(q);
                status = in_err(q) ? IBV_WC_WR_FLUSH_ERR : retry_exceeded(q);
                break;
            }
            done += n;
        }
    }
    if (status == IBV_WC_SUCCESS && r.op == OP_WRITE && io_all(fd, &st, sizeof(st), 0) != 0) {
        drop_sock(q);
        status = in_err(q) ? IBV_WC_WR_FLUSH_ERR : retry_exceeded(q);
    } else if (status == IBV_WC_SUCCESS && r.op == OP_WRITE && st != ST_OK) {
        /* The responder's QP was reset under the WRITE and dropped the rest of it. */
        drop_sock(q);
        status = in_err(q) ? IBV_WC_WR_FLUSH_ERR : retry_exceeded(q);
    }
    if (status == IBV_WC_SUCCESS) q->next_psn = (q->next_psn + 1) & 0xffffff;
out:
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < w->num_sge; i++) lmr[i]->busy--;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_lock);
    *bytes = (uint32_t)total;
    return status;
}

static void *engine(void *arg) {
    struct fake_qp *q = arg;
    pthread_mutex_lock(&q->lk);
    for (;;) {
        while (!q->stop && (q->sq_count == 0 || (q->state != IBV_QPS_RTS && q->state != IBV_QPS_ERR)))
            pthread_cond_wait(&q->cv, &q->lk);
        if (q->stop) break;
        struct swr w = q->sq[q->sq_head];
        if (q->state == IBV_QPS_ERR) {
            q->sq_head = (q->sq_head + 1) % q->sq_cap;
            q->sq_count--;
            pthread_mutex_unlock(&q->lk);
            complete(q, &w, IBV_WC_WR_FLUSH_ERR, 0); /* every WR, signalled or not */
            pthread_mutex_lock(&q->lk);
            continue;
        }
        q->busy = 1;
        pthread_mutex_unlock(&q->lk);
        uint32_t bytes = 0;
        int status = execute(q, &w, &bytes);
        pthread_mutex_lock(&q->lk);
        q->busy = 0;
        q->sq_head = (q->sq_head + 1) % q->sq_cap;
        q->sq_count--;
        if (status != IBV_WC_SUCCESS && q->state != IBV_QPS_ERR) {
            q->state = IBV_QPS_ERR;
            q->qp.state = IBV_QPS_ERR;
        }
        pthread_cond_broadcast(&q->cv);
        pthread_mutex_unlock(&q->lk);
        complete(q, &w, status, bytes);
        pthread_mutex_lock(&q->lk);
    }
    pthread_mutex_unlock(&q->lk);
    return NULL;
}

static int fake_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
    struct fake_qp *q = (struct fake_qp *)ibqp;
    int rc = 0;
    pthread_mutex_lock(&q->lk);
    if (q->state != IBV_QPS_RTS && q->state != IBV_QPS_ERR) {
        rc = EINVAL;
        *bad = wr;
    }
    for (; wr && rc == 0; wr = wr->next) {
        if (q->sq_count == q->sq_cap) {
            rc = ENOMEM;
        } else if (wr->num_sge < 0 || wr->num_sge > MAX_SGE ||
                   (wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_READ)) {
            rc = EINVAL;
        }
        if (rc) {
            *bad = wr;
            break;
        }
        struct swr *w = &q->sq[(q->sq_head + q->sq_count) % q->sq_cap];
        w->wr_id = wr->wr_id;
        w->opcode = wr->opcode;
        w->signaled = (wr->send_flags & IBV_SEND_SIGNALED) != 0;
        w->num_sge = wr->num_sge;
        w->raddr = wr->wr.rdma.remote_addr;
        w->rkey = wr->wr.rdma.rkey;
        memcpy(w->sge, wr->sg_list, sizeof(struct ibv_sge) * (size_t)wr->num_sge);
        q->sq_count++;
    }
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->lk);
    return rc;
}

static int fake_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) {
    (void)qp;
    *bad = wr;
    return EOPNOTSUPP; /* the stand-in moves RDMA READ/WRITE only */
}

/* ---------- device, context, PD ---------- */

struct ibv_device **ibv_get_device_list(int *num) {
    const char *v = getenv("HMC_FAKE_IBV_DEVICES");
    if (v && strcmp(v, "0") == 0) {
        errno = ENOSYS;
        return NULL;
    }
    memset(&g_device, 0, sizeof(g_device));
    g_device.node_type = IBV_NODE_CA;
    g_device.transport_type = IBV_TRANSPORT_IB;
    strcpy(g_device.name, "hmcfake0");
    strcpy(g_device.dev_name, "uverbs0");
    g_list[0] = &g_device;
    g_list[1] = NULL;
    if (num) *num = 1;
    return g_list;
}

void ibv_free_device_list(struct ibv_device **list) { (void)list; }

const char *ibv_get_device_name(struct ibv_device *d) { return d->name; }

struct ibv_context *ibv_open_device(struct ibv_device *d) {
    pthread_mutex_lock(&g_lock);
    int rc = nic_start_locked();
    pthread_mutex_unlock(&g_lock);
    if (rc) {
        errno = rc;
        return NULL;
    }
    struct ibv_context *c = calloc(1, sizeof(*c));
    if (!c) {
        errno = ENOMEM;
        return NULL;
    }
    c->device = d;
    c->cmd_fd = -1;
    c->async_fd = -1;
    c->num_comp_vectors = 1;
    pthread_mutex_init(&c->mutex, NULL);
    c->ops.poll_cq = fake_poll_cq;
    c->ops.req_notify_cq = fake_req_notify_cq;
    c->ops.post_send = fake_post_send;
    c->ops.post_recv = fake_post_recv;
    pthread_mutex_lock(&g_lock);
    g_live_ctx++;
    pthread_mutex_unlock(&g_lock);
    return c;
}

int ibv_close_device(struct ibv_context *c) {
    free(c);
    pthread_mutex_lock(&g_lock);
    g_live_ctx--;
    pthread_mutex_unlock(&g_lock);
    return 0;
}

int ibv_query_device(struct ibv_context *c, struct ibv_device_attr *a) {
    (void)c;
    memset(a, 0, sizeof(*a));
    strcpy(a->fw_ver, "hmc-standin-1");
    a->max_mr_size = UINT64_MAX;
    a->page_size_cap = 4096;
    a->max_qp = 65536;
    a->max_qp_wr = MAX_QP_WR;
    a->max_sge = MAX_SGE;
    a->max_sge_rd = MAX_SGE;
    a->max_cq = 65536;
    a->max_cqe = MAX_CQE;
    a->max_mr = 1 << 20;
    a->max_pd = 1 << 16;
    a->max_qp_rd_atom = MAX_RD_ATOM;
    a->max_qp_init_rd_atom = MAX_RD_ATOM;
    a->max_pkeys = 1;
    a->phys_port_cnt = 1;
    return 0;
}

int ibv_query_port(struct ibv_context *c, uint8_t port, struct _compat_ibv_port_attr *out) {
    (void)c;
    if (port != 1) return EINVAL;
    struct ibv_port_attr *a = (struct ibv_port_attr *)out;
    memset(a, 0, sizeof(*a));
    a->state = IBV_PORT_ACTIVE;
    a->max_mtu = IBV_MTU_4096;
    a->active_mtu = g_active_mtu;
    a->gid_tbl_len = 2;
    a->max_msg_sz = g_max_msg;
    a->pkey_tbl_len = 1;
    a->link_layer = IBV_LINK_LAYER_ETHERNET;
    a->phys_state = 5;
    return 0;
}

int ibv_query_gid(struct ibv_context *c, uint8_t port, int index, union ibv_gid *gid) {
    (void)c;
    if (port != 1 || index < 0 || index > 1) return -1;
    *gid = g_gid[index];
    return 0;
}

int _ibv_query_gid_ex(struct ibv_context *c, uint32_t port, uint32_t index,
                      struct ibv_gid_entry *e, uint32_t flags, size_t size) {
    (void)c;
    (void)flags;
    if (port != 1 || index > 1) return ENODATA;
    if (size < sizeof(*e)) return EINVAL;
    memset(e, 0, sizeof(*e));
    e->gid = g_gid[index];
    e->gid_index = index;
    e->port_num = port;
    e->gid_type = index == 0 ? IBV_GID_TYPE_ROCE_V1 : IBV_GID_TYPE_ROCE_V2;
    return 0;
}

const char *ibv_wc_status_str(enum ibv_wc_status s) {
    static const char *names[] = {"success", "local length error", "local QP operation error",
        "local EE context operation error", "local protection error", "Work Request Flushed Error",
        "memory management operation error", "bad response error", "local access error",
        "remote invalid request error", "remote access error", "remote operation error",
        "transport retry counter exceeded", "RNR retry counter exceeded"};
    return (unsigned)s < sizeof(names) / sizeof(names[0]) ? names[s] : "unknown";
}

struct ibv_pd *ibv_alloc_pd(struct ibv_context *c) {
    struct ibv_pd *pd = calloc(1, sizeof(*pd));
    if (!pd) {
        errno = ENOMEM;
        return NULL;
    }
    pd->context = c;
    pthread_mutex_lock(&g_lock);
    g_live_pds++;
    pthread_mutex_unlock(&g_lock);
    return pd;
}

int ibv_dealloc_pd(struct ibv_pd *pd) {
    pthread_mutex_lock(&g_lock);
    for (struct fake_mr *m = g_mrs; m; m = m->next)
        if (m->mr.pd == pd) {
            pthread_mutex_unlock(&g_lock);
            return EBUSY;
        }
    for (struct fake_qp *q = g_qps; q; q = q->next)
        if (q->qp.pd == pd) {
            pthread_mutex_unlock(&g_lock);
            return EBUSY;
        }
    g_live_pds--;
    pthread_mutex_unlock(&g_lock);
    free(pd);
    return 0;
}

/* ---------- memory regions ---------- */

#define KNOWN_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static struct ibv_mr *add_mr(struct ibv_pd *pd, char *host, size_t len, uint64_t iova, int access,
                             void *mapping, size_t maplen) {
    /* As the spec requires: remote write needs local write; unknown bits are refused. */
    if ((access & ~KNOWN_ACCESS) ||
        ((access & IBV_ACCESS_REMOTE_WRITE) && !(access & IBV_ACCESS_LOCAL_WRITE))) {
        errno = EINVAL;
        return NULL;
    }
    struct fake_mr *m = calloc(1, sizeof(*m));
    if (!m) {
        errno = ENOMEM;
        return NULL;
    }
    pthread_mutex_lock(&g_lock);
    uint32_t k = g_next_key++;
    m->mr.context = pd->context;
    m->mr.pd = pd;
    m->mr.addr = (void *)(uintptr_t)iova;
    m->mr.length = len;
    m->mr.handle = k;
    m->mr.lkey = (k << 8) | 0x11;
    m->mr.rkey = (k << 8) | 0x7e;
    m->access = access;
    m->host = host;
    m->mapping = mapping;
    m->maplen = maplen;
    m->next = g_mrs;
    g_mrs = m;
    g_live_mrs++;
    pthread_mutex_unlock(&g_lock);
    return &m->mr;
}

struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access) {
    return add_mr(pd, addr, len, (uint64_t)(uintptr_t)addr, access, NULL, 0);
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
                                unsigned int access) {
    return add_mr(pd, addr, len, iova, (int)access, NULL, 0);
}

struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len, uint64_t iova,
                                 int fd, int access) {
    if (g_dmabuf_eopnotsupp) {
        errno = EOPNOTSUPP;
        return NULL;
    }
    if (fd < 0) {
        errno = EBADF;
        return NULL;
    }
    /* A memfd stands in for a DMA-BUF: map it, as the device would reach its pages. */
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uint64_t base = offset & ~(uint64_t)(page - 1);
    size_t maplen = (size_t)(offset - base) + len;
    void *p = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)base);
    if (p == MAP_FAILED) return NULL;
    struct ibv_mr *mr = add_mr(pd, (char *)p + (offset - base), len, iova, access, p, maplen);
    if (!mr) munmap(p, maplen);
    return mr;
}

int ibv_dereg_mr(struct ibv_mr *ibmr) {
    struct fake_mr *m = (struct fake_mr *)ibmr;
    pthread_mutex_lock(&g_lock);
    struct fake_mr **pp = &g_mrs;
    while (*pp && *pp != m) pp = &(*pp)->next;
    if (!*pp) {
        pthread_mutex_unlock(&g_lock);
        return EINVAL;
    }
    *pp = m->next; /* no new user can find it */
    while (m->busy) pthread_cond_wait(&g_cv, &g_lock);
    g_live_mrs--;
    pthread_mutex_unlock(&g_lock);
    if (m->mapping) munmap(m->mapping, m->maplen);
    free(m);
    return 0;
}

/* ---------- queue pairs ---------- */

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a) {
    if (a->qp_type != IBV_QPT_RC || !a->send_cq || !a->recv_cq || a->srq) {
        errno = EOPNOTSUPP;
        return NULL;
    }
    if (a->cap.max_send_wr < 1 || a->cap.max_send_wr > MAX_QP_WR || a->cap.max_send_sge > MAX_SGE ||
        a->cap.max_recv_wr > MAX_QP_WR || a->cap.max_recv_sge > MAX_SGE) {
        errno = EINVAL;
        return NULL;
    }
    struct fake_qp *q = calloc(1, sizeof(*q));
    if (!q || !(q->sq = calloc(a->cap.max_send_wr, sizeof(struct swr)))) {
        free(q);
        errno = ENOMEM;
        return NULL;
    }
    q->sq_cap = (int)a->cap.max_send_wr;
    q->sock = -1;
    q->state = IBV_QPS_RESET;
    pthread_mutex_init(&q->lk, NULL);
    pthread_cond_init(&q->cv, NULL);
    pthread_mutex_init(&q->qp.mutex, NULL);
    pthread_cond_init(&q->qp.cond, NULL);
    q->qp.context = pd->context;
    q->qp.qp_context = a->qp_context;
    q->qp.pd = pd;
    q->qp.send_cq = a->send_cq;
    q->qp.recv_cq = a->recv_cq;
    q->qp.state = IBV_QPS_RESET;
    q->qp.qp_type = IBV_QPT_RC;
    if (pthread_create(&q->engine, NULL, engine, q) != 0) {
        free(q->sq);
        free(q);
        errno = EAGAIN;
        return NULL;
    }
    pthread_mutex_lock(&g_lock);
    q->qp.qp_num = g_next_qpn++ & 0xffffff;
    q->qp.handle = q->qp.qp_num;
    q->next = g_qps;
    g_qps = q;
    g_live_qps++;
    pthread_mutex_unlock(&g_lock);
    return &q->qp;
}

int ibv_destroy_qp(struct ibv_qp *ibqp) {
    struct fake_qp *q = (struct fake_qp *)ibqp;
    pthread_mutex_lock(&g_lock);
    struct fake_qp **pp = &g_qps;
    while (*pp && *pp != q) pp = &(*pp)->next;
    if (*pp) *pp = q->next;
    g_live_qps--;
    pthread_mutex_unlock(&g_lock);
    pthread_mutex_lock(&q->lk);
    q->stop = 1;
    q->incarnation++; /* a WRITE its responder is serving lands no more */
    if (q->sock >= 0) shutdown(q->sock, SHUT_RDWR);
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->lk);
    pthread_mutex_lock(&g_lock);
    while (q->serving > 0) pthread_cond_wait(&g_cv, &g_lock);
    pthread_mutex_unlock(&g_lock);
    pthread_join(q->engine, NULL);
    if (q->sock >= 0) close(q->sock);
    free(q->sq);
    free(q);
    return 0;
}

/* Required and optional attribute masks of each RC transition (IB spec, table 91). */
static int masks_for(int from, int to, int *req, int *opt) {
    *opt = 0;
    if (to == IBV_QPS_RESET || to == IBV_QPS_ERR) {
        *req = IBV_QP_STATE;
        return 0;
    }
    if (from == IBV_QPS_RESET && to == IBV_QPS_INIT) {
        *req = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    } else if (from == IBV_QPS_INIT && to == IBV_QPS_INIT) {
        *req = IBV_QP_STATE;
        *opt = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    } else if (from == IBV_QPS_INIT && to == IBV_QPS_RTR) {
        *req = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
        *opt = IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX;
    } else if ((from == IBV_QPS_RTR || from == IBV_QPS_RTS) && to == IBV_QPS_RTS) {
        *req = from == IBV_QPS_RTR ? IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
                                         IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC
                                   : IBV_QP_STATE;
        *opt = IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER | IBV_QP_ALT_PATH |
               IBV_QP_PATH_MIG_STATE;
    } else {
        return EINVAL;
    }
    return 0;
}

static void log_refusal(const char *why) {
    if (getenv("HMC_FAKE_IBV_VERBOSE")) fprintf(stderr, "ibverbs stand-in: modify_qp: %s\n", why);
}

int ibv_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *a, int mask) {
    struct fake_qp *q = (struct fake_qp *)ibqp;
    if (!(mask & IBV_QP_STATE)) return EINVAL;
    pthread_mutex_lock(&q->lk);
    int from = q->state, to = a->qp_state, req, opt, rc = EINVAL;
    if (masks_for(from, to, &req, &opt) != 0) {
        log_refusal("transition not allowed");
        goto out;
    }
    if ((mask & req) != req || (mask & ~(req | opt))) {
        log_refusal("attribute mask");
        goto out;
    }
    if ((mask & IBV_QP_PORT) && a->port_num != 1) goto out;
    if ((mask & IBV_QP_ACCESS_FLAGS) && (a->qp_access_flags & ~(KNOWN_ACCESS | IBV_ACCESS_REMOTE_ATOMIC))) goto out;
    if ((mask & IBV_QP_PATH_MTU) && (a->path_mtu < IBV_MTU_256 || a->path_mtu > g_active_mtu)) {
        log_refusal("path MTU above the port's active MTU");
        goto out;
    }
    if ((mask & IBV_QP_AV) && (!a->ah_attr.is_global || a->ah_attr.grh.sgid_index > 1 ||
                               a->ah_attr.port_num != 1)) {
        log_refusal("address vector (RoCE needs a GRH with a valid sgid_index, port 1)");
        goto out;
    }
    if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && a->max_dest_rd_atomic > MAX_RD_ATOM) goto out;
    if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a->max_rd_atomic > MAX_RD_ATOM) goto out;
    if ((mask & IBV_QP_TIMEOUT) && a->timeout > 31) goto out;
    if ((mask & IBV_QP_RETRY_CNT) && a->retry_cnt > 7) goto out;
    if ((mask & IBV_QP_RNR_RETRY) && a->rnr_retry > 7) goto out;
    if (to == IBV_QPS_RESET) {
        while (q->busy) pthread_cond_wait(&q->cv, &q->lk);
        q->sq_head = q->sq_count = 0; /* RESET discards WRs without completions */
        if (q->sock >= 0) {
            close(q->sock);
            q->sock = -1;
        }
    }
    if (mask & IBV_QP_PORT) q->port = a->port_num;
    if (mask & IBV_QP_ACCESS_FLAGS) q->access = (int)a->qp_access_flags;
    if (mask & IBV_QP_PATH_MTU) q->mtu = a->path_mtu;
    if (mask & IBV_QP_AV) {
        q->dgid = a->ah_attr.grh.dgid;
        q->sgid_index = a->ah_attr.grh.sgid_index;
    }
    if (mask & IBV_QP_DEST_QPN) q->dest_qpn = a->dest_qp_num;
    if (mask & IBV_QP_RQ_PSN) q->expected_psn = a->rq_psn & 0xffffff;
    if (mask & IBV_QP_SQ_PSN) q->next_psn = a->sq_psn & 0xffffff;
    if (mask & IBV_QP_TIMEOUT) q->timeout = a->timeout;
    if (mask & IBV_QP_RETRY_CNT) q->retry_cnt = a->retry_cnt;
    if (mask & IBV_QP_RNR_RETRY) q->rnr_retry = a->rnr_retry;
    if (mask & IBV_QP_MAX_QP_RD_ATOMIC) q->rd_atomic = a->max_rd_atomic;
    if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) q->dest_rd_atomic = a->max_dest_rd_atomic;
    if (to == IBV_QPS_RESET || to == IBV_QPS_ERR) q->incarnation++;
    q->state = to;
    q->qp.state = (enum ibv_qp_state)to;
    if (to == IBV_QPS_ERR && q->sock >= 0) shutdown(q->sock, SHUT_RDWR);
    pthread_cond_broadcast(&q->cv);
    rc = 0;
out:
    pthread_mutex_unlock(&q->lk);
    return rc;
}

/* ---------- test control ---------- */

long hmc_fake_ibv_live(const char *what) {
    pthread_mutex_lock(&g_lock);
    long v = !strcmp(what, "qps") ? g_live_qps : !strcmp(what, "mrs") ? g_live_mrs
           : !strcmp(what, "cqs") ? g_live_cqs : !strcmp(what, "contexts") ? g_live_ctx
           : !strcmp(what, "pds") ? g_live_pds : !strcmp(what, "channels") ? g_live_channels : -1;
    pthread_mutex_unlock(&g_lock);
    return v;
}
