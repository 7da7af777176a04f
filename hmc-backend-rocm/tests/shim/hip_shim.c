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

/* Every function but the error texts comes from devshim_cudart.h: hip_runtime_api.h
 * declares hipError_t as an enum (int), hipMemcpyKind with the CUDA values and
 * hipIpcMemHandle_t as char reserved[HIP_IPC_HANDLE_SIZE = 64], as that header assumes. */
#define SHIM_RT(stem) hip##stem
#define SHIM_RT_HOST_ALLOC hipHostMalloc
#define SHIM_RT_HOST_FREE hipHostFree
#define SHIM_RT_VERSION 60200000 /* HIP 6.2 encoding: major * 10^7 + minor * 10^5 + patch */
#define SHIM_RT_HANDLE_MAGIC 0x48495053u /* "HIPS" */
#include "devshim_cudart.h"

SHIM_EXPORT const char *hipGetErrorName(int e) {
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

SHIM_EXPORT const char *hipGetErrorString(int e) {
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
