// hmc.hpp: a header-only C++17 layer over hmc.h (libhmc's C API).
//
// - namespace hmc: RAII classes (Engine, Registration, Request) whose calls return
//   hmc_status, as the C API does; hmc::check() turns a status into an hmc::Error exception
//   for code that prefers them (only where exceptions are enabled).
// - namespace hmc::hixl: HIXL's names and shapes (class Hixl, AscendString, MemDesc,
//   MemType, MemHandle, TransferOp, TransferOpDesc, TransferArgs, TransferReq,
//   TransferStatus, NotifyDesc, Status and its constants), so that a HIXL program ports by
//   changing its include, `using namespace hixl;` to `using namespace hmc::hixl;`, and its
//   ACL memory calls (docs/c-api.md).
//
// No C++ type crosses the library's ABI (only hmc.h's C types do), so this header works
// with either libstdc++ string ABI (_GLIBCXX_USE_CXX11_ABI=0 or 1).
#ifndef HMC_HMC_HPP
#define HMC_HMC_HPP

#include <hmc/hmc.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
#include <stdexcept>
#endif

namespace hmc {

/// This thread's last error message (hmc_last_error()).
inline std::string last_error() { return std::string(hmc_last_error()); }

#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
/// A failed call as an exception: its status and message.
class Error : public std::runtime_error {
 public:
  Error(hmc_status status, const std::string &message)
      : std::runtime_error(std::string(hmc_status_name(status)) + ": " + message),
        status_(status) {}
  hmc_status status() const noexcept { return status_; }

 private:
  hmc_status status_;
};

/// Throws hmc::Error unless `s` is HMC_OK or HMC_PENDING; returns `s`.
inline hmc_status check(hmc_status s) {
  if (s != HMC_OK && s != HMC_PENDING) {
    throw Error(s, last_error());
  }
  return s;
}
#endif

/// A read-only view of `size` elements (std::span's shape, for C++17).
template <class T>
class Span {
 public:
  constexpr Span() noexcept = default;
  constexpr Span(const T *data, std::size_t size) noexcept : data_(data), size_(size) {}
  Span(const std::vector<T> &v) noexcept : data_(v.data()), size_(v.size()) {}  // NOLINT
  template <std::size_t N>
  constexpr Span(const T (&a)[N]) noexcept : data_(a), size_(N) {}  // NOLINT
  constexpr const T *data() const noexcept { return data_; }
  constexpr std::size_t size() const noexcept { return size_; }
  constexpr const T *begin() const noexcept { return data_; }
  constexpr const T *end() const noexcept { return data_ + size_; }

 private:
  const T *data_ = nullptr;
  std::size_t size_ = 0;
};

/// A transfer's direction.
enum class Op : uint32_t { Read = HMC_READ, Write = HMC_WRITE };

/// One received notification.
struct Notification {
  std::string from;
  std::string name;
  std::string msg;
  std::string failed;  // empty unless the transfer it was attached to failed
};

class Engine;

/// A registration; deregistered when destroyed (or by reset()).
class Registration {
 public:
  Registration() noexcept = default;
  Registration(hmc_engine *engine, hmc_mem *mem) noexcept : engine_(engine), mem_(mem) {}
  Registration(Registration &&o) noexcept { swap(o); }
  Registration &operator=(Registration &&o) noexcept {
    Registration(std::move(o)).swap(*this);
    return *this;
  }
  Registration(const Registration &) = delete;
  Registration &operator=(const Registration &) = delete;
  ~Registration() { reset(); }

  /// Deregisters now (a no-op when empty); the memory may be freed afterwards.
  hmc_status reset() noexcept {
    hmc_status s = HMC_OK;
    if (mem_ != nullptr) {
      s = hmc_deregister_mem(engine_, mem_);
    }
    engine_ = nullptr;
    mem_ = nullptr;
    return s;
  }
  /// Gives up ownership: the caller deregisters the handle.
  hmc_mem *release() noexcept { return std::exchange(mem_, nullptr); }
  hmc_mem *get() const noexcept { return mem_; }
  explicit operator bool() const noexcept { return mem_ != nullptr; }

