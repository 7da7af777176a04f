/*
 * hmc.h: the C API of libhmc (the HMC one-sided transfer engine and RPC runtime).
 * Pure C11; usable from C++ as is. Guide: docs/c-api.md.
 *
 * Conventions, for every function below:
 *
 * - Every call returns an hmc_status. HMC_OK (0) is success; HMC_PENDING (1) says a
 *   request or call is still running and is not an error; everything else is an error, and
 *   hmc_last_error() then gives this thread's message: which argument or limit, and what
 *   to do. A message stays valid until the next failing call on the same thread.
 * - Handles (hmc_engine *, hmc_mem *, hmc_request *, ...) are opaque: never dereference
 *   them. A NULL, closed, released, made-up or wrong-kind handle is HMC_ERR_INVALID_ARGUMENT,
 *   never a crash. A handle stays valid until the call that closes or releases it (or, for
 *   an engine's registrations and requests, until hmc_engine_close of the engine).
 * - Threads: every function may be called from any thread, and every handle used from
 *   many threads at once. Blocking functions (connect, transfer_sync, request_wait, RPC
 *   calls, close) must not be called from a completion callback or an RPC handler (they
 *   run on the library's threads): they fail HMC_ERR_STATE there.
 * - Pointers the caller passes are only read during the call (strings, descriptor arrays,
 *   option arrays), except registered memory, which the caller keeps allocated until it
 *   is deregistered. Memory the library returns (messages, notification lists, byte
 *   buffers) is the library's, freed by the matching _free call, never by free().
 * - Structs that may grow start with size_t struct_size: set it to sizeof(the struct)
 *   (the _INIT macros do), so that a program built against this header runs on a newer
 *   library, and a size the library cannot read is HMC_ERR_STRUCT_SIZE, not a crash.
 * - Timeouts are in milliseconds. For a call's deadline, 0 means the engine's
 *   default_timeout_ms option (10 s), or the RPC client's default_timeout_ms (30 s); for
 *   a wait (hmc_request_wait, hmc_xfer_wait, hmc_rpc_pending_wait), 0 means look and
 *   return at once.
 * - The library owns a runtime (two threads, started on first use). A process that forks
 *   after using libhmc cannot use it in the child (HMC_ERR_STATE): fork first, or exec.
 * - When it starts, the library sets SIGPIPE to "ignore" if the program left it at the
 *   default (which would kill the process when a peer closes a socket mid-write); a
 *   handler the program installed is kept.
 */
#ifndef HMC_HMC_H
#define HMC_HMC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Versioning ------------------------------------------------------------------- */

/* The SONAME is libhmc.so.<MAJOR>. A program needs a library of the same major and a
 * minor at least the header's it was built with. */
#define HMC_API_VERSION_MAJOR 0
#define HMC_API_VERSION_MINOR 1
#define HMC_API_VERSION ((HMC_API_VERSION_MAJOR << 16) | HMC_API_VERSION_MINOR)

/* The library's version, (major << 16) | minor. */
uint32_t hmc_api_version(void);

/* ---- Errors ------------------------------------------------------------------------ */

typedef enum hmc_status {
    HMC_OK = 0,
    HMC_PENDING = 1,                /* not an error: still running */
    HMC_ERR_INVALID_ARGUMENT = 2,   /* NULL/zero/huge/unknown argument or option; bad handle */
    HMC_ERR_STRUCT_SIZE = 3,        /* a struct_size this library cannot read */
    HMC_ERR_NOT_CONNECTED = 4,
    HMC_ERR_ALREADY_CONNECTED = 5,
    HMC_ERR_NOT_REGISTERED = 6,     /* an address in no registered region */
    HMC_ERR_DEADLINE = 7,           /* the timeout passed; the memory is no longer touched */
    HMC_ERR_CANCELLED = 8,
    HMC_ERR_PEER_GONE = 9,          /* the peer went away or restarted */
    HMC_ERR_LIMIT = 10,             /* a limit was reached; the message names the option */
    HMC_ERR_UNSUPPORTED_MEMORY = 11,
    HMC_ERR_UNSUPPORTED = 12,
    HMC_ERR_AUTH = 13,              /* authentication failed or was refused */
    HMC_ERR_UNAVAILABLE = 14,       /* backend, transport, peer or service unreachable */
    HMC_ERR_STATE = 15,             /* not now: finalized, blocking call in a callback, fork */
    HMC_ERR_REMOTE = 16,            /* an RPC server answered a non-OK status */
    HMC_ERR_BUFFER_TOO_SMALL = 17,  /* the length needed was written; call again */
    HMC_ERR_INTERNAL = 18           /* a bug in libhmc (a caught panic included) */
} hmc_status;

