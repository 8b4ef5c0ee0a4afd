// The engine end to end on stories260K: batching, chunked prefill, preemption and prefix caching
// must not change any request's output, the pool's invariants hold after every step, and every
// test ends with the pool fully free.

#include "worker/engine/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/block_hash/block_hash.h"
#include "gtest/gtest.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/worker/engine/engine_test_util.h"
#include "tests/worker/model/golden.h"
#include "worker/kv/kv_cache.h"
#include "worker/model/batch_builder.h"
#include "worker/model/llama_model.h"

namespace kvserve {
namespace {

using testing_engine::Collected;
using testing_engine::Drain;

class EngineTest : public testing_engine::StoriesModelTest {
 protected:

  static EngineOptions Options() {
    EngineOptions o;
    o.num_threads = 1;
    o.check_invariants = true;
    return o;
  }

  static EngineRequest Greedy(std::string id, std::vector<TokenId> prompt, int max_tokens) {
    return testing_engine::Greedy(std::move(id), std::move(prompt), max_tokens);
  }

  static std::vector<EngineRequest> MixedWorkload() { return testing_engine::MixedWorkload(); }

  // MixedWorkload's requests, each run alone: the reference every batch configuration is
  // compared with (computed once per test binary).
  static const std::vector<Collected>& MixedWorkloadAlone() {
    static const std::vector<Collected>* alone =
        new std::vector<Collected>(RunAlone(MixedWorkload()));
    return *alone;
  }

  // Runs each request alone on a fresh engine.
  static std::vector<Collected> RunAlone(const std::vector<EngineRequest>& requests) {
    std::vector<Collected> out;
    EngineOptions o = Options();
    o.scheduler.enable_prefix_caching = false;
    std::unique_ptr<Engine> engine = *Engine::Create(model_, o);
    for (const EngineRequest& r : requests) {
      std::shared_ptr<RequestStream> s = *engine->Submit(r);
      out.push_back(Drain(*s)[0]);
    }
    return out;
  }

