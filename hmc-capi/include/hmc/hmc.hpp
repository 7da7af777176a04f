// hmc.hpp: a header-only C++17 layer over hmc.h (libhmc's C API).
//
// - namespace hmc: RAII classes (Engine, Registration, Request) whose calls return
//   hmc_status, as the C API does; hmc::check() turns a status into an hmc::Error exception
//   for code that prefers them (only where exceptions are enabled).
// - namespace hmc::llm_datadist: LLM-DataDist's KV API names (class LlmDataDist, Cache,
//   CacheDesc, CacheIndex, KvCacheExtParam, LLM_* status codes) over the C KV API.
// - namespace hmc::hixl: HIXL's names and shapes (class Hixl, AscendString, MemDesc,
//   MemType, MemHandle, TransferOp, TransferOpDesc, TransferArgs, TransferReq,
//   TransferStatus, NotifyDesc, GetTransferStatusArgs, TransferResult, AsyncConnectStatus,
//   FeatureType, Status and its constants), so that a HIXL program ports by changing its
//   include, `using namespace hixl;` to `using namespace hmc::hixl;`, and its ACL memory
//   calls (docs/c-api.md). Its async connects run on threads of its own (<thread>).
//
// No C++ type crosses the library's ABI (only hmc.h's C types do), so this header works
// with either libstdc++ string ABI (_GLIBCXX_USE_CXX11_ABI=0 or 1).
#ifndef HMC_HMC_HPP
#define HMC_HMC_HPP

#include <hmc/hmc.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
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

namespace detail {
/// A handle `H` of owner `O` (an engine, a client) released by `Release` when destroyed:
/// movable, not copyable. A handle whose owner was closed first is refused by status, not
/// dereferenced, so destruction order does not matter.
template <class O, class H, hmc_status (*Release)(O *, H *)>
class Owned {
 public:
  Owned() noexcept = default;
  Owned(O *owner, H *handle) noexcept : o_(owner), h_(handle) {}
  Owned(Owned &&x) noexcept : o_(std::exchange(x.o_, nullptr)), h_(std::exchange(x.h_, nullptr)) {}
  Owned &operator=(Owned &&x) noexcept {
    if (this != &x) {
      reset();
      o_ = std::exchange(x.o_, nullptr);
      h_ = std::exchange(x.h_, nullptr);
    }
    return *this;
  }
  Owned(const Owned &) = delete;
  Owned &operator=(const Owned &) = delete;
  ~Owned() { reset(); }

  /// Releases now (a no-op when empty).
  hmc_status reset() noexcept {
    hmc_status s = HMC_OK;
    if (h_ != nullptr) {
      s = Release(o_, std::exchange(h_, nullptr));
    }
    o_ = nullptr;
    return s;
  }
  /// Gives up ownership: the caller releases the handle.
  H *release() noexcept { return std::exchange(h_, nullptr); }
  H *get() const noexcept { return h_; }
  explicit operator bool() const noexcept { return h_ != nullptr; }

 protected:
  O *owner() const noexcept { return o_; }

 private:
  O *o_ = nullptr;
  H *h_ = nullptr;
};
}  // namespace detail

/// A registration; deregistered when destroyed (or by reset()).
class Registration : public detail::Owned<hmc_engine, hmc_mem, hmc_deregister_mem> {
 public:
  using Owned::Owned;
};

/// An asynchronous transfer; released when destroyed (which cancels it if still running).
class Request : public detail::Owned<hmc_engine, hmc_request, hmc_request_release> {
 public:
  using Owned::Owned;
  /// HMC_PENDING while running, HMC_OK when completed, else why it failed.
  hmc_status status() const noexcept { return hmc_request_status(owner(), get(), nullptr); }
  hmc_status wait(std::chrono::milliseconds timeout) const noexcept {
    return hmc_request_wait(owner(), get(), static_cast<uint32_t>(timeout.count()));
  }
  hmc_status cancel() const noexcept { return hmc_request_cancel(owner(), get()); }
  hmc_status telemetry(hmc_telemetry &out) const noexcept {
    out.struct_size = sizeof out;
    return hmc_request_telemetry(owner(), get(), &out);
  }
};

/// A prepared descriptor list (hmc_prep_local / hmc_prep_remote); released when destroyed.
class PreparedList : public detail::Owned<hmc_engine, hmc_prepped, hmc_prepped_release> {
 public:
  using Owned::Owned;
  /// Entries in the list (a strided descriptor counts its blocks); 0 on failure.
  uint64_t size() const noexcept {
    uint64_t n = 0;
    hmc_prepped_len(owner(), get(), &n);
    return n;
  }
};

