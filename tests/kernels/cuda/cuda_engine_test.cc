// The engine end to end on a CUDA device (label gpu) or on the CUDA simulator (<test>_sim,
// KVSERVE_TEST_DEVICE=cuda-sim), with f32 weights kept in f32: stories260K's golden greedy tokens
// for both prompts; 64 mixed concurrent requests identical to each run alone, with chunked
// prefill, prefix-cache hits and preemption; int8 and fp8 KV; decode graphs against eager
// launches; tensor parallelism over NCCL (--tp 2, where two devices exist); and a tiny Qwen3.

#include <algorithm>
#include <cstdio>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/test_util/scratch_dir.h"
#include "tests/worker/engine/engine_test_util.h"
#include "tests/worker/model/golden.h"
#include "worker/engine/engine.h"
#include "worker/kv/kv_offload.h"
#include "worker/model/synth_writer.h"
#include "worker/planner/pipeline_layout.h"
#include "worker/pp/pipeline_group.h"
#include "worker/pp/stage_runner.h"

namespace kvserve {
namespace {

using testing_engine::Collected;
using testing_engine::Drain;
using testing_engine::Greedy;

class CudaEngineTest : public testing_engine::StoriesModelTest {
 protected:

  static EngineOptions Options() {
    EngineOptions o;
    o.device = testing_cuda::TestDevice();
    o.keep_f32_weights = true;
    o.num_threads = 1;
    o.check_invariants = true;
    o.kv_cache_memory = int64_t{16} << 20;
    return o;
  }

  /// An engine on the device under test, or null having skipped (or failed) the test.
  static std::unique_ptr<Engine> Make(const EngineOptions& o) {
    absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(model_, o);
    if (!e.ok()) {
      FailOrSkip(e.status());
      return nullptr;
    }
    return std::move(*e);
  }

  /// An engine that could not be created fails the test, unless it found no device (--device
  /// gives FAILED_PRECONDITION): that skips like every CUDA test, failing in CI when the
  /// backend library was built but does not load (KVSERVE_SKIP_NO_DEVICE).
  static void FailOrSkip(const absl::Status& s) {
    if (s.code() != absl::StatusCode::kFailedPrecondition) {
      ADD_FAILURE() << "no usable CUDA engine: " << s;
      return;
    }
    KVSERVE_SKIP_NO_DEVICE(s.message());
  }

  /// The mixed workload, shorter on the simulator (4 to 15 generated tokens a request).
  static std::vector<EngineRequest> Workload() {
    return testing_engine::MixedWorkload(testing_cuda::UseSimulator() ? 12 : 40);
  }

  /// Each request of the workload alone on one engine (computed once per test binary).
  static const std::vector<Collected>* Alone() {
    static std::vector<Collected>* alone = nullptr;
    if (alone != nullptr) return alone;
    EngineOptions o = Options();
    o.scheduler.enable_prefix_caching = false;
    std::unique_ptr<Engine> engine = Make(o);
    if (engine == nullptr) return nullptr;
    alone = new std::vector<Collected>();
    for (const EngineRequest& r : Workload()) alone->push_back(Drain(**engine->Submit(r))[0]);
    return alone;
  }

