/*
 * musa_shim.c: an ABI shim of libmusart for hmc-backend-musa's tests (test-only).
 *
 * Exports the MUSA runtime functions hmc-backend-musa declares, with the signatures of
 * the MUSA toolkit's include/musa_runtime_api.h and driver_types.h, over host memory (see
 * hmc-testshim/shim/devshim_core.h). It checks our binding layer; it is not a hardware
 * verification.
 */
/* musaError_t values from driver_types.h of the MUSA toolkit (CUDA numbering). */
#define SHIM_ERR_INVALID_VALUE 1       /* musaErrorInvalidValue */
#define SHIM_ERR_OUT_OF_MEMORY 2       /* musaErrorMemoryAllocation */
#define SHIM_ERR_INVALID_DIRECTION 21  /* musaErrorInvalidMemcpyDirection */
#define SHIM_ERR_NO_DEVICE 100         /* musaErrorNoDevice */
#define SHIM_ERR_INVALID_DEVICE 101    /* musaErrorInvalidDevice */
#include "devshim_core.h"

typedef int musaError_t;
typedef enum musaMemcpyKind {
  musaMemcpyHostToHost = 0,
  musaMemcpyHostToDevice = 1,
  musaMemcpyDeviceToHost = 2,
  musaMemcpyDeviceToDevice = 3,
  musaMemcpyDefault = 4
} musaMemcpyKind;
typedef struct musaIpcMemHandle_st {
  char reserved[64];
} musaIpcMemHandle_t;

#define HANDLE_MAGIC 0x4d555341u /* "MUSA" */

SHIM_EXPORT musaError_t musaRuntimeGetVersion(int *version) {
  SHIM_INJECT("musaRuntimeGetVersion");
  if (version == NULL) return SHIM_ERR_INVALID_VALUE;
  *version = 40000; /* a MUSA 4.0 runtime, in the CUDA-style encoding 1000 * major + 10 * minor */
  return 0;
}

SHIM_EXPORT musaError_t musaGetDeviceCount(int *count) {
  SHIM_INJECT("musaGetDeviceCount");
  if (count == NULL) return SHIM_ERR_INVALID_VALUE;
  *count = shim_device_count();
  return *count == 0 ? SHIM_ERR_NO_DEVICE : 0;
}

SHIM_EXPORT musaError_t musaSetDevice(int device) {
  SHIM_INJECT("musaSetDevice");
  return shim_set_device(device);
}

SHIM_EXPORT musaError_t musaMalloc(void **ptr, size_t size) {
  SHIM_INJECT("musaMalloc");
  return shim_alloc(ptr, size, SHIM_DEVICE);
}

SHIM_EXPORT musaError_t musaFree(void *ptr) {
  SHIM_INJECT("musaFree");
  return shim_release(ptr, SHIM_DEVICE);
}

SHIM_EXPORT musaError_t musaHostAlloc(void **ptr, size_t size, unsigned int flags) {
  SHIM_INJECT("musaHostAlloc");
  if (flags != 0) return SHIM_ERR_INVALID_VALUE; /* we only ever pass musaHostAllocDefault */
  return shim_alloc(ptr, size, SHIM_PINNED);
}

SHIM_EXPORT musaError_t musaFreeHost(void *ptr) {
  SHIM_INJECT("musaFreeHost");
  return shim_release(ptr, SHIM_PINNED);
}

SHIM_EXPORT musaError_t musaMemcpy(void *dst, const void *src, size_t size, musaMemcpyKind kind) {
  SHIM_INJECT("musaMemcpy");
  switch (kind) {
    case musaMemcpyHostToHost: return shim_copy(dst, src, size, SHIM_H2H);
    case musaMemcpyHostToDevice: return shim_copy(dst, src, size, SHIM_H2D);
    case musaMemcpyDeviceToHost: return shim_copy(dst, src, size, SHIM_D2H);
    case musaMemcpyDeviceToDevice: return shim_copy(dst, src, size, SHIM_D2D);
    default: return SHIM_ERR_INVALID_DIRECTION; /* we never pass musaMemcpyDefault */
  }
}

SHIM_EXPORT musaError_t musaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
  SHIM_INJECT("musaMemGetInfo");
  return shim_mem_info(free_bytes, total_bytes);
}

SHIM_EXPORT musaError_t musaIpcGetMemHandle(musaIpcMemHandle_t *handle, void *dev_ptr) {
  SHIM_INJECT("musaIpcGetMemHandle");
  if (handle == NULL) return SHIM_ERR_INVALID_VALUE;
  int32_t pid, fd;
  int rc = shim_ipc_export(dev_ptr, &pid, &fd);
  if (rc != 0) return rc;
  memset(handle, 0, sizeof *handle);
  uint32_t magic = HANDLE_MAGIC;
  memcpy(handle->reserved, &magic, 4);
  memcpy(handle->reserved + 4, &pid, 4);
  memcpy(handle->reserved + 8, &fd, 4);
  return 0;
}

SHIM_EXPORT musaError_t musaIpcOpenMemHandle(void **dev_ptr, musaIpcMemHandle_t handle,
                                           unsigned int flags) {
  SHIM_INJECT("musaIpcOpenMemHandle");
  if (flags != 1) return SHIM_ERR_INVALID_VALUE; /* musaIpcMemLazyEnablePeerAccess */
  uint32_t magic;
  int32_t pid, fd;
  memcpy(&magic, handle.reserved, 4);
  memcpy(&pid, handle.reserved + 4, 4);
  memcpy(&fd, handle.reserved + 8, 4);
  if (magic != HANDLE_MAGIC) return SHIM_ERR_INVALID_VALUE;
  return shim_ipc_open(pid, fd, dev_ptr);
}

SHIM_EXPORT musaError_t musaIpcCloseMemHandle(void *dev_ptr) {
  SHIM_INJECT("musaIpcCloseMemHandle");
  return shim_release(dev_ptr, SHIM_MAPPED);
}

SHIM_EXPORT const char *musaGetErrorName(musaError_t e) {
  switch (e) {
    case 0: return "musaSuccess";
    case 1: return "musaErrorInvalidValue";
    case 2: return "musaErrorMemoryAllocation";
    case 21: return "musaErrorInvalidMemcpyDirection";
    case 100: return "musaErrorNoDevice";
    case 101: return "musaErrorInvalidDevice";
    case 700: return "musaErrorIllegalAddress";
    default: return "musaErrorUnknown";
  }
}

SHIM_EXPORT const char *musaGetErrorString(musaError_t e) {
  switch (e) {
    case 0: return "no error";
    case 1: return "invalid argument";
    case 2: return "out of memory";
    case 21: return "invalid copy direction for memcpy";
    case 100: return "no MUSA-capable device is detected";
    case 101: return "invalid device ordinal";
    case 700: return "an illegal memory access was encountered";
    default: return "unknown error";
  }
}