 private:
  void swap(Registration &o) noexcept {
    std::swap(engine_, o.engine_);
    std::swap(mem_, o.mem_);
  }
  hmc_engine *engine_ = nullptr;
  hmc_mem *mem_ = nullptr;
};

/// An asynchronous transfer; released when destroyed (which cancels it if still running).
class Request {
 public:
  Request() noexcept = default;
  Request(hmc_engine *engine, hmc_request *req) noexcept : engine_(engine), req_(req) {}
  Request(Request &&o) noexcept { swap(o); }
  Request &operator=(Request &&o) noexcept {
    Request(std::move(o)).swap(*this);
    return *this;
  }
  Request(const Request &) = delete;
  Request &operator=(const Request &) = delete;
  ~Request() { reset(); }

  /// HMC_PENDING while running, HMC_OK when completed, else why it failed.
  hmc_status status() const noexcept { return hmc_request_status(engine_, req_, nullptr); }
  hmc_status wait(std::chrono::milliseconds timeout) const noexcept {
    return hmc_request_wait(engine_, req_, static_cast<uint32_t>(timeout.count()));
  }
  hmc_status cancel() const noexcept { return hmc_request_cancel(engine_, req_); }
  hmc_status telemetry(hmc_telemetry &out) const noexcept {
    out.struct_size = sizeof out;
    return hmc_request_telemetry(engine_, req_, &out);
  }
  hmc_status reset() noexcept {
    hmc_status s = HMC_OK;
    if (req_ != nullptr) {
      s = hmc_request_release(engine_, req_);
    }
    engine_ = nullptr;
    req_ = nullptr;
    return s;
  }
  hmc_request *release() noexcept { return std::exchange(req_, nullptr); }
  hmc_request *get() const noexcept { return req_; }
  explicit operator bool() const noexcept { return req_ != nullptr; }

 private:
  void swap(Request &o) noexcept {
    std::swap(engine_, o.engine_);
    std::swap(req_, o.req_);
  }
  hmc_engine *engine_ = nullptr;
  hmc_request *req_ = nullptr;
};

/// An engine; closed when destroyed. Every call may be made from many threads.
class Engine {
 public:
  using Options = std::vector<std::pair<std::string, std::string>>;

