/*
 * acl_shim.c: an ABI shim of libascendcl (ACL) for hmc-backend-ascend's tests (test-only).
 *
 * Exports the ACL functions hmc-backend-ascend declares, with the signatures of CANN's
 * include/external/acl/acl_rt.h, over host memory (see hmc-testshim/shim/devshim_core.h).
 * It checks our binding layer; it is not a hardware verification.
 *
 * Beyond the shared core it checks what is ACL's own: the malloc policy
 * (ACL_MEM_MALLOC_HUGE_FIRST = 0), aclrtMemcpy's destMax (>= count; the last call's
 * destMax, count and kind are recorded per thread for the tests), aclrtGetMemInfo's
 * attribute (ACL_HBM_MEM = 1), the IPC key length (65) and flags, that an exported
 * allocation's key is closed before it is freed, and aclInit's repeat code. Every failure,
 * injected or not, leaves a per-thread text for aclGetRecentErrMsg.
 *
 * Built with -DSHIM_ACL_NO_IPC it exports no aclrtIpcMem* function, as an older CANN.
 */
/* aclError values from acl_base_rt.h and error_codes/rt_error_codes.h. */
#define SHIM_ERR_INVALID_VALUE 107000     /* ACL_ERROR_RT_PARAM_INVALID */
#define SHIM_ERR_OUT_OF_MEMORY 207001     /* ACL_ERROR_RT_MEMORY_ALLOCATION */
#define SHIM_ERR_INVALID_DIRECTION 107016 /* ACL_ERROR_RT_INVALID_MEMORY_TYPE */
#define SHIM_ERR_NO_DEVICE 207004         /* ACL_ERROR_RT_NO_DEVICE */
#define SHIM_ERR_INVALID_DEVICE 107001    /* ACL_ERROR_RT_INVALID_DEVICEID */
#define SHIM_ACL_REPEAT_INITIALIZE 100002 /* ACL_ERROR_REPEAT_INITIALIZE */
#define SHIM_ACL_KEY_LEN 65               /* aclrtIpcMemGetExportKey's `len` */
#include "devshim_core.h"

static __thread char shim_acl_msg[160];
static __thread size_t shim_acl_last_dest_max, shim_acl_last_count;
static __thread int shim_acl_last_kind = -1;
static int shim_acl_inits = 0;
static int shim_acl_resets[64];

static const char *shim_acl_text(int code) {
  switch (code) {
    case 107000: return "param invalid";
    case 107001: return "invalid device id";
    case 107016: return "invalid memory type";
    case 207001: return "memory allocation error";
    case 207004: return "no device";
    case 507899: return "drv internal error";
    default: return "unknown error";
  }
}

/* Records `code`'s text for aclGetRecentErrMsg when it is a failure, and returns it. */
static int shim_acl_result(const char *name, int code) {
  if (code != 0)
    snprintf(shim_acl_msg, sizeof shim_acl_msg, "[shim] %s: %s", name, shim_acl_text(code));
  return code;
}

/* Every exported function: an injected failure, else `call`, and the recorded text. */
#define SHIM_ACL(name, call)                      \
  do {                                            \
    int rc_ = shim_inject(name);                  \
    if (rc_ == 0) rc_ = (call);                   \
    return shim_acl_result(name, rc_);            \
  } while (0)

/* Test control: aclInit calls so far, aclrtResetDevice calls for `device`, and the last
 * aclrtMemcpy of this thread. */
SHIM_EXPORT int hmc_shim_acl_init_count(void) { return __atomic_load_n(&shim_acl_inits, __ATOMIC_SEQ_CST); }
SHIM_EXPORT int hmc_shim_acl_reset_count(int device) {
  return device >= 0 && device < 64 ? __atomic_load_n(&shim_acl_resets[device], __ATOMIC_SEQ_CST) : -1;
}
SHIM_EXPORT int hmc_shim_acl_last_memcpy(size_t *dest_max, size_t *count) {
  *dest_max = shim_acl_last_dest_max;
  *count = shim_acl_last_count;
  return shim_acl_last_kind;
}

static int shim_acl_init(const char *config) {
  if (config != NULL) return SHIM_ERR_INVALID_VALUE; /* we never pass a configuration */
  return __atomic_fetch_add(&shim_acl_inits, 1, __ATOMIC_SEQ_CST) == 0 ? 0 : SHIM_ACL_REPEAT_INITIALIZE;
}
SHIM_EXPORT int aclInit(const char *config) { SHIM_ACL("aclInit", shim_acl_init(config)); }