/// A transfer made of two prepared lists, posted any number of times; released (a post in
/// progress cancelled and waited for) when destroyed.
class PreparedTransfer : public detail::Owned<hmc_engine, hmc_xfer, hmc_xfer_release> {
 public:
  using Owned::Owned;
  hmc_status post() noexcept { return hmc_xfer_post(owner(), get()); }
  hmc_status status() const noexcept { return hmc_xfer_status(owner(), get(), nullptr); }
  hmc_status wait(std::chrono::milliseconds t) const noexcept {
    return hmc_xfer_wait(owner(), get(), static_cast<uint32_t>(t.count()));
  }
  hmc_status telemetry(hmc_telemetry &out) const noexcept {
    out.struct_size = sizeof out;
    return hmc_xfer_telemetry(owner(), get(), &out);
  }
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

  /// Resolves blocks of this engine's registered memory once.
  hmc_status prepare_local(Span<hmc_block_desc> blocks, PreparedList &out) {
    hmc_prepped *p = nullptr;
    hmc_status s = hmc_prep_local(e_, blocks.data(), blocks.size(), &p);
    if (s == HMC_OK) {
      out = PreparedList(e_, p);
    }
    return s;
  }
  /// Resolves blocks of the connected peer `remote`'s memory once.
  hmc_status prepare_remote(const std::string &remote, Span<hmc_block_desc> blocks,
                            std::chrono::milliseconds timeout, PreparedList &out) {
    hmc_prepped *p = nullptr;
    hmc_status s =
        hmc_prep_remote(e_, remote.c_str(), blocks.data(), blocks.size(), ms(timeout), &p);
    if (s == HMC_OK) {
      out = PreparedList(e_, p);
    }
    return s;
  }
  /// Entries `local_idx[k]` of `local` with `remote_idx[k]` of `remote`; with a
  /// non-empty `notify_name`, every post ends by delivering that notification.
  hmc_status make_transfer(Op op, const PreparedList &local, Span<uint64_t> local_idx,
                           const PreparedList &remote, Span<uint64_t> remote_idx,
                           PreparedTransfer &out, const std::string &notify_name = "",
                           const std::string &notify_msg = "") {
    if (local_idx.size() != remote_idx.size()) {
      return HMC_ERR_INVALID_ARGUMENT;
    }
    hmc_xfer *x = nullptr;
    hmc_status s = hmc_make_xfer(e_, static_cast<uint32_t>(op), local.get(), local_idx.data(),
                                 remote.get(), remote_idx.data(), local_idx.size(),
                                 notify_name.empty() ? nullptr : notify_name.c_str(),
                                 notify_msg.data(), notify_msg.size(), &x);
    if (s == HMC_OK) {
      out = PreparedTransfer(e_, x);
    }
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
class Pending : public detail::Owned<hmc_rpc_client, hmc_rpc_pending, hmc_rpc_pending_release> {
 public:
  using Owned::Owned;
  hmc_status wait(std::chrono::milliseconds t) const noexcept {
    return hmc_rpc_pending_wait(owner(), get(), static_cast<uint32_t>(t.count()));
  }
  hmc_status take(Bytes &response, uint32_t *rpc_status = nullptr) {
    return hmc_rpc_pending_take(owner(), get(), response.out(), rpc_status);
  }
  hmc_status cancel() const noexcept { return hmc_rpc_pending_cancel(owner(), get()); }
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

/// What Hixl::GetTransferStatus over all requests reports: at most `max_query_count`
/// requests, leaving out those still running when `skip_waiting`.
struct GetTransferStatusArgs {
  uint32_t max_query_count = UINT32_MAX;
  bool skip_waiting = false;
  uint8_t reserved[123] = {};
};

/// One request's state from Hixl::GetTransferStatus over all requests, with the
/// `user_data` its TransferArgs gave.
struct TransferResult {
  TransferReq req = nullptr;
  const void *user_data = nullptr;
  TransferStatus status = TransferStatus::WAITING;
  uint8_t reserved[108] = {};
};

/// A remote's state after Hixl::ConnectAsync / DisconnectAsync (its newest task's).
enum class AsyncConnectStatus {
  NOT_CONNECT,
  CONNECT_PENDING,
  CONNECTING,
  CONNECTED,
  CONNECT_FAILED,
  DISCONNECT_PENDING,
  DISCONNECTING
};

/// What Hixl::GetCapability is asked about.
enum FeatureType : int32_t {
  AUTO_CONNECT = 0,        // transfers without Connect first: not in hmc
  CLIENT_SERVER_COMM = 1,  // Initialize("ip:port") listens, Initialize("ip") connects out
};
constexpr int32_t FEATURE_SUPPORTED = 1;
constexpr int32_t FEATURE_NOT_SUPPORTED = 0;

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

namespace detail {
/// Hixl::ConnectAsync and DisconnectAsync: tasks run by kWorkers threads (started by the
/// first task), one remote's tasks in the order given, different remotes' at the same time;
/// a remote's status is that of its newest task. Destroying it drops the tasks not started
/// and waits for the running ones (each within its timeout).
class ConnectQueue {
 public:
  /// HIXL's defaults for its connect pool (threads, queued tasks).
  static constexpr std::size_t kWorkers = 2;
  static constexpr std::size_t kCapacity = 256;

  explicit ConnectQueue(hmc_engine *engine) : engine_(engine) {}
  ConnectQueue(const ConnectQueue &) = delete;
  ConnectQueue &operator=(const ConnectQueue &) = delete;
  ~ConnectQueue() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto &t : workers_) {
      t.join();
    }
  }

  /// Queues a connect (or a disconnect) of `remote`; RESOURCE_EXHAUSTED while kCapacity
  /// tasks wait.
  Status submit(const AscendString &remote, bool connect, uint32_t timeout_ms) {
    std::lock_guard<std::mutex> lock(mu_);
    if (queued_ >= kCapacity) {
      return RESOURCE_EXHAUSTED;
    }
    while (workers_.size() < kWorkers) {
      workers_.emplace_back([this] { work(); });
    }
    Remote &r = remotes_[remote];
    r.tasks.push_back(Task{connect, timeout_ms, ++seq_});
    r.newest = seq_;
    r.status = connect ? AsyncConnectStatus::CONNECT_PENDING
                       : AsyncConnectStatus::DISCONNECT_PENDING;
    queued_++;
    if (!r.busy && r.tasks.size() == 1) {
      ready_.push_back(remote);
      cv_.notify_one();
    }
    return SUCCESS;
  }

  /// `remote`'s status (NOT_CONNECT when no task was given for it).
  AsyncConnectStatus status(const AscendString &remote) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = remotes_.find(remote);
    return it == remotes_.end() ? AsyncConnectStatus::NOT_CONNECT : it->second.status;
  }

  /// Every remote a task was given for, with its status.
  void statuses(std::map<AscendString, AsyncConnectStatus> &out) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto &r : remotes_) {
      out[r.first] = r.second.status;
    }
  }

 private:
  struct Task {
    bool connect;
    uint32_t timeout_ms;
    uint64_t seq;
  };
  struct Remote {
    std::deque<Task> tasks;
    bool busy = false;  // a worker runs its front task; it re-queues the remote after
    uint64_t newest = 0;
    AsyncConnectStatus status = AsyncConnectStatus::NOT_CONNECT;
  };

  static AsyncConnectStatus outcome(bool connect, hmc_status s) noexcept {
    if (connect) {
      return s == HMC_OK || s == HMC_ERR_ALREADY_CONNECTED ? AsyncConnectStatus::CONNECTED
                                                           : AsyncConnectStatus::CONNECT_FAILED;
    }
    // A disconnect that failed for another reason than "not connected" left it connected.
    return s == HMC_OK || s == HMC_ERR_NOT_CONNECTED ? AsyncConnectStatus::NOT_CONNECT
                                                     : AsyncConnectStatus::CONNECTED;
  }

  void work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stopping_ || !ready_.empty(); });
      if (stopping_) {
        return;
      }
      AscendString name = ready_.front();
      ready_.pop_front();
      Remote &r = remotes_[name];  // std::map: stays valid while others are added
      Task t = r.tasks.front();
      r.tasks.pop_front();
      queued_--;
      r.busy = true;
      if (t.seq == r.newest) {
        r.status = t.connect ? AsyncConnectStatus::CONNECTING : AsyncConnectStatus::DISCONNECTING;
      }
      lock.unlock();
      hmc_status s = t.connect ? hmc_connect(engine_, name.GetString(), t.timeout_ms)
                               : hmc_disconnect(engine_, name.GetString());
      lock.lock();
      if (t.seq == r.newest) {
        r.status = outcome(t.connect, s);
      }
      r.busy = false;
      if (!r.tasks.empty()) {
        ready_.push_back(name);
        cv_.notify_one();
      }
    }
  }

  hmc_engine *const engine_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::size_t queued_ = 0;
  uint64_t seq_ = 0;
  std::map<AscendString, Remote> remotes_;
  std::deque<AscendString> ready_;  // remotes with tasks that no worker runs
  std::vector<std::thread> workers_;
};
}  // namespace detail

