// Two workers (and a router) in one process over loopback gRPC: what moving KV blocks between
// workers buys.
//
//   build/bench/cluster_bench --benchmark_counters_tabular=true
//
// The model is engine_bench's synthetic Llama (4 layers, hidden 512, 8 KV heads of 64, bf16
// weights and KV, GPT-2 vocabulary); every worker runs its engine on one thread.
//
// BM_KvTransferTtft: a prefix is built on worker A, then asked on worker B with a hint naming A
// (GenerateRequest.kv_source, what the router's kv_aware policy sets). Arg transfer: 0 B ignores
// the hint and computes the prompt (--kv-transfer never), 1 B pulls the blocks
// (--kv-transfer always), 2 B's cost model decides (auto). Eight 512-token prefixes, each
// followed by its own 16-token question; counters: ttft_ms (mean, client side, on B),
// pulled_MB per request, pull_MB/s (bytes over the pull's duration on B's pull histogram) and
// prefill_tok/s (B's measured prefill rate).
//
// BM_PipelineThroughput: one worker against a two-stage pipeline group (see below).
//
// BM_DisaggregatedItl: chat traffic (4 streams, 32-token prompts, 48 tokens each) mixed with
// long prompts (one stream of 1024-token prompts, 8 tokens each) through a router over two
// workers. Arg disaggregated: 0 both workers --role both (colocated, kv_aware), 1 one --role
// prefill and one --role decode. Counters: the chat streams' inter-token latency p50 / p99 /
// p99.9 / max and how many gaps exceeded 100 ms (stalls), and the long prompts' mean time to
// first token, all measured by the clients.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/gpt2_vocab_model.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "kvserve/v1/inference.grpc.pb.h"
#include "router/router_server.h"
#include "worker/engine/engine.h"
#include "worker/kv/kv_offload.h"
#include "worker/model/loaded_model.h"
#include "worker/planner/pipeline_layout.h"
#include "worker/pp/pipeline_group.h"
#include "worker/pp/stage_runner.h"
#include "worker/server/worker_server.h"

namespace kvserve {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kTokenizer = kGpt2Tokenizer;

const LoadedModel* Model() { return Gpt2VocabModel(); }

struct BenchWorker {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<WorkerServer> server;
  std::string address;
  std::unique_ptr<v1::Inference::Stub> stub;
};

std::unique_ptr<BenchWorker> StartWorker(KvTransferMode mode, const std::string& role,
                                         int64_t kv_blocks = 1024) {
  EngineOptions o;
  o.num_threads = 1;
  o.block_size = 16;
  o.num_kv_blocks = kv_blocks;
  o.kv_cache_dtype = KvCacheDType::kBF16;
  auto w = std::make_unique<BenchWorker>();
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(Model(), o);
  if (!engine.ok()) return nullptr;
  w->engine = *std::move(engine);
  WorkerServerOptions server_options;
  server_options.model_name = "synthetic";
  server_options.kv_transfer.mode = mode;
  server_options.role = role;
  w->server = std::make_unique<WorkerServer>(Model(), w->engine.get(), server_options);
  absl::StatusOr<int> port = w->server->Start("127.0.0.1:0");
  if (!port.ok()) return nullptr;
  w->address = absl::StrCat("127.0.0.1:", *port);
  w->stub =
      v1::Inference::NewStub(grpc::CreateChannel(w->address, grpc::InsecureChannelCredentials()));
  return w;
}

std::vector<uint32_t> Tokens(int n, uint32_t seed) {
  std::vector<uint32_t> ids;
  uint32_t x = seed * 2654435761u + 1;
  for (int i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    ids.push_back(1 + (x >> 8) % 50000);
  }
  return ids;
}

v1::GenerateRequest Request(const std::vector<uint32_t>& prompt, uint32_t max_tokens) {
  v1::GenerateRequest r;
  for (uint32_t id : prompt) r.add_prompt_token_ids(id);
  r.set_max_tokens(max_tokens);
  r.mutable_sampling()->set_temperature(0.0f);
  r.set_ignore_eos(true);
  return r;
}

// Runs one Generate; returns false on error. `ttft` gets the seconds to the first token and
// `gaps` (if not null) the seconds between consecutive messages with tokens.
bool Run(v1::Inference::Stub* stub, const v1::GenerateRequest& request, double* ttft,
         std::vector<double>* gaps = nullptr) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(300));
  const Clock::time_point start = Clock::now();
  Clock::time_point last{};
  auto reader = stub->Generate(&context, request);
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    if (msg.token_ids_size() == 0) continue;
    const Clock::time_point now = Clock::now();
    if (last == Clock::time_point{}) {
      if (ttft != nullptr) *ttft = std::chrono::duration<double>(now - start).count();
    } else if (gaps != nullptr) {
      gaps->push_back(std::chrono::duration<double>(now - last).count());
    }
    last = now;
  }
  return reader->Finish().ok();
}