/* This thread's last error message ("" if none). Owned by the library; valid until the
 * next failing call on this thread. */
const char *hmc_last_error(void);

/* The name of a status ("HMC_ERR_DEADLINE"); a static string. */
const char *hmc_status_name(int status);

/* ---- Engine ------------------------------------------------------------------------ */

typedef struct hmc_engine hmc_engine;
typedef struct hmc_mem hmc_mem;
typedef struct hmc_request hmc_request;
typedef struct hmc_notify_list hmc_notify_list;

/* One option of the engine, HIXL's option map as key/value strings. Keys: transport
 * (tcp|shm|ucx|rdma|auto|<plugin>), auth_secret_file, auth_secret, metadata
 * (embedded|etcd://host:port/ns), name, default_timeout_ms, no_progress_timeout_ms,
 * max_regions, max_remote_regions, max_descs_per_transfer, max_pending_notifies,
 * max_notify_len, max_metadata_blob_len, plugin_path, copy_threads, ... (the engine's
 * EngineConfig; an unknown key is HMC_ERR_INVALID_ARGUMENT listing the known ones). */
typedef struct hmc_option {
    const char *key;
    const char *value;
} hmc_option;

typedef struct hmc_engine_options {
    size_t struct_size;         /* sizeof(hmc_engine_options) */
    const hmc_option *options;  /* num_options entries (NULL if 0); read during the call */
    size_t num_options;
} hmc_engine_options;
#define HMC_ENGINE_OPTIONS_INIT {sizeof(hmc_engine_options), NULL, 0}

/* Opens an engine whose metadata service listens at local_engine: "ip:port" for an
 * engine others connect to, "ip" (or "ip:0") for one that only connects out, as HIXL's
 * Initialize. options may be NULL (defaults). On success *out is the engine, which the
 * caller closes with hmc_engine_close. */
hmc_status hmc_engine_open(const char *local_engine, const hmc_engine_options *options,
                           hmc_engine **out);

/* Closes the engine: cancels its transfers in flight, disconnects, stops its service.
 * Its registrations and requests become invalid handles; the memory it had registered
 * may be freed once this returns. A second close is HMC_ERR_INVALID_ARGUMENT. */
hmc_status hmc_engine_close(hmc_engine *engine);

/* The engine's name (what peers pass to hmc_connect), NUL-terminated into buf of cap
 * bytes; *len (if not NULL) gets its length without the NUL. buf NULL or too small:
 * HMC_ERR_BUFFER_TOO_SMALL with *len set. */
hmc_status hmc_engine_name(const hmc_engine *engine, char *buf, size_t cap, size_t *len);

/* A descriptor that becomes readable when a request of this engine completes or a
 * notification arrives, for epoll, io_uring or asio loops. Owned by the engine (do not
 * close it); valid until hmc_engine_close. After it fires: hmc_engine_fd_drain, then
 * hmc_engine_poll_completed and hmc_get_notifies. */
hmc_status hmc_engine_fd(const hmc_engine *engine, int *fd);
hmc_status hmc_engine_fd_drain(const hmc_engine *engine);

/* ---- Memory ------------------------------------------------------------------------ */

enum { HMC_MEM_HOST = 0, HMC_MEM_DEVICE = 1 };
enum { HMC_DEVICE_CUDA = 1, HMC_DEVICE_ROCM = 2, HMC_DEVICE_MLU = 3, HMC_DEVICE_MUSA = 4,
       HMC_DEVICE_ASCEND = 5 };
/* hmc_mem_desc.flags: peers may only read it, and it may only be a WRITE's source. */
#define HMC_MEM_READ_ONLY 1u

typedef struct hmc_mem_desc {
    size_t struct_size;     /* sizeof(hmc_mem_desc) */
    uint64_t addr;          /* host or device address */
    uint64_t len;           /* bytes, > 0 */
    uint32_t mem_type;      /* HMC_MEM_HOST or HMC_MEM_DEVICE */
    uint32_t device_kind;   /* device memory: HMC_DEVICE_CUDA, ...; host: 0 */
    uint32_t device_id;     /* device memory: the device ordinal; host: 0 */
    uint32_t flags;         /* 0 or HMC_MEM_READ_ONLY (host memory only) */
} hmc_mem_desc;
#define HMC_MEM_DESC_INIT {sizeof(hmc_mem_desc), 0, 0, HMC_MEM_HOST, 0, 0, 0}