/// HIXL's engine: Initialize, RegisterMem, Connect, ConnectAsync/DisconnectAsync with
/// GetAsyncConnectStatus, TransferSync/TransferAsync, GetTransferStatus (one request, or
/// all), SendNotify/GetNotifies, Disconnect, DeregisterMem, Finalize, GetCapability.
/// hmc::last_error() says why a call failed (on the thread that made it: not for the
/// async connects, whose outcome is their status). Its calls other than Initialize and
/// Finalize may be made from many threads at once.
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
    stop_connects();
    std::lock_guard<std::mutex> lock(mu_);
    return to_status(engine_.open(local_engine.GetString(), opts));
  }

  /// Waits for the async connects that are running (each within its timeout), drops those
  /// not started, releases the requests and registrations, closes the engine.
  void Finalize() {
    stop_connects();
    std::lock_guard<std::mutex> lock(mu_);
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
    std::lock_guard<std::mutex> lock(mu_);
    regs_.emplace(mem_handle, std::move(r));
    return SUCCESS;
  }

  Status DeregisterMem(MemHandle mem_handle) {
    std::lock_guard<std::mutex> lock(mu_);
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

  /// Queues a connect to `remote_engine` and returns: GetAsyncConnectStatus follows it
  /// (CONNECT_PENDING, CONNECTING, then CONNECTED or CONNECT_FAILED). As in HIXL, one
  /// remote's tasks run in the order given, different remotes' at the same time, and the
  /// async calls are not mixed with Connect/Disconnect for the same remote.
  /// RESOURCE_EXHAUSTED while 256 tasks wait.
  Status ConnectAsync(const AscendString &remote_engine, int32_t timeout_in_millis = 1000) {
    return submit_connect(remote_engine, true, timeout_in_millis);
  }

  /// Queues a disconnect from `remote_engine` (DISCONNECT_PENDING, DISCONNECTING, then
  /// NOT_CONNECT; CONNECTED again if the engine refused it).
  Status DisconnectAsync(const AscendString &remote_engine, int32_t timeout_in_millis = 1000) {
    return submit_connect(remote_engine, false, timeout_in_millis);
  }

  /// The status of the newest async connect or disconnect of `remote_engine` (NOT_CONNECT
  /// when none was asked for).
  Status GetAsyncConnectStatus(const AscendString &remote_engine, AsyncConnectStatus &status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!engine_) {
      return FAILED;
    }
    status = connects_ ? connects_->status(remote_engine) : AsyncConnectStatus::NOT_CONNECT;
    return SUCCESS;
  }

  /// Every remote an async connect or disconnect was asked for, with its status.
  Status GetAsyncConnectStatus(std::map<AscendString, AsyncConnectStatus> &statuses) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!engine_) {
      return FAILED;
    }
    if (connects_) {
      connects_->statuses(statuses);
    }
    return SUCCESS;
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
    std::vector<hmc_xfer_desc> d = descs(op_descs);
    Request r;
    hmc_status s = engine_.transfer_async(remote_engine.GetString(), op(operation), d,
                                          std::chrono::milliseconds(0), r);
    if (s != HMC_OK) {
      return to_status(s);
    }
    req = r.get();
    std::lock_guard<std::mutex> lock(mu_);
    reqs_.emplace(req, Pending{std::move(r), optional_args.user_data, ++req_seq_});
    return SUCCESS;
  }

  Status GetTransferStatus(const TransferReq &req, TransferStatus &status) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = reqs_.find(req);
    if (it == reqs_.end()) {
      return PARAM_INVALID;
    }
    status = state_of(it->second.request);
    if (status != TransferStatus::WAITING) {
      reqs_.erase(it);
    }
    return SUCCESS;
  }

  /// The requests of TransferAsync not yet reported ended, oldest first, into `results`
  /// (replacing its contents): at most `args.max_query_count`, those still running left
  /// out when `args.skip_waiting`. As with one request, a request reported ended is
  /// released and not reported again.
  Status GetTransferStatus(const GetTransferStatusArgs &args,
                           std::vector<TransferResult> &results) {
    std::lock_guard<std::mutex> lock(mu_);
    results.clear();
    std::vector<std::map<TransferReq, Pending>::iterator> order;
    order.reserve(reqs_.size());
    for (auto it = reqs_.begin(); it != reqs_.end(); ++it) {
      order.push_back(it);
    }
    std::sort(order.begin(), order.end(),
              [](const auto &x, const auto &y) { return x->second.seq < y->second.seq; });
    for (auto it : order) {
      if (results.size() >= args.max_query_count) {
        break;
      }
      TransferResult r;
      r.req = it->first;
      r.user_data = it->second.user_data;
      r.status = state_of(it->second.request);
      if (r.status == TransferStatus::WAITING && args.skip_waiting) {
        continue;
      }
      results.push_back(r);
      if (r.status != TransferStatus::WAITING) {
        reqs_.erase(it);
      }
    }
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

  /// Whether hmc has `feature_type` (FEATURE_SUPPORTED or FEATURE_NOT_SUPPORTED into
  /// `value`; an unknown feature is not supported); PARAM_INVALID for a negative one. Needs
  /// no Hixl: CLIENT_SERVER_COMM is supported, AUTO_CONNECT is not (Connect first).
  static Status GetCapability(FeatureType feature_type, int32_t &value) {
    if (static_cast<int32_t>(feature_type) < 0) {
      return PARAM_INVALID;
    }
    value = feature_type == CLIENT_SERVER_COMM ? FEATURE_SUPPORTED : FEATURE_NOT_SUPPORTED;
    return SUCCESS;
  }

  /// The engine underneath, for hmc's calls that HIXL lacks (fd, telemetry, ...).
  Engine &engine() noexcept { return engine_; }

 private:
  /// A request of TransferAsync until GetTransferStatus reports it ended.
  struct Pending {
    Request request;
    const void *user_data;
    uint64_t seq;  // TransferAsync's order, for GetTransferStatus over all requests
  };

  Status submit_connect(const AscendString &remote, bool connect, int32_t timeout_in_millis) {
    if (timeout_in_millis <= 0) {
      return PARAM_INVALID;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (!engine_) {
      return FAILED;
    }
    if (!connects_) {
      connects_.reset(new detail::ConnectQueue(engine_.get()));
    }
    return connects_->submit(remote, connect, static_cast<uint32_t>(timeout_in_millis));
  }

  /// Ends the async connects (waiting for the running ones) outside the lock: they do not
  /// take it, but a caller of GetAsyncConnectStatus meanwhile should not wait on them.
  void stop_connects() {
    std::unique_ptr<detail::ConnectQueue> q;
    {
      std::lock_guard<std::mutex> lock(mu_);
      q = std::move(connects_);
    }
    q.reset();
  }

  TransferStatus state_of(const Request &r) const {
    uint32_t state = HMC_REQUEST_WAITING;
    hmc_request_status(engine_.get(), r.get(), &state);
    switch (state) {
      case HMC_REQUEST_WAITING:
        return TransferStatus::WAITING;
      case HMC_REQUEST_COMPLETED:
        return TransferStatus::COMPLETED;
      case HMC_REQUEST_TIMEOUT:
        return TransferStatus::TIMEOUT;
      default:
        return TransferStatus::FAILED;
    }
  }

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

  // Guards the maps, the queue's pointer and the engine's opening and closing; the
  // engine's own calls need no lock.
  std::mutex mu_;
  Engine engine_;
  std::map<MemHandle, Registration> regs_;
  std::map<TransferReq, Pending> reqs_;
  uint64_t req_seq_ = 0;
  std::unique_ptr<detail::ConnectQueue> connects_;
  uint32_t device_kind_ = HMC_DEVICE_CUDA;
  uint32_t device_id_ = 0;
};

}  // namespace hixl