void BM_KvTransferTtft(benchmark::State& state) {
  if (Model() == nullptr) {
    state.SkipWithError("gpt2 tokenizer not found");
    return;
  }
  constexpr int kPrefixes = 8;
  constexpr int kPrefixLen = 512;
  const int transfer = static_cast<int>(state.range(0));
  const KvTransferMode mode = transfer == 0   ? KvTransferMode::kNever
                              : transfer == 1 ? KvTransferMode::kAlways
                                              : KvTransferMode::kAuto;
  double ttft_sum = 0;
  ServingStats b_stats;
  double prefill_rate = 0;
  for (auto _ : state) {
    std::unique_ptr<BenchWorker> a = StartWorker(KvTransferMode::kNever, "both");
    std::unique_ptr<BenchWorker> b = StartWorker(mode, "both");
    if (a == nullptr || b == nullptr) {
      state.SkipWithError("worker did not start");
      return;
    }
    for (int p = 0; p < kPrefixes; ++p) {
      std::vector<uint32_t> prefix = Tokens(kPrefixLen, p + 1);
      std::vector<uint32_t> on_a = prefix;
      for (uint32_t t : Tokens(16, 100 + p)) on_a.push_back(t);
      double ignored = 0;
      if (!Run(a->stub.get(), Request(on_a, 1), &ignored)) {
        state.SkipWithError("request on A failed");
        return;
      }
      std::vector<uint32_t> on_b = prefix;
      for (uint32_t t : Tokens(16, 200 + p)) on_b.push_back(t);
      v1::GenerateRequest r = Request(on_b, 1);
      r.mutable_kv_source()->set_worker(a->address);
      r.mutable_kv_source()->set_first_block(0);
      r.mutable_kv_source()->set_num_blocks(kPrefixLen / 16);
      double ttft = 0;
      if (!Run(b->stub.get(), r, &ttft)) {
        state.SkipWithError("request on B failed");
        return;
      }
      ttft_sum += ttft;
    }
    b_stats = b->server->stats();
    prefill_rate = b->engine->stats().prefill_tokens_per_second;
  }
  const double n = static_cast<double>(state.iterations()) * kPrefixes;
  state.counters["ttft_ms"] = 1e3 * ttft_sum / n;
  state.counters["pulled_MB"] = b_stats.kv_pulled_bytes / 1e6 / kPrefixes;
  state.counters["pulls"] = static_cast<double>(b_stats.kv_pulls);
  state.counters["prefill_tok/s"] = prefill_rate;
}
BENCHMARK(BM_KvTransferTtft)
    ->ArgName("transfer")
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Iterations(1)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  return v[i];
}