  static void ExpectPoolFree(const Engine& engine) { testing_engine::ExpectPoolFree(engine); }
};

TEST_F(CudaEngineTest, GoldenPromptsWithGraphsAndEager) {
  const auto golden = testing_golden::LoadStoriesGolden();
  for (bool graphs : {true, false}) {
    EngineOptions o = Options();
    o.cuda_graphs = graphs;
    std::unique_ptr<Engine> engine = Make(o);
    if (engine == nullptr) return;
    for (const auto& c : golden.cases) {
      EngineRequest r = Greedy(c.prompt, c.prompt_ids, static_cast<int>(c.generated_ids.size()));
      r.params.ignore_eos = false;
      const Collected got = Drain(**engine->Submit(r))[0];
      EXPECT_EQ(got.tokens, c.generated_ids) << c.prompt << (graphs ? " (graphs)" : " (eager)");
      EXPECT_EQ(c.prompt + got.text, c.text);
    }
    ExpectPoolFree(*engine);
  }
}

struct BatchCase {
  const char* name;
  int32_t max_num_batched_tokens;
  int64_t num_kv_blocks;
  bool graphs;
  bool expect_preemption;
};

class CudaEngineBatchTest : public CudaEngineTest,
                            public ::testing::WithParamInterface<BatchCase> {};

TEST_P(CudaEngineBatchTest, ConcurrentRequestsMatchAlone) {
  const BatchCase& bc = GetParam();
  const std::vector<Collected>* alone = Alone();
  if (alone == nullptr) return;
  const std::vector<EngineRequest> requests = Workload();
  EngineOptions o = Options();
  o.scheduler.max_num_batched_tokens = bc.max_num_batched_tokens;
  o.num_kv_blocks = bc.num_kv_blocks;
  o.cuda_graphs = bc.graphs;
  std::unique_ptr<Engine> engine = Make(o);
  if (engine == nullptr) return;
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const EngineRequest& r : requests) streams.push_back(*engine->Submit(r));
  for (size_t i = 0; i < requests.size(); ++i) {
    const Collected got = Drain(*streams[i])[0];
    // Tokens must match; logprobs only closely (cuBLAS may pick other GEMM kernels for other
    // batch sizes, which sum in another order).
    EXPECT_EQ(got.tokens, (*alone)[i].tokens) << requests[i].request_id;
    ASSERT_EQ(got.logprobs.size(), (*alone)[i].logprobs.size());
    for (size_t j = 0; j < got.logprobs.size(); ++j) {
      EXPECT_NEAR(got.logprobs[j], (*alone)[i].logprobs[j], 1e-3) << requests[i].request_id;
    }
  }
  const EngineStats st = engine->stats();
  EXPECT_GT(st.prefix_hit_tokens, 0);
  if (bc.expect_preemption) {
    EXPECT_GT(st.num_preemptions, 0);
  }
  ExpectPoolFree(*engine);
}

INSTANTIATE_TEST_SUITE_P(Configs, CudaEngineBatchTest,
                         ::testing::Values(BatchCase{"default_graphs", 2048, 0, true, false},
                                           BatchCase{"default_eager", 2048, 0, false, false},
                                           BatchCase{"chunked_prefill", 48, 0, true, false},
                                           BatchCase{"preemption", 96, 40, true, true}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST_F(CudaEngineTest, QuantizedKvCache) {
  // int8 / fp8 KV round K and V; the golden prompts must keep their first tokens, and the CPU
  // engine on the same dtype (same codec) is the reference for how many.
  const auto golden = testing_golden::LoadStoriesGolden();
  for (KvCacheDType dtype : {KvCacheDType::kInt8, KvCacheDType::kFp8E4M3}) {
    EngineOptions o = Options();
    o.kv_cache_dtype = dtype;
    std::unique_ptr<Engine> engine = Make(o);
    if (engine == nullptr) return;
    EngineOptions cpu_options = o;
    cpu_options.device = DeviceChoice::kCpu;
    std::unique_ptr<Engine> cpu = *Engine::Create(model_, cpu_options);
    // 48 tokens on the simulator, where every step costs milliseconds.
    const size_t tokens = testing_cuda::UseSimulator() ? 48 : golden.cases[0].generated_ids.size();
    for (const auto& c : golden.cases) {
      const EngineRequest r = Greedy(c.prompt, c.prompt_ids, static_cast<int>(tokens));
      const Collected got = Drain(**engine->Submit(r))[0];
      const Collected want = Drain(**cpu->Submit(r))[0];
      size_t match = 0;
      while (match < got.tokens.size() && got.tokens[match] == c.generated_ids[match]) ++match;
      size_t same_as_cpu = 0;
      while (same_as_cpu < got.tokens.size() &&
             got.tokens[same_as_cpu] == want.tokens[same_as_cpu]) {
        ++same_as_cpu;
      }
      std::printf("kv %s \"%s\": %zu of %zu leading tokens match f32, %zu match the CPU engine\n",
                  std::string(KvCacheDTypeName(dtype)).c_str(), c.prompt.c_str(), match, tokens,
                  same_as_cpu);
      EXPECT_GE(match, 8u);
      // The simulator sums like the CPU closely enough to agree on every token seen so far; a
      // GPU's cuBLAS and attention sum in other orders.
      EXPECT_GE(same_as_cpu, testing_cuda::UseSimulator() ? std::min<size_t>(16, tokens) : 8u);
    }
    ExpectPoolFree(*engine);
  }
}

// The prefix cache's host and disk tiers over device memory: blocks go down through
// KvCache::ReadBlock (device to host) and come back through WriteBlock, and the tokens are those
// of the same engine without tiers. Four prefixes of 4 blocks, twice, in a pool of 12 blocks.
TEST_F(CudaEngineTest, KvTiersRestoreWhatTheDevicePoolDropped) {
  const std::vector<EngineRequest> requests = testing_engine::SharedPrefixRounds(4);
  for (KvCacheDType dtype : {KvCacheDType::kF32, KvCacheDType::kInt8}) {
    SCOPED_TRACE(KvCacheDTypeName(dtype));
    EngineOptions o = Options();
    o.kv_cache_memory = 0;
    o.num_kv_blocks = 13;
    o.block_size = 16;
    o.kv_cache_dtype = dtype;
    std::unique_ptr<Engine> plain = Make(o);
    if (plain == nullptr) return;
    const std::vector<Collected> want = testing_engine::RunInTurn(*plain, requests);
    o.kv_offload.host_bytes = int64_t{4} << 20;
    o.kv_offload.disk_dir = test_util::TestScratchDir();
    o.kv_offload.disk_bytes = int64_t{16} << 20;
    std::unique_ptr<Engine> tiered = Make(o);
    if (tiered == nullptr) return;
    const std::vector<Collected> got = testing_engine::RunInTurn(*tiered, requests);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].tokens, want[i].tokens) << i;
      EXPECT_EQ(got[i].logprobs, want[i].logprobs) << i;
    }
    const EngineStats st = tiered->stats();
    EXPECT_EQ(st.kv_tiers.restored_from_host, 4 * 4);
    EXPECT_EQ(st.prefix_restored_tokens, 4 * 64);
    ExpectPoolFree(*tiered);
  }
}