  static void ExpectPoolFree(const Engine& engine) { testing_engine::ExpectPoolFree(engine); }
};

TEST(EngineDefaultsTest, DefaultKvBudgetIsCappedByAvailableHostMemory) {
  constexpr int64_t kGiB = int64_t{1} << 30;
  EXPECT_EQ(DefaultKvBudget(10 * kGiB, 64 * kGiB, true), 4 * kGiB);
  EXPECT_EQ(DefaultKvBudget(10 * kGiB, 2 * kGiB, true), 1 * kGiB);
  EXPECT_EQ(DefaultKvBudget(100 << 20, 64 * kGiB, true), 100 << 20);
  EXPECT_EQ(DefaultKvBudget(10 * kGiB, 0, true), 4 * kGiB);        // available unknown
  EXPECT_EQ(DefaultKvBudget(10 * kGiB, 2 * kGiB, false), 4 * kGiB);  // a device pool
}

TEST_F(EngineTest, GoldenPromptsAlone) {
  std::unique_ptr<Engine> engine = *Engine::Create(model_, Options());
  const auto golden = testing_golden::LoadStoriesGolden();
  for (const auto& c : golden.cases) {
    EngineRequest r = Greedy(c.prompt, c.prompt_ids, static_cast<int>(c.generated_ids.size()));
    r.params.ignore_eos = false;
    std::shared_ptr<RequestStream> s = *engine->Submit(r);
    Collected got = Drain(*s)[0];
    EXPECT_EQ(got.tokens, c.generated_ids);
    EXPECT_EQ(c.prompt + got.text, c.text);
    EXPECT_EQ(got.final_output.finish_reason, FinishReason::kLength);
    EXPECT_EQ(got.final_output.usage.prompt_tokens, static_cast<int>(c.prompt_ids.size()));
    EXPECT_EQ(got.final_output.usage.completion_tokens, static_cast<int>(c.generated_ids.size()));
  }
  ExpectPoolFree(*engine);
}

struct BatchCase {
  const char* name;
  int32_t max_num_batched_tokens;
  int64_t num_kv_blocks;
  bool prefix_caching;
  bool expect_preemption;
};

class EngineBatchTest : public EngineTest, public ::testing::WithParamInterface<BatchCase> {};

TEST_P(EngineBatchTest, ConcurrentRequestsMatchAlone) {
  const BatchCase& bc = GetParam();
  const std::vector<EngineRequest> requests = MixedWorkload();
  const std::vector<Collected>& alone = MixedWorkloadAlone();
  EngineOptions o = Options();
  o.scheduler.max_num_batched_tokens = bc.max_num_batched_tokens;
  o.scheduler.enable_prefix_caching = bc.prefix_caching;
  o.num_kv_blocks = bc.num_kv_blocks;
  std::unique_ptr<Engine> engine = *Engine::Create(model_, o);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const EngineRequest& r : requests) streams.push_back(*engine->Submit(r));
  for (size_t i = 0; i < requests.size(); ++i) {
    Collected got = Drain(*streams[i])[0];
    EXPECT_EQ(got.tokens, alone[i].tokens) << requests[i].request_id;
    // Bit-identical logits give bit-identical log-probabilities.
    EXPECT_EQ(got.logprobs, alone[i].logprobs) << requests[i].request_id;
    EXPECT_EQ(got.text, alone[i].text);
  }
  const EngineStats st = engine->stats();
  if (bc.expect_preemption) {
    EXPECT_GT(st.num_preemptions, 0);
  }
  if (bc.prefix_caching) {
    EXPECT_GT(st.prefix_hit_tokens, 0);
  } else {
    EXPECT_EQ(st.prefix_hit_tokens, 0);
  }
  ExpectPoolFree(*engine);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, EngineBatchTest,
    ::testing::Values(BatchCase{"default", 2048, 0, true, false},
                      BatchCase{"chunked_prefill", 48, 0, true, false},
                      BatchCase{"preemption", 96, 40, true, true},
                      BatchCase{"preemption_no_prefix_cache", 96, 40, false, true},
                      BatchCase{"no_prefix_cache", 2048, 0, false, false}),
    [](const auto& info) { return std::string(info.param.name); });

// Sampled requests with several samples each (temperature, seed, n = 2 or 3) run together in a
// pool small enough to preempt them give every sample the tokens and log-probabilities it has
// alone and unpreempted: a preempted sample is recomputed, and its seeded draws must not shift.
TEST_F(EngineTest, PreemptedSampledRequestsWithSeveralSamplesMatchUnpreempted) {
  std::vector<EngineRequest> requests = testing_engine::MixedWorkload(24);
  requests.resize(24);
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].n = 2 + static_cast<int>(i % 2);
    requests[i].params.temperature = 0.8f;
    requests[i].params.top_p = 0.95f;
    requests[i].params.seed = 1000 + i;
  }
  std::vector<std::map<int, Collected>> alone;
  {
    EngineOptions o = Options();
    o.scheduler.enable_prefix_caching = false;
    std::unique_ptr<Engine> engine = *Engine::Create(model_, o);
    for (const EngineRequest& r : requests) alone.push_back(Drain(**engine->Submit(r)));
    EXPECT_EQ(engine->stats().num_preemptions, 0);
  }
  EngineOptions o = Options();
  o.scheduler.max_num_batched_tokens = 96;
  o.num_kv_blocks = 40;
  std::unique_ptr<Engine> engine = *Engine::Create(model_, o);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const EngineRequest& r : requests) streams.push_back(*engine->Submit(r));
  for (size_t i = 0; i < requests.size(); ++i) {
    const std::map<int, Collected> got = Drain(*streams[i]);
    ASSERT_EQ(got.size(), alone[i].size()) << requests[i].request_id;
    for (const auto& [sample, collected] : got) {
      const Collected& ref = alone[i].at(sample);
      EXPECT_EQ(collected.tokens, ref.tokens) << requests[i].request_id << " sample " << sample;
      EXPECT_EQ(collected.logprobs, ref.logprobs) << requests[i].request_id << " sample " << sample;
      EXPECT_EQ(collected.text, ref.text) << requests[i].request_id << " sample " << sample;
    }
  }
  EXPECT_GT(engine->stats().num_preemptions, 0) << "the pool was meant to force preemption";
  ExpectPoolFree(*engine);
}

