// The engine end to end on a CUDA device (label gpu) or on the CUDA simulator (<test>_sim,
// KVSERVE_TEST_DEVICE=cuda-sim), with f32 weights kept in f32: stories260K's golden greedy tokens
// for both prompts (in full with f32 activations, a long prefix with the default bf16 ones); 64
// mixed concurrent requests identical to each run alone, with chunked prefill, prefix-cache hits
// and preemption; int8 and fp8 KV; decode graphs against eager
// launches; sampling on the device against the host sampler (same seeded tokens); tensor
// parallelism over NCCL (--tp 2, where two devices exist); and a tiny Qwen3. Runs compared with
// other runs (alone, on another engine, on the CPU) must be identical on the simulator; on a GPU,
// where cuBLAS sums in other orders for other batch shapes, they may part at a near-tie
// (ExpectAgree).

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
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

// While alive, CUDA backends created keep f32 activations (KVSERVE_CUDA_F32_ACTIVATIONS=1, the
// escape hatch of docs/gpu.md, "Activations in bf16"): for the tests that hold the device to
// llama2.c's goldens bit for bit.
class F32Activations {
 public:
  F32Activations() { setenv("KVSERVE_CUDA_F32_ACTIVATIONS", "1", 1); }
  ~F32Activations() { unsetenv("KVSERVE_CUDA_F32_ACTIVATIONS"); }
  F32Activations(const F32Activations&) = delete;
  F32Activations& operator=(const F32Activations&) = delete;
};

// Log-probabilities of one request on a GPU against a reference run (see ExpectAgree). Measured
// on an H200 with bf16 activations: up to 6.1e-2 before the tokens part, and 1.3e-2 between the
// two runs' picks where they part; with f32 activations no request parted at all.
constexpr float kGpuLogprobTolerance = 0.1f;

// Compares a run on the device under test with a reference run of the same request (alone,
// on another engine or on the CPU). The CUDA simulator's GEMMs sum each row in one order
// whatever the batch, as the CPU does, so there the tokens must be equal and the logprobs equal
// (sim_tolerance 0) or within sim_tolerance. cuBLAS on a GPU picks other kernels for other batch
// shapes and sums in other orders, so a pick between two nearly equal logits can go the other
// way, and the texts then go their own ways. There the logprobs must agree within
// kGpuLogprobTolerance up to the first token that differs and, for a greedy request, at that
// token too: each run chose a top-1 token of nearly the same probability, a near-tie rather
// than wrong logits. Later tokens are not compared. Returns the index where the tokens part
// (the common length when they never do).
size_t ExpectAgree(const Collected& got, const Collected& want, float sim_tolerance,
                   const std::string& what, bool greedy = true) {
  const size_t n = std::min(got.tokens.size(), want.tokens.size());
  // Requests without log-probabilities report none: their tokens alone are compared.
  const bool logprobs = !got.logprobs.empty() || !want.logprobs.empty();
  if (logprobs) {
    EXPECT_EQ(got.logprobs.size(), got.tokens.size()) << what;
    EXPECT_EQ(want.logprobs.size(), want.tokens.size()) << what;
    if (got.logprobs.size() < n || want.logprobs.size() < n) return 0;
  }
  if (testing_cuda::UseSimulator()) {
    EXPECT_EQ(got.tokens, want.tokens) << what;
    for (size_t j = 0; logprobs && j < n; ++j) {
      if (sim_tolerance == 0.0f) {
        EXPECT_EQ(got.logprobs[j], want.logprobs[j]) << what << ", token " << j;
      } else {
        EXPECT_NEAR(got.logprobs[j], want.logprobs[j], sim_tolerance) << what << ", token " << j;
      }
    }
    return n;
  }
  size_t part = 0;
  while (part < n && got.tokens[part] == want.tokens[part]) ++part;
  const size_t compared = part < n && greedy ? part + 1 : part;
  for (size_t j = 0; logprobs && j < compared; ++j) {
    EXPECT_NEAR(got.logprobs[j], want.logprobs[j], kGpuLogprobTolerance)
        << what << ", token " << j << (j == part ? " (where the tokens part)" : "");
  }
  if (part < n) {
    std::printf("%s: tokens part at %zu of %zu (%d vs %d", what.c_str(), part, n, got.tokens[part],
                want.tokens[part]);
    if (logprobs) {
      std::printf(", logprobs %.4f vs %.4f", static_cast<double>(got.logprobs[part]),
                  static_cast<double>(want.logprobs[part]));
    }
    std::printf(")\n");
  }
  return part;
}