// LLM-DataDist's KV API (hicann/hixl: include/llm_datadist/llm_datadist.h) over the C KV
// API: class LlmDataDist and its types and status codes. A cache is published under its
// cache id (request key {cluster, cache_id, 0, 0}, blocks key {cluster, cache_id}), so a
// peer names it by CacheIndex{cluster_id, cache_id}, as in LLM-DataDist. Not supported
// (LLM_PARAM_INVALID): batch_index other than 0, a size other than -1, different source
// and destination layer ranges, CopyKvCache, SetRole, copies between two caches.
namespace llm_datadist {

using Status = uint32_t;
using AscendString = hixl::AscendString;

constexpr const char OPTION_LISTEN_IP_INFO[] = "llm.ListenIpInfo";
constexpr const char OPTION_DEVICE_ID[] = "llm.DeviceId";
constexpr const char OPTION_TRANSFER_BACKEND[] = "llm.TransferBackend";

constexpr Status LLM_SUCCESS = 0x0U;
constexpr Status LLM_FAILED = 0xFFFFFFFFU;
constexpr Status LLM_WAIT_PROC_TIMEOUT = 0x5010B001U;
constexpr Status LLM_KV_CACHE_NOT_EXIST = 0x5010B002U;
constexpr Status LLM_PARAM_INVALID = 0x5010B005U;
constexpr Status LLM_NOT_YET_LINK = 0x5010B007U;
constexpr Status LLM_ALREADY_LINK = 0x5010B008U;
constexpr Status LLM_LINK_FAILED = 0x5010B009U;
constexpr Status LLM_UNLINK_FAILED = 0x5010B00AU;
constexpr Status LLM_FEATURE_NOT_ENABLED = 0x5010B019U;
constexpr Status LLM_TIMEOUT = 0x5010B01AU;
constexpr Status LLM_OUT_OF_MEMORY = 0x5010B01CU;

/// The element types hmc moves (the values are hmc's; the names are ge's).
enum DataType {
  DT_UNDEFINED = -1,
  DT_FLOAT8_E4M3FN = HMC_DTYPE_FP8,
  DT_FLOAT16 = HMC_DTYPE_F16,
  DT_BF16 = HMC_DTYPE_BF16,
  DT_FLOAT = HMC_DTYPE_F32,
  DT_INT8 = HMC_DTYPE_I8,
  DT_UINT8 = HMC_DTYPE_U8,
  DT_INT32 = HMC_DTYPE_I32,
  DT_FLOAT8_E5M2 = 100,  // moved as FP8 (only the size matters)
};

struct IpInfo {
  AscendString ip;
  uint16_t port = 0U;
  uint8_t reserved[128] = {};
};

struct ClusterInfo {
  uint64_t remote_cluster_id = 0U;
  int32_t remote_role_type = 0;
  std::vector<IpInfo> local_ip_infos;
  std::vector<IpInfo> remote_ip_infos;
  uint8_t reserved[128] = {};
};

enum class LlmRole : int32_t { kPrompt = 1, kDecoder = 2, kMix = 3, kEnd };

struct CacheIndex {
  uint64_t cluster_id;
  int64_t cache_id;
  uint32_t batch_index;
  uint8_t reserved[128];
};

enum class CachePlacement : uint32_t { kHost = 0U, kDevice = 1U };

struct CacheDesc {
  CachePlacement placement = CachePlacement::kDevice;
  uint32_t num_tensors = 0U;
  DataType data_type = DT_UNDEFINED;
  std::vector<int64_t> shape;
  uint8_t reserved[128] = {};
};

struct Cache {
  int64_t cache_id = -1;
  std::vector<uintptr_t> tensor_addrs;
  CacheDesc cache_desc;
  uint8_t reserved[128] = {};
};

struct KvCacheExtParam {
  std::pair<int32_t, int32_t> src_layer_range = {-1, -1};
  std::pair<int32_t, int32_t> dst_layer_range{-1, -1};
  uint8_t tensor_num_per_layer = 2;
  uint8_t reserved[127] = {};
};

struct RegisterCfg {
  uint8_t reserved[128] = {0};
};

/// An hmc_status as LLM-DataDist's Status.
inline Status to_status(hmc_status s) noexcept {
  switch (s) {
    case HMC_OK:
      return LLM_SUCCESS;
    case HMC_ERR_INVALID_ARGUMENT:
    case HMC_ERR_STRUCT_SIZE:
    case HMC_ERR_BUFFER_TOO_SMALL:
      return LLM_PARAM_INVALID;
    case HMC_ERR_NOT_CONNECTED:
      return LLM_NOT_YET_LINK;
    case HMC_ERR_ALREADY_CONNECTED:
      return LLM_ALREADY_LINK;
    case HMC_ERR_NOT_REGISTERED:
      return LLM_KV_CACHE_NOT_EXIST;
    case HMC_ERR_DEADLINE:
      return LLM_TIMEOUT;
    case HMC_ERR_LIMIT:
      return LLM_OUT_OF_MEMORY;
    case HMC_ERR_UNSUPPORTED:
    case HMC_ERR_UNSUPPORTED_MEMORY:
      return LLM_FEATURE_NOT_ENABLED;
    default:
      return LLM_FAILED;
  }
}

/// LLM-DataDist's KV service over an hmc engine. hmc::last_error() says why a call failed.
class LlmDataDist {
 public:
  LlmDataDist(uint64_t cluster_id, LlmRole role) : cluster_id_(cluster_id), role_(role) {}
  ~LlmDataDist() { Finalize(); }
  LlmDataDist(const LlmDataDist &) = delete;
  LlmDataDist &operator=(const LlmDataDist &) = delete;

