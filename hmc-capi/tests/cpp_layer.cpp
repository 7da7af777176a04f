// The idiomatic C++ layer of hmc.hpp: hmc::Engine, Registration, Request, PreparedList,
// PreparedTransfer and hmc::check, in one process over TCP. RAII releases in any order
// (a registration outliving its engine is refused by status, not a crash), moved-from
// objects are empty, and hmc::check throws hmc::Error with the status. Exit status 0 when
// every expectation held.
#include <hmc/hmc.hpp>

#include <cstdio>
#include <cstring>
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
  std::printf("cpp_layer: %d failed\n", failures);
  return failures == 0 ? 0 : 1;
}