TEST_F(EngineTest, ParallelSamplingGivesTheSameTokens) {
  // Seeded temperature sampling with top-k/top-p and penalties: sampling a step's sequences on
  // two threads draws exactly what the loop thread alone draws.
  std::vector<EngineRequest> requests = MixedWorkload();
  for (size_t i = 0; i < requests.size(); ++i) {
    SamplingParams& p = requests[i].params;
    p.temperature = 0.9f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.presence_penalty = 0.3f;
    p.seed = 1000 + i;
  }
  auto run = [&](int threads) {
    EngineOptions o = Options();
    o.num_threads = threads;
    o.parallel_sampling_min_logits = 0;
    std::unique_ptr<Engine> engine = *Engine::Create(model_, o);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const EngineRequest& r : requests) streams.push_back(*engine->Submit(r));
    std::vector<std::vector<TokenId>> out;
    for (auto& s : streams) out.push_back(Drain(*s)[0].tokens);
    ExpectPoolFree(*engine);
    return out;
  };
  EXPECT_EQ(run(2), run(1));
}

TEST_F(EngineTest, SharedPrefixBlocksAreHeldOnce) {
  EngineOptions o = Options();
  o.run_loop_thread = false;
  o.scheduler.max_num_batched_tokens = 32 * 300;
  o.num_kv_blocks = 400;
  std::unique_ptr<Engine> engine = *Engine::Create(model_, o);
  std::vector<TokenId> prefix = {1};
  for (int i = 1; i < 256; ++i) prefix.push_back(3 + (i * 37) % 500);
  std::vector<std::shared_ptr<RequestStream>> streams;
  auto submit = [&](int i) {
    std::vector<TokenId> prompt = prefix;
    for (int j = 0; j < 8; ++j) prompt.push_back(3 + (i * 11 + j * 5) % 500);
    streams.push_back(*engine->Submit(Greedy(absl::StrCat("p", i), prompt, 4)));
  };
  submit(0);
  ASSERT_TRUE(engine->StepOnce());  // prefill of the first request fills the prefix cache
  EXPECT_EQ(engine->stats().used_blocks, 17);
  for (int i = 1; i < 32; ++i) submit(i);
  ASSERT_TRUE(engine->StepOnce());
  // 16 prefix blocks held once, plus one block of its own per request for the 8-token suffix.
  EngineStats st = engine->stats();
  EXPECT_EQ(st.used_blocks, 16 + 32);
  EXPECT_EQ(st.prefix_hit_tokens, 31 * 256);
  while (engine->StepOnce()) {
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    auto out = Drain(*streams[i]);
    EXPECT_EQ(out[0].tokens.size(), 4u);
    EXPECT_EQ(out[0].final_output.usage.cached_prompt_tokens, i == 0 ? 0 : 256);
    EXPECT_EQ(out[0].final_output.usage.peak_kv_blocks, 17);
  }
  ExpectPoolFree(*engine);
}