  Engine() noexcept = default;
  Engine(Engine &&o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  Engine &operator=(Engine &&o) noexcept {
    if (this != &o) {
      close();
      e_ = std::exchange(o.e_, nullptr);
    }
    return *this;
  }
  Engine(const Engine &) = delete;
  Engine &operator=(const Engine &) = delete;
  ~Engine() { close(); }

  /// Opens the engine at `local` ("ip:port" to be connected to, "ip" to connect out).
  hmc_status open(const std::string &local, const Options &options = {}) {
    close();
    std::vector<hmc_option> kv;
    kv.reserve(options.size());
    for (const auto &o : options) {
      kv.push_back(hmc_option{o.first.c_str(), o.second.c_str()});
    }
    hmc_engine_options opts = HMC_ENGINE_OPTIONS_INIT;
    opts.options = kv.data();
    opts.num_options = kv.size();
    return hmc_engine_open(local.c_str(), &opts, &e_);
  }
  hmc_status close() noexcept {
    if (e_ == nullptr) {
      return HMC_OK;
    }
    return hmc_engine_close(std::exchange(e_, nullptr));
  }
  hmc_engine *get() const noexcept { return e_; }
  explicit operator bool() const noexcept { return e_ != nullptr; }

  /// The engine's name (what peers connect to); empty on failure.
  std::string name() const {
    std::size_t len = 0;
    hmc_engine_name(e_, nullptr, 0, &len);
    std::string s(len + 1, '\0');
    if (hmc_engine_name(e_, &s[0], s.size(), &len) != HMC_OK) {
      return std::string();
    }
    s.resize(len);
    return s;
  }
  /// The descriptor that becomes readable when a request ends or a notification arrives.
  int fd() const noexcept {
    int fd = -1;
    hmc_engine_fd(e_, &fd);
    return fd;
  }
  hmc_status drain_fd() const noexcept { return hmc_engine_fd_drain(e_); }

  hmc_status register_host(const void *addr, std::size_t len, Registration &out,
                           bool read_only = false) {
    hmc_mem_desc d = HMC_MEM_DESC_INIT;
    d.addr = reinterpret_cast<uintptr_t>(addr);
    d.len = len;
    d.flags = read_only ? HMC_MEM_READ_ONLY : 0u;
    return register_mem(d, out);
  }
  hmc_status register_device(uint32_t device_kind, uint32_t device_id, uint64_t addr,
                             std::size_t len, Registration &out) {
    hmc_mem_desc d = HMC_MEM_DESC_INIT;
    d.addr = addr;
    d.len = len;
    d.mem_type = HMC_MEM_DEVICE;
    d.device_kind = device_kind;
    d.device_id = device_id;
    return register_mem(d, out);
  }
  hmc_status register_mem(const hmc_mem_desc &d, Registration &out) {
    hmc_mem *m = nullptr;
    hmc_status s = hmc_register_mem(e_, &d, &m);
    if (s == HMC_OK) {
      out = Registration(e_, m);
    }
    return s;
  }

  hmc_status connect(const std::string &remote, std::chrono::milliseconds timeout) {
    return hmc_connect(e_, remote.c_str(), ms(timeout));
  }
  hmc_status disconnect(const std::string &remote) {
    return hmc_disconnect(e_, remote.c_str());
  }
  hmc_status transfer(const std::string &remote, Op op, Span<hmc_xfer_desc> descs,
                      std::chrono::milliseconds timeout) {
    return hmc_transfer_sync(e_, remote.c_str(), static_cast<uint32_t>(op), descs.data(),
                             descs.size(), ms(timeout));
  }
  hmc_status transfer_async(const std::string &remote, Op op, Span<hmc_xfer_desc> descs,
                            std::chrono::milliseconds timeout, Request &out,
                            const hmc_transfer_args *args = nullptr) {
    hmc_request *r = nullptr;
    hmc_status s = hmc_transfer_async(e_, remote.c_str(), static_cast<uint32_t>(op),
                                      descs.data(), descs.size(), ms(timeout), args, &r);
    if (s == HMC_OK) {
      out = Request(e_, r);
    }
    return s;
  }
  /// Requests that ended since the last call (their handles; the Request objects that own
  /// them stay the owners).
  hmc_status poll_completed(std::vector<hmc_request *> &out, std::size_t max = 64) {
    out.resize(max);
    std::size_t n = 0;
    hmc_status s = hmc_engine_poll_completed(e_, out.data(), max, &n);
    out.resize(s == HMC_OK ? n : 0);
    return s;
  }

  hmc_status send_notify(const std::string &remote, const std::string &name,
                         const std::string &msg, std::chrono::milliseconds timeout) {
    return hmc_send_notify(e_, remote.c_str(), name.c_str(), msg.data(), msg.size(),
                           ms(timeout));
  }
  /// Takes every notification received so far, appending them to `out`.
  hmc_status notifications(std::vector<Notification> &out) {
    hmc_notify_list *list = nullptr;
    std::size_t n = 0;
    hmc_status s = hmc_get_notifies(e_, &list, &n);
    if (s != HMC_OK) {
      return s;
    }
    for (std::size_t i = 0; i < n; i++) {
      const hmc_notify *note = nullptr;
      if (hmc_notify_list_get(list, i, &note) == HMC_OK) {
        out.push_back(Notification{
            note->from, note->name,
            std::string(reinterpret_cast<const char *>(note->msg), note->msg_len),
            note->failed != nullptr ? note->failed : ""});
      }
    }
    return hmc_notify_list_free(list);
  }

 private:
  static uint32_t ms(std::chrono::milliseconds t) noexcept {
    return t.count() <= 0 ? 0u : static_cast<uint32_t>(t.count());
  }
  hmc_engine *e_ = nullptr;
};


/// Bytes the library returned (an RPC response); freed when destroyed.
class Bytes {
 public:
  Bytes() noexcept = default;
  explicit Bytes(hmc_bytes *b) noexcept : b_(b) {}
  Bytes(Bytes &&o) noexcept : b_(std::exchange(o.b_, nullptr)) {}
  Bytes &operator=(Bytes &&o) noexcept {
    if (this != &o) {
      reset();
      b_ = std::exchange(o.b_, nullptr);
    }
    return *this;
  }
  Bytes(const Bytes &) = delete;
  Bytes &operator=(const Bytes &) = delete;
  ~Bytes() { reset(); }