void BM_DisaggregatedItl(benchmark::State& state) {
  if (Model() == nullptr) {
    state.SkipWithError("gpt2 tokenizer not found");
    return;
  }
  constexpr int kChatStreams = 4;
  constexpr int kChatRequests = 12;  // per stream
  constexpr int kLongLen = 1024;
  const bool disaggregated = state.range(0) == 1;
  std::vector<double> gaps;
  std::vector<double> long_ttfts;
  std::atomic<int> failures{0};
  for (auto _ : state) {
    std::unique_ptr<BenchWorker> w1 =
        StartWorker(KvTransferMode::kAuto, disaggregated ? "prefill" : "both");
    std::unique_ptr<BenchWorker> w2 =
        StartWorker(disaggregated ? KvTransferMode::kAlways : KvTransferMode::kAuto,
                    disaggregated ? "decode" : "both");
    if (w1 == nullptr || w2 == nullptr) {
      state.SkipWithError("worker did not start");
      return;
    }
    RouterOptions options;
    options.listen = "127.0.0.1:0";
    options.model_path = kTokenizer;
    options.model_name = "synthetic";
    options.pool.static_workers = {w1->address, w2->address};
    options.pool.probe_interval = absl::Milliseconds(100);
    absl::StatusOr<std::unique_ptr<RouterServer>> router = RouterServer::Start(options);
    if (!router.ok()) {
      state.SkipWithError(std::string(router.status().message()).c_str());
      return;
    }
    // Let the router see both workers (and their roles) before traffic starts.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    auto stub = v1::Inference::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", (*router)->port()), grpc::InsecureChannelCredentials()));
    std::mutex mu;
    std::atomic<bool> chat_done{false};
    std::vector<std::thread> threads;
    for (int s = 0; s < kChatStreams; ++s) {
      threads.emplace_back([&, s] {
        for (int i = 0; i < kChatRequests; ++i) {
          std::vector<double> mine;
          double ttft = 0;
          if (!Run(stub.get(), Request(Tokens(32, 1000 + s * 100 + i), 48), &ttft, &mine)) {
            ++failures;
          }
          std::lock_guard<std::mutex> lock(mu);
          gaps.insert(gaps.end(), mine.begin(), mine.end());
        }
      });
    }
    std::thread long_prompts([&] {
      for (int i = 0; !chat_done.load(); ++i) {
        double ttft = 0;
        if (!Run(stub.get(), Request(Tokens(kLongLen, 5000 + i), 8), &ttft)) {
          ++failures;
          continue;
        }
        std::lock_guard<std::mutex> lock(mu);
        long_ttfts.push_back(ttft);
      }
    });
    for (auto& t : threads) t.join();
    chat_done = true;
    long_prompts.join();
    (*router)->Shutdown();
  }
  if (failures.load() > 0) state.SkipWithError("some requests failed");
  state.counters["itl_p50_ms"] = 1e3 * Percentile(gaps, 0.5);
  state.counters["itl_p99_ms"] = 1e3 * Percentile(gaps, 0.99);
  state.counters["itl_p99.9_ms"] = 1e3 * Percentile(gaps, 0.999);
  state.counters["itl_max_ms"] = 1e3 * Percentile(gaps, 1.0);
  // Gaps of a stream stalled behind a long prefill: over 100 ms.
  state.counters["stalls"] = static_cast<double>(
      std::count_if(gaps.begin(), gaps.end(), [](double g) { return g > 0.1; }));
  double sum = 0;
  for (double t : long_ttfts) sum += t;
  state.counters["long_ttft_ms"] = long_ttfts.empty() ? 0 : 1e3 * sum / long_ttfts.size();
  state.counters["long_prompts"] = static_cast<double>(long_ttfts.size());
}
BENCHMARK(BM_DisaggregatedItl)
    ->ArgName("disaggregated")
    ->Arg(0)
    ->Arg(1)
    ->Iterations(1)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// A model whose layers outweigh its output head (engine_bench's has 4 small layers behind a
// 50257-row head, half its work): 8 layers, hidden 1024, 16 heads over 4 KV heads, FFN 2816,
// the GPT-2 vocabulary tied to the embedding, bf16. The head costs about 4.7 layers.
const LoadedModel* PipelineModel() {
  static LoadedModel* model = [] {
    const LoadedModel* vocab = Gpt2VocabModel();
    if (vocab == nullptr) return static_cast<LoadedModel*>(nullptr);
    auto* m = new LoadedModel;
    m->tokenizer = LoadTokenizer(kGpt2Tokenizer).value();
    SyntheticModelOptions o;
    o.num_layers = 8;
    o.hidden_size = 1024;
    o.num_heads = 16;
    o.num_kv_heads = 4;
    o.intermediate_size = 2816;
    o.vocab_size = 50257;
    o.tie_word_embeddings = true;
    o.dtype = DType::kBF16;
    m->weights = MakeSyntheticModel(o).value();
    return m;
  }();
  return model;
}