TEST_F(EngineTest, AbortFreesBlocksAtOnce) {
  EngineOptions o = Options();
  o.run_loop_thread = false;
  std::unique_ptr<Engine> engine = *Engine::Create(model_, o);
  std::vector<TokenId> prompt(100, 300);
  prompt[0] = 1;
  std::shared_ptr<RequestStream> s = *engine->Submit(Greedy("a", prompt, 200));
  ASSERT_TRUE(engine->StepOnce());
  ASSERT_TRUE(engine->StepOnce());
  EXPECT_GT(engine->stats().used_blocks, 0);
  engine->Abort("a");
  engine->StepOnce();
  EXPECT_EQ(engine->stats().used_blocks, 0);
  auto out = Drain(*s);
  EXPECT_TRUE(out[0].final_output.finished);
  EXPECT_TRUE(absl::IsCancelled(out[0].final_output.status)) << out[0].final_output.status;
  // The id can be reused once the request is gone.
  EXPECT_TRUE(engine->Submit(Greedy("a", prompt, 1)).ok());
  while (engine->StepOnce()) {
  }
  ExpectPoolFree(*engine);
}

TEST_F(EngineTest, SamplesShareThePromptAndMatchSingleRequests) {
  std::unique_ptr<Engine> engine = *Engine::Create(model_, Options());
  const std::vector<TokenId> prompt = {1, 403, 407, 261, 378, 432, 383};  // not block aligned
  EngineRequest r;
  r.request_id = "n3";
  r.prompt_ids = prompt;
  r.n = 3;
  r.params.temperature = 0.8f;
  r.params.seed = 1234;
  r.params.max_tokens = 30;
  r.params.ignore_eos = true;
  auto samples = Drain(**engine->Submit(r));
  ASSERT_EQ(samples.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EngineRequest single = r;
    single.request_id = absl::StrCat("single", i);
    single.n = 1;
    single.params.seed = 1234 + i;
    auto alone = Drain(**engine->Submit(single));
    EXPECT_EQ(samples[i].tokens, alone[0].tokens) << "sample " << i;
    EXPECT_EQ(samples[i].final_output.usage.completion_tokens, 30);
  }
  EXPECT_NE(samples[0].tokens, samples[1].tokens);
  ExpectPoolFree(*engine);
}

TEST_F(EngineTest, RejectsBadRequests) {
  EngineOptions o = Options();
  o.num_kv_blocks = 8;  // 7 usable blocks = 112 tokens
  std::unique_ptr<Engine> engine = *Engine::Create(model_, o);
  EXPECT_TRUE(absl::IsInvalidArgument(engine->Submit(Greedy("e", {}, 4)).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(engine->Submit(Greedy("v", {1, 512}, 4)).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(engine->Submit(Greedy("l", std::vector<TokenId>(512, 5), 4)).status()));
  absl::Status big = engine->Submit(Greedy("b", std::vector<TokenId>(200, 5), 4)).status();
  EXPECT_TRUE(absl::IsResourceExhausted(big)) << big;
  EXPECT_NE(big.message().find("KV blocks"), std::string::npos) << big;
  EngineRequest bad_n = Greedy("n", {1, 5}, 4);
  bad_n.n = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(engine->Submit(bad_n).status()));
  EngineRequest bad_p = Greedy("t", {1, 5}, 4);
  bad_p.params.top_p = 2.0f;
  absl::Status s = engine->Submit(bad_p).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("top_p"), std::string::npos) << s;
}