  Span<uint8_t> view() const noexcept {
    const uint8_t *d = nullptr;
    std::size_t n = 0;
    if (b_ == nullptr || hmc_bytes_data(b_, &d, &n) != HMC_OK) {
      return Span<uint8_t>();
    }
    return Span<uint8_t>(d, n);
  }
  std::string str() const {
    Span<uint8_t> v = view();
    return std::string(reinterpret_cast<const char *>(v.data()), v.size());
  }
  void reset() noexcept {
    if (b_ != nullptr) {
      hmc_bytes_free(std::exchange(b_, nullptr));
    }
  }
  hmc_bytes **out() noexcept {
    reset();
    return &b_;
  }

 private:
  hmc_bytes *b_ = nullptr;
};

namespace rpc {

/// A call being handled (valid during the handler).
class Call {
 public:
  explicit Call(hmc_rpc_call *c) noexcept : c_(c) {}
  hmc_status respond(const void *data, std::size_t len) { return hmc_rpc_respond(c_, data, len); }
  hmc_status respond(const std::string &s) { return respond(s.data(), s.size()); }
  bool cancelled() const noexcept {
    int c = 0;
    hmc_rpc_call_cancelled(c_, &c);
    return c != 0;
  }
  /// Milliseconds before the client's deadline (-1: none).
  int64_t remaining_ms() const noexcept {
    int64_t ms = -1;
    hmc_rpc_call_remaining_ms(c_, &ms);
    return ms;
  }

 private:
  hmc_rpc_call *c_;
};

/// A method: the request's bytes in; respond through `call`; return HMC_RPC_OK or an
/// error status (HMC_RPC_APP_STATUS + n). Called from many threads at once.
using Handler = std::function<uint32_t(Call &call, Span<uint8_t> request)>;

/// An RPC server whose methods are C++ callables; closed when destroyed.
class Server {
 public:
  Server() = default;
  Server(const Server &) = delete;
  Server &operator=(const Server &) = delete;
  ~Server() { close(); }

  hmc_status create(uint32_t workers = 0) {
    close();
    hmc_rpc_server_options o = HMC_RPC_SERVER_OPTIONS_INIT;
    o.workers = workers;
    return hmc_rpc_server_new(&o, &s_);
  }
  hmc_status add(uint32_t method_id, Handler h) {
    handlers_.push_back(std::make_unique<Handler>(std::move(h)));
    return hmc_rpc_server_register(s_, method_id, &Server::trampoline, handlers_.back().get());
  }
  hmc_status add_demo() { return hmc_rpc_server_register_demo(s_); }
  hmc_status start(const std::string &addr) { return hmc_rpc_server_start(s_, addr.c_str()); }
  std::string address() const {
    char buf[512];
    return hmc_rpc_server_address(s_, buf, sizeof buf, nullptr) == HMC_OK ? std::string(buf)
                                                                          : std::string();
  }
  /// Stops serving (waiting for calls in flight); the handlers are freed after.
  hmc_status close() noexcept {
    hmc_status st = HMC_OK;
    if (s_ != nullptr) {
      st = hmc_rpc_server_close(std::exchange(s_, nullptr));
    }
    handlers_.clear();
    return st;
  }