/* Registers memory for transfers by this engine and its peers. Host memory must be
 * mapped (an unmapped range, or a read-only one without HMC_MEM_READ_ONLY, is refused);
 * device memory is opened through its vendor's library (loaded at run time: a missing
 * one is HMC_ERR_UNAVAILABLE). The memory must stay allocated until
 * hmc_deregister_mem (or hmc_engine_close) has returned: peers may read or write it at
 * any time until then. */
hmc_status hmc_register_mem(hmc_engine *engine, const hmc_mem_desc *desc, hmc_mem **out);

/* Deregisters: peers can no longer reach the memory once this returns (a transfer still
 * using it is waited for), so the caller may free it. mem must be of this engine. */
hmc_status hmc_deregister_mem(hmc_engine *engine, hmc_mem *mem);

/* ---- Connections and transfers ----------------------------------------------------- */

/* Connects to the engine named remote_engine ("ip:port", or its name in the metadata
 * service) within timeout_ms: fetches its region table and connects the data plane. */
hmc_status hmc_connect(hmc_engine *engine, const char *remote_engine, uint32_t timeout_ms);
hmc_status hmc_disconnect(hmc_engine *engine, const char *remote_engine);

enum { HMC_READ = 0, HMC_WRITE = 1 };  /* READ: remote to local; WRITE: local to remote */

/* One element of a transfer. Fixed layout (it never grows). */
typedef struct hmc_xfer_desc {
    uint64_t local_addr;   /* in this engine's registered memory */
    uint64_t remote_addr;  /* in the peer's registered memory */
    uint64_t len;
} hmc_xfer_desc;

/* Moves every descriptor (at most max_descs_per_transfer) between this engine and
 * remote_engine, which must be connected; every address is checked before a byte moves.
 * Returns when done, or HMC_ERR_DEADLINE after timeout_ms, when the transport no longer
 * touches the memory. */
hmc_status hmc_transfer_sync(hmc_engine *engine, const char *remote_engine, uint32_t op,
                             const hmc_xfer_desc *descs, size_t num_descs,
                             uint32_t timeout_ms);

/* Called once, on a library thread, when a request ends, with its final status. It must
 * not block or call blocking functions; it may call hmc_request_status/release. */
typedef void (*hmc_request_callback)(void *user_data, hmc_request *req, int status);

typedef struct hmc_transfer_args {
    size_t struct_size;             /* sizeof(hmc_transfer_args) */
    hmc_request_callback callback;  /* NULL: none */
    void *user_data;                /* passed to callback */
} hmc_transfer_args;
#define HMC_TRANSFER_ARGS_INIT {sizeof(hmc_transfer_args), NULL, NULL}

/* Starts a transfer and returns at once with *out, a request the caller releases with
 * hmc_request_release. Its end is seen by hmc_request_status/wait, the engine's fd
 * (hmc_engine_poll_completed), or args->callback. args may be NULL. */
hmc_status hmc_transfer_async(hmc_engine *engine, const char *remote_engine, uint32_t op,
                              const hmc_xfer_desc *descs, size_t num_descs,
                              uint32_t timeout_ms, const hmc_transfer_args *args,
                              hmc_request **out);

/* hmc_request_status's *state (HIXL's TransferStatus order). */
enum { HMC_REQUEST_WAITING = 0, HMC_REQUEST_COMPLETED = 1, HMC_REQUEST_TIMEOUT = 2,
       HMC_REQUEST_FAILED = 3 };

/* HMC_PENDING while running, HMC_OK once completed; once ended otherwise, the failure's
 * status (HMC_ERR_DEADLINE, HMC_ERR_CANCELLED, HMC_ERR_PEER_GONE, ...) with its message.
 * *state (if not NULL) gets one of HMC_REQUEST_*. req must be of this engine. */
hmc_status hmc_request_status(hmc_engine *engine, hmc_request *req, uint32_t *state);

/* Waits up to timeout_ms for the request to end (0: just look), then returns as
 * hmc_request_status. */
hmc_status hmc_request_wait(hmc_engine *engine, hmc_request *req, uint32_t timeout_ms);

/* Cancels a running request: it ends HMC_ERR_CANCELLED, and once that is reported the
 * transport no longer touches its memory. An ended request keeps its status. */