// BM_PipelineThroughput: greedy decode (32-token prompts, 64 tokens each) from `streams`
// concurrent clients, each running its share of 32 requests back to back, on one worker (pp 1)
// or on a pipeline group of two stages in this process (pp 2: the leader and a stage runner over
// loopback gRPC, layers 6 + 2 so that the last stage's two layers and the head weigh about what
// the leader's six do). Every engine and stage runs on one thread, so the group computes with
// two cores where the worker has one: perfect pipelining would double the tokens/s. Counters:
// tok/s, and for pp 2 the most steps in flight, the hand-over and logits MB that crossed
// between the stages per generated token, and each stage's busy fraction (computing, over the
// run's wall time; the rest is its pipeline bubble).
void BM_PipelineThroughput(benchmark::State& state) {
  const LoadedModel* model = PipelineModel();
  if (model == nullptr) {
    state.SkipWithError("gpt2 tokenizer not found");
    return;
  }
  const int pp = static_cast<int>(state.range(0));
  const int streams = static_cast<int>(state.range(1));
  constexpr int kRequests = 32;
  constexpr int kTokens = 64;
  int64_t generated = 0;
  double seconds = 0;
  PipelineGroupStats group_stats;
  std::atomic<int> failures{0};
  for (auto _ : state) {
    EngineOptions o;
    o.num_threads = 1;
    o.block_size = 16;
    o.num_kv_blocks = 1024;
    o.kv_cache_dtype = KvCacheDType::kBF16;
    std::unique_ptr<PipelineGroup> group;
    if (pp > 1) {
      PipelineGroupOptions g;
      const std::vector<int> counts = {6, 2};
      g.stages = *SplitLayers(model->config().num_layers, pp, counts);
      g.model_fingerprint = ModelWeightsFingerprint(*model->weights);
      g.hidden_size = model->config().hidden_size;
      g.vocab_size = model->config().vocab_size;
      group = *PipelineGroup::Create(g);
      o.pipeline = group.get();
    }
    std::unique_ptr<Engine> engine = *Engine::Create(model, o);
    WorkerServerOptions server_options;
    server_options.model_name = "synthetic";
    server_options.pipeline = group.get();
    WorkerServer server(model, engine.get(), server_options);
    absl::StatusOr<int> port = server.Start("127.0.0.1:0");
    if (!port.ok()) {
      state.SkipWithError("worker did not start");
      return;
    }
    const std::string address = absl::StrCat("127.0.0.1:", *port);
    std::vector<std::unique_ptr<PipelineStageRunner>> runners;
    std::vector<std::thread> stage_threads;
    for (int r = 1; r < pp; ++r) {
      PipelineStageOptions so;
      so.leader = address;
      so.pp_size = pp;
      so.requested_rank = r;
      so.tensor_parallel.num_threads = 1;
      runners.push_back(std::make_unique<PipelineStageRunner>(model->weights.get(), so));
      stage_threads.emplace_back([runner = runners.back().get()] { (void)runner->Run(); });
    }
    const Clock::time_point formed_by = Clock::now() + std::chrono::seconds(30);
    while (group != nullptr && !group->formed() && Clock::now() < formed_by) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    auto stub =
        v1::Inference::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    const Clock::time_point start = Clock::now();
    std::vector<std::thread> clients;
    for (int c = 0; c < streams; ++c) {
      clients.emplace_back([&, c] {
        for (int i = c; i < kRequests; i += streams) {
          double ttft = 0;
          if (!Run(stub.get(), Request(Tokens(32, 7000 + i), kTokens), &ttft)) ++failures;
        }
      });
    }
    for (std::thread& t : clients) t.join();
    seconds += std::chrono::duration<double>(Clock::now() - start).count();
    generated += int64_t{kRequests} * kTokens;
    if (group != nullptr) group_stats = group->stats();
    const double wall = std::chrono::duration<double>(Clock::now() - start).count();
    if (pp > 1) {
      // Busy fractions over the run: 1 minus each is that stage's bubble (waiting, not
      // computing). The leader's includes embedding; the stage's its head and hand-over decode.
      state.counters["leader_busy"] = engine->stats().local_stage_seconds / wall;
      state.counters["stage1_busy"] = runners[0]->stats().busy_seconds / wall;
    }
    server.Shutdown();
    for (auto& runner : runners) runner->Stop();
    for (std::thread& t : stage_threads) t.join();
  }
  if (failures.load() > 0) state.SkipWithError("some requests failed");
  state.counters["tok/s"] = static_cast<double>(generated) / seconds;
  if (pp > 1) {
    state.counters["max_in_flight"] = static_cast<double>(group_stats.max_in_flight);
    state.counters["MB_per_token"] =
        static_cast<double>(group_stats.bytes_sent + group_stats.bytes_received) / 1e6 /
        static_cast<double>(generated);
  }
}
BENCHMARK(BM_PipelineThroughput)
    ->ArgNames({"pp", "streams"})
    ->ArgsProduct({{1, 2}, {1, 4, 16}})
    ->Iterations(1)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace kvserve

BENCHMARK_MAIN();