 private:
  static uint32_t trampoline(void *user, hmc_rpc_call *c, const uint8_t *req, std::size_t len) {
    Call call(c);
#if defined(__cpp_exceptions) || defined(__EXCEPTIONS)
    try {
      return (*static_cast<Handler *>(user))(call, Span<uint8_t>(req, len));
    } catch (const std::exception &e) {
      call.respond(std::string("a C++ exception: ") + e.what());
      return HMC_RPC_INTERNAL;
    } catch (...) {
      call.respond(std::string("a C++ exception"));
      return HMC_RPC_INTERNAL;
    }
#else
    return (*static_cast<Handler *>(user))(call, Span<uint8_t>(req, len));
#endif
  }
  hmc_rpc_server *s_ = nullptr;
  std::vector<std::unique_ptr<Handler>> handlers_;
};

/// An asynchronous call; released (cancelled if still running) when destroyed.
class Pending {
 public:
  Pending() noexcept = default;
  Pending(hmc_rpc_client *c, hmc_rpc_pending *p) noexcept : c_(c), p_(p) {}
  Pending(Pending &&o) noexcept
      : c_(std::exchange(o.c_, nullptr)), p_(std::exchange(o.p_, nullptr)) {}
  Pending &operator=(Pending &&o) noexcept {
    if (this != &o) {
      reset();
      c_ = std::exchange(o.c_, nullptr);
      p_ = std::exchange(o.p_, nullptr);
    }
    return *this;
  }
  Pending(const Pending &) = delete;
  Pending &operator=(const Pending &) = delete;
  ~Pending() { reset(); }

  hmc_status wait(std::chrono::milliseconds t) const noexcept {
    return hmc_rpc_pending_wait(c_, p_, static_cast<uint32_t>(t.count()));
  }
  hmc_status take(Bytes &response, uint32_t *rpc_status = nullptr) {
    return hmc_rpc_pending_take(c_, p_, response.out(), rpc_status);
  }
  hmc_status cancel() const noexcept { return hmc_rpc_pending_cancel(c_, p_); }
  hmc_rpc_pending *get() const noexcept { return p_; }
  void reset() noexcept {
    if (p_ != nullptr) {
      hmc_rpc_pending_release(c_, std::exchange(p_, nullptr));
    }
  }

 private:
  hmc_rpc_client *c_ = nullptr;
  hmc_rpc_pending *p_ = nullptr;
};

/// An RPC client; closed when destroyed.
class Client {
 public:
  Client() = default;
  Client(const Client &) = delete;
  Client &operator=(const Client &) = delete;
  ~Client() { close(); }

  hmc_status connect(const std::string &addr) {
    close();
    return hmc_rpc_client_connect(addr.c_str(), nullptr, &c_);
  }
  hmc_status close() noexcept {
    return c_ == nullptr ? HMC_OK : hmc_rpc_client_close(std::exchange(c_, nullptr));
  }
  hmc_status call(uint32_t method_id, Span<uint8_t> request, std::chrono::milliseconds timeout,
                  Bytes &response, uint32_t *rpc_status = nullptr) {
    return hmc_rpc_call_sync(c_, method_id, request.data(), request.size(),
                             static_cast<uint32_t>(timeout.count()), response.out(), rpc_status);
  }
  hmc_status call(uint32_t method_id, const std::string &request,
                  std::chrono::milliseconds timeout, Bytes &response,
                  uint32_t *rpc_status = nullptr) {
    return call(method_id,
                Span<uint8_t>(reinterpret_cast<const uint8_t *>(request.data()), request.size()),
                timeout, response, rpc_status);
  }
  hmc_status call_async(uint32_t method_id, Span<uint8_t> request,
                        std::chrono::milliseconds timeout, Pending &out,
                        hmc_rpc_callback callback = nullptr, void *user_data = nullptr) {
    hmc_rpc_pending *p = nullptr;
    hmc_status s = hmc_rpc_call_async(c_, method_id, request.data(), request.size(),
                                      static_cast<uint32_t>(timeout.count()), callback,
                                      user_data, &p);
    if (s == HMC_OK) {
      out = Pending(c_, p);
    }
    return s;
  }
  int fd() const noexcept {
    int fd = -1;
    hmc_rpc_client_fd(c_, &fd);
    return fd;
  }
  hmc_rpc_client *get() const noexcept { return c_; }

