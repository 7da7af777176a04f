/*
 * devshim_core.h: the shared core of HMC's ABI shims (test-only).
 *
 * An ABI shim is a small shared library that exports a vendor runtime's symbols (hipMalloc,
 * cnrtMemcpy, musaIpcOpenMemHandle, ...) with the vendor's C signatures, over host memory.
 * The HMC backend crates load it in place of the real runtime so their tests can check the
 * binding layer (loading, symbol resolution, argument order, direction enums, device
 * context, error mapping) on machines without the hardware. It is NOT a hardware
 * verification and says nothing about real drivers.
 *
 * A vendor shim defines its error codes, then includes this file exactly once:
 *   SHIM_ERR_INVALID_VALUE, SHIM_ERR_OUT_OF_MEMORY, SHIM_ERR_INVALID_DEVICE,
 *   SHIM_ERR_INVALID_DIRECTION, SHIM_ERR_NO_DEVICE
 * A vendor whose runtime mirrors the CUDA runtime name for name (HIP, MUSA) then includes
 * devshim_cudart.h, which defines all its functions but the error texts.
 *
 * Behaviour:
 * - Device count: $HMC_SHIM_DEVICE_COUNT (default 4; 0 means "no device").
 * - Current device: per thread, default 0, as in the real runtimes.
 * - Device memory: memfd-backed shared mappings, recorded in a table with their device.
 *   Every copy checks that each side is (or is not) device memory as its direction enum
 *   says, and that device memory belongs to the calling thread's current device.
 * - Pinned host memory: anonymous mappings, recorded so they can be freed only as pinned.
 * - IPC: a handle carries (pid, fd); opening maps /proc/<pid>/fd/<fd>, so handles work
 *   across processes for real (and within one process, as a second mapping).
 * - Failure injection: hmc_shim_fail_next("cnrtMemcpy", code) makes the next call of that
 *   function on this thread return `code` without doing anything.
 */
#ifndef HMC_DEVSHIM_CORE_H
#define HMC_DEVSHIM_CORE_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(SHIM_ERR_INVALID_VALUE) || !defined(SHIM_ERR_OUT_OF_MEMORY) || \
    !defined(SHIM_ERR_INVALID_DEVICE) || !defined(SHIM_ERR_INVALID_DIRECTION) || \
    !defined(SHIM_ERR_NO_DEVICE)
#error "define the SHIM_ERR_* vendor codes before including devshim_core.h"
#endif

#define SHIM_EXPORT __attribute__((visibility("default")))

enum shim_dir { SHIM_H2H = 0, SHIM_H2D = 1, SHIM_D2H = 2, SHIM_D2D = 3 };
enum shim_kind { SHIM_FREE = 0, SHIM_DEVICE = 1, SHIM_PINNED = 2, SHIM_MAPPED = 3 };

/* Largest single allocation the shim accepts; larger ones fail as out of memory. */
#define SHIM_MAX_ALLOC ((size_t)1 << 36)
#define SHIM_TABLE_LEN 8192

struct shim_entry {
  uintptr_t base;
  size_t len;
  int kind;
  int device;
  int fd;
};

static struct shim_entry shim_table[SHIM_TABLE_LEN];
static pthread_mutex_t shim_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread int shim_current_device = 0;
static __thread char shim_fail_name[64];
static __thread int shim_fail_code = 0;

/* Test control: the next call of `name` on this thread returns `code`. */
SHIM_EXPORT int hmc_shim_fail_next(const char *name, int code) {
  snprintf(shim_fail_name, sizeof shim_fail_name, "%s", name);
  shim_fail_code = code;
  return 0;
}

/* Test control: live allocations (device, pinned or mapped) attributed to `device`. */
SHIM_EXPORT int hmc_shim_live_on_device(int device) {
  int n = 0;
  pthread_mutex_lock(&shim_lock);
  for (int i = 0; i < SHIM_TABLE_LEN; i++)
    if (shim_table[i].kind != SHIM_FREE && shim_table[i].device == device) n++;
  pthread_mutex_unlock(&shim_lock);
  return n;
}

/* Test control: the calling thread's current device. */
SHIM_EXPORT int hmc_shim_current_device(void) { return shim_current_device; }

static int shim_inject(const char *name) {
  if (shim_fail_code != 0 && strcmp(shim_fail_name, name) == 0) {
    int code = shim_fail_code;
    shim_fail_code = 0;
    return code;
  }
  return 0;
}

#define SHIM_INJECT(name)                 \
  do {                                    \
    int shim_injected_ = shim_inject(name); \
    if (shim_injected_ != 0) return shim_injected_; \
  } while (0)

static int shim_device_count(void) {
  const char *s = getenv("HMC_SHIM_DEVICE_COUNT");
  return s ? atoi(s) : 4;
}

