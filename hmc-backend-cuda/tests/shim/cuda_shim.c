/*
 * cuda_shim.c: an ABI shim of the CUDA driver (libcuda) for hmc-backend-cuda's tests
 * (test-only).
 *
 * Exports the driver functions hmc-backend-cuda calls through cudarc, with the signatures
 * of NVIDIA's cuda.h, over host memory (see hmc-testshim/shim/devshim_core.h). Tests load it
 * in a child process whose LD_LIBRARY_PATH puts it first as libcuda.so. It checks our
 * binding layer (context binding per thread, stream/event/host-function plumbing of the
 * async copies, IPC, DMA-BUF, error mapping); it is not a hardware verification.
 *
 * Streams run copies at once; a host function runs on its own thread (after any hold set by
 * hmc_cuda_shim_hold_host_funcs), and cuStreamSynchronize waits for the stream's pending
 * host functions.
 */
/* CUresult values from cuda.h. */
#define SHIM_ERR_INVALID_VALUE 1       /* CUDA_ERROR_INVALID_VALUE */
#define SHIM_ERR_OUT_OF_MEMORY 2       /* CUDA_ERROR_OUT_OF_MEMORY */
#define SHIM_ERR_INVALID_DIRECTION 1   /* CUDA_ERROR_INVALID_VALUE: no direction code in CUDA */
#define SHIM_ERR_NO_DEVICE 100         /* CUDA_ERROR_NO_DEVICE */
#define SHIM_ERR_INVALID_DEVICE 101    /* CUDA_ERROR_INVALID_DEVICE */
#define CU_ERR_INVALID_CONTEXT 201     /* CUDA_ERROR_INVALID_CONTEXT */
#define CU_ERR_INVALID_HANDLE 400      /* CUDA_ERROR_INVALID_HANDLE */
#include "devshim_core.h"

#include <stdatomic.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef void (*CUhostFn)(void *userData);
typedef struct CUipcMemHandle_st {
  char reserved[64];
} CUipcMemHandle;

struct CUstream_st {
  int device;
  atomic_int pending;
};
struct CUevent_st {
  int device;
};

#define CTX_BASE 0x1000
#define HANDLE_MAGIC 0x43554441u /* "CUDA" */

static __thread int has_ctx = 0;
static atomic_int hold_host_funcs = 0;

/* Test control: while set, host functions wait before running. */
SHIM_EXPORT void hmc_cuda_shim_hold_host_funcs(int hold) { atomic_store(&hold_host_funcs, hold); }

#define NEED_CTX()                              \
  do {                                          \
    if (!has_ctx) return CU_ERR_INVALID_CONTEXT; \
  } while (0)

SHIM_EXPORT CUresult cuDriverGetVersion(int *v) {
  if (v == NULL) return SHIM_ERR_INVALID_VALUE;
  *v = 12080;
  return 0;
}

SHIM_EXPORT CUresult cuInit(unsigned int flags) {
  SHIM_INJECT("cuInit");
  if (flags != 0) return SHIM_ERR_INVALID_VALUE;
  return shim_device_count() == 0 ? SHIM_ERR_NO_DEVICE : 0;
}

SHIM_EXPORT CUresult cuDeviceGetCount(int *count) {
  SHIM_INJECT("cuDeviceGetCount");
  if (count == NULL) return SHIM_ERR_INVALID_VALUE;
  *count = shim_device_count();
  return 0;
}

SHIM_EXPORT CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
  SHIM_INJECT("cuDeviceGet");
  if (dev == NULL) return SHIM_ERR_INVALID_VALUE;
  if (ordinal < 0 || ordinal >= shim_device_count()) return SHIM_ERR_INVALID_DEVICE;
  *dev = ordinal;
  return 0;
}

SHIM_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
  if (name == NULL || len <= 0) return SHIM_ERR_INVALID_VALUE;
  snprintf(name, (size_t)len, "HMC ABI shim device %d", dev);
  return 0;
}