// KV blocks moving between two engines on the device (what Worker/FetchKvBlocks carries): one
// engine computes each prompt, its blocks are read out (KvCache::ReadBlock, device to host) and
// handed to the other engine with the request, which writes them into its pool (WriteBlock)
// instead of computing them. The tokens and logprobs are the first engine's.
TEST_F(CudaEngineTest, KvBlocksMoveBetweenEngines) {
  const std::vector<EngineRequest> requests = testing_engine::SharedPrefixRounds(3, 1);
  for (KvCacheDType dtype : {KvCacheDType::kF32, KvCacheDType::kInt8}) {
    SCOPED_TRACE(KvCacheDTypeName(dtype));
    EngineOptions o = Options();
    o.kv_cache_memory = 0;
    o.num_kv_blocks = 32;
    o.block_size = 16;
    o.kv_cache_dtype = dtype;
    std::unique_ptr<Engine> holder = Make(o);
    std::unique_ptr<Engine> receiver = Make(o);
    if (holder == nullptr || receiver == nullptr) return;
    ASSERT_EQ(holder->kv_identity().layout, receiver->kv_identity().layout);
    const std::vector<Collected> want = testing_engine::RunInTurn(*holder, requests);
    int64_t moved = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      EngineRequest r = requests[i];
      std::promise<std::vector<KvBlockPayload>> promise;
      holder->ExportKvBlocks(
          HashFullBlocks(r.prompt_ids, 16, r.cache_salt), 0, int64_t{1} << 30,
          [&promise](std::vector<KvBlockPayload> blocks) { promise.set_value(std::move(blocks)); });
      r.kv_blocks = promise.get_future().get();
      EXPECT_EQ(r.kv_blocks.size(), r.prompt_ids.size() / 16) << i;
      moved += static_cast<int64_t>(r.kv_blocks.size());
      const Collected got = Drain(**receiver->Submit(std::move(r)))[0];
      EXPECT_EQ(got.tokens, want[i].tokens) << i;
      EXPECT_EQ(got.logprobs, want[i].logprobs) << i;
    }
    const EngineStats st = receiver->stats();
    // Every full block but a last one that ends the prompt is restored.
    EXPECT_GT(st.kv_transfer.restored_blocks, 0);
    EXPECT_LE(st.kv_transfer.restored_blocks, moved);
    EXPECT_EQ(st.kv_transfer.staged_blocks, 0);
    ExpectPoolFree(*receiver);
  }
}