static int shim_set_device(int device) {
  int count = shim_device_count();
  if (count == 0) return SHIM_ERR_NO_DEVICE;
  if (device < 0 || device >= count) return SHIM_ERR_INVALID_DEVICE;
  shim_current_device = device;
  return 0;
}

static int shim_record(uintptr_t base, size_t len, int kind, int fd) {
  pthread_mutex_lock(&shim_lock);
  for (int i = 0; i < SHIM_TABLE_LEN; i++) {
    if (shim_table[i].kind == SHIM_FREE) {
      shim_table[i] = (struct shim_entry){base, len, kind, shim_current_device, fd};
      pthread_mutex_unlock(&shim_lock);
      return 0;
    }
  }
  pthread_mutex_unlock(&shim_lock);
  return SHIM_ERR_OUT_OF_MEMORY;
}

/* Finds the entry containing address `a`; copies it to *out. Returns 1 when found. */
static int shim_find(uintptr_t a, struct shim_entry *out, int *index) {
  int found = 0;
  pthread_mutex_lock(&shim_lock);
  for (int i = 0; i < SHIM_TABLE_LEN; i++) {
    struct shim_entry *e = &shim_table[i];
    if (e->kind != SHIM_FREE && a >= e->base && a < e->base + (e->len ? e->len : 1)) {
      *out = *e;
      if (index) *index = i;
      found = 1;
      break;
    }
  }
  pthread_mutex_unlock(&shim_lock);
  return found;
}

static int shim_alloc(void **ptr, size_t len, int kind) {
  if (ptr == NULL) return SHIM_ERR_INVALID_VALUE;
  *ptr = NULL;
  if (shim_device_count() == 0) return SHIM_ERR_NO_DEVICE;
  if (len > SHIM_MAX_ALLOC) return SHIM_ERR_OUT_OF_MEMORY;
  if (len == 0) return 0;
  int fd = -1;
  void *p;
  if (kind == SHIM_DEVICE) {
    fd = memfd_create("hmc-devshim", MFD_CLOEXEC);
    if (fd < 0) return SHIM_ERR_OUT_OF_MEMORY;
    if (ftruncate(fd, (off_t)len) != 0) {
      close(fd);
      return SHIM_ERR_OUT_OF_MEMORY;
    }
    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  } else {
    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  }
  if (p == MAP_FAILED) {
    if (fd >= 0) close(fd);
    return SHIM_ERR_OUT_OF_MEMORY;
  }
  int rc = shim_record((uintptr_t)p, len, kind, fd);
  if (rc != 0) {
    munmap(p, len);
    if (fd >= 0) close(fd);
    return rc;
  }
  *ptr = p;
  return 0;
}

/* Frees an allocation of `kind` whose base is `ptr`. Device and mapped memory must be
 * freed in the context of the device that owns it. */
static int shim_release(void *ptr, int kind) {
  if (ptr == NULL) return 0;
  struct shim_entry e;
  int i;
  if (!shim_find((uintptr_t)ptr, &e, &i) || e.base != (uintptr_t)ptr || e.kind != kind)
    return SHIM_ERR_INVALID_VALUE;
  if (kind != SHIM_PINNED && e.device != shim_current_device) return SHIM_ERR_INVALID_DEVICE;
  pthread_mutex_lock(&shim_lock);
  shim_table[i].kind = SHIM_FREE;
  pthread_mutex_unlock(&shim_lock);
  munmap(ptr, e.len);
  if (e.fd >= 0) close(e.fd);
  return 0;
}

/* Checks one side of a copy: device memory of the current device, or not device memory. */
static int shim_check_side(const void *p, size_t len, int want_device) {
  struct shim_entry e;
  int found = shim_find((uintptr_t)p, &e, NULL);
  int is_device = found && (e.kind == SHIM_DEVICE || e.kind == SHIM_MAPPED);
  if (want_device) {
    if (!is_device) return SHIM_ERR_INVALID_DIRECTION;
    if (e.device != shim_current_device) return SHIM_ERR_INVALID_DEVICE;
    if ((uintptr_t)p + len > e.base + e.len) return SHIM_ERR_INVALID_VALUE;
  } else if (is_device) {
    return SHIM_ERR_INVALID_DIRECTION;
  }
  return 0;
}

static int shim_copy(void *dst, const void *src, size_t len, int dir) {
  if (len == 0) return 0;
  if (dst == NULL || src == NULL) return SHIM_ERR_INVALID_VALUE;
  int src_dev = dir == SHIM_D2H || dir == SHIM_D2D;
  int dst_dev = dir == SHIM_H2D || dir == SHIM_D2D;
  int rc = shim_check_side(src, len, src_dev);
  if (rc == 0) rc = shim_check_side(dst, len, dst_dev);
  if (rc != 0) return rc;
  memmove(dst, src, len);
  return 0;
}