 private:
  hmc_rpc_client *c_ = nullptr;
};

}  // namespace rpc

// HIXL's API (hicann/hixl: include/hixl/hixl.h and hixl_types.h) over hmc::Engine.
namespace hixl {

using Status = uint32_t;
constexpr Status SUCCESS = 0U;
constexpr Status PARAM_INVALID = 103900U;
constexpr Status TIMEOUT = 103901U;
constexpr Status NOT_CONNECTED = 103902U;
constexpr Status ALREADY_CONNECTED = 103903U;
constexpr Status NOTIFY_FAILED = 103904U;
constexpr Status UNSUPPORTED = 103905U;
constexpr Status FAILED = 503900U;
constexpr Status RESOURCE_EXHAUSTED = 203900U;

/// hmc's own option of Hixl::Initialize (not passed to the engine): which device
/// MEM_DEVICE memory is, "cuda:0" (the default), "rocm:1", "ascend:0", ...
constexpr const char OPTION_DEVICE[] = "hmc.device";
/// The engine's transport ("tcp", "shm", "ucx", "rdma", "auto"): an engine option.
constexpr const char OPTION_TRANSPORT[] = "transport";

/// HIXL's string type (ge::AscendString's calls), a std::string inside this header only.
class AscendString {
 public:
  AscendString() = default;
  AscendString(const char *s) : s_(s != nullptr ? s : "") {}  // NOLINT
  AscendString(const char *s, std::size_t len) : s_(s != nullptr ? std::string(s, len) : "") {}
  const char *GetString() const noexcept { return s_.c_str(); }
  std::size_t GetLength() const noexcept { return s_.size(); }
  bool operator<(const AscendString &o) const noexcept { return s_ < o.s_; }
  bool operator==(const AscendString &o) const noexcept { return s_ == o.s_; }
  bool operator!=(const AscendString &o) const noexcept { return s_ != o.s_; }

 private:
  std::string s_;
};

using MemHandle = void *;
using TransferReq = void *;

enum MemType { MEM_DEVICE, MEM_HOST };
enum TransferOp { READ, WRITE };

struct MemDesc {
  uintptr_t addr;
  std::size_t len;
  bool local_only = false;
  uint8_t reserved[127] = {};
};

struct TransferOpDesc {
  uintptr_t local_addr;
  uintptr_t remote_addr;
  std::size_t len;
};

enum class TransferStatus { WAITING, COMPLETED, TIMEOUT, FAILED };

struct TransferArgs {
  const void *user_data = nullptr;
  uint8_t reserved[120] = {};
};

struct NotifyDesc {
  AscendString name;
  AscendString notify_msg;
};

/// An hmc_status as HIXL's Status.
inline Status to_status(hmc_status s) noexcept {
  switch (s) {
    case HMC_OK:
      return SUCCESS;
    case HMC_ERR_INVALID_ARGUMENT:
    case HMC_ERR_STRUCT_SIZE:
    case HMC_ERR_NOT_REGISTERED:
    case HMC_ERR_BUFFER_TOO_SMALL:
      return PARAM_INVALID;
    case HMC_ERR_DEADLINE:
      return TIMEOUT;
    case HMC_ERR_NOT_CONNECTED:
      return NOT_CONNECTED;
    case HMC_ERR_ALREADY_CONNECTED:
      return ALREADY_CONNECTED;
    case HMC_ERR_UNSUPPORTED:
    case HMC_ERR_UNSUPPORTED_MEMORY:
      return UNSUPPORTED;
    case HMC_ERR_LIMIT:
      return RESOURCE_EXHAUSTED;
    default:
      return FAILED;
  }
}

/// HIXL's engine: Initialize, RegisterMem, Connect, TransferSync/TransferAsync,
/// GetTransferStatus, SendNotify/GetNotifies, Disconnect, DeregisterMem, Finalize.
/// hmc::last_error() says why a call failed.
class Hixl {
 public:
  Hixl() = default;
  ~Hixl() { Finalize(); }
  Hixl(const Hixl &) = delete;
  Hixl &operator=(const Hixl &) = delete;