// Golden tokens the bf16-activation engine must reproduce from the start of each generation.
// bf16 rounding flips one near-tie: "Once upon a time", generated token 181, where the
// reference's two best logits are 0.0042 apart (the narrowest margin of both 196-token
// generations) and bf16 puts the other one ahead by 0.0014; fed the golden tokens, every other
// step of both generations picks the golden token (measured on the simulator). After a flip the
// text goes its own way, so bf16 is held to a prefix and f32 to the whole.
constexpr size_t kBf16GoldenTokens = 128;

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

// The goldens exactly with f32 activations, with graphs and eagerly; with bf16 activations (the
// default) their first kBf16GoldenTokens tokens on the simulator, and on a GPU the f32 run's
// tokens up to a near-tie (measured on an H200: "Once upon a time" parts at token 67).
TEST_F(CudaEngineTest, GoldenPromptsWithGraphsAndEager) {
  const auto golden = testing_golden::LoadStoriesGolden();
  std::vector<Collected> f32_runs;  // with graphs, per golden case
  for (const auto& [f32, graphs] :
       {std::pair{true, true}, std::pair{true, false}, std::pair{false, true}}) {
    const std::string what = std::string(f32 ? " (f32 activations" : " (bf16 activations") +
                             (graphs ? ", graphs)" : ", eager)");
    std::optional<F32Activations> hatch;
    if (f32) hatch.emplace();
    EngineOptions o = Options();
    o.cuda_graphs = graphs;
    std::unique_ptr<Engine> engine = Make(o);
    if (engine == nullptr) return;
    for (size_t i = 0; i < golden.cases.size(); ++i) {
      const auto& c = golden.cases[i];
      EngineRequest r = Greedy(c.prompt, c.prompt_ids, static_cast<int>(c.generated_ids.size()));
      r.params.ignore_eos = false;
      const Collected got = Drain(**engine->Submit(r))[0];
      if (f32) {
        EXPECT_EQ(got.tokens, c.generated_ids) << c.prompt << what;
        EXPECT_EQ(c.prompt + got.text, c.text) << what;
        if (graphs) f32_runs.push_back(got);
      } else if (!testing_cuda::UseSimulator()) {
        // On a GPU, against the f32 run (the goldens' tokens, with their logprobs).
        ASSERT_EQ(f32_runs.size(), golden.cases.size());
        ExpectAgree(got, f32_runs[i], 0.0f, c.prompt + what);
      } else {
        ASSERT_GE(got.tokens.size(), kBf16GoldenTokens) << c.prompt << what;
        EXPECT_EQ(std::vector<TokenId>(got.tokens.begin(), got.tokens.begin() + kBf16GoldenTokens),
                  std::vector<TokenId>(c.generated_ids.begin(),
                                       c.generated_ids.begin() + kBf16GoldenTokens))
            << c.prompt << what;
      }
      if (!f32) {
        const size_t same =
            static_cast<size_t>(std::mismatch(got.tokens.begin(), got.tokens.end(),
                                              c.generated_ids.begin(), c.generated_ids.end())
                                    .first -
                                got.tokens.begin());
        std::printf("%s%s: the first %zu of %zu golden tokens\n", c.prompt.c_str(), what.c_str(),
                    same, c.generated_ids.size());
      }
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
  size_t parted = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const Collected got = Drain(*streams[i])[0];
    // On the simulator tokens must match and logprobs closely (the simulator's attention
    // splits differ with the batch; with bf16 activations such an f32 difference can move a
    // bf16 rounding: measured up to 1.5e-2, under 1e-3 with f32 activations).
    parted += ExpectAgree(got, (*alone)[i], 5e-2f, requests[i].request_id) < got.tokens.size();
  }
  std::printf("%s: %zu of %zu requests part from their run alone at a near-tie\n", bc.name, parted,
              requests.size());
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

// FP8 weights (--quantization fp8) serve the golden prompts, keeping their first tokens, and the
// planner sizes the KV pool with the weights' FP8 bytes: the memory they free (stories260K's
// f32 layer matrices shrink to a quarter) becomes KV blocks.
TEST_F(CudaEngineTest, Fp8WeightsServeTheGoldenPromptsAndFreeKvMemory) {
  const auto golden = testing_golden::LoadStoriesGolden();
  EngineOptions o = Options();
  o.fp8_weights = true;
  std::unique_ptr<Engine> engine = Make(o);
  if (engine == nullptr) return;
  const size_t tokens = testing_cuda::UseSimulator() ? 48 : golden.cases[0].generated_ids.size();
  for (const auto& c : golden.cases) {
    const Collected got =
        Drain(**engine->Submit(Greedy(c.prompt, c.prompt_ids, static_cast<int>(tokens))))[0];
    size_t match = 0;
    while (match < got.tokens.size() && got.tokens[match] == c.generated_ids[match]) ++match;
    std::printf("fp8 weights \"%s\": %zu of %zu leading tokens match the f32 reference\n",
                c.prompt.c_str(), match, tokens);
    EXPECT_GE(match, 8u);
  }
  ExpectPoolFree(*engine);
  engine.reset();
  // Pool sizes from the device's memory: 0.2 of the simulator's, the weights' bytes subtracted.
  int64_t blocks[2] = {};
  for (bool fp8 : {false, true}) {
    EngineOptions sized = Options();
    sized.fp8_weights = fp8;
    sized.kv_cache_memory = 0;
    sized.gpu_memory_utilization = 0.2;
    std::unique_ptr<Engine> e = Make(sized);
    if (e == nullptr) return;
    blocks[fp8] = e->num_kv_blocks();
  }
  int64_t freed = 0;  // what the FP8 layer matrices save, in bytes
  model_->weights->ForEachLayerTensor([&](const TensorView& t) {
    if (t.shape.size() == 2) freed += t.nbytes() - t.shape[0] * (t.shape[1] + 4);
  });
  const ModelConfig& c = model_->weights->config;
  const int64_t block_bytes = 2 * int64_t{c.num_layers} * c.num_kv_heads * c.head_dim *
                              Options().block_size *
                              KvCacheDTypeElemBytes(Options().kv_cache_dtype);
  std::printf("KV blocks with the weights' bytes: %lld as stored, %lld in FP8 (%lld freed)\n",
              static_cast<long long>(blocks[0]), static_cast<long long>(blocks[1]),
              static_cast<long long>(freed));
  EXPECT_NEAR(static_cast<double>(blocks[1] - blocks[0]), static_cast<double>(freed) / block_bytes,
              2.0);
}

// A seeded top-k / top-p request (or greedy at temperature 0) of `max_tokens` tokens on a prompt
// of 20 + 7 * seed % 50 tokens, ignoring EOS, with no log-probabilities.
EngineRequest Sampled(int i, float temperature, int32_t top_k, float top_p, int max_tokens) {
  std::mt19937 rng(static_cast<uint32_t>(1000 + i));
  std::uniform_int_distribution<TokenId> tok(3, 500);
  EngineRequest r;
  r.request_id = absl::StrCat("s", i);
  r.prompt_ids = {1};
  while (static_cast<int>(r.prompt_ids.size()) < 20 + 7 * i % 50) r.prompt_ids.push_back(tok(rng));
  r.params.temperature = temperature;
  r.params.top_k = top_k;
  r.params.top_p = top_p;
  r.params.seed = 100 + i;
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  return r;
}

// Runs `requests` concurrently on `engine`; every sample's tokens, request by request.
std::vector<std::map<int, Collected>> RunTogether(Engine& engine,
                                                  const std::vector<EngineRequest>& requests) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const EngineRequest& r : requests) {
    absl::StatusOr<std::shared_ptr<RequestStream>> stream = engine.Submit(r);
    EXPECT_TRUE(stream.ok()) << stream.status();
    if (stream.ok()) streams.push_back(*stream);
  }
  std::vector<std::map<int, Collected>> out;
  for (const auto& stream : streams) out.push_back(Drain(*stream));
  return out;
}