  /// OPTION_LISTEN_IP_INFO ("ip:port") is where a prompt listens (a decoder may leave it
  /// out: "127.0.0.1"); OPTION_DEVICE_ID is the CUDA device of kDevice caches; other keys
  /// are engine options (transport, auth_secret_file, ...).
  Status Initialize(const std::map<AscendString, AscendString> &options) {
    std::string local = "127.0.0.1";
    Engine::Options opts;
    for (const auto &kv : options) {
      std::string k = kv.first.GetString();
      if (k == OPTION_LISTEN_IP_INFO) {
        local = kv.second.GetString();
      } else if (k == OPTION_DEVICE_ID) {
        device_id_ = static_cast<uint32_t>(std::strtoul(kv.second.GetString(), nullptr, 10));
      } else if (k != OPTION_TRANSFER_BACKEND) {
        opts.emplace_back(k, kv.second.GetString());
      }
    }
    hmc_status s = engine_.open(local, opts);
    if (s != HMC_OK) {
      return to_status(s);
    }
    uint32_t role = role_ == LlmRole::kDecoder ? HMC_ROLE_DECODER : HMC_ROLE_PROMPT;
    return to_status(hmc_datadist_new(engine_.get(), cluster_id_, role, &dd_));
  }

  void Finalize() {
    if (dd_ != nullptr) {
      hmc_datadist_close(std::exchange(dd_, nullptr));
    }
    caches_.clear();
    engine_.close();
  }