static int shim_mem_info(size_t *free_bytes, size_t *total_bytes) {
  if (free_bytes == NULL || total_bytes == NULL) return SHIM_ERR_INVALID_VALUE;
  *total_bytes = SHIM_MAX_ALLOC;
  *free_bytes = SHIM_MAX_ALLOC;
  return 0;
}

/* IPC export: the allocation based at `ptr` (current device) as (pid, fd). */
static int shim_ipc_export(void *ptr, int32_t *pid, int32_t *fd) {
  struct shim_entry e;
  if (!shim_find((uintptr_t)ptr, &e, NULL) || e.base != (uintptr_t)ptr || e.kind != SHIM_DEVICE)
    return SHIM_ERR_INVALID_VALUE;
  if (e.device != shim_current_device) return SHIM_ERR_INVALID_DEVICE;
  *pid = (int32_t)getpid();
  *fd = e.fd;
  return 0;
}

/* The base and length of the device allocation (of the current device) holding `ptr`, as
 * the vendors' MemGetAddressRange report them. */
__attribute__((unused)) static int shim_address_range(const void *ptr, uintptr_t *base, size_t *len) {
  struct shim_entry e;
  if (base == NULL || len == NULL) return SHIM_ERR_INVALID_VALUE;
  if (!shim_find((uintptr_t)ptr, &e, NULL) || e.kind != SHIM_DEVICE) return SHIM_ERR_INVALID_VALUE;
  if (e.device != shim_current_device) return SHIM_ERR_INVALID_DEVICE;
  *base = e.base;
  *len = e.len;
  return 0;
}

/* IPC import: maps the exporter's memfd into this process as device memory of the current
 * device. */
static int shim_ipc_open(int32_t pid, int32_t fd, void **out) {
  if (out == NULL) return SHIM_ERR_INVALID_VALUE;
  *out = NULL;
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)pid, (int)fd);
  int local = open(path, O_RDWR | O_CLOEXEC);
  if (local < 0) return SHIM_ERR_INVALID_VALUE;
  struct stat st;
  if (fstat(local, &st) != 0 || st.st_size <= 0) {
    close(local);
    return SHIM_ERR_INVALID_VALUE;
  }
  void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, local, 0);
  if (p == MAP_FAILED) {
    close(local);
    return SHIM_ERR_OUT_OF_MEMORY;
  }
  int rc = shim_record((uintptr_t)p, (size_t)st.st_size, SHIM_MAPPED, local);
  if (rc != 0) {
    munmap(p, (size_t)st.st_size);
    close(local);
    return rc;
  }
  *out = p;
  return 0;
}

/* Helpers a shim may not need (hence `unused`). IPC handles of the CUDA-runtime shape (a `char reserved[64]` struct in HIP, MUSA and the
 * CUDA driver): the shim's vendor `magic`, then the exporter's pid and fd, then zeros. */
__attribute__((unused)) static int shim_ipc_export_bytes(void *ptr, char *reserved, size_t size, uint32_t magic) {
  if (reserved == NULL || size < 12) return SHIM_ERR_INVALID_VALUE;
  int32_t pid, fd;
  int rc = shim_ipc_export(ptr, &pid, &fd);
  if (rc != 0) return rc;
  memset(reserved, 0, size);
  memcpy(reserved, &magic, 4);
  memcpy(reserved + 4, &pid, 4);
  memcpy(reserved + 8, &fd, 4);
  return 0;
}

/* The (pid, fd) of a handle written by shim_ipc_export_bytes with the same `magic`. */
__attribute__((unused)) static int shim_ipc_unpack(const char *reserved, uint32_t magic,
                                                   int32_t *pid, int32_t *fd) {
  uint32_t got;
  memcpy(&got, reserved, 4);
  memcpy(pid, reserved + 4, 4);
  memcpy(fd, reserved + 8, 4);
  return got == magic ? 0 : SHIM_ERR_INVALID_VALUE;
}

/* Opens a handle written by shim_ipc_export_bytes with the same `magic`. */
__attribute__((unused)) static int shim_ipc_open_bytes(const char *reserved, uint32_t magic,
                                                       void **out) {
  int32_t pid, fd;
  int rc = shim_ipc_unpack(reserved, magic, &pid, &fd);
  if (rc != 0) return rc;
  return shim_ipc_open(pid, fd, out);
}

/* A vendor "get device count" over the shim: `*count` devices, "no device" when 0. */
__attribute__((unused)) static int shim_get_device_count(int *count) {
  if (count == NULL) return SHIM_ERR_INVALID_VALUE;
  *count = shim_device_count();
  return *count == 0 ? SHIM_ERR_NO_DEVICE : 0;
}

#endif /* HMC_DEVSHIM_CORE_H */
