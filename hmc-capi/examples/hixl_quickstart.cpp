// HIXL's C++ quick start on hmc: the same calls (Hixl, Initialize, RegisterMem, Connect,
// TransferSync, SendNotify/GetNotifies, Disconnect, DeregisterMem, Finalize) with the
// include and namespace changed, and the ACL memory calls replaced (docs/c-api.md):
//
//   hixl_quickstart server TRANSPORT MEMORY          prints "READY <engine> <address>"
//   hixl_quickstart client TRANSPORT MEMORY ENGINE ADDRESS
//
// MEMORY is `host`, or `cuda` for device memory allocated with the CUDA driver API
// (libcuda.so.1, opened at run time, so building needs no CUDA; `cargo xtask test` runs it
// against the project's CUDA driver ABI shim, a GPU machine against the driver). The server fills its
// buffer with 0x5A; the client READs it and checks every byte, WRITEs 0xA5 back and
// notifies; the server checks every byte of the WRITE. Exit status 0 when all held.
#include <hmc/hmc.hpp>

#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

using namespace hmc::hixl;

namespace {
constexpr int32_t kTimeoutMs = 10000;
constexpr size_t kBufSize = 1024 * 1024;
constexpr uint8_t kServerFill = 0x5A;
constexpr uint8_t kClientFill = 0xA5;

void ExitOnFailure(Status status, const char *what) {
  if (status != SUCCESS) {
    std::printf("[ERROR] %s: status %u: %s\n", what, status, hmc::last_error().c_str());
    std::exit(EXIT_FAILURE);
  }
}

void ExitUnless(bool ok, const char *what) {
  if (!ok) {
    std::printf("[ERROR] %s\n", what);
    std::exit(EXIT_FAILURE);
  }
}

// The buffer: host memory, or CUDA device memory through the driver API (what HIXL's
// aclrtMalloc/aclrtMemcpy become on an NVIDIA GPU).
class Buffer {
 public:
  explicit Buffer(const std::string &kind) : device_(kind == "cuda") {
    if (!device_) {
      host_.assign(kBufSize, 0);
      addr_ = reinterpret_cast<uintptr_t>(host_.data());
      return;
    }
    lib_ = dlopen("libcuda.so.1", RTLD_NOW);
    ExitUnless(lib_ != nullptr, "libcuda.so.1 cannot be opened (no NVIDIA driver)");
    load(init_, "cuInit");
    load(device_get_, "cuDeviceGet");
    load(retain_, "cuDevicePrimaryCtxRetain");
    load(set_current_, "cuCtxSetCurrent");
    load(alloc_, "cuMemAlloc_v2");
    load(free_, "cuMemFree_v2");
    load(htod_, "cuMemcpyHtoDAsync_v2");
    load(dtoh_, "cuMemcpyDtoHAsync_v2");
    load(sync_, "cuStreamSynchronize");
    load(stream_create_, "cuStreamCreate");
    load(stream_destroy_, "cuStreamDestroy_v2");
    int dev = 0;
    void *ctx = nullptr;
    ExitUnless(init_(0) == 0 && device_get_(&dev, 0) == 0 && retain_(&ctx, dev) == 0 &&
                   set_current_(ctx) == 0,
               "CUDA device 0 cannot be opened");
    // CU_STREAM_NON_BLOCKING (1), as the engine's CUDA backend makes its own.
    ExitUnless(stream_create_(&stream_, 1) == 0, "cuStreamCreate failed");
    unsigned long long p = 0;
    ExitUnless(alloc_(&p, kBufSize) == 0, "cuMemAlloc failed");
    addr_ = static_cast<uintptr_t>(p);
  }
  ~Buffer() {
    if (device_ && addr_ != 0) {
      free_(addr_);
      stream_destroy_(stream_);
    }
  }
  Buffer(const Buffer &) = delete;
  Buffer &operator=(const Buffer &) = delete;

  MemType type() const { return device_ ? MEM_DEVICE : MEM_HOST; }
  uintptr_t addr() const { return addr_; }
  void Fill(uint8_t v) {
    std::vector<uint8_t> bytes(kBufSize, v);
    if (device_) {
      ExitUnless(htod_(addr_, bytes.data(), kBufSize, stream_) == 0 && sync_(stream_) == 0,
                 "cuMemcpyHtoDAsync failed");
    } else {
      host_ = bytes;
    }
  }
  bool AllEqual(uint8_t v) {
    std::vector<uint8_t> bytes(kBufSize);
    if (device_) {
      ExitUnless(dtoh_(bytes.data(), addr_, kBufSize, stream_) == 0 && sync_(stream_) == 0,
                 "cuMemcpyDtoHAsync failed");
    } else {
      bytes = host_;
    }
    for (size_t i = 0; i < kBufSize; i++) {
      if (bytes[i] != v) {
        std::printf("[ERROR] byte %zu is 0x%02x, expected 0x%02x\n", i, bytes[i], v);
        return false;
      }
    }
    return true;
  }