SHIM_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
  (void)dev;
  if (bytes == NULL) return SHIM_ERR_INVALID_VALUE;
  *bytes = SHIM_MAX_ALLOC;
  return 0;
}

SHIM_EXPORT CUresult cuDeviceGetAttribute(int *value, int attrib, CUdevice dev) {
  (void)dev;
  if (value == NULL) return SHIM_ERR_INVALID_VALUE;
  *value = attrib == 124 ? 1 : 0; /* CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED */
  return 0;
}

SHIM_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
  SHIM_INJECT("cuDevicePrimaryCtxRetain");
  if (ctx == NULL) return SHIM_ERR_INVALID_VALUE;
  if (dev < 0 || dev >= shim_device_count()) return SHIM_ERR_INVALID_DEVICE;
  *ctx = (CUcontext)(uintptr_t)(CTX_BASE + dev);
  return 0;
}

SHIM_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  (void)dev;
  return 0;
}

SHIM_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  SHIM_INJECT("cuCtxSetCurrent");
  uintptr_t v = (uintptr_t)ctx;
  if (v < CTX_BASE || v >= CTX_BASE + (uintptr_t)shim_device_count()) return CU_ERR_INVALID_CONTEXT;
  int rc = shim_set_device((int)(v - CTX_BASE));
  if (rc == 0) has_ctx = 1;
  return rc;
}

SHIM_EXPORT CUresult cuStreamCreate(CUstream *stream, unsigned int flags) {
  SHIM_INJECT("cuStreamCreate");
  NEED_CTX();
  if (stream == NULL || flags != 1) return SHIM_ERR_INVALID_VALUE; /* CU_STREAM_NON_BLOCKING */
  struct CUstream_st *s = calloc(1, sizeof *s);
  if (s == NULL) return SHIM_ERR_OUT_OF_MEMORY;
  s->device = shim_current_device;
  *stream = s;
  return 0;
}

static CUresult check_stream(CUstream s) {
  if (s == NULL || s->device != shim_current_device) return CU_ERR_INVALID_HANDLE;
  return 0;
}

SHIM_EXPORT CUresult cuStreamSynchronize(CUstream s) {
  SHIM_INJECT("cuStreamSynchronize");
  NEED_CTX();
  /* CU_STREAM_LEGACY and CU_STREAM_PER_THREAD: copies run at once, nothing is pending. */
  if (s == (CUstream)(uintptr_t)1 || s == (CUstream)(uintptr_t)2) return 0;
  CUresult rc = check_stream(s);
  if (rc != 0) return rc;
  while (atomic_load(&s->pending) > 0) usleep(100);
  return 0;
}

SHIM_EXPORT CUresult cuStreamDestroy_v2(CUstream s) {
  NEED_CTX();
  CUresult rc = check_stream(s);
  if (rc != 0) return rc;
  while (atomic_load(&s->pending) > 0) usleep(100);
  free(s);
  return 0;
}

SHIM_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
  SHIM_INJECT("cuMemAlloc");
  NEED_CTX();
  if (dptr == NULL) return SHIM_ERR_INVALID_VALUE;
  if (size == 0) return SHIM_ERR_INVALID_VALUE; /* the real driver refuses 0 too */
  void *p;
  int rc = shim_alloc(&p, size, SHIM_DEVICE);
  *dptr = (CUdeviceptr)(uintptr_t)p;
  return rc;
}

SHIM_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  SHIM_INJECT("cuMemFree");
  NEED_CTX();
  return shim_release((void *)(uintptr_t)dptr, SHIM_DEVICE);
}

SHIM_EXPORT CUresult cuMemHostAlloc(void **p, size_t size, unsigned int flags) {
  SHIM_INJECT("cuMemHostAlloc");
  NEED_CTX();
  if (flags != 0) return SHIM_ERR_INVALID_VALUE;
  return shim_alloc(p, size, SHIM_PINNED);
}

