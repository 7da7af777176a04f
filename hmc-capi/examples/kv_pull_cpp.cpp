// LLM-DataDist's KV calls on hmc (hmc::llm_datadist), as two processes:
//
//   kv_pull_cpp server TRANSPORT                the prompt cluster (1): AllocateCache of a
//                                               paged host cache, filled; prints
//                                               "READY <ip> <port> <cache id>"
//   kv_pull_cpp client TRANSPORT IP PORT ID     the decoder cluster (2): LinkLlmClusters,
//                                               PullKvCache of the whole cache, PullKvBlocks
//                                               of layer 0's blocks 1 and 3 into 0 and 1,
//                                               CopyKvBlocks, UnlinkLlmClusters; checks
//                                               every byte, then tells the prompt
//
// Exit status 0 when every check passed on both sides.
#include <hmc/hmc.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

using namespace hmc::llm_datadist;

namespace {
constexpr uint64_t kPrompt = 1;
constexpr uint64_t kDecoder = 2;
constexpr int kTensors = 4;  // 2 layers x (K, V)
constexpr int kBlocks = 4;
constexpr size_t kBlockBytes = 8 * 128 * 2;  // 8 x 128 f16

void Check(Status s, const char *what) {
  if (s != LLM_SUCCESS) {
    std::fprintf(stderr, "%s: status 0x%x: %s\n", what, s, hmc::last_error().c_str());
    std::exit(1);
  }
}

void Expect(bool ok, const char *what) {
  if (!ok) {
    std::fprintf(stderr, "expected: %s\n", what);
    std::exit(1);
  }
}

CacheDesc Desc(int blocks) {
  CacheDesc d;
  d.placement = CachePlacement::kHost;
  d.num_tensors = kTensors;
  d.data_type = DT_FLOAT16;
  d.shape = {blocks, 8, 128};
  return d;
}

uint8_t Pattern(int tensor, int block) { return static_cast<uint8_t>(0x10 * tensor + block + 1); }

bool BlockIs(uintptr_t tensor, int block, uint8_t v) {
  const uint8_t *p = reinterpret_cast<const uint8_t *>(tensor) + block * kBlockBytes;
  for (size_t i = 0; i < kBlockBytes; i++) {
    if (p[i] != v) {
      return false;
    }
  }
  return true;
}

std::map<AscendString, AscendString> Options(const char *transport, const char *listen) {
  std::map<AscendString, AscendString> o;
  o["transport"] = transport;
  if (listen != nullptr) {
    o[OPTION_LISTEN_IP_INFO] = listen;
  }
  return o;
}

int RunServer(const char *transport) {
  LlmDataDist dd(kPrompt, LlmRole::kPrompt);
  Check(dd.Initialize(Options(transport, "127.0.0.1:0")), "Initialize");
  Cache cache;
  Check(dd.AllocateCache(Desc(kBlocks), cache), "AllocateCache");
  for (int t = 0; t < kTensors; t++) {
    for (int b = 0; b < kBlocks; b++) {
      std::memset(reinterpret_cast<void *>(cache.tensor_addrs[t] + b * kBlockBytes), Pattern(t, b),
                  kBlockBytes);
    }
  }
  std::string name = dd.engine().name();  // tcp://127.0.0.1:PORT
  std::string hostport = name.substr(name.find("//") + 2);
  std::printf("READY %s %s %lld\n", hostport.substr(0, hostport.find(':')).c_str(),
              hostport.substr(hostport.find(':') + 1).c_str(), static_cast<long long>(cache.cache_id));
  std::fflush(stdout);
  bool done = false;
  for (int i = 0; i < 1000 && !done; i++) {
    std::vector<hmc::Notification> notes;
    dd.engine().notifications(notes);
    done = !notes.empty();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  Expect(done, "the decoder said it pulled");
  std::printf("[prompt] the decoder pulled cache %lld\n", static_cast<long long>(cache.cache_id));
  Check(dd.DeallocateCache(cache.cache_id), "DeallocateCache");
  dd.Finalize();
  return 0;
}

int RunClient(const char *transport, const char *ip, const char *port, int64_t cache_id) {
  LlmDataDist dd(kDecoder, LlmRole::kDecoder);
  Check(dd.Initialize(Options(transport, nullptr)), "Initialize");
  ClusterInfo prompt;
  prompt.remote_cluster_id = kPrompt;
  IpInfo where;
  where.ip = ip;
  where.port = static_cast<uint16_t>(std::atoi(port));
  prompt.remote_ip_infos.push_back(where);
  std::vector<Status> rets;
  Check(dd.LinkLlmClusters({prompt}, rets, 10000), "LinkLlmClusters");

  Cache whole;
  Check(dd.AllocateCache(Desc(kBlocks), whole), "AllocateCache");
  CacheIndex src{kPrompt, cache_id, 0, {}};
  Check(dd.PullKvCache(src, whole), "PullKvCache");
  for (int t = 0; t < kTensors; t++) {
    for (int b = 0; b < kBlocks; b++) {
      Expect(BlockIs(whole.tensor_addrs[t], b, Pattern(t, b)), "every block of the whole cache");
    }
  }
  std::printf("[decoder] PullKvCache: %d tensors x %d blocks checked\n", kTensors, kBlocks);

  Cache paged;
  Check(dd.AllocateCache(Desc(2), paged), "AllocateCache");
  KvCacheExtParam layer0;
  layer0.src_layer_range = {0, 0};
  layer0.dst_layer_range = {0, 0};
  Check(dd.PullKvBlocks(src, paged, {1, 3}, {0, 1}, layer0), "PullKvBlocks");
  for (int t = 0; t < kTensors; t++) {
    Expect(BlockIs(paged.tensor_addrs[t], 0, t < 2 ? Pattern(t, 1) : 0) &&
               BlockIs(paged.tensor_addrs[t], 1, t < 2 ? Pattern(t, 3) : 0),
           "layer 0's blocks arrived, layer 1's did not move");
  }
  Check(dd.CopyKvBlocks(paged, paged, {1}, {{0}}), "CopyKvBlocks");
  Expect(BlockIs(paged.tensor_addrs[0], 0, Pattern(0, 3)), "the copied block");
  Expect(dd.PullKvCache(CacheIndex{kPrompt, cache_id, 1, {}}, whole) == LLM_PARAM_INVALID,
         "a batch index is refused");
  Expect(dd.PullKvCache(CacheIndex{kPrompt, cache_id + 100, 0, {}}, whole) ==
             LLM_KV_CACHE_NOT_EXIST,
         "a cache id nobody published");
  std::printf("[decoder] PullKvBlocks of layer 0 and CopyKvBlocks: checked\n");

  Check(dd.engine().send_notify(prompt.remote_ip_infos[0].ip.GetString() + std::string(":") + port,
                                "pulled", "", std::chrono::milliseconds(10000)) == HMC_OK
            ? LLM_SUCCESS
            : LLM_FAILED,
        "notify");
  Check(dd.UnlinkLlmClusters({prompt}, rets), "UnlinkLlmClusters");
  Check(dd.DeallocateCache(paged.cache_id), "DeallocateCache");
  Check(dd.DeallocateCache(whole.cache_id), "DeallocateCache");
  dd.Finalize();
  return 0;
}
}  // namespace

int main(int argc, char **argv) {
  if (argc == 3 && std::strcmp(argv[1], "server") == 0) {
    return RunServer(argv[2]);
  }
  if (argc == 6 && std::strcmp(argv[1], "client") == 0) {
    return RunClient(argv[2], argv[3], argv[4], std::atoll(argv[5]));
  }
  std::fprintf(stderr, "usage: %s server TRANSPORT | client TRANSPORT IP PORT CACHE_ID\n", argv[0]);
  return 2;
}