  /// `local_engine` is "ip:port" for an engine others connect to, "ip" for a client.
  /// Options are the engine's (transport, auth_secret_file, metadata, limits, ...) plus
  /// OPTION_DEVICE; HIXL's own Ascend options are refused as unknown.
  Status Initialize(const AscendString &local_engine,
                    const std::map<AscendString, AscendString> &options) {
    Engine::Options opts;
    for (const auto &kv : options) {
      if (std::strcmp(kv.first.GetString(), OPTION_DEVICE) == 0) {
        if (!parse_device(kv.second.GetString())) {
          return PARAM_INVALID;
        }
        continue;
      }
      opts.emplace_back(kv.first.GetString(), kv.second.GetString());
    }
    return to_status(engine_.open(local_engine.GetString(), opts));
  }

  void Finalize() {
    reqs_.clear();
    regs_.clear();
    engine_.close();
  }

  Status RegisterMem(const MemDesc &mem, MemType type, MemHandle &mem_handle) {
    Registration r;
    hmc_status s = type == MEM_HOST
                       ? engine_.register_host(reinterpret_cast<const void *>(mem.addr),
                                               mem.len, r)
                       : engine_.register_device(device_kind_, device_id_, mem.addr, mem.len, r);
    if (s != HMC_OK) {
      return to_status(s);
    }
    mem_handle = r.get();
    regs_.emplace(mem_handle, std::move(r));
    return SUCCESS;
  }

  Status DeregisterMem(MemHandle mem_handle) {
    auto it = regs_.find(mem_handle);
    if (it == regs_.end()) {
      return PARAM_INVALID;
    }
    hmc_status s = it->second.reset();
    regs_.erase(it);
    return to_status(s);
  }

  Status Connect(const AscendString &remote_engine, int32_t timeout_in_millis = 1000) {
    if (timeout_in_millis <= 0) {
      return PARAM_INVALID;
    }
    return to_status(engine_.connect(remote_engine.GetString(),
                                     std::chrono::milliseconds(timeout_in_millis)));
  }

  Status Disconnect(const AscendString &remote_engine, int32_t timeout_in_millis = 1000) {
    (void)timeout_in_millis;
    return to_status(engine_.disconnect(remote_engine.GetString()));
  }

  Status TransferSync(const AscendString &remote_engine, TransferOp operation,
                      const std::vector<TransferOpDesc> &op_descs,
                      int32_t timeout_in_millis = 1000) {
    if (timeout_in_millis <= 0) {
      return PARAM_INVALID;
    }
    std::vector<hmc_xfer_desc> d = descs(op_descs);
    return to_status(engine_.transfer(remote_engine.GetString(), op(operation), d,
                                      std::chrono::milliseconds(timeout_in_millis)));
  }

  /// Starts a transfer; `req` is valid until GetTransferStatus reports it ended (then it
  /// is released, as in HIXL). Its timeout is the engine's default_timeout_ms.
  Status TransferAsync(const AscendString &remote_engine, TransferOp operation,
                       const std::vector<TransferOpDesc> &op_descs,
                       const TransferArgs &optional_args, TransferReq &req) {
    (void)optional_args;
    std::vector<hmc_xfer_desc> d = descs(op_descs);
    Request r;
    hmc_status s = engine_.transfer_async(remote_engine.GetString(), op(operation), d,
                                          std::chrono::milliseconds(0), r);
    if (s != HMC_OK) {
      return to_status(s);
    }
    req = r.get();
    reqs_.emplace(req, std::move(r));
    return SUCCESS;
  }

