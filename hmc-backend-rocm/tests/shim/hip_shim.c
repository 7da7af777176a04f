/*
 * hip_shim.c: an ABI shim of libamdhip64 for hmc-backend-rocm's tests (test-only).
 *
 * Exports the HIP runtime functions hmc-backend-rocm declares, with the signatures of
 * ROCm/HIP include/hip/hip_runtime_api.h, over host memory (see
 * hmc-testshim/shim/devshim_core.h). It checks our binding layer; it is not a hardware
 * verification.
 */
/* hipError_t values from hip_runtime_api.h. */
#define SHIM_ERR_INVALID_VALUE 1       /* hipErrorInvalidValue */
#define SHIM_ERR_OUT_OF_MEMORY 2       /* hipErrorOutOfMemory */
#define SHIM_ERR_INVALID_DIRECTION 21  /* hipErrorInvalidMemcpyDirection */
#define SHIM_ERR_NO_DEVICE 100         /* hipErrorNoDevice */
#define SHIM_ERR_INVALID_DEVICE 101    /* hipErrorInvalidDevice */
#include "devshim_core.h"

typedef int hipError_t;
typedef enum hipMemcpyKind {
  hipMemcpyHostToHost = 0,
  hipMemcpyHostToDevice = 1,
  hipMemcpyDeviceToHost = 2,
  hipMemcpyDeviceToDevice = 3,
  hipMemcpyDefault = 4
} hipMemcpyKind;
typedef struct hipIpcMemHandle_st {
  char reserved[64];
} hipIpcMemHandle_t;

#define HANDLE_MAGIC 0x48495053u /* "HIPS" */

SHIM_EXPORT hipError_t hipRuntimeGetVersion(int *version) {
  SHIM_INJECT("hipRuntimeGetVersion");
  if (version == NULL) return SHIM_ERR_INVALID_VALUE;
  *version = 60200000; /* HIP 6.2 encoding: major * 10^7 + minor * 10^5 + patch */
  return 0;
}

SHIM_EXPORT hipError_t hipGetDeviceCount(int *count) {
  SHIM_INJECT("hipGetDeviceCount");
  if (count == NULL) return SHIM_ERR_INVALID_VALUE;
  *count = shim_device_count();
  return *count == 0 ? SHIM_ERR_NO_DEVICE : 0;
}

SHIM_EXPORT hipError_t hipSetDevice(int device) {
  SHIM_INJECT("hipSetDevice");
  return shim_set_device(device);
}

SHIM_EXPORT hipError_t hipMalloc(void **ptr, size_t size) {
  SHIM_INJECT("hipMalloc");
  return shim_alloc(ptr, size, SHIM_DEVICE);
}

SHIM_EXPORT hipError_t hipFree(void *ptr) {
  SHIM_INJECT("hipFree");
  return shim_release(ptr, SHIM_DEVICE);
}

SHIM_EXPORT hipError_t hipHostMalloc(void **ptr, size_t size, unsigned int flags) {
  SHIM_INJECT("hipHostMalloc");
  if (flags != 0) return SHIM_ERR_INVALID_VALUE; /* we only ever pass hipHostMallocDefault */
  return shim_alloc(ptr, size, SHIM_PINNED);
}

SHIM_EXPORT hipError_t hipHostFree(void *ptr) {
  SHIM_INJECT("hipHostFree");
  return shim_release(ptr, SHIM_PINNED);
}

SHIM_EXPORT hipError_t hipMemcpy(void *dst, const void *src, size_t size, hipMemcpyKind kind) {
  SHIM_INJECT("hipMemcpy");
  switch (kind) {
    case hipMemcpyHostToHost: return shim_copy(dst, src, size, SHIM_H2H);
    case hipMemcpyHostToDevice: return shim_copy(dst, src, size, SHIM_H2D);
    case hipMemcpyDeviceToHost: return shim_copy(dst, src, size, SHIM_D2H);
    case hipMemcpyDeviceToDevice: return shim_copy(dst, src, size, SHIM_D2D);
    default: return SHIM_ERR_INVALID_DIRECTION; /* we never pass hipMemcpyDefault */
  }
}

SHIM_EXPORT hipError_t hipMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
  SHIM_INJECT("hipMemGetInfo");
  return shim_mem_info(free_bytes, total_bytes);
}

SHIM_EXPORT hipError_t hipIpcGetMemHandle(hipIpcMemHandle_t *handle, void *dev_ptr) {
  SHIM_INJECT("hipIpcGetMemHandle");
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

SHIM_EXPORT hipError_t hipIpcOpenMemHandle(void **dev_ptr, hipIpcMemHandle_t handle,
                                           unsigned int flags) {
  SHIM_INJECT("hipIpcOpenMemHandle");
  if (flags != 1) return SHIM_ERR_INVALID_VALUE; /* hipIpcMemLazyEnablePeerAccess */
  uint32_t magic;
  int32_t pid, fd;
  memcpy(&magic, handle.reserved, 4);
  memcpy(&pid, handle.reserved + 4, 4);
  memcpy(&fd, handle.reserved + 8, 4);
  if (magic != HANDLE_MAGIC) return SHIM_ERR_INVALID_VALUE;
  return shim_ipc_open(pid, fd, dev_ptr);
}

SHIM_EXPORT hipError_t hipIpcCloseMemHandle(void *dev_ptr) {
  SHIM_INJECT("hipIpcCloseMemHandle");
  return shim_release(dev_ptr, SHIM_MAPPED);
}

SHIM_EXPORT const char *hipGetErrorName(hipError_t e) {
  switch (e) {
    case 0: return "hipSuccess";
    case 1: return "hipErrorInvalidValue";
    case 2: return "hipErrorOutOfMemory";
    case 21: return "hipErrorInvalidMemcpyDirection";
    case 100: return "hipErrorNoDevice";
    case 101: return "hipErrorInvalidDevice";
    case 700: return "hipErrorIllegalAddress";
    default: return "hipErrorUnknown";
  }
}

SHIM_EXPORT const char *hipGetErrorString(hipError_t e) {
  switch (e) {
    case 0: return "no error";
    case 1: return "invalid argument";
    case 2: return "out of memory";
    case 21: return "invalid copy direction for memcpy";
    case 100: return "no ROCm-capable device is detected";
    case 101: return "invalid device ordinal";
    case 700: return "an illegal memory access was encountered";
    default: return "unknown error";
  }
}