hmc_status hmc_request_cancel(hmc_engine *engine, hmc_request *req);

/* Releases the handle (cancelling the request if still running; its callback, if any,
 * still runs once). A second release is HMC_ERR_INVALID_ARGUMENT. */
hmc_status hmc_request_release(hmc_engine *engine, hmc_request *req);

/* Up to cap requests of this engine that ended since the last call (released ones are
 * skipped), into reqs; *count gets how many. */
hmc_status hmc_engine_poll_completed(hmc_engine *engine, hmc_request **reqs, size_t cap,
                                     size_t *count);

typedef struct hmc_telemetry {
    size_t struct_size;          /* sizeof(hmc_telemetry), set by the caller */
    uint64_t posted_at_unix_ns;  /* when it was posted */
    uint64_t duration_ns;        /* how long it ran (0 while running) */
    uint64_t bytes;              /* bytes asked for */
    uint64_t descs;              /* descriptors given */
} hmc_telemetry;
#define HMC_TELEMETRY_INIT {sizeof(hmc_telemetry), 0, 0, 0, 0}

/* What the request did: HMC_OK once ended, HMC_PENDING (with duration 0) while running. */
hmc_status hmc_request_telemetry(hmc_engine *engine, hmc_request *req, hmc_telemetry *out);

/* ---- Prepared lists and index transfers (NIXL's shape) ------------------------------- */

typedef struct hmc_prepped hmc_prepped;  /* a prepared descriptor list */
typedef struct hmc_xfer hmc_xfer;        /* a transfer made of two prepared lists */

/* count blocks of len bytes, stride apart from addr (count 1: one block). Fixed layout. */
typedef struct hmc_block_desc {
    uint64_t addr;
    uint64_t len;
    uint64_t stride;
    uint64_t count;
} hmc_block_desc;

/* Resolves blocks of this engine's registered memory once (an entry outside every
 * region, or straddling two, is refused here). Entries are numbered in order, a strided
 * descriptor giving count of them. Released with hmc_prepped_release. */
hmc_status hmc_prep_local(hmc_engine *engine, const hmc_block_desc *blocks, size_t num_blocks,
                          hmc_prepped **out);
/* The same for the connected peer remote_engine's memory (its table is fetched again once
 * if an entry is not in the one known). The list becomes invalid when the peer
 * deregisters a region under it or restarts: transfers made of it then fail. */
hmc_status hmc_prep_remote(hmc_engine *engine, const char *remote_engine,
                           const hmc_block_desc *blocks, size_t num_blocks,
                           uint32_t timeout_ms, hmc_prepped **out);
hmc_status hmc_prepped_len(const hmc_engine *engine, const hmc_prepped *list,
                           uint64_t *entries);
hmc_status hmc_prepped_release(hmc_engine *engine, hmc_prepped *list);

/* A transfer of entries local_idx[k] of local with remote_idx[k] of remote, for every k <
 * num (pairs of one length; contiguous pairs merge). With notify_name (NULL: none), every
 * post ends by delivering that notification to the peer, after the bytes (a failed post
 * sends a failure notice instead). Released with hmc_xfer_release. */
hmc_status hmc_make_xfer(hmc_engine *engine, uint32_t op, const hmc_prepped *local,
                         const uint64_t *local_idx, const hmc_prepped *remote,
                         const uint64_t *remote_idx, size_t num, const char *notify_name,
                         const void *notify_msg, size_t notify_len, hmc_xfer **out);
/* Starts the transfer (again, once the last post ended). Its bytes move in chunks of at
 * most progress_chunk_bytes, each within no_progress_timeout_ms; the end of a post also
 * makes the engine's descriptor readable. */
hmc_status hmc_xfer_post(hmc_engine *engine, hmc_xfer *xfer);
/* The last post, as hmc_request_status reports (HMC_ERR_STATE before the first post). */
hmc_status hmc_xfer_status(hmc_engine *engine, hmc_xfer *xfer, uint32_t *state);
hmc_status hmc_xfer_wait(hmc_engine *engine, hmc_xfer *xfer, uint32_t timeout_ms);
/* The last post's telemetry (bytes moved, runs after merging, duration): HMC_OK once it
 * ended, HMC_PENDING before. */
hmc_status hmc_xfer_telemetry(hmc_engine *engine, hmc_xfer *xfer, hmc_telemetry *out);
/* Cancels a post in progress and waits until the transport is done with it; later posts
 * are refused (the handle is invalid). */