TEST_F(EngineTest, SlidingWindowReleasesBlocksAndKeepsOutputs) {
  // stories260K with a 32-token window: blocks wholly before the window are freed while the
  // sequence decodes, and the output does not depend on chunking or batching.
  LoadedModel windowed = *LoadModel(testing_golden::kStoriesGguf);
  windowed.weights->config.sliding_window = 32;
  std::vector<TokenId> prompt = {1, 403, 407, 261, 378};
  for (int i = 0; i < 35; ++i) prompt.push_back(3 + (i * 29) % 500);
  auto run = [&](int32_t budget, bool together) {
    EngineOptions o = Options();
    o.scheduler.max_num_batched_tokens = budget;
    std::unique_ptr<Engine> engine = *Engine::Create(&windowed, o);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int i = 0; i < (together ? 8 : 1); ++i) {
      streams.push_back(*engine->Submit(Greedy(absl::StrCat("s", i), prompt, 200)));
    }
    std::vector<Collected> out;
    for (auto& s : streams) out.push_back(Drain(*s)[0]);
    ExpectPoolFree(*engine);
    return out;
  };
  const std::vector<Collected> alone = run(2048, false);
  ASSERT_EQ(alone[0].tokens.size(), 200u);
  // 240 tokens would need 15 blocks; the window keeps at most 3 (prompt allocation aside).
  EXPECT_LE(alone[0].final_output.usage.peak_kv_blocks, 4);
  for (const Collected& c : run(8, true)) {
    EXPECT_EQ(c.tokens, alone[0].tokens);
    EXPECT_EQ(c.logprobs, alone[0].logprobs);
  }
  // The window changes the output compared with full attention over the same model.
  std::unique_ptr<Engine> full = *Engine::Create(model_, Options());
  EXPECT_NE(Drain(**full->Submit(Greedy("f", prompt, 200)))[0].tokens, alone[0].tokens);
}

/// golden.json's probe position (the last prompt token) computed with the KV cache in `dtype`:
/// positions 0..n-2 prefilled in one forward pass, the last token decoded in a second, so its
/// attention reads K/V that an earlier step wrote (and quantized) into the cache. Prefill reads
/// the cache too (RopeKvWrite stores K/V, then PagedAttention reads only the cache), so both
/// steps see the dtype's rounding.
std::vector<float> ProbeLogits(const LoadedModel& m, const std::vector<TokenId>& prompt,
                               KvCacheDType dtype) {
  cpu::ThreadPool pool(1);
  std::unique_ptr<LlamaModel> model = *LlamaModel::Create(m.weights.get(), &pool);
  constexpr int kBlockSize = 16;
  const int blocks = (m.config().max_position_embeddings + kBlockSize - 1) / kBlockSize;
  std::unique_ptr<KvCache> cache = *KvCache::Create(m.config(), blocks, kBlockSize, dtype);
  std::vector<int32_t> table(blocks);
  std::iota(table.rbegin(), table.rend(), 0);
  std::vector<float> logits(m.config().vocab_size);
  BatchBuilder builder;
  const std::span<const TokenId> ids(prompt);
  builder.AddSequence(ids.first(ids.size() - 1), 0, table, kBlockSize, true);
  EXPECT_TRUE(model->Forward(builder.Build(), *cache, logits.data()).ok());
  builder.Clear();
  builder.AddSequence(ids.last(1), static_cast<int32_t>(ids.size() - 1), table, kBlockSize, true);
  EXPECT_TRUE(model->Forward(builder.Build(), *cache, logits.data()).ok());
  return logits;
}

/// log p(id) under `logits` (log_softmax in double).
double LogProb(const std::vector<float>& logits, TokenId id) {
  const double top = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float x : logits) sum += std::exp(x - top);
  return logits[id] - top - std::log(sum);
}

