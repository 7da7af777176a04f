/*
 * cnrt_shim.c: an ABI shim of libcnrt for hmc-backend-mlu's tests (test-only).
 *
 * Exports the CNRT functions hmc-backend-mlu declares, with the signatures of Cambricon
 * CNToolkit's cnrt.h (CNRT 5 and later), over host memory (see
 * hmc-testshim/shim/devshim_core.h). It checks our binding layer; it is not a hardware
 * verification.
 */
/* cnrtRet_t values from cnrt.h. CNRT has no "invalid direction" code; a wrong direction
 * is reported as cnrtErrorArgsInvalid. */
#define SHIM_ERR_INVALID_VALUE 100006     /* cnrtErrorArgsInvalid */
#define SHIM_ERR_OUT_OF_MEMORY 100100     /* cnrtErrorNoMem */
#define SHIM_ERR_INVALID_DIRECTION 100006 /* cnrtErrorArgsInvalid */
#define SHIM_ERR_NO_DEVICE 100004         /* cnrtErrorNoDevice */
#define SHIM_ERR_INVALID_DEVICE 100005    /* cnrtErrorDeviceInvalid */
#include "devshim_core.h"

typedef int cnrtRet_t;
typedef enum {
  cnrtMemcpyHostToDev = 0,
  cnrtMemcpyDevToDev,
  cnrtMemcpyDevToHost,
  cnrtMemcpyHostToHost,
  cnrtMemcpyPeerToPeer,
  cnrtMemcpyNoDirection,
} cnrtMemTransDir_t;
typedef void *cnrtIpcMemHandle;

SHIM_EXPORT void cnrtGetLibVersion(int *major, int *minor, int *patch) {
  *major = 6;
  *minor = 7;
  *patch = 1;
}

SHIM_EXPORT cnrtRet_t cnrtGetDeviceCount(unsigned int *count) {
  SHIM_INJECT("cnrtGetDeviceCount");
  if (count == NULL) return SHIM_ERR_INVALID_VALUE;
  int n = shim_device_count();
  *count = (unsigned int)n;
  return n == 0 ? SHIM_ERR_NO_DEVICE : 0;
}

SHIM_EXPORT cnrtRet_t cnrtSetDevice(int ordinal) {
  SHIM_INJECT("cnrtSetDevice");
  return shim_set_device(ordinal);
}

SHIM_EXPORT cnrtRet_t cnrtMalloc(void **ptr, size_t bytes) {
  SHIM_INJECT("cnrtMalloc");
  return shim_alloc(ptr, bytes, SHIM_DEVICE);
}

SHIM_EXPORT cnrtRet_t cnrtFree(void *ptr) {
  SHIM_INJECT("cnrtFree");
  return shim_release(ptr, SHIM_DEVICE);
}

SHIM_EXPORT cnrtRet_t cnrtHostMalloc(void **ptr, size_t bytes) {
  SHIM_INJECT("cnrtHostMalloc");
  return shim_alloc(ptr, bytes, SHIM_PINNED);
}

SHIM_EXPORT cnrtRet_t cnrtFreeHost(void *ptr) {
  SHIM_INJECT("cnrtFreeHost");
  return shim_release(ptr, SHIM_PINNED);
}

SHIM_EXPORT cnrtRet_t cnrtMemcpy(void *dst, void *src, size_t bytes, cnrtMemTransDir_t dir) {
  SHIM_INJECT("cnrtMemcpy");
  switch (dir) {
    case cnrtMemcpyHostToDev: return shim_copy(dst, src, bytes, SHIM_H2D);
    case cnrtMemcpyDevToDev: return shim_copy(dst, src, bytes, SHIM_D2D);
    case cnrtMemcpyDevToHost: return shim_copy(dst, src, bytes, SHIM_D2H);
    case cnrtMemcpyHostToHost: return shim_copy(dst, src, bytes, SHIM_H2H);
    default: return SHIM_ERR_INVALID_DIRECTION; /* we never pass P2P or NoDirection */
  }
}

SHIM_EXPORT cnrtRet_t cnrtMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
  SHIM_INJECT("cnrtMemGetInfo");
  return shim_mem_info(free_bytes, total_bytes);
}

/* The handle value packs (pid << 32 | fd), so it survives a trip through another process. */
SHIM_EXPORT cnrtRet_t cnrtAcquireMemHandle(cnrtIpcMemHandle *handle, void *ptr) {
  SHIM_INJECT("cnrtAcquireMemHandle");
  if (handle == NULL) return SHIM_ERR_INVALID_VALUE;
  int32_t pid, fd;
  int rc = shim_ipc_export(ptr, &pid, &fd);
  if (rc != 0) return rc;
  *handle = (cnrtIpcMemHandle)(uintptr_t)(((uint64_t)(uint32_t)pid << 32) | (uint32_t)fd);
  return 0;
}

SHIM_EXPORT cnrtRet_t cnrtMapMemHandle(void **ptr, cnrtIpcMemHandle handle, int flags) {
  SHIM_INJECT("cnrtMapMemHandle");
  if (flags != 0) return SHIM_ERR_INVALID_VALUE; /* "Currently it only supports value 0" */
  uint64_t v = (uint64_t)(uintptr_t)handle;
  return shim_ipc_open((int32_t)(v >> 32), (int32_t)(v & 0xffffffffu), ptr);
}

SHIM_EXPORT cnrtRet_t cnrtUnMapMemHandle(void *ptr) {
  SHIM_INJECT("cnrtUnMapMemHandle");
  return shim_release(ptr, SHIM_MAPPED);
}

SHIM_EXPORT const char *cnrtGetErrorStr(cnrtRet_t code) {
  switch (code) {
    case 0: return "Success";
    case 100004: return "No MLU device found";
    case 100005: return "Invalid device ordinal";
    case 100006: return "Invalid argument";
    case 100007: return "Failure on system call";
    case 100100: return "No sufficient MLU device memory";
    default: return "Unknown error";
  }
}