SHIM_EXPORT CUresult cuMemFreeHost(void *p) {
  SHIM_INJECT("cuMemFreeHost");
  NEED_CTX();
  return shim_release(p, SHIM_PINNED);
}

SHIM_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
  NEED_CTX();
  return shim_mem_info(free_bytes, total_bytes);
}

SHIM_EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
  SHIM_INJECT("cuMemcpyHtoDAsync");
  NEED_CTX();
  CUresult rc = check_stream(s);
  return rc != 0 ? rc : shim_copy((void *)(uintptr_t)dst, src, n, SHIM_H2D);
}

SHIM_EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
  SHIM_INJECT("cuMemcpyDtoHAsync");
  NEED_CTX();
  CUresult rc = check_stream(s);
  return rc != 0 ? rc : shim_copy(dst, (const void *)(uintptr_t)src, n, SHIM_D2H);
}

SHIM_EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  SHIM_INJECT("cuMemcpyDtoDAsync");
  NEED_CTX();
  CUresult rc = check_stream(s);
  return rc != 0 ? rc : shim_copy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n, SHIM_D2D);
}

SHIM_EXPORT CUresult cuEventCreate(CUevent *e, unsigned int flags) {
  SHIM_INJECT("cuEventCreate");
  NEED_CTX();
  if (e == NULL || flags != 2) return SHIM_ERR_INVALID_VALUE; /* CU_EVENT_DISABLE_TIMING */
  struct CUevent_st *ev = calloc(1, sizeof *ev);
  if (ev == NULL) return SHIM_ERR_OUT_OF_MEMORY;
  ev->device = shim_current_device;
  *e = ev;
  return 0;
}

SHIM_EXPORT CUresult cuEventRecord(CUevent e, CUstream s) {
  SHIM_INJECT("cuEventRecord");
  NEED_CTX();
  if (e == NULL || e->device != shim_current_device) return CU_ERR_INVALID_HANDLE;
  return check_stream(s);
}

SHIM_EXPORT CUresult cuEventQuery(CUevent e) {
  SHIM_INJECT("cuEventQuery");
  NEED_CTX();
  if (e == NULL || e->device != shim_current_device) return CU_ERR_INVALID_HANDLE;
  return 0; /* copies complete at enqueue */
}

SHIM_EXPORT CUresult cuEventDestroy_v2(CUevent e) {
  NEED_CTX();
  if (e == NULL || e->device != shim_current_device) return CU_ERR_INVALID_HANDLE;
  free(e);
  return 0;
}

struct host_call {
  CUhostFn fn;
  void *user;
  CUstream stream;
};

static void *run_host_call(void *arg) {
  struct host_call *c = arg;
  usleep(1000);
  while (atomic_load(&hold_host_funcs)) usleep(200);
  c->fn(c->user);
  atomic_fetch_sub(&c->stream->pending, 1);
  free(c);
  return NULL;
}

SHIM_EXPORT CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void *user) {
  SHIM_INJECT("cuLaunchHostFunc");
  NEED_CTX();
  CUresult rc = check_stream(s);
  if (rc != 0) return rc;
  if (fn == NULL) return SHIM_ERR_INVALID_VALUE;
  struct host_call *c = malloc(sizeof *c);
  if (c == NULL) return SHIM_ERR_OUT_OF_MEMORY;
  *c = (struct host_call){fn, user, s};
  atomic_fetch_add(&s->pending, 1);
  pthread_t t;
  if (pthread_create(&t, NULL, run_host_call, c) != 0) {
    atomic_fetch_sub(&s->pending, 1);
    free(c);
    return SHIM_ERR_OUT_OF_MEMORY;
  }
  pthread_detach(t);
  return 0;
}