 private:
  template <class F>
  void load(F &f, const char *name) {
    f = reinterpret_cast<F>(dlsym(lib_, name));
    ExitUnless(f != nullptr, name);
  }
  bool device_;
  std::vector<uint8_t> host_;
  uintptr_t addr_ = 0;
  void *lib_ = nullptr;
  int (*init_)(unsigned) = nullptr;
  int (*device_get_)(int *, int) = nullptr;
  int (*retain_)(void **, int) = nullptr;
  int (*set_current_)(void *) = nullptr;
  int (*alloc_)(unsigned long long *, size_t) = nullptr;
  int (*free_)(unsigned long long) = nullptr;
  int (*htod_)(unsigned long long, const void *, size_t, void *) = nullptr;
  int (*dtoh_)(void *, unsigned long long, size_t, void *) = nullptr;
  int (*sync_)(void *) = nullptr;
  int (*stream_create_)(void **, unsigned) = nullptr;
  int (*stream_destroy_)(void *) = nullptr;
  void *stream_ = nullptr;
};

void Initialize(Hixl &engine, const char *local, const char *transport) {
  std::map<AscendString, AscendString> opts;
  opts[OPTION_TRANSPORT] = transport;
  ExitOnFailure(engine.Initialize(local, opts), "Initialize");
}

int RunServer(const char *transport, const std::string &memory) {
  Hixl engine;
  Initialize(engine, "127.0.0.1:0", transport);
  Buffer buf(memory);
  buf.Fill(kServerFill);
  MemDesc desc{};
  desc.addr = buf.addr();
  desc.len = kBufSize;
  MemHandle handle = nullptr;
  ExitOnFailure(engine.RegisterMem(desc, buf.type(), handle), "RegisterMem");
  std::printf("READY %s %lu\n", engine.engine().name().c_str(),
              static_cast<unsigned long>(buf.addr()));
  std::fflush(stdout);

  bool done = false;
  for (int i = 0; i < 1000 && !done; i++) {
    std::vector<NotifyDesc> notifies;
    ExitOnFailure(engine.GetNotifies(notifies), "GetNotifies");
    for (const auto &n : notifies) {
      std::printf("[INFO] notify %s: %s\n", n.name.GetString(), n.notify_msg.GetString());
      done = done || std::strcmp(n.name.GetString(), "written") == 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ExitUnless(done, "no notification from the client");
  ExitUnless(buf.AllEqual(kClientFill), "the client's WRITE did not arrive");
  std::printf("[INFO] Verify of the client's WRITE success\n");
  ExitOnFailure(engine.DeregisterMem(handle), "DeregisterMem");
  engine.Finalize();
  return 0;
}

int RunClient(const char *transport, const std::string &memory, const char *server,
              uintptr_t remote_addr) {
  Hixl engine;
  Initialize(engine, "127.0.0.1", transport);
  Buffer buf(memory);
  MemDesc desc{};
  desc.addr = buf.addr();
  desc.len = kBufSize;
  MemHandle handle = nullptr;
  ExitOnFailure(engine.RegisterMem(desc, buf.type(), handle), "RegisterMem");
  ExitOnFailure(engine.Connect(server, kTimeoutMs), "Connect");

  TransferOpDesc op{buf.addr(), remote_addr, kBufSize};
  ExitOnFailure(engine.TransferSync(server, READ, {op}, kTimeoutMs), "TransferSync READ");
  ExitUnless(buf.AllEqual(kServerFill), "READ verify failed");
  std::printf("[INFO] TransferSync READ completed, verify success\n");

  buf.Fill(kClientFill);
  TransferReq req = nullptr;
  ExitOnFailure(engine.TransferAsync(server, WRITE, {op}, TransferArgs{}, req), "TransferAsync");
  TransferStatus status = TransferStatus::WAITING;
  while (status == TransferStatus::WAITING) {
    ExitOnFailure(engine.GetTransferStatus(req, status), "GetTransferStatus");
  }
  ExitUnless(status == TransferStatus::COMPLETED, "TransferAsync WRITE did not complete");
  std::printf("[INFO] TransferAsync WRITE completed\n");

  NotifyDesc note{AscendString("written"), AscendString("0xA5")};
  ExitOnFailure(engine.SendNotify(server, note, kTimeoutMs), "SendNotify");
  ExitOnFailure(engine.Disconnect(server, kTimeoutMs), "Disconnect");
  ExitOnFailure(engine.DeregisterMem(handle), "DeregisterMem");
  engine.Finalize();
  return 0;
}
}  // namespace

int main(int argc, char **argv) {
  if (argc == 4 && std::strcmp(argv[1], "server") == 0) {
    return RunServer(argv[2], argv[3]);
  }
  if (argc == 6 && std::strcmp(argv[1], "client") == 0) {
    return RunClient(argv[2], argv[3], argv[4],
                     static_cast<uintptr_t>(std::strtoull(argv[5], nullptr, 10)));
  }
  std::printf("usage: %s server TRANSPORT host|cuda | client TRANSPORT host|cuda ENGINE ADDR\n",
              argv[0]);
  return 2;
}
