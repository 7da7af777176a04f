// The idiomatic C++ layer of hmc.hpp: hmc::Engine, Registration, Request, PreparedList,
// PreparedTransfer and hmc::check, in one process over TCP. RAII releases in any order
// (a registration outliving its engine is refused by status, not a crash), moved-from
// objects are empty, and hmc::check throws hmc::Error with the status. Then hmc::hixl's
// calls that hixl_quickstart.cpp does not make: ConnectAsync, DisconnectAsync,
// GetAsyncConnectStatus (both), GetTransferStatus over all requests, GetCapability. Exit
// status 0 when every expectation held.
#include <hmc/hmc.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

namespace {
int failures = 0;

#define EXPECT(cond)                                                                \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "line %d: %s does not hold (%s)\n", __LINE__, #cond,     \
                   hmc::last_error().c_str());                                      \
      failures++;                                                                   \
    }                                                                               \
  } while (0)

constexpr std::chrono::milliseconds kTimeout(5000);

using hmc::hixl::AsyncConnectStatus;

/// Polls `remote`'s async connect status until it is `want` (or kTimeout passes); every
/// status seen on the way must be one of `allowed`.
bool reaches(hmc::hixl::Hixl &h, const char *remote, AsyncConnectStatus want,
             std::vector<AsyncConnectStatus> allowed) {
  allowed.push_back(want);
  auto deadline = std::chrono::steady_clock::now() + kTimeout;
  while (std::chrono::steady_clock::now() < deadline) {
    AsyncConnectStatus s = AsyncConnectStatus::NOT_CONNECT;
    if (h.GetAsyncConnectStatus(remote, s) != hmc::hixl::SUCCESS) {
      return false;
    }
    if (s == want) {
      return true;
    }
    bool ok = false;
    for (auto a : allowed) {
      ok = ok || a == s;
    }
    if (!ok) {
      std::fprintf(stderr, "%s: unexpected status %d\n", remote, static_cast<int>(s));
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

void hixl_calls() {
  using namespace hmc::hixl;
  int32_t value = -7;
  EXPECT(Hixl::GetCapability(CLIENT_SERVER_COMM, value) == SUCCESS && value == FEATURE_SUPPORTED);
  EXPECT(Hixl::GetCapability(AUTO_CONNECT, value) == SUCCESS && value == FEATURE_NOT_SUPPORTED);
  value = FEATURE_SUPPORTED;
  EXPECT(Hixl::GetCapability(static_cast<FeatureType>(999), value) == SUCCESS &&
         value == FEATURE_NOT_SUPPORTED);
  EXPECT(Hixl::GetCapability(static_cast<FeatureType>(-1), value) == PARAM_INVALID);

  Hixl server, client;
  const std::map<AscendString, AscendString> tcp = {{OPTION_TRANSPORT, "tcp"}};
  EXPECT(client.ConnectAsync("127.0.0.1:1") == FAILED);  // before Initialize
  EXPECT(server.Initialize("127.0.0.1:0", tcp) == SUCCESS);
  EXPECT(client.Initialize("127.0.0.1", tcp) == SUCCESS);
  const std::string peer = server.engine().name();
  std::vector<uint8_t> src(1 << 16, 0x5a), dst(1 << 16, 0);
  MemHandle hs = nullptr, hd = nullptr;
  EXPECT(client.RegisterMem(MemDesc{reinterpret_cast<uintptr_t>(src.data()), src.size()},
                            MEM_HOST, hs) == SUCCESS);
  EXPECT(server.RegisterMem(MemDesc{reinterpret_cast<uintptr_t>(dst.data()), dst.size()},
                            MEM_HOST, hd) == SUCCESS);

  // Connects run in the background; nobody listens on port 1, so that one fails.
  AsyncConnectStatus s = AsyncConnectStatus::CONNECTED;
  EXPECT(client.GetAsyncConnectStatus(peer.c_str(), s) == SUCCESS &&
         s == AsyncConnectStatus::NOT_CONNECT);
  EXPECT(client.ConnectAsync(peer.c_str(), 0) == PARAM_INVALID);
  EXPECT(client.ConnectAsync(peer.c_str(), 5000) == SUCCESS);
  EXPECT(client.ConnectAsync("127.0.0.1:1", 1000) == SUCCESS);
  const std::vector<AsyncConnectStatus> connecting = {AsyncConnectStatus::CONNECT_PENDING,
                                                      AsyncConnectStatus::CONNECTING};
  EXPECT(reaches(client, peer.c_str(), AsyncConnectStatus::CONNECTED, connecting));
  EXPECT(reaches(client, "127.0.0.1:1", AsyncConnectStatus::CONNECT_FAILED, connecting));
  std::map<AscendString, AsyncConnectStatus> all;
  EXPECT(client.GetAsyncConnectStatus(all) == SUCCESS && all.size() == 2 &&
         all[peer.c_str()] == AsyncConnectStatus::CONNECTED);

  // Four requests with their user_data, reported oldest first, each once.
  int tags[4] = {0, 1, 2, 3};
  std::vector<TransferReq> reqs(4);
  for (int i = 0; i < 4; i++) {
    TransferArgs args;
    args.user_data = &tags[i];
    std::vector<TransferOpDesc> d = {{reinterpret_cast<uintptr_t>(src.data()) + i * 4096,
                                      reinterpret_cast<uintptr_t>(dst.data()) + i * 4096, 4096}};
    EXPECT(client.TransferAsync(peer.c_str(), WRITE, d, args, reqs[i]) == SUCCESS);
  }
  std::vector<TransferResult> results;
  GetTransferStatusArgs two;
  two.max_query_count = 2;
  EXPECT(client.GetTransferStatus(two, results) == SUCCESS && results.size() == 2 &&
         results[0].req == reqs[0] && results[0].user_data == &tags[0] &&
         results[1].req == reqs[1]);
  std::vector<const void *> ended;
  for (const auto &r : results) {
    if (r.status != TransferStatus::WAITING) {
      EXPECT(r.status == TransferStatus::COMPLETED);
      ended.push_back(r.user_data);
    }
  }
  GetTransferStatusArgs done_only;
  done_only.skip_waiting = true;
  auto deadline = std::chrono::steady_clock::now() + kTimeout;
  while (ended.size() < 4 && std::chrono::steady_clock::now() < deadline) {
    EXPECT(client.GetTransferStatus(done_only, results) == SUCCESS);
    for (const auto &r : results) {
      EXPECT(r.status == TransferStatus::COMPLETED);
      ended.push_back(r.user_data);
    }
  }
  EXPECT(ended.size() == 4 && dst[3 * 4096] == 0x5a && dst[4 * 4096] == 0);
  for (int i = 0; i < 4 && i < static_cast<int>(ended.size()); i++) {
    EXPECT(std::count(ended.begin(), ended.end(), &tags[i]) == 1);
  }
  EXPECT(client.GetTransferStatus(GetTransferStatusArgs(), results) == SUCCESS &&
         results.empty());
  TransferStatus one = TransferStatus::WAITING;
  EXPECT(client.GetTransferStatus(reqs[0], one) == PARAM_INVALID);  // reported: released

  // One remote's tasks in order; its status is the newest task's.
  EXPECT(client.DisconnectAsync(peer.c_str()) == SUCCESS);
  EXPECT(client.ConnectAsync(peer.c_str(), 5000) == SUCCESS);
  EXPECT(client.DisconnectAsync(peer.c_str()) == SUCCESS);
  EXPECT(client.GetAsyncConnectStatus(peer.c_str(), s) == SUCCESS &&
         (s == AsyncConnectStatus::DISCONNECT_PENDING || s == AsyncConnectStatus::DISCONNECTING ||
          s == AsyncConnectStatus::NOT_CONNECT));
  EXPECT(reaches(client, peer.c_str(), AsyncConnectStatus::NOT_CONNECT,
                 {AsyncConnectStatus::DISCONNECT_PENDING, AsyncConnectStatus::DISCONNECTING}));
  std::vector<TransferOpDesc> d = {{reinterpret_cast<uintptr_t>(src.data()),
                                    reinterpret_cast<uintptr_t>(dst.data()), 64}};
  EXPECT(client.TransferSync(peer.c_str(), READ, d) == NOT_CONNECTED);

  // From many threads at once: connects to distinct unreachable ports and status calls.
  EXPECT(client.ConnectAsync(peer.c_str(), 5000) == SUCCESS);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; t++) {
    threads.emplace_back([&client, t] {
      std::string far = "127.0.0.1:" + std::to_string(2 + t);
      EXPECT(client.ConnectAsync(far.c_str(), 500) == SUCCESS);
      std::map<AscendString, AsyncConnectStatus> m;
      EXPECT(client.GetAsyncConnectStatus(m) == SUCCESS && !m.empty());
    });
  }
  for (auto &t : threads) {
    t.join();
  }
  EXPECT(reaches(client, peer.c_str(), AsyncConnectStatus::CONNECTED, connecting));
  EXPECT(client.TransferSync(peer.c_str(), READ, d) == SUCCESS);
  // Finalize waits for what still runs; a second one and a status afterwards are safe.
  EXPECT(client.ConnectAsync("127.0.0.1:1", 1000) == SUCCESS);
  client.Finalize();
  client.Finalize();
  EXPECT(client.GetAsyncConnectStatus(peer.c_str(), s) == FAILED);
  server.Finalize();
}
}  // namespace

int main() {
  const hmc::Engine::Options tcp = {{"transport", "tcp"}};
  hmc::Engine a, b;
  EXPECT(a.open("127.0.0.1", tcp) == HMC_OK);
  EXPECT(b.open("127.0.0.1:0", tcp) == HMC_OK);
  const std::string peer = b.name();
  EXPECT(!peer.empty());

  std::vector<uint8_t> src(1 << 16, 0), dst(1 << 16, 0);
  hmc::Registration rs, rd;
  EXPECT(a.register_host(src.data(), src.size(), rs) == HMC_OK && rs);
  EXPECT(b.register_host(dst.data(), dst.size(), rd) == HMC_OK && rd);
  EXPECT(a.connect(peer, kTimeout) == HMC_OK);

  // A sync WRITE, then an async READ back.
  std::memset(src.data(), 0x3c, 4096);
  hmc_xfer_desc w = {reinterpret_cast<uintptr_t>(src.data()),
                     reinterpret_cast<uintptr_t>(dst.data()), 4096};
  EXPECT(a.transfer(peer, hmc::Op::Write, {&w, 1}, kTimeout) == HMC_OK);
  EXPECT(dst[0] == 0x3c && dst[4095] == 0x3c);
  hmc_xfer_desc r = {reinterpret_cast<uintptr_t>(src.data()) + 8192,
                     reinterpret_cast<uintptr_t>(dst.data()), 4096};
  hmc::Request req;
  EXPECT(a.transfer_async(peer, hmc::Op::Read, {&r, 1}, kTimeout, req) == HMC_OK && req);
  EXPECT(req.wait(kTimeout) == HMC_OK && req.status() == HMC_OK);
  EXPECT(src[8192] == 0x3c);
  hmc_telemetry t = HMC_TELEMETRY_INIT;
  EXPECT(req.telemetry(t) == HMC_OK && t.bytes == 4096);
  hmc::Request moved = std::move(req);
  EXPECT(!req && moved);
  std::vector<hmc_request *> done;
  EXPECT(a.poll_completed(done) == HMC_OK && done.size() == 1 && done[0] == moved.get());

  // Strided lists: blocks 0..7 of 1 KiB, 4 KiB apart, into the same places at the peer.
  hmc_block_desc ls = {reinterpret_cast<uintptr_t>(src.data()), 1024, 4096, 8};
  hmc_block_desc rs_blocks = {reinterpret_cast<uintptr_t>(dst.data()), 1024, 4096, 8};
  hmc::PreparedList local, remote;
  EXPECT(a.prepare_local({&ls, 1}, local) == HMC_OK && local.size() == 8);
  EXPECT(a.prepare_remote(peer, {&rs_blocks, 1}, kTimeout, remote) == HMC_OK);
  const uint64_t idx[] = {0, 1, 2, 3, 4, 5, 6, 7};
  hmc::PreparedTransfer x;
  EXPECT(a.make_transfer(hmc::Op::Write, local, idx, remote, idx, x, "blocks", "8") == HMC_OK);
  for (int i = 0; i < 8; i++) {
    src[i * 4096] = static_cast<uint8_t>(0x70 + i);
  }
  EXPECT(x.post() == HMC_OK && x.wait(kTimeout) == HMC_OK);
  EXPECT(dst[7 * 4096] == 0x77 && x.telemetry(t) == HMC_OK && t.bytes == 8 * 1024);
  std::vector<hmc::Notification> notes;
  EXPECT(b.notifications(notes) == HMC_OK && notes.size() == 1 && notes[0].name == "blocks" &&
         notes[0].msg == "8");
  EXPECT(a.make_transfer(hmc::Op::Write, local, {idx, 2}, remote, {idx, 3}, x) ==
         HMC_ERR_INVALID_ARGUMENT);

  // hmc::check: an exception carrying the status.
  bool threw = false;
  try {
    hmc::check(a.connect("127.0.0.1:1", std::chrono::milliseconds(500)));
  } catch (const hmc::Error &e) {
    threw = e.status() == HMC_ERR_UNAVAILABLE && std::strstr(e.what(), "HMC_ERR_UNAVAILABLE");
  }
  EXPECT(threw);

  // The engine closed first: the registration's release is refused by status.
  moved.reset();
  x.reset();
  local.reset();
  remote.reset();
  EXPECT(a.close() == HMC_OK && !a);
  EXPECT(rs.reset() == HMC_ERR_INVALID_ARGUMENT);
  EXPECT(rd.reset() == HMC_OK);
  hixl_calls();
  std::printf("cpp_layer: %d failed\n", failures);
  return failures == 0 ? 0 : 1;
}