hmc_status hmc_xfer_release(hmc_engine *engine, hmc_xfer *xfer);

/* ---- Notifications ----------------------------------------------------------------- */

/* Sends a small message (name + msg, at most max_notify_len bytes with the sender's
 * name) to a connected engine, where it waits for hmc_get_notifies. */
hmc_status hmc_send_notify(hmc_engine *engine, const char *remote_engine, const char *name,
                           const void *msg, size_t msg_len, uint32_t timeout_ms);

/* One received notification. The library allocates these; fields are only ever added at
 * the end, so a program reads those it knows. */
typedef struct hmc_notify {
    size_t struct_size;
    const char *from;     /* the sending engine's name */
    const char *name;
    const uint8_t *msg;
    size_t msg_len;
    const char *failed;   /* NULL, or why the transfer it was attached to failed */
} hmc_notify;

/* Takes every notification received so far (oldest first) into a list the caller frees
 * with hmc_notify_list_free; *count gets how many (possibly 0). */
hmc_status hmc_get_notifies(hmc_engine *engine, hmc_notify_list **out, size_t *count);

/* The index-th notification; the pointer (and its strings) is valid until the list is
 * freed. */
hmc_status hmc_notify_list_get(const hmc_notify_list *list, size_t index,
                               const hmc_notify **out);
hmc_status hmc_notify_list_free(hmc_notify_list *list);

/* ---- Metadata blobs (connecting without a service lookup) -------------------------- */

/* This engine's metadata (name, addresses, regions) into buf; *len gets its length.
 * buf NULL or too small: HMC_ERR_BUFFER_TOO_SMALL with *len set. */
hmc_status hmc_local_metadata(const hmc_engine *engine, void *buf, size_t cap, size_t *len);

/* Adds the engine a blob describes as a connected peer; its name (what transfers take)
 * goes to name/name_len as in hmc_engine_name (both may be NULL). */
hmc_status hmc_add_remote(hmc_engine *engine, const void *blob, size_t blob_len,
                          uint32_t timeout_ms, char *name, size_t cap, size_t *name_len);
hmc_status hmc_remove_remote(hmc_engine *engine, const char *remote_engine);

/* ---- KV caches (LLM-DataDist's model) ------------------------------------------------ */

typedef struct hmc_datadist hmc_datadist;  /* one cluster's KV service over an engine */
typedef struct hmc_kv_cache hmc_kv_cache;

enum { HMC_ROLE_PROMPT = 0, HMC_ROLE_DECODER = 1 };
enum { HMC_DTYPE_FP8 = 0, HMC_DTYPE_F16 = 1, HMC_DTYPE_BF16 = 2, HMC_DTYPE_F32 = 3,
       HMC_DTYPE_I8 = 4, HMC_DTYPE_U8 = 5, HMC_DTYPE_I32 = 6 };

/* A request's whole cache at a prompt cluster. Fixed layout. */
typedef struct hmc_cache_key {
    uint64_t prompt_cluster_id;
    uint64_t req_id;
    uint64_t model_id;
    uint64_t prefix_id;  /* 0: none */
} hmc_cache_key;

/* A paged cache's blocks at a cluster. Fixed layout. */
typedef struct hmc_blocks_key {
    uint64_t prompt_cluster_id;
    uint64_t model_id;
} hmc_blocks_key;

/* A cache: num_tensors tensors (2 per layer, K and V) of one shape and dtype, each at its
 * own address. For a blocks cache shape[0] is the block count. */
typedef struct hmc_cache_desc {
    size_t struct_size;     /* sizeof(hmc_cache_desc) */
    uint32_t mem_type;      /* HMC_MEM_HOST or HMC_MEM_DEVICE */
    uint32_t device_kind;   /* device memory: HMC_DEVICE_*; host: 0 */
    uint32_t device_id;
    uint32_t num_tensors;
    uint32_t dtype;         /* HMC_DTYPE_* */
    uint32_t num_dims;      /* dimensions in shape, 1 to 16 */
    const uint64_t *shape;  /* read during the call */
} hmc_cache_desc;
#define HMC_CACHE_DESC_INIT {sizeof(hmc_cache_desc), HMC_MEM_HOST, 0, 0, 0, 0, 0, NULL}

