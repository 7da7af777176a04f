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

/* Every function but the error texts comes from devshim_cudart.h: musa_runtime_api.h
 * and driver_types.h declare musaError_t as an enum (int), musaMemcpyKind with the CUDA
 * values and musaIpcMemHandle_t as char reserved[MUSA_IPC_HANDLE_SIZE = 64], as that header
 * assumes. */
#define SHIM_RT(stem) musa##stem
#define SHIM_RT_HOST_ALLOC musaHostAlloc
#define SHIM_RT_HOST_FREE musaFreeHost
#define SHIM_RT_VERSION 40000 /* a MUSA 4.0 runtime, in the CUDA-style encoding 1000 * major + 10 * minor */
#define SHIM_RT_HANDLE_MAGIC 0x4d555341u /* "MUSA" */
#include "devshim_cudart.h"

SHIM_EXPORT const char *musaGetErrorName(int e) {
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

SHIM_EXPORT const char *musaGetErrorString(int e) {
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