TEST_F(EngineTest, QuantizedKvCacheDtypes) {
  // Each KV dtype against golden.json's logits probe (raw f32 logits of llama2.c at position 4 of
  // "Once upon a time", spanning -10 to 17.8): the largest |logit error| over the 512-token
  // vocabulary must stay under a per-dtype bound. A stored K/V element is off by at most half a
  // step of its format: f16 2^-12 and bf16 2^-9 of |x|; int8 0.5/127 of its head's largest |x|
  // (one scale per token and head); fp8 e4m3 (3 mantissa bits) 2^-5 of |x|. Through 5 layers of
  // attention that came to (CPU, every ISA path; f32 KV shows the model's own error):
  //   dtype  measured max |logit error|     bound  = measured x   in half-steps of the format
  //   f32    6.9e-6                         1e-4     (llama_model_test's f32 bound)
  //   f16    5.0e-3 (AVX-512), 5.6e-3       8e-3     1.4          33 x 2^-12
  //   bf16   4.3e-2                         5e-2     1.16         26 x 2^-9
  //   int8   0.24                           0.33     1.37         84 x 0.5/127
  //   fp8    0.44                           0.5      1.14         16 x 2^-5
  // (bf16 / f16 = 8.7 for a 2^3 finer step; fp8 gains from its scale putting the head's largest
  // element at 448.) The margins are small on purpose: the errors are deterministic, and a codec
  // that truncates instead of rounding to nearest even gives f16 1.0e-2, bf16 5.9e-2, int8 0.42,
  // fp8 0.55; a scale off by 2x about 5; swapped vector halves about 15; swapped bytes NaN (all
  // checked by breaking EncodeKvVector on purpose), each over its bound.
  const auto golden = testing_golden::LoadStoriesGolden();
  const std::vector<float>& want = golden.probe_logits;
  const TokenId want_top =
      static_cast<TokenId>(std::max_element(want.begin(), want.end()) - want.begin());
  const int64_t budget = int64_t{8} << 20;
  int64_t f32_blocks = 0;
  struct DTypeBound {
    KvCacheDType dtype;
    float max_logit_error;
  };
  for (const DTypeBound& b :
       {DTypeBound{KvCacheDType::kF32, 1e-4f}, DTypeBound{KvCacheDType::kF16, 8e-3f},
        DTypeBound{KvCacheDType::kBF16, 5e-2f}, DTypeBound{KvCacheDType::kInt8, 0.33f},
        DTypeBound{KvCacheDType::kFp8E4M3, 0.5f}}) {
    const KvCacheDType dtype = b.dtype;
    const std::string name(KvCacheDTypeName(dtype));
    const std::vector<float> got_logits = ProbeLogits(*model_, golden.probe_prompt_ids, dtype);
    ASSERT_EQ(got_logits.size(), want.size());
    float max_error = 0.0f;
    for (size_t i = 0; i < want.size(); ++i) {
      const float error = std::fabs(got_logits[i] - want[i]);
      max_error = std::max(max_error, std::isnan(error) ? HUGE_VALF : error);  // NaN fails
    }
    std::printf("kv dtype %-4s probe: max |logit error| %.3g (bound %.3g)\n", name.c_str(),
                max_error, b.max_logit_error);
    EXPECT_LE(max_error, b.max_logit_error) << name;

    EngineOptions o = Options();
    o.kv_cache_dtype = dtype;
    o.kv_cache_memory = budget;
    std::unique_ptr<Engine> engine = *Engine::Create(model_, o);
    if (dtype == KvCacheDType::kF32) f32_blocks = engine->num_kv_blocks();
    // The same budget holds more blocks of a narrower dtype: 4 bytes per element for f32,
    // 2 for f16/bf16, 1 + 4/head_dim for int8/fp8 (head_dim 8 here).
    const double expected_ratio = dtype == KvCacheDType::kF32   ? 1.0
                                  : dtype == KvCacheDType::kF16 ||
                                          dtype == KvCacheDType::kBF16
                                      ? 2.0
                                      : 32.0 / 12.0;
    EXPECT_NEAR(static_cast<double>(engine->num_kv_blocks()) / f32_blocks, expected_ratio, 0.01);
    // Through the engine: the probe prompt's first token is the probe's argmax, and its logprob
    // (log_softmax of the probe logits) is within 2x the logit bound of llama2.c's (a logprob
    // error is the logit's error minus that of the log-sum-exp, each at most the bound).
    EngineRequest probe = Greedy("probe", golden.probe_prompt_ids, 1);
    const Collected first = Drain(**engine->Submit(probe))[0];
    ASSERT_EQ(first.tokens.size(), 1u);
    EXPECT_EQ(first.tokens[0], want_top) << name;
    ASSERT_EQ(first.logprobs.size(), 1u);
    EXPECT_NEAR(first.logprobs[0], LogProb(want, want_top), 2 * b.max_logit_error) << name;
    // How many leading greedy tokens of each golden prompt survive (printed for the record):
    // f32 and f16 KV reproduce all of them; the narrower dtypes at least the first 8.
    for (const auto& c : golden.cases) {
      EngineRequest r = Greedy(c.prompt, c.prompt_ids, static_cast<int>(c.generated_ids.size()));
      const Collected got = Drain(**engine->Submit(r))[0];
      size_t match = 0;
      while (match < got.tokens.size() && got.tokens[match] == c.generated_ids[match]) ++match;
      std::printf("kv dtype %-4s prompt \"%s\": %zu of %zu leading tokens match f32\n",
                  name.c_str(), c.prompt.c_str(), match, c.generated_ids.size());
      if (dtype == KvCacheDType::kF32 || dtype == KvCacheDType::kF16) {
        EXPECT_EQ(match, c.generated_ids.size());
      } else {
        EXPECT_GE(match, 8u);
      }
    }
    ExpectPoolFree(*engine);
  }
}