/* Which layers a blocks transfer covers (NULL: every tensor). */
typedef struct hmc_kv_layers {
    size_t struct_size;          /* sizeof(hmc_kv_layers) */
    uint32_t layer_begin;
    uint32_t layer_end;          /* one past the last */
    uint32_t tensors_per_layer;  /* 2 for K and V */
} hmc_kv_layers;
#define HMC_KV_LAYERS_INIT {sizeof(hmc_kv_layers), 0, 0, 2}

/* A KV service for cluster cluster_id in role HMC_ROLE_*, over engine (which must stay
 * open while it is used). Closed with hmc_datadist_close, which deallocates its caches. */
hmc_status hmc_datadist_new(hmc_engine *engine, uint64_t cluster_id, uint32_t role,
                            hmc_datadist **out);
hmc_status hmc_datadist_close(hmc_datadist *datadist);
/* Links cluster_id, served by the engine remote_engine (connects to it). */
hmc_status hmc_datadist_link(hmc_datadist *datadist, uint64_t cluster_id,
                             const char *remote_engine, uint32_t timeout_ms);
hmc_status hmc_datadist_unlink(hmc_datadist *datadist, uint64_t cluster_id);

/* Allocates a host cache, registers it and publishes it under keys (num_keys of them,
 * may be 0) and blocks_key (NULL: none). The memory is the library's until
 * hmc_datadist_deallocate_cache; hmc_kv_cache_tensor_addrs says where it is. */
hmc_status hmc_datadist_allocate_cache(hmc_datadist *datadist, const hmc_cache_desc *desc,
                                       const hmc_cache_key *keys, size_t num_keys,
                                       const hmc_blocks_key *blocks_key, hmc_kv_cache **out);
/* Registers a cache in memory the caller owns (desc->num_tensors addresses, host or
 * device memory), which stays allocated until hmc_datadist_deallocate_cache returns. */
hmc_status hmc_datadist_register_cache(hmc_datadist *datadist, const hmc_cache_desc *desc,
                                       const uint64_t *tensor_addrs, const hmc_cache_key *keys,
                                       size_t num_keys, const hmc_blocks_key *blocks_key,
                                       hmc_kv_cache **out);
/* The cache's tensor addresses into addrs (cap of them); *count gets how many there are
 * (too few: HMC_ERR_BUFFER_TOO_SMALL with *count set). */
hmc_status hmc_kv_cache_tensor_addrs(const hmc_datadist *datadist, const hmc_kv_cache *cache,
                                     uint64_t *addrs, size_t cap, size_t *count);
/* Unpublishes and deregisters the cache (waiting for transfers using it), and frees it if
 * the library allocated it. */
hmc_status hmc_datadist_deallocate_cache(hmc_datadist *datadist, hmc_kv_cache *cache);

/* The whole cache published under src at its prompt cluster (linked) into dst; both
 * layouts must match (an error names both sides' values before a byte moves). */
hmc_status hmc_datadist_pull_cache(hmc_datadist *datadist, const hmc_cache_key *src,
                                   hmc_kv_cache *dst, uint32_t timeout_ms);
/* The whole cache src into the cache published under dst at cluster dst_cluster. */
hmc_status hmc_datadist_push_cache(hmc_datadist *datadist, hmc_kv_cache *src,
                                   uint64_t dst_cluster, const hmc_cache_key *dst,
                                   uint32_t timeout_ms);
/* Blocks src_blocks[i] of the blocks cache published under src into dst_blocks[i] of dst,
 * for the tensors of layers (NULL: all); runs of consecutive blocks become one
 * descriptor. */
hmc_status hmc_datadist_pull_blocks(hmc_datadist *datadist, const hmc_blocks_key *src,
                                    hmc_kv_cache *dst, const uint64_t *src_blocks,
                                    const uint64_t *dst_blocks, size_t num_blocks,
                                    const hmc_kv_layers *layers, uint32_t timeout_ms);
hmc_status hmc_datadist_push_blocks(hmc_datadist *datadist, hmc_kv_cache *src,
                                    uint64_t dst_cluster, const hmc_blocks_key *dst,
                                    const uint64_t *src_blocks, const uint64_t *dst_blocks,
                                    size_t num_blocks, const hmc_kv_layers *layers,
                                    uint32_t timeout_ms);
/* Copies blocks within one host cache (src_blocks[i] to dst_blocks[i], every tensor). */
hmc_status hmc_datadist_copy_blocks(hmc_datadist *datadist, hmc_kv_cache *cache,
                                    const uint64_t *src_blocks, const uint64_t *dst_blocks,
                                    size_t num_blocks);