SHIM_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr dptr) {
  SHIM_INJECT("cuIpcGetMemHandle");
  NEED_CTX();
  if (h == NULL) return SHIM_ERR_INVALID_VALUE;
  return shim_ipc_export_bytes((void *)(uintptr_t)dptr, h->reserved, sizeof h->reserved,
                               HANDLE_MAGIC);
}

SHIM_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr dptr) {
  SHIM_INJECT("cuMemGetAddressRange");
  NEED_CTX();
  uintptr_t b = 0;
  if (base == NULL) return SHIM_ERR_INVALID_VALUE;
  int rc = shim_address_range((void *)(uintptr_t)dptr, &b, size);
  *base = (CUdeviceptr)b;
  return rc;
}

SHIM_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *dptr, CUipcMemHandle h, unsigned int flags) {
  SHIM_INJECT("cuIpcOpenMemHandle");
  NEED_CTX();
  if (dptr == NULL || flags != 1) return SHIM_ERR_INVALID_VALUE; /* LAZY_ENABLE_PEER_ACCESS */
  int32_t pid, fd;
  if (shim_ipc_unpack(h.reserved, HANDLE_MAGIC, &pid, &fd) != 0) return SHIM_ERR_INVALID_VALUE;
  if (pid == (int32_t)getpid()) return CU_ERR_INVALID_CONTEXT; /* as the driver: not in-process */
  void *p;
  int rc = shim_ipc_open(pid, fd, &p);
  *dptr = (CUdeviceptr)(uintptr_t)p;
  return rc;
}

SHIM_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  SHIM_INJECT("cuIpcCloseMemHandle");
  NEED_CTX();
  return shim_release((void *)(uintptr_t)dptr, SHIM_MAPPED);
}

SHIM_EXPORT CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size,
                                                   int type, unsigned long long flags) {
  SHIM_INJECT("cuMemGetHandleForAddressRange");
  NEED_CTX();
  if (handle == NULL || type != 1 || flags != 0) return SHIM_ERR_INVALID_VALUE;
  struct shim_entry e;
  if (!shim_find((uintptr_t)dptr, &e, NULL) || e.kind != SHIM_DEVICE ||
      (uintptr_t)dptr + size > e.base + e.len)
    return SHIM_ERR_INVALID_VALUE;
  int fd = dup(e.fd);
  if (fd < 0) return SHIM_ERR_OUT_OF_MEMORY;
  *(int *)handle = fd;
  return 0;
}

SHIM_EXPORT CUresult cuGetErrorName(CUresult e, const char **s) {
  if (s == NULL) return SHIM_ERR_INVALID_VALUE;
  switch (e) {
    case 0: *s = "CUDA_SUCCESS"; break;
    case 1: *s = "CUDA_ERROR_INVALID_VALUE"; break;
    case 2: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case 100: *s = "CUDA_ERROR_NO_DEVICE"; break;
    case 101: *s = "CUDA_ERROR_INVALID_DEVICE"; break;
    case 201: *s = "CUDA_ERROR_INVALID_CONTEXT"; break;
    case 400: *s = "CUDA_ERROR_INVALID_HANDLE"; break;
    case 700: *s = "CUDA_ERROR_ILLEGAL_ADDRESS"; break;
    default: *s = NULL; return SHIM_ERR_INVALID_VALUE;
  }
  return 0;
}

SHIM_EXPORT CUresult cuGetErrorString(CUresult e, const char **s) {
  if (s == NULL) return SHIM_ERR_INVALID_VALUE;
  switch (e) {
    case 0: *s = "no error"; break;
    case 1: *s = "invalid argument"; break;
    case 2: *s = "out of memory"; break;
    case 100: *s = "no CUDA-capable device is detected"; break;
    case 101: *s = "invalid device ordinal"; break;
    case 201: *s = "invalid device context"; break;
    case 400: *s = "invalid resource handle"; break;
    case 700: *s = "an illegal memory access was encountered"; break;
    default: *s = NULL; return SHIM_ERR_INVALID_VALUE;
  }
  return 0;
}