// The device sampler reproduces the host sampler: seeded top-k / top-p requests (temperatures
// that are not powers of two, nucleus cuts, k from 1 to 64, n = 3 forks sharing the prompt's
// logits row, a greedy request) draw the same tokens with their logits sampled on the device as
// with the logits copied to the host, and every token of the device run was sampled there.
TEST_F(CudaEngineTest, DeviceSamplingDrawsTheHostSamplersTokens) {
  struct Case {
    float temperature;
    int32_t top_k;
    float top_p;
  };
  const Case cases[] = {{0.8f, 40, 0.95f}, {1.0f, 64, 1.0f}, {1.3f, 10, 0.9f}, {0.7f, 5, 0.5f},
                        {2.0f, 1, 1.0f},   {0.0f, 0, 1.0f},  {1.0f, 20, 0.8f}, {3.0f, 64, 0.99f}};
  std::vector<EngineRequest> requests;
  int i = 0;
  for (const Case& c : cases) {
    requests.push_back(Sampled(i++, c.temperature, c.top_k, c.top_p, 12));
  }
  requests.push_back(Sampled(i++, 0.9f, 32, 0.9f, 10));
  requests.back().n = 3;
  std::vector<std::vector<std::map<int, Collected>>> runs;
  for (bool device_sampling : {false, true}) {
    EngineOptions o = Options();
    o.device_sampling = device_sampling;
    std::unique_ptr<Engine> engine = Make(o);
    if (engine == nullptr) return;
    runs.push_back(RunTogether(*engine, requests));
    size_t tokens = 0;
    for (const auto& samples : runs.back()) {
      for (const auto& [index, c] : samples) tokens += c.tokens.size();
    }
    EXPECT_EQ(tokens, size_t{8 * 12 + 3 * 10});
    EXPECT_EQ(engine->stats().device_sampled_tokens,
              device_sampling ? static_cast<int64_t>(tokens) : 0);
    ExpectPoolFree(*engine);
  }
  ASSERT_EQ(runs[0].size(), requests.size());
  ASSERT_EQ(runs[1].size(), requests.size());
  for (size_t r = 0; r < requests.size(); ++r) {
    ASSERT_EQ(runs[1][r].size(), static_cast<size_t>(requests[r].n));
    for (const auto& [index, host] : runs[0][r]) {
      EXPECT_EQ(runs[1][r][index].tokens, host.tokens)
          << requests[r].request_id << " sample " << index;
    }
  }
  // Not every token the same: the requests really sampled.
  EXPECT_NE(runs[0][0][0].tokens, runs[0][1][0].tokens);
}