/* ---- RPC runtime --------------------------------------------------------------------- */

typedef struct hmc_rpc_server hmc_rpc_server;
typedef struct hmc_rpc_client hmc_rpc_client;
typedef struct hmc_rpc_call hmc_rpc_call;        /* a call being handled */
typedef struct hmc_rpc_pending hmc_rpc_pending;  /* an asynchronous client call */
typedef struct hmc_bytes hmc_bytes;              /* bytes the library returns */

/* RPC status codes a handler returns and a client sees (docs/protocol.md); applications
 * use codes from HMC_RPC_APP_STATUS up. */
#define HMC_RPC_OK 0u
#define HMC_RPC_BAD_PAYLOAD 2u
#define HMC_RPC_INTERNAL 7u
#define HMC_RPC_APP_STATUS 1000u
/* The demo service's method ids (hmc_rpc_server_register_demo). */
#define HMC_RPC_DEMO_ECHO 1u
#define HMC_RPC_DEMO_UPPERCASE 2u
#define HMC_RPC_DEMO_COMPLEX 3u

typedef struct hmc_rpc_server_options {
    size_t struct_size;            /* sizeof(hmc_rpc_server_options) */
    uint32_t workers;              /* threads running handlers; 0: 4 */
    uint32_t max_inflight;         /* calls running at once; 0: 4096 */
    const char *auth_secret_file;  /* NULL, or the pre-shared secret clients must prove */
} hmc_rpc_server_options;
#define HMC_RPC_SERVER_OPTIONS_INIT {sizeof(hmc_rpc_server_options), 0, 0, NULL}

/* A method's implementation. It runs on one of the server's worker threads (so it may
 * block, and may call the engine's blocking functions), with the request's bytes, valid
 * until it returns. It answers with hmc_rpc_respond and returns HMC_RPC_OK, or returns
 * an error status (HMC_RPC_APP_STATUS + n, or HMC_RPC_BAD_PAYLOAD, ...) with the bytes
 * given to hmc_rpc_respond as the error message. call is valid until it returns. */
typedef uint32_t (*hmc_rpc_handler)(void *user_data, hmc_rpc_call *call, const uint8_t *request,
                                    size_t request_len);

/* A server, not yet serving: register its methods, then start it. Closed with
 * hmc_rpc_server_close. options may be NULL. */
hmc_status hmc_rpc_server_new(const hmc_rpc_server_options *options, hmc_rpc_server **out);
/* Registers handler under method_id (a second registration of an id replaces the first).
 * user_data is passed to every call of it, from many threads at once. */
hmc_status hmc_rpc_server_register(hmc_rpc_server *server, uint32_t method_id,
                                   hmc_rpc_handler handler, void *user_data);
/* Registers the demo methods: echo (1), uppercase (2) and complex (3). */
hmc_status hmc_rpc_server_register_demo(hmc_rpc_server *server);
/* Starts serving at addr: "tcp://IP:PORT" (port 0 picks one) or "unix:///path". */
hmc_status hmc_rpc_server_start(hmc_rpc_server *server, const char *addr);
/* The address it serves at ("tcp://127.0.0.1:40123"), as hmc_engine_name writes. */
hmc_status hmc_rpc_server_address(const hmc_rpc_server *server, char *buf, size_t cap,
                                  size_t *len);
/* Stops accepting, waits for the calls in flight (up to 30 s), closes. */
hmc_status hmc_rpc_server_close(hmc_rpc_server *server);

/* Inside a handler: the response (or error message), copied; a later call replaces it. */
hmc_status hmc_rpc_respond(hmc_rpc_call *call, const void *data, size_t len);
/* Inside a handler: milliseconds before the client's deadline (-1: none). */
hmc_status hmc_rpc_call_remaining_ms(const hmc_rpc_call *call, int64_t *ms);
/* Inside a handler: 1 once the client cancelled, its deadline passed or it went away. */
hmc_status hmc_rpc_call_cancelled(const hmc_rpc_call *call, int *cancelled);

typedef struct hmc_rpc_client_options {
    size_t struct_size;            /* sizeof(hmc_rpc_client_options) */
    uint32_t connect_timeout_ms;   /* 0: 5000 */
    uint32_t default_timeout_ms;   /* a call's deadline when it passes 0; 0: 30000 */
    const char *auth_secret_file;  /* NULL, or the server's pre-shared secret */
} hmc_rpc_client_options;
#define HMC_RPC_CLIENT_OPTIONS_INIT {sizeof(hmc_rpc_client_options), 0, 0, NULL}

