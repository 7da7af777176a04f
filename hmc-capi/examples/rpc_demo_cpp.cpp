// The RPC demo in C++ (hmc::rpc over libhmc), as two processes:
//
//   rpc_demo_cpp server tcp          serves the demo methods and a word count written as a
//                                    lambda; prints "READY <address>"
//   rpc_demo_cpp client tcp ADDRESS  calls echo, word count (sync and async) and an unknown
//                                    method, checks the answers, then stops the server
//
// Exit status 0 when every check passed on both sides.
#include <hmc/hmc.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace {
constexpr uint32_t kWordCount = 200;
constexpr uint32_t kStop = 201;
constexpr std::chrono::milliseconds kTimeout(5000);

void Check(hmc_status s, const char *what) {
  if (s != HMC_OK) {
    std::fprintf(stderr, "%s: %s: %s\n", what, hmc_status_name(s), hmc::last_error().c_str());
    std::exit(1);
  }
}

void Expect(bool ok, const char *what) {
  if (!ok) {
    std::fprintf(stderr, "expected: %s\n", what);
    std::exit(1);
  }
}

int RunServer() {
  std::atomic<bool> stop{false};
  hmc::rpc::Server server;
  Check(server.create(), "create");
  Check(server.add_demo(), "add_demo");
  Check(server.add(kWordCount,
                   [](hmc::rpc::Call &call, hmc::Span<uint8_t> req) -> uint32_t {
                     uint32_t words = 0;
                     bool in_word = false;
                     for (uint8_t c : req) {
                       bool space = c == ' ' || c == '\n' || c == '\t';
                       words += !space && !in_word;
                       in_word = !space;
                     }
                     return call.respond(std::to_string(words)) == HMC_OK ? HMC_RPC_OK
                                                                          : HMC_RPC_INTERNAL;
                   }),
        "add");
  Check(server.add(kStop,
                   [&stop](hmc::rpc::Call &, hmc::Span<uint8_t>) -> uint32_t {
                     stop = true;
                     return HMC_RPC_OK;
                   }),
        "add");
  Check(server.start("tcp://127.0.0.1:0"), "start");
  std::printf("READY %s\n", server.address().c_str());
  std::fflush(stdout);
  for (int i = 0; i < 6000 && !stop; i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  Check(server.close(), "close");
  std::printf("[server] stopped\n");
  return stop ? 0 : 1;
}

int RunClient(const std::string &addr) {
  hmc::rpc::Client client;
  Check(client.connect(addr), "connect");
  hmc::Bytes resp;
  Check(client.call(HMC_RPC_DEMO_ECHO, "ping", kTimeout, resp), "echo");
  Expect(resp.str() == "ping", "echo answers ping");
  Check(client.call(kWordCount, "the quick  brown fox", kTimeout, resp), "word count");
  Expect(resp.str() == "4", "four words");

  const std::string text = "one two three";
  hmc::rpc::Pending pending;
  Check(client.call_async(kWordCount,
                          hmc::Span<uint8_t>(reinterpret_cast<const uint8_t *>(text.data()),
                                             text.size()),
                          kTimeout, pending),
        "call_async");
  Check(pending.wait(kTimeout), "wait");
  Check(pending.take(resp), "take");
  Expect(resp.str() == "3", "three words, asynchronously");

  uint32_t code = 0;
  Expect(client.call(999, "", kTimeout, resp, &code) == HMC_ERR_REMOTE && code == 1,
         "an unknown method is UNKNOWN_METHOD");
  Check(client.call(kStop, "", kTimeout, resp), "stop");
  std::printf("[client] echo, a C++ method sync and async, an unknown method: all checked\n");
  return 0;
}
}  // namespace

int main(int argc, char **argv) {
  if (argc == 3 && std::strcmp(argv[1], "server") == 0) {
    return RunServer();
  }
  if (argc == 4 && std::strcmp(argv[1], "client") == 0) {
    return RunClient(argv[3]);
  }
  std::fprintf(stderr, "usage: %s server tcp | client tcp ADDRESS\n", argv[0]);
  return 2;
}