static int shim_acl_version(int32_t *major, int32_t *minor, int32_t *patch) {
  if (!major || !minor || !patch) return SHIM_ERR_INVALID_VALUE;
  *major = 8;
  *minor = 1;
  *patch = 0;
  return 0;
}
SHIM_EXPORT int aclrtGetVersion(int32_t *major, int32_t *minor, int32_t *patch) {
  SHIM_ACL("aclrtGetVersion", shim_acl_version(major, minor, patch));
}

SHIM_EXPORT const char *aclGetRecentErrMsg(void) { return shim_acl_msg; }

SHIM_EXPORT int aclrtGetDeviceCount(uint32_t *count) {
  SHIM_ACL("aclrtGetDeviceCount", shim_get_device_count((int *)count));
}

SHIM_EXPORT int aclrtSetDevice(int32_t device) { SHIM_ACL("aclrtSetDevice", shim_set_device(device)); }

static int shim_acl_reset(int32_t device) {
  if (device < 0 || device >= shim_device_count() || device >= 64) return SHIM_ERR_INVALID_DEVICE;
  __atomic_fetch_add(&shim_acl_resets[device], 1, __ATOMIC_SEQ_CST);
  return 0;
}
SHIM_EXPORT int aclrtResetDevice(int32_t device) { SHIM_ACL("aclrtResetDevice", shim_acl_reset(device)); }

/* Bases of allocations whose IPC key is exported and not yet closed. */
static uintptr_t shim_acl_exported[SHIM_TABLE_LEN];

static int shim_acl_is_exported(uintptr_t base, int clear) {
  int found = 0;
  pthread_mutex_lock(&shim_lock);
  for (int i = 0; i < SHIM_TABLE_LEN && !found; i++)
    if (shim_acl_exported[i] == base) {
      found = 1;
      if (clear) shim_acl_exported[i] = 0;
    }
  pthread_mutex_unlock(&shim_lock);
  return found;
}

static int shim_acl_malloc(void **ptr, size_t size, int policy) {
  if (policy != 0) return SHIM_ERR_INVALID_VALUE; /* ACL_MEM_MALLOC_HUGE_FIRST */
  return shim_alloc(ptr, size, SHIM_DEVICE);
}
SHIM_EXPORT int aclrtMalloc(void **ptr, size_t size, int policy) {
  SHIM_ACL("aclrtMalloc", shim_acl_malloc(ptr, size, policy));
}

static int shim_acl_free(void *ptr) {
  /* The IPC reference: the exporter closes the key (aclrtIpcMemClose) before aclrtFree. */
  if (ptr != NULL && shim_acl_is_exported((uintptr_t)ptr, 0)) return SHIM_ERR_INVALID_VALUE;
  return shim_release(ptr, SHIM_DEVICE);
}
SHIM_EXPORT int aclrtFree(void *ptr) { SHIM_ACL("aclrtFree", shim_acl_free(ptr)); }

SHIM_EXPORT int aclrtMallocHost(void **ptr, size_t size) {
  SHIM_ACL("aclrtMallocHost", shim_alloc(ptr, size, SHIM_PINNED));
}

SHIM_EXPORT int aclrtFreeHost(void *ptr) { SHIM_ACL("aclrtFreeHost", shim_release(ptr, SHIM_PINNED)); }

static int shim_acl_memcpy(void *dst, size_t dest_max, const void *src, size_t count, int kind) {
  shim_acl_last_dest_max = dest_max;
  shim_acl_last_count = count;
  shim_acl_last_kind = kind;
  if (dest_max < count) return SHIM_ERR_INVALID_VALUE;
  /* aclrtMemcpyKind: HOST_TO_HOST 0, HOST_TO_DEVICE 1, DEVICE_TO_HOST 2, DEVICE_TO_DEVICE 3. */
  if (kind < 0 || kind > 3) return SHIM_ERR_INVALID_DIRECTION; /* we never pass DEFAULT (4) */
  return shim_copy(dst, src, count, kind);
}
SHIM_EXPORT int aclrtMemcpy(void *dst, size_t dest_max, const void *src, size_t count, int kind) {
  SHIM_ACL("aclrtMemcpy", shim_acl_memcpy(dst, dest_max, src, count, kind));
}

static int shim_acl_mem_info(int attr, size_t *free_bytes, size_t *total_bytes) {
  if (attr != 1) return SHIM_ERR_INVALID_VALUE; /* ACL_HBM_MEM */
  return shim_mem_info(free_bytes, total_bytes);
}
SHIM_EXPORT int aclrtGetMemInfo(int attr, size_t *free_bytes, size_t *total_bytes) {
  SHIM_ACL("aclrtGetMemInfo", shim_acl_mem_info(attr, free_bytes, total_bytes));
}