/* Connects to a server (reconnecting by itself later if the connection drops). Closed
 * with hmc_rpc_client_close, which cancels its calls in flight. options may be NULL. */
hmc_status hmc_rpc_client_connect(const char *addr, const hmc_rpc_client_options *options,
                                  hmc_rpc_client **out);
hmc_status hmc_rpc_client_close(hmc_rpc_client *client);

/* Calls method_id with the request's bytes and waits up to timeout_ms. On success
 * *response (if not NULL) is the answer, freed by the caller with hmc_bytes_free. When
 * the server answered an error status: HMC_ERR_REMOTE with its message, and *rpc_status
 * (if not NULL) the status code; HMC_ERR_DEADLINE when the deadline passed (the server is
 * told to cancel). */
hmc_status hmc_rpc_call_sync(hmc_rpc_client *client, uint32_t method_id, const void *request,
                             size_t request_len, uint32_t timeout_ms, hmc_bytes **response,
                             uint32_t *rpc_status);

/* Called once, on a library thread, when an async call ends. Must not block. */
typedef void (*hmc_rpc_callback)(void *user_data, hmc_rpc_pending *call, int status);

/* Starts a call and returns at once with *out, which the caller releases with
 * hmc_rpc_pending_release. Its end is seen by hmc_rpc_pending_wait, the client's fd
 * (hmc_rpc_client_poll_completed), or callback (may be NULL). */
hmc_status hmc_rpc_call_async(hmc_rpc_client *client, uint32_t method_id, const void *request,
                              size_t request_len, uint32_t timeout_ms,
                              hmc_rpc_callback callback, void *user_data,
                              hmc_rpc_pending **out);
/* Waits up to timeout_ms (0: just look): HMC_PENDING, HMC_OK, or how the call failed. */
hmc_status hmc_rpc_pending_wait(hmc_rpc_client *client, hmc_rpc_pending *call,
                                uint32_t timeout_ms);
/* The ended call's answer, as hmc_rpc_call_sync gives it (HMC_PENDING while running). */
hmc_status hmc_rpc_pending_take(hmc_rpc_client *client, hmc_rpc_pending *call,
                                hmc_bytes **response, uint32_t *rpc_status);
/* Cancels the call (the server is told); it ends HMC_ERR_CANCELLED. */
hmc_status hmc_rpc_pending_cancel(hmc_rpc_client *client, hmc_rpc_pending *call);
/* Releases the handle, cancelling the call if still running. */
hmc_status hmc_rpc_pending_release(hmc_rpc_client *client, hmc_rpc_pending *call);

/* As hmc_engine_fd, for the client's async calls. */
hmc_status hmc_rpc_client_fd(const hmc_rpc_client *client, int *fd);
hmc_status hmc_rpc_client_fd_drain(const hmc_rpc_client *client);
hmc_status hmc_rpc_client_poll_completed(hmc_rpc_client *client, hmc_rpc_pending **calls,
                                         size_t cap, size_t *count);

/* The bytes (not NUL-terminated) and their length; valid until hmc_bytes_free. */
hmc_status hmc_bytes_data(const hmc_bytes *bytes, const uint8_t **data, size_t *len);
hmc_status hmc_bytes_free(hmc_bytes *bytes);

/* The demo service from a client, typed: uppercase's answer NUL-terminated into buf (as
 * hmc_engine_name writes), complex's into *out. */
hmc_status hmc_rpc_demo_uppercase(hmc_rpc_client *client, const char *text, uint32_t timeout_ms,
                                  char *buf, size_t cap, size_t *len);

typedef struct hmc_rpc_complex_result {
    size_t struct_size;   /* sizeof(hmc_rpc_complex_result), set by the caller */
    uint32_t count;
    uint32_t has_values;  /* 1 when min, max and mean are set */
    int64_t sum;
    int64_t min;
    int64_t max;
    double mean;
} hmc_rpc_complex_result;
#define HMC_RPC_COMPLEX_RESULT_INIT {sizeof(hmc_rpc_complex_result), 0, 0, 0, 0, 0, 0.0}

hmc_status hmc_rpc_demo_complex(hmc_rpc_client *client, const char *label,
                                const int64_t *values, size_t num_values, uint32_t timeout_ms,
                                hmc_rpc_complex_result *out);

#ifdef __cplusplus
}
#endif

#endif /* HMC_HMC_H */