  /// Links each cluster at its first remote_ip_infos entry; one status per cluster.
  Status LinkLlmClusters(const std::vector<ClusterInfo> &clusters, std::vector<Status> &rets,
                         int32_t timeout_in_millis = 1000) {
    return each(clusters, rets, [&](const ClusterInfo &c) -> Status {
      if (c.remote_ip_infos.empty()) {
        return LLM_PARAM_INVALID;
      }
      const IpInfo &ip = c.remote_ip_infos.front();
      std::string addr = std::string(ip.ip.GetString()) + ":" + std::to_string(ip.port);
      hmc_status s = hmc_datadist_link(dd_, c.remote_cluster_id, addr.c_str(),
                                       static_cast<uint32_t>(timeout_in_millis));
      return s == HMC_OK ? LLM_SUCCESS : (s == HMC_ERR_ALREADY_CONNECTED ? LLM_ALREADY_LINK
                                                                          : LLM_LINK_FAILED);
    });
  }

  Status UnlinkLlmClusters(const std::vector<ClusterInfo> &clusters, std::vector<Status> &rets,
                           int32_t timeout_in_millis = 1000, bool force_flag = false) {
    (void)timeout_in_millis;
    (void)force_flag;
    return each(clusters, rets, [&](const ClusterInfo &c) -> Status {
      return hmc_datadist_unlink(dd_, c.remote_cluster_id) == HMC_OK ? LLM_SUCCESS
                                                                     : LLM_UNLINK_FAILED;
    });
  }