TEST_F(CudaEngineTest, TensorParallelOverNccl) {
  const auto golden = testing_golden::LoadStoriesGolden();
  KVSERVE_REQUIRE_DEVICES(2);
  EngineOptions o = Options();
  o.tensor_parallel_size = 2;
  o.num_threads = 2;
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(model_, o);
  if (!e.ok()) {
    FailOrSkip(e.status());
    return;
  }
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& c : golden.cases) {
    streams.push_back(
        *(*e)->Submit(Greedy(c.prompt, c.prompt_ids, static_cast<int>(c.generated_ids.size()))));
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    EXPECT_EQ(Drain(*streams[i])[0].tokens, golden.cases[i].generated_ids);
  }
  ExpectPoolFree(**e);
}

// A pipeline group on the device: the leader's engine runs layers 0-2 on its device and a stage
// runner (in this process, over loopback gRPC) layers 3-4 on its own; the hand-over goes device
// to device over NCCL send/recv (the simulator) and through host memory. Tokens are the whole
// model's on one device and the reference's greedy tokens; log-probabilities are close.
TEST_F(CudaEngineTest, PipelineStagesOnTheDevice) {
  const auto golden = testing_golden::LoadStoriesGolden();
  EngineOptions o = Options();
  std::unique_ptr<Engine> whole = Make(o);
  if (whole == nullptr) return;
  // Hand-overs device to device over NCCL where two stages can have devices of their own (the
  // simulator: every process has its devices; one real GPU cannot hold two NCCL ranks of one
  // communicator), and through the leader's host memory.
  std::vector<bool> device_hand_over = {false};
  if (testing_cuda::UseSimulator()) device_hand_over.push_back(true);
  for (const bool device : device_hand_over) {
    SCOPED_TRACE(device ? "device hand-over" : "host hand-over");
    PipelineGroupOptions g;
    g.stages = *SplitLayers(model_->config().num_layers, 2);
    g.model_fingerprint = ModelWeightsFingerprint(*model_->weights);
    g.hidden_size = model_->config().hidden_size;
    g.vocab_size = model_->config().vocab_size;
    std::unique_ptr<PipelineGroup> group = *PipelineGroup::Create(g);
    o.pipeline = group.get();
    o.pipeline_device_hand_over = device;
    std::unique_ptr<Engine> leader = Make(o);
    if (leader == nullptr) return;
    EXPECT_EQ(group->device_hand_over(), device);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(group->service());
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    ASSERT_NE(server, nullptr);
    PipelineStageOptions so;
    so.leader = absl::StrCat("127.0.0.1:", port);
    so.pp_size = 2;
    so.tensor_parallel.num_threads = 1;
    so.retry_interval = absl::Milliseconds(20);
    BackendOptions backend;
    backend.keep_f32_weights = true;
    backend.simulator = testing_cuda::UseSimulator();
    UseDeviceRanks(&so.tensor_parallel, backend);
    so.device = backend.simulator ? "cuda-sim" : "cuda";
    PipelineStageRunner stage(model_->weights.get(), so);
    std::thread stage_thread([&stage] { (void)stage.Run(); });
    for (int i = 0; i < 2000 && !group->formed(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(group->formed()) << group->NotFormedReason();
    // The first tokens of each golden prompt, all at once (two micro-batches in flight).
    constexpr int kTokens = 12;
    std::vector<std::shared_ptr<RequestStream>> got, want;
    for (const auto& c : golden.cases) {
      got.push_back(*leader->Submit(Greedy(c.prompt, c.prompt_ids, kTokens)));
      want.push_back(*whole->Submit(Greedy(c.prompt, c.prompt_ids, kTokens)));
    }
    for (size_t i = 0; i < got.size(); ++i) {
      const Collected a = Drain(*got[i])[0];
      const Collected b = Drain(*want[i])[0];
      EXPECT_EQ(a.tokens, b.tokens) << i;
      // Logprobs only closely: the steps' batches differ (micro-batches here, and the whole
      // engine replays graphs for the decode steps that are not mixed with a prefill, which
      // timing decides), and with them GEMM kernels and attention splits.
      ASSERT_EQ(a.logprobs.size(), b.logprobs.size()) << i;
      for (size_t j = 0; j < a.logprobs.size(); ++j) {
        EXPECT_NEAR(a.logprobs[j], b.logprobs[j], 1e-3) << i << ", token " << j;
      }
      const std::vector<TokenId>& ids = golden.cases[i].generated_ids;
      EXPECT_EQ(a.tokens, std::vector<TokenId>(ids.begin(), ids.begin() + kTokens)) << i;
    }
    const PipelineGroupStats stats = group->stats();
    EXPECT_GT(stats.steps, 0);
    // Device to device, nothing but logits crosses gRPC.
    if (device) {
      EXPECT_EQ(stats.bytes_sent, 0);
    }
    ExpectPoolFree(*leader);
    stage.Stop();
    stage_thread.join();
    group->Shutdown();
    server->Shutdown();
    leader.reset();
  }
}

// A tiny random Qwen3 (per-head q/k norms, head_dim 32 != hidden / heads): the device decodes
// the CPU's greedy tokens, with graphs and eagerly, and over NCCL where two devices exist.
TEST_F(CudaEngineTest, Qwen3MatchesTheCpu) {
  SynthWriteOptions w;
  w.model.architecture = "qwen3";
  w.model.num_layers = 2;
  w.model.hidden_size = 64;
  w.model.num_heads = 4;
  w.model.num_kv_heads = 2;
  w.model.head_dim = 32;
  w.model.intermediate_size = 96;
  w.model.vocab_size = 600;
  w.model.max_position_embeddings = 128;
  w.model.seed = 11;
  w.format = SynthFormat::kGguf;
  w.out_dir = test_util::ScratchPath("qwen3");
  absl::StatusOr<SynthOutputs> written = WriteSynthModel(w);
  ASSERT_TRUE(written.ok()) << written.status();
  absl::StatusOr<LoadedModel> qwen3 = LoadModel(written->gguf_path);
  ASSERT_TRUE(qwen3.ok()) << qwen3.status();
  std::vector<TokenId> prompt = {1};
  for (int i = 1; i < 21; ++i) prompt.push_back(static_cast<TokenId>(3 + (i * 37) % 590));
  const EngineRequest r = Greedy("q", prompt, 10);

  EngineOptions cpu_options;
  cpu_options.num_threads = 1;
  cpu_options.kv_cache_memory = int64_t{4} << 20;
  const Collected cpu = Drain(**(*Engine::Create(&*qwen3, cpu_options))->Submit(r))[0];
  auto run = [&](const EngineOptions& o, const char* what) {
    absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(&*qwen3, o);
    if (!e.ok()) {
      FailOrSkip(e.status());
      return;
    }
    const Collected got = Drain(**(*e)->Submit(r))[0];
    EXPECT_EQ(got.tokens, cpu.tokens) << what;
    ASSERT_EQ(got.logprobs.size(), cpu.logprobs.size()) << what;
    for (size_t j = 0; j < got.logprobs.size(); ++j) {
      EXPECT_NEAR(got.logprobs[j], cpu.logprobs[j], 1e-3) << what;
    }
    ExpectPoolFree(**e);
  };
  for (bool graphs : {true, false}) {
    EngineOptions o = Options();
    o.cuda_graphs = graphs;
    run(o, graphs ? "graphs" : "eager");
    if (HasFatalFailure() || IsSkipped()) return;
  }
  KVSERVE_REQUIRE_DEVICES(2);
  EngineOptions o = Options();
  o.tensor_parallel_size = 2;
  o.num_threads = 2;
  run(o, "tp 2");
}

}  // namespace
}  // namespace kvserve
