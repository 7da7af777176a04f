/*
 * devshim_cudart.h: the functions of a vendor runtime that mirrors the CUDA runtime API
 * name for name (HIP, MUSA), over devshim_core.h (test-only).
 *
 * A vendor shim includes devshim_core.h, then defines and includes this file:
 *   SHIM_RT(stem)          the vendor symbol for a CUDA-runtime name stem (`hip##stem`)
 *   SHIM_RT_HOST_ALLOC     its pinned allocation function (`hipHostMalloc`)
 *   SHIM_RT_HOST_FREE      its pinned free function (`hipHostFree`)
 *   SHIM_RT_VERSION        what <vendor>RuntimeGetVersion reports
 *   SHIM_RT_HANDLE_MAGIC   4 bytes marking its IPC handles
 * and then defines <vendor>GetErrorName and <vendor>GetErrorString (the vendor's texts).
 *
 * The values below are shared by the CUDA runtime and the vendors' headers, which the
 * vendor shim cites: `<vendor>Error_t` is a C enum passed as int; `<vendor>MemcpyKind` is
 * HostToHost = 0, HostToDevice = 1, DeviceToHost = 2, DeviceToDevice = 3, Default = 4;
 * `<vendor>IpcMemHandle_t` is `struct { char reserved[64]; }` passed by value; the default
 * host-alloc flags are 0 and `<vendor>IpcMemLazyEnablePeerAccess` is 1.
 */
#ifndef HMC_DEVSHIM_CUDART_H
#define HMC_DEVSHIM_CUDART_H

#if !defined(SHIM_RT) || !defined(SHIM_RT_HOST_ALLOC) || !defined(SHIM_RT_HOST_FREE) || \
    !defined(SHIM_RT_VERSION) || !defined(SHIM_RT_HANDLE_MAGIC)
#error "define SHIM_RT, SHIM_RT_HOST_ALLOC, SHIM_RT_HOST_FREE, SHIM_RT_VERSION and SHIM_RT_HANDLE_MAGIC before including devshim_cudart.h"
#endif

#define SHIM_STR_(x) #x
#define SHIM_STR(x) SHIM_STR_(x)
/* The vendor name of a stem, as a string: SHIM_RT_NAME(Malloc) is "hipMalloc". */
#define SHIM_RT_NAME(stem) SHIM_STR(SHIM_RT(stem))

typedef struct shim_rt_ipc_handle {
  char reserved[64];
} shim_rt_ipc_handle;

enum { SHIM_RT_H2H = 0, SHIM_RT_H2D = 1, SHIM_RT_D2H = 2, SHIM_RT_D2D = 3 };

SHIM_EXPORT int SHIM_RT(RuntimeGetVersion)(int *version) {
  SHIM_INJECT(SHIM_RT_NAME(RuntimeGetVersion));
  if (version == NULL) return SHIM_ERR_INVALID_VALUE;
  *version = SHIM_RT_VERSION;
  return 0;
}

SHIM_EXPORT int SHIM_RT(GetDeviceCount)(int *count) {
  SHIM_INJECT(SHIM_RT_NAME(GetDeviceCount));
  return shim_get_device_count(count);
}

SHIM_EXPORT int SHIM_RT(SetDevice)(int device) {
  SHIM_INJECT(SHIM_RT_NAME(SetDevice));
  return shim_set_device(device);
}

SHIM_EXPORT int SHIM_RT(Malloc)(void **ptr, size_t size) {
  SHIM_INJECT(SHIM_RT_NAME(Malloc));
  return shim_alloc(ptr, size, SHIM_DEVICE);
}

SHIM_EXPORT int SHIM_RT(Free)(void *ptr) {
  SHIM_INJECT(SHIM_RT_NAME(Free));
  return shim_release(ptr, SHIM_DEVICE);
}

SHIM_EXPORT int SHIM_RT_HOST_ALLOC(void **ptr, size_t size, unsigned int flags) {
  SHIM_INJECT(SHIM_STR(SHIM_RT_HOST_ALLOC));
  if (flags != 0) return SHIM_ERR_INVALID_VALUE; /* we only ever pass the default flags */
  return shim_alloc(ptr, size, SHIM_PINNED);
}