  Status GetTransferStatus(const TransferReq &req, TransferStatus &status) {
    auto it = reqs_.find(req);
    if (it == reqs_.end()) {
      return PARAM_INVALID;
    }
    uint32_t state = HMC_REQUEST_WAITING;
    hmc_request_status(engine_.get(), it->second.get(), &state);
    switch (state) {
      case HMC_REQUEST_WAITING:
        status = TransferStatus::WAITING;
        return SUCCESS;
      case HMC_REQUEST_COMPLETED:
        status = TransferStatus::COMPLETED;
        break;
      case HMC_REQUEST_TIMEOUT:
        status = TransferStatus::TIMEOUT;
        break;
      default:
        status = TransferStatus::FAILED;
        break;
    }
    reqs_.erase(it);
    return SUCCESS;
  }

  Status SendNotify(const AscendString &remote_engine, const NotifyDesc &notify,
                    int32_t timeout_in_millis = 1000) {
    if (timeout_in_millis <= 0) {
      return PARAM_INVALID;
    }
    hmc_status s = engine_.send_notify(
        remote_engine.GetString(), notify.name.GetString(),
        std::string(notify.notify_msg.GetString(), notify.notify_msg.GetLength()),
        std::chrono::milliseconds(timeout_in_millis));
    return s == HMC_OK ? SUCCESS : (s == HMC_ERR_INVALID_ARGUMENT ? PARAM_INVALID
                                                                  : NOTIFY_FAILED);
  }

  Status GetNotifies(std::vector<NotifyDesc> &notifies) {
    std::vector<Notification> got;
    hmc_status s = engine_.notifications(got);
    for (const auto &n : got) {
      notifies.push_back(NotifyDesc{AscendString(n.name.c_str()),
                                    AscendString(n.msg.data(), n.msg.size())});
    }
    return to_status(s);
  }

  /// The engine underneath, for hmc's calls that HIXL lacks (fd, telemetry, ...).
  Engine &engine() noexcept { return engine_; }

 private:
  static Op op(TransferOp o) noexcept { return o == READ ? Op::Read : Op::Write; }
  static std::vector<hmc_xfer_desc> descs(const std::vector<TransferOpDesc> &in) {
    std::vector<hmc_xfer_desc> out;
    out.reserve(in.size());
    for (const auto &d : in) {
      out.push_back(hmc_xfer_desc{d.local_addr, d.remote_addr, d.len});
    }
    return out;
  }
  bool parse_device(const char *s) {
    static const std::pair<const char *, uint32_t> kinds[] = {
        {"cuda", HMC_DEVICE_CUDA}, {"rocm", HMC_DEVICE_ROCM},     {"mlu", HMC_DEVICE_MLU},
        {"musa", HMC_DEVICE_MUSA}, {"ascend", HMC_DEVICE_ASCEND}};
    std::string v(s);
    std::size_t colon = v.find(':');
    std::string kind = v.substr(0, colon);
    for (const auto &k : kinds) {
      if (kind == k.first) {
        device_kind_ = k.second;
        device_id_ = colon == std::string::npos
                         ? 0u
                         : static_cast<uint32_t>(std::strtoul(v.c_str() + colon + 1, nullptr, 10));
        return true;
      }
    }
    return false;
  }

  Engine engine_;
  std::map<MemHandle, Registration> regs_;
  std::map<TransferReq, Request> reqs_;
  uint32_t device_kind_ = HMC_DEVICE_CUDA;
  uint32_t device_id_ = 0;
};

}  // namespace hixl
}  // namespace hmc

#endif  // HMC_HMC_HPP