// Requests the device kernel cannot serve (log-probabilities, a repetition penalty, top-k 0,
// min-p) share steps with ones it can: only their logits rows come to the host and are sampled
// there, every token of the others is sampled on the device even in those shared steps, and
// every request draws the tokens it draws alone on a host-sampling engine.
TEST_F(CudaEngineTest, HostOnlyRequestsShareStepsWithDeviceSampledOnes) {
  std::vector<EngineRequest> requests;
  requests.push_back(Sampled(0, 0.8f, 40, 0.9f, 14));
  requests.push_back(Sampled(1, 0.0f, 0, 1.0f, 14));
  requests.push_back(Sampled(2, 1.2f, 8, 1.0f, 14));
  EngineRequest logprobs = Sampled(3, 0.8f, 40, 0.9f, 4);
  logprobs.params.logprobs = 2;
  requests.push_back(logprobs);
  EngineRequest penalty = Sampled(4, 0.8f, 40, 0.9f, 4);
  penalty.params.repetition_penalty = 1.3f;
  requests.push_back(penalty);
  requests.push_back(Sampled(5, 0.8f, 0, 0.9f, 3));  // top_k 0: the whole vocabulary
  EngineRequest min_p = Sampled(6, 0.8f, 40, 1.0f, 3);
  min_p.params.min_p = 0.05f;
  requests.push_back(min_p);

  EngineOptions host_options = Options();
  host_options.device_sampling = false;
  std::unique_ptr<Engine> host = Make(host_options);
  if (host == nullptr) return;
  std::unique_ptr<Engine> device = Make(Options());
  if (device == nullptr) return;
  const std::vector<std::map<int, Collected>> together = RunTogether(*device, requests);
  ASSERT_EQ(together.size(), requests.size());
  size_t tokens = 0;
  size_t device_capable_tokens = 0;  // of requests 0..2
  for (size_t r = 0; r < requests.size(); ++r) {
    const Collected alone = Drain(**host->Submit(requests[r]))[0];
    const Collected& got = together[r].at(0);
    ExpectAgree(got, alone, 1e-3f, requests[r].request_id, requests[r].params.temperature == 0.0f);
    EXPECT_EQ(got.final_output.finish_reason, FinishReason::kLength) << requests[r].request_id;
    tokens += got.tokens.size();
    if (r < 3) device_capable_tokens += got.tokens.size();
  }
  EXPECT_EQ(together[3].at(0).logprobs.size(), 4u);  // log-probabilities still reported
  EXPECT_EQ(device->stats().device_sampled_tokens, static_cast<int64_t>(device_capable_tokens));
  EXPECT_LT(device_capable_tokens, tokens);
  EXPECT_EQ(host->stats().device_sampled_tokens, 0);
  ExpectPoolFree(*device);
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
    for (size_t i = 0; i < got.size(); ++i) ExpectAgree(got[i], want[i], 0.0f, absl::StrCat(i));
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
      ExpectAgree(got, want[i], 0.0f, absl::StrCat(i));
    }
    const EngineStats st = receiver->stats();
    // Every full block but a last one that ends the prompt is restored.
    EXPECT_GT(st.kv_transfer.restored_blocks, 0);
    EXPECT_LE(st.kv_transfer.restored_blocks, moved);
    EXPECT_EQ(st.kv_transfer.staged_blocks, 0);
    ExpectPoolFree(*receiver);
  }
}

// The goldens in full, so with f32 activations (bf16 ones over NCCL: cuda_model_test).
TEST_F(CudaEngineTest, TensorParallelOverNccl) {
  const auto golden = testing_golden::LoadStoriesGolden();
  KVSERVE_REQUIRE_DEVICES(2);
  const F32Activations hatch;
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
      // timing decides), and with them GEMM kernels and attention splits. With bf16
      // activations an f32 difference of an ulp can move a bf16 rounding: measured up to 1.1e-2
      // (f32 activations: under 1e-3).
      ASSERT_EQ(a.logprobs.size(), b.logprobs.size()) << i;
      for (size_t j = 0; j < a.logprobs.size(); ++j) {
        EXPECT_NEAR(a.logprobs[j], b.logprobs[j], 4e-2) << i << ", token " << j;
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
    // bf16 activations against the CPU's f32: measured up to 7.3e-3 on the simulator (f32
    // ones: under 1e-3). A random model's next-token distribution is nearly flat (logprobs
    // about -4.6 over 600 tokens), so on a GPU a greedy pick can part at a near-tie.
    ExpectAgree(got, cpu, 3e-2f, what);
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