SHIM_EXPORT int SHIM_RT_HOST_FREE(void *ptr) {
  SHIM_INJECT(SHIM_STR(SHIM_RT_HOST_FREE));
  return shim_release(ptr, SHIM_PINNED);
}

SHIM_EXPORT int SHIM_RT(Memcpy)(void *dst, const void *src, size_t size, int kind) {
  SHIM_INJECT(SHIM_RT_NAME(Memcpy));
  switch (kind) {
    case SHIM_RT_H2H: return shim_copy(dst, src, size, SHIM_H2H);
    case SHIM_RT_H2D: return shim_copy(dst, src, size, SHIM_H2D);
    case SHIM_RT_D2H: return shim_copy(dst, src, size, SHIM_D2H);
    case SHIM_RT_D2D: return shim_copy(dst, src, size, SHIM_D2D);
    default: return SHIM_ERR_INVALID_DIRECTION; /* we never pass <vendor>MemcpyDefault */
  }
}

SHIM_EXPORT int SHIM_RT(MemGetInfo)(size_t *free_bytes, size_t *total_bytes) {
  SHIM_INJECT(SHIM_RT_NAME(MemGetInfo));
  return shim_mem_info(free_bytes, total_bytes);
}

SHIM_EXPORT int SHIM_RT(IpcGetMemHandle)(shim_rt_ipc_handle *handle, void *dev_ptr) {
  SHIM_INJECT(SHIM_RT_NAME(IpcGetMemHandle));
  if (handle == NULL) return SHIM_ERR_INVALID_VALUE;
  return shim_ipc_export_bytes(dev_ptr, handle->reserved, sizeof handle->reserved,
                               SHIM_RT_HANDLE_MAGIC);
}

SHIM_EXPORT int SHIM_RT(IpcOpenMemHandle)(void **dev_ptr, shim_rt_ipc_handle handle,
                                         unsigned int flags) {
  SHIM_INJECT(SHIM_RT_NAME(IpcOpenMemHandle));
  /* Test control: this process cannot open peers' handles (another container, no peer
     access), as the vendor runtimes answer then. */
  if (getenv("HMC_SHIM_IPC_REFUSE") != NULL) return SHIM_ERR_INVALID_VALUE;
  if (flags != 1) return SHIM_ERR_INVALID_VALUE; /* <vendor>IpcMemLazyEnablePeerAccess */
  return shim_ipc_open_bytes(handle.reserved, SHIM_RT_HANDLE_MAGIC, dev_ptr);
}

static int shim_device_syncs = 0;

/* Test control: how many times the runtime's device synchronisation was called. */
SHIM_EXPORT int hmc_shim_device_syncs(void) { return __atomic_load_n(&shim_device_syncs, __ATOMIC_SEQ_CST); }

SHIM_EXPORT int SHIM_RT(DeviceSynchronize)(void) {
  SHIM_INJECT(SHIM_RT_NAME(DeviceSynchronize));
  __atomic_add_fetch(&shim_device_syncs, 1, __ATOMIC_SEQ_CST);
  return 0;
}

SHIM_EXPORT int SHIM_RT(MemGetAddressRange)(void **base, size_t *size, void *dev_ptr) {
  SHIM_INJECT(SHIM_RT_NAME(MemGetAddressRange));
  uintptr_t b = 0;
  int rc = shim_address_range(dev_ptr, &b, size);
  if (rc == 0 && base != NULL) *base = (void *)b;
  return base == NULL ? SHIM_ERR_INVALID_VALUE : rc;
}

SHIM_EXPORT int SHIM_RT(IpcCloseMemHandle)(void *dev_ptr) {
  SHIM_INJECT(SHIM_RT_NAME(IpcCloseMemHandle));
  return shim_release(dev_ptr, SHIM_MAPPED);
}

#endif /* HMC_DEVSHIM_CUDART_H */