TEST_F(EngineTest, TensorParallelRanksGiveTheGoldenTokens) {
  const auto golden = testing_golden::LoadStoriesGolden();
  for (int tp : {2, 4}) {
    EngineOptions o = Options();
    o.tensor_parallel_size = tp;
    o.num_threads = tp;
    std::unique_ptr<Engine> engine = *Engine::Create(model_, o);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const auto& c : golden.cases) {
      streams.push_back(*engine->Submit(
          Greedy(c.prompt, c.prompt_ids, static_cast<int>(c.generated_ids.size()))));
    }
    for (size_t i = 0; i < streams.size(); ++i) {
      EXPECT_EQ(Drain(*streams[i])[0].tokens, golden.cases[i].generated_ids) << "tp " << tp;
    }
    ExpectPoolFree(*engine);
  }
  EngineOptions bad = Options();
  bad.tensor_parallel_size = 3;  // 8 heads do not split over 3 ranks
  absl::Status s = Engine::Create(model_, bad).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
}

// A subscriber that stops reading costs at most kMaxPending batches: one push more and the queue
// collapses into "closed" (the worker's StreamKvEvents call then ends RESOURCE_EXHAUSTED and the
// router subscribes again for a fresh snapshot), dropping the backlog instead of delivering it.
TEST(KvEventStreamTest, AReaderThatFallsBehindIsClosedInsteadOfGrowingTheQueue) {
  KvEventStream stream;
  size_t notified = 0;
  stream.SetListener([&notified] { ++notified; });
  for (size_t i = 0; i < KvEventStream::kMaxPending; ++i) {
    ASSERT_TRUE(stream.Push(KvEventBatch{}));
  }
  EXPECT_FALSE(stream.closed());
  EXPECT_TRUE(stream.Push(KvEventBatch{}));  // one too many
  EXPECT_TRUE(stream.closed());
  KvEventBatch batch;
  EXPECT_FALSE(stream.TryNext(&batch));
  EXPECT_FALSE(stream.Next(&batch, std::chrono::milliseconds(0)));
  EXPECT_FALSE(stream.Push(KvEventBatch{}));            // the engine drops the subscription here
  EXPECT_EQ(notified, KvEventStream::kMaxPending + 1);  // the reader was woken to see the close
}