  /// Allocates a host cache (kDevice caches are allocated by the framework and registered
  /// with RegisterKvCache).
  Status AllocateCache(const CacheDesc &cache_desc, Cache &cache) {
    int64_t id = next_id_;
    hmc_kv_cache *c = nullptr;
    Status st = publish(cache_desc, id, nullptr, c);
    if (st != LLM_SUCCESS) {
      return st;
    }
    next_id_++;
    caches_[id] = c;
    cache.cache_id = id;
    cache.cache_desc = cache_desc;
    return addrs(c, cache.tensor_addrs);
  }

  Status RegisterKvCache(const CacheDesc &cache_desc, const std::vector<uint64_t> &addrs,
                         const RegisterCfg &cfg, int64_t &cache_id) {
    (void)cfg;
    if (addrs.size() != cache_desc.num_tensors) {
      return LLM_PARAM_INVALID;
    }
    int64_t id = next_id_;
    hmc_kv_cache *c = nullptr;
    Status st = publish(cache_desc, id, addrs.data(), c);
    if (st == LLM_SUCCESS) {
      next_id_++;
      caches_[id] = c;
      cache_id = id;
    }
    return st;
  }

  /// A cache that does not exist (or was deallocated) is LLM_SUCCESS, as in LLM-DataDist.
  Status DeallocateCache(int64_t cache_id) {
    auto it = caches_.find(cache_id);
    if (it == caches_.end()) {
      return LLM_SUCCESS;
    }
    hmc_kv_cache *c = it->second;
    caches_.erase(it);
    return to_status(hmc_datadist_deallocate_cache(dd_, c));
  }
  Status UnregisterKvCache(int64_t cache_id) { return DeallocateCache(cache_id); }

  Status PullKvCache(const CacheIndex &src_cache_index, const Cache &dst_cache,
                     uint32_t batch_index = 0U, int64_t size = -1,
                     const KvCacheExtParam &ext_param = {}) {
    hmc_kv_cache *c = find(dst_cache.cache_id);
    if (c == nullptr || batch_index != 0 || size != -1 || !whole(ext_param) ||
        src_cache_index.batch_index != 0) {
      return LLM_PARAM_INVALID;
    }
    hmc_cache_key key = {src_cache_index.cluster_id, static_cast<uint64_t>(src_cache_index.cache_id),
                         0, 0};
    return to_status(hmc_datadist_pull_cache(dd_, &key, c, timeout_ms_));
  }

  Status PushKvCache(const Cache &src_cache, const CacheIndex &dst_cache_index,
                     uint32_t src_batch_index = 0U, int64_t size = -1,
                     const KvCacheExtParam &ext_param = {}) {
    hmc_kv_cache *c = find(src_cache.cache_id);
    if (c == nullptr || src_batch_index != 0 || size != -1 || !whole(ext_param)) {
      return LLM_PARAM_INVALID;
    }
    hmc_cache_key key = {dst_cache_index.cluster_id, static_cast<uint64_t>(dst_cache_index.cache_id),
                         0, 0};
    return to_status(hmc_datadist_push_cache(dd_, c, dst_cache_index.cluster_id, &key, timeout_ms_));
  }

  Status PullKvBlocks(const CacheIndex &src_cache_index, const Cache &dst_cache,
                      const std::vector<uint64_t> &src_blocks, const std::vector<uint64_t> &dst_blocks,
                      const KvCacheExtParam &ext_param = {}) {
    hmc_kv_cache *c = find(dst_cache.cache_id);
    hmc_kv_layers layers = HMC_KV_LAYERS_INIT;
    if (c == nullptr || src_blocks.size() != dst_blocks.size() || !range(ext_param, layers)) {
      return LLM_PARAM_INVALID;
    }
    hmc_blocks_key key = {src_cache_index.cluster_id, static_cast<uint64_t>(src_cache_index.cache_id)};
    return to_status(hmc_datadist_pull_blocks(dd_, &key, c, src_blocks.data(), dst_blocks.data(),
                                              src_blocks.size(), whole(ext_param) ? nullptr : &layers,
                                              timeout_ms_));
  }

  Status PushKvBlocks(const Cache &src_cache, const CacheIndex &dst_cache_index,
                      const std::vector<uint64_t> &src_blocks, const std::vector<uint64_t> &dst_blocks,
                      const KvCacheExtParam &ext_param = {}) {
    hmc_kv_cache *c = find(src_cache.cache_id);
    hmc_kv_layers layers = HMC_KV_LAYERS_INIT;
    if (c == nullptr || src_blocks.size() != dst_blocks.size() || !range(ext_param, layers)) {
      return LLM_PARAM_INVALID;
    }
    hmc_blocks_key key = {dst_cache_index.cluster_id, static_cast<uint64_t>(dst_cache_index.cache_id)};
    return to_status(hmc_datadist_push_blocks(dd_, c, dst_cache_index.cluster_id, &key,
                                              src_blocks.data(), dst_blocks.data(), src_blocks.size(),
                                              whole(ext_param) ? nullptr : &layers, timeout_ms_));
  }