#ifndef SHIM_ACL_NO_IPC
/* Keys are "acl-shim:<pid>:<fd>" (NUL-terminated within 65 bytes). Imported mappings are
 * remembered with their key, so aclrtIpcMemClose can unmap them. */
struct shim_acl_import {
  char key[SHIM_ACL_KEY_LEN];
  void *ptr;
};
static struct shim_acl_import shim_acl_imports[256];

static int shim_acl_export(void *ptr, size_t size, char *key, size_t len, uint64_t flags) {
  if (key == NULL || len != SHIM_ACL_KEY_LEN) return SHIM_ERR_INVALID_VALUE;
  if (flags != 1) return SHIM_ERR_INVALID_VALUE; /* ..._DISABLE_PID_VALIDATION */
  struct shim_entry e;
  if (!shim_find((uintptr_t)ptr, &e, NULL) || e.len != size) return SHIM_ERR_INVALID_VALUE;
  int32_t pid, fd;
  int rc = shim_ipc_export(ptr, &pid, &fd);
  if (rc != 0) return rc;
  memset(key, 0, len);
  snprintf(key, len, "acl-shim:%d:%d", (int)pid, (int)fd);
  pthread_mutex_lock(&shim_lock);
  for (int i = 0; i < SHIM_TABLE_LEN; i++)
    if (shim_acl_exported[i] == 0) {
      shim_acl_exported[i] = (uintptr_t)ptr;
      break;
    }
  pthread_mutex_unlock(&shim_lock);
  return 0;
}
SHIM_EXPORT int aclrtIpcMemGetExportKey(void *ptr, size_t size, char *key, size_t len, uint64_t flags) {
  SHIM_ACL("aclrtIpcMemGetExportKey", shim_acl_export(ptr, size, key, len, flags));
}

static int shim_acl_import(void **ptr, const char *key, uint64_t flags) {
  if (key == NULL || flags != 0) return SHIM_ERR_INVALID_VALUE; /* ..._IMPORT_FLAG_DEFAULT */
  int pid, fd;
  if (sscanf(key, "acl-shim:%d:%d", &pid, &fd) != 2) return SHIM_ERR_INVALID_VALUE;
  int rc = shim_ipc_open(pid, fd, ptr);
  if (rc != 0) return rc;
  pthread_mutex_lock(&shim_lock);
  for (int i = 0; i < 256; i++)
    if (shim_acl_imports[i].ptr == NULL) {
      snprintf(shim_acl_imports[i].key, SHIM_ACL_KEY_LEN, "%s", key);
      shim_acl_imports[i].ptr = *ptr;
      break;
    }
  pthread_mutex_unlock(&shim_lock);
  return 0;
}
SHIM_EXPORT int aclrtIpcMemImportByKey(void **ptr, const char *key, uint64_t flags) {
  SHIM_ACL("aclrtIpcMemImportByKey", shim_acl_import(ptr, key, flags));
}

/* Closes an imported mapping of `key` if this process has one, else the export of `key`. */
static int shim_acl_close(const char *key) {
  if (key == NULL) return SHIM_ERR_INVALID_VALUE;
  void *mapped = NULL;
  pthread_mutex_lock(&shim_lock);
  for (int i = 0; i < 256; i++)
    if (shim_acl_imports[i].ptr != NULL && strcmp(shim_acl_imports[i].key, key) == 0) {
      mapped = shim_acl_imports[i].ptr;
      shim_acl_imports[i].ptr = NULL;
      break;
    }
  pthread_mutex_unlock(&shim_lock);
  if (mapped != NULL) return shim_release(mapped, SHIM_MAPPED);
  int pid, fd;
  if (sscanf(key, "acl-shim:%d:%d", &pid, &fd) != 2 || pid != (int)getpid())
    return SHIM_ERR_INVALID_VALUE;
  for (int i = 0; i < SHIM_TABLE_LEN; i++) {
    struct shim_entry e = shim_table[i];
    if (e.kind == SHIM_DEVICE && e.fd == fd) return shim_acl_is_exported(e.base, 1) ? 0 : SHIM_ERR_INVALID_VALUE;
  }
  return SHIM_ERR_INVALID_VALUE;
}
SHIM_EXPORT int aclrtIpcMemClose(const char *key) { SHIM_ACL("aclrtIpcMemClose", shim_acl_close(key)); }
#endif /* SHIM_ACL_NO_IPC */