TEST_F(EngineTest, KvEventsReportCachedBlocks) {
  EngineOptions o = Options();
  o.run_loop_thread = false;
  std::unique_ptr<Engine> engine = *Engine::Create(model_, o);
  std::shared_ptr<KvEventStream> events = engine->SubscribeKvEvents();
  engine->StepOnce();
  KvEventBatch batch;
  ASSERT_TRUE(events->Next(&batch, std::chrono::milliseconds(0)));
  EXPECT_TRUE(batch.reset);
  EXPECT_TRUE(batch.events.empty());
  std::vector<TokenId> prompt = {1};
  for (int i = 1; i < 40; ++i) prompt.push_back(3 + i);
  std::shared_ptr<RequestStream> s = *engine->Submit(Greedy("k", prompt, 2));
  while (engine->StepOnce()) {
  }
  // The prompt's two full blocks are stored, with the keys the router computes.
  std::vector<BlockKey> stored;
  while (events->Next(&batch, std::chrono::milliseconds(0))) {
    EXPECT_FALSE(batch.reset);
    for (const KvEvent& e : batch.events) {
      if (e.type == KvEvent::Type::kStored) stored.push_back(e.key);
    }
  }
  const std::vector<BlockKey> expected = HashFullBlocks(prompt, 16, "");
  ASSERT_EQ(expected.size(), 2u);
  EXPECT_EQ(stored, expected);
  // A late subscriber gets them as a snapshot.
  std::shared_ptr<KvEventStream> late = engine->SubscribeKvEvents();
  engine->StepOnce();
  ASSERT_TRUE(late->Next(&batch, std::chrono::milliseconds(0)));
  EXPECT_TRUE(batch.reset);
  std::vector<BlockKey> snapshot;
  for (const KvEvent& e : batch.events) snapshot.push_back(e.key);
  EXPECT_EQ(snapshot, expected);
}

TEST_F(EngineTest, DrainRefusesNewRequestsAndFinishesRunningOnes) {
  std::unique_ptr<Engine> engine = *Engine::Create(model_, Options());
  std::shared_ptr<RequestStream> s = *engine->Submit(Greedy("d", {1, 403, 407}, 30));
  engine->Drain();
  EXPECT_TRUE(engine->draining());
  EXPECT_TRUE(absl::IsUnavailable(engine->Submit(Greedy("e", {1, 5}, 3)).status()));
  EXPECT_EQ(Drain(*s)[0].tokens.size(), 30u);
  EXPECT_TRUE(engine->idle());
}

TEST_F(EngineTest, RandomWorkloadKeepsInvariants) {
  // Random arrivals, lengths, samples and aborts on a small pool, stepped by hand; the engine
  // checks the pool after every step.
  EngineOptions o = Options();
  o.run_loop_thread = false;
  o.num_kv_blocks = 60;
  o.scheduler.max_num_batched_tokens = 80;
  o.scheduler.max_num_seqs = 12;
  std::unique_ptr<Engine> engine = *Engine::Create(model_, o);
  std::mt19937 rng(99);
  std::vector<std::pair<std::string, std::shared_ptr<RequestStream>>> live;
  int next = 0;
  for (int step = 0; step < 400; ++step) {
    if (rng() % 3 == 0) {
      std::vector<TokenId> prompt = {1};
      const int len = 1 + static_cast<int>(rng() % 120);
      for (int j = 0; j < len; ++j) prompt.push_back(3 + static_cast<TokenId>(rng() % (j < 20 ? 4 : 500)));
      EngineRequest r = Greedy(absl::StrCat("w", next++), prompt, 1 + static_cast<int>(rng() % 60));
      r.n = 1 + static_cast<int>(rng() % 3);
      r.params.temperature = 0.7f;
      r.params.seed = rng();
      auto s = engine->Submit(r);
      if (s.ok()) live.emplace_back(r.request_id, *s);
    }
    if (!live.empty() && rng() % 17 == 0) engine->Abort(live[rng() % live.size()].first);
    engine->StepOnce();
  }
  while (engine->StepOnce()) {
  }
  for (auto& [id, s] : live) {
    RequestOutput msg;
    while (s->TryNext(&msg)) {
    }
  }
  ExpectPoolFree(*engine);
  EXPECT_GT(engine->stats().num_preemptions, 0);
}

}  // namespace
}  // namespace kvserve