  /// Copies blocks within one cache (src_cache and dst_cache the same), to each list.
  Status CopyKvBlocks(const Cache &src_cache, const Cache &dst_cache,
                      const std::vector<uint64_t> &src_blocks,
                      const std::vector<std::vector<uint64_t>> &dst_blocks_list) {
    hmc_kv_cache *c = find(src_cache.cache_id);
    if (c == nullptr || src_cache.cache_id != dst_cache.cache_id) {
      return LLM_PARAM_INVALID;
    }
    for (const auto &dst : dst_blocks_list) {
      if (dst.size() != src_blocks.size()) {
        return LLM_PARAM_INVALID;
      }
      hmc_status s = hmc_datadist_copy_blocks(dd_, c, src_blocks.data(), dst.data(), dst.size());
      if (s != HMC_OK) {
        return to_status(s);
      }
    }
    return LLM_SUCCESS;
  }

  /// The engine underneath (its name is what peers link to), and the transfers' timeout.
  Engine &engine() noexcept { return engine_; }
  void set_timeout(std::chrono::milliseconds t) { timeout_ms_ = static_cast<uint32_t>(t.count()); }

 private:
  template <class F>
  static Status each(const std::vector<ClusterInfo> &clusters, std::vector<Status> &rets, F f) {
    rets.clear();
    Status all = LLM_SUCCESS;
    for (const auto &c : clusters) {
      rets.push_back(f(c));
      if (rets.back() != LLM_SUCCESS) {
        all = rets.back();
      }
    }
    return all;
  }
  static bool whole(const KvCacheExtParam &p) {
    return p.src_layer_range.first < 0 && p.dst_layer_range.first < 0;
  }
  /// LLM-DataDist's inclusive layer range as hmc's; both sides must name the same.
  static bool range(const KvCacheExtParam &p, hmc_kv_layers &out) {
    if (whole(p)) {
      return true;
    }
    if (p.src_layer_range != p.dst_layer_range || p.src_layer_range.first < 0 ||
        p.src_layer_range.second < p.src_layer_range.first) {
      return false;
    }
    out.layer_begin = static_cast<uint32_t>(p.src_layer_range.first);
    out.layer_end = static_cast<uint32_t>(p.src_layer_range.second) + 1;
    out.tensors_per_layer = p.tensor_num_per_layer;
    return true;
  }
  hmc_kv_cache *find(int64_t id) const {
    auto it = caches_.find(id);
    return it == caches_.end() ? nullptr : it->second;
  }
  Status publish(const CacheDesc &d, int64_t id, const uint64_t *addrs, hmc_kv_cache *&out) {
    if (d.data_type == DT_UNDEFINED || d.shape.empty()) {
      return LLM_PARAM_INVALID;
    }
    std::vector<uint64_t> shape(d.shape.begin(), d.shape.end());
    hmc_cache_desc desc = HMC_CACHE_DESC_INIT;
    if (d.placement == CachePlacement::kDevice) {
      desc.mem_type = HMC_MEM_DEVICE;
      desc.device_kind = HMC_DEVICE_CUDA;
      desc.device_id = device_id_;
    }
    desc.num_tensors = d.num_tensors;
    desc.dtype = d.data_type == DT_FLOAT8_E5M2 ? static_cast<uint32_t>(HMC_DTYPE_FP8)
                                                : static_cast<uint32_t>(d.data_type);
    desc.num_dims = static_cast<uint32_t>(shape.size());
    desc.shape = shape.data();
    hmc_cache_key key = {cluster_id_, static_cast<uint64_t>(id), 0, 0};
    hmc_blocks_key blocks = {cluster_id_, static_cast<uint64_t>(id)};
    hmc_status s = addrs == nullptr
                       ? hmc_datadist_allocate_cache(dd_, &desc, &key, 1, &blocks, &out)
                       : hmc_datadist_register_cache(dd_, &desc, addrs, &key, 1, &blocks, &out);
    return to_status(s);
  }
  Status addrs(hmc_kv_cache *c, std::vector<uintptr_t> &out) {
    std::size_t n = 0;
    hmc_kv_cache_tensor_addrs(dd_, c, nullptr, 0, &n);
    std::vector<uint64_t> a(n);
    hmc_status s = hmc_kv_cache_tensor_addrs(dd_, c, a.data(), a.size(), &n);
    out.assign(a.begin(), a.end());
    return to_status(s);
  }

  uint64_t cluster_id_;
  LlmRole role_;
  uint32_t device_id_ = 0;
  uint32_t timeout_ms_ = 10000;
  int64_t next_id_ = 1;
  Engine engine_;
  hmc_datadist *dd_ = nullptr;
  std::map<int64_t, hmc_kv_cache *> caches_;
};

}  // namespace llm_datadist
}  // namespace hmc

#endif  // HMC_HMC_HPP
