#ifndef KVSERVE_TESTS_WORKER_ENGINE_ENGINE_TEST_UTIL_H_
#define KVSERVE_TESTS_WORKER_ENGINE_ENGINE_TEST_UTIL_H_

// What the engine tests (CPU: engine_test; CUDA and the CUDA simulator: cuda_engine_test) share:
// draining a request's stream, greedy requests, and the mixed workload of 64 requests.

#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/worker/model/golden.h"
#include "worker/engine/engine.h"

namespace kvserve::testing_engine {

struct Collected {
  std::vector<TokenId> tokens;
  std::vector<float> logprobs;  // chosen token's logprob per step: a fingerprint of the logits
  std::string text;
  RequestOutput final_output;
};

/// Reads a stream to its end, by sample index.
inline std::map<int, Collected> Drain(RequestStream& stream) {
  std::map<int, Collected> out;
  RequestOutput msg;
  while (stream.Next(&msg)) {
    Collected& c = out[msg.sample_index];
    c.tokens.insert(c.tokens.end(), msg.token_ids.begin(), msg.token_ids.end());
    for (const SampleResult& lp : msg.logprobs) c.logprobs.push_back(lp.logprob.value_or(0));
    c.text += msg.text;
    if (msg.finished) c.final_output = msg;
  }
  return out;
}

/// Options for the tiny synthetic models of the model-family tests: 2 threads, invariants
/// checked, a 4 MiB KV pool.
inline EngineOptions SmallModelOptions() {
  EngineOptions o;
  o.num_threads = 2;
  o.check_invariants = true;
  o.kv_cache_memory = int64_t{4} << 20;
  return o;
}

/// Runs `r` alone on a fresh engine over `m` and collects its first sample.
inline Collected RunAlone(const LoadedModel& m, const EngineRequest& r,
                          const EngineOptions& o = SmallModelOptions()) {
  std::unique_ptr<Engine> engine = *Engine::Create(&m, o);
  return Drain(**engine->Submit(r))[0];
}

/// A greedy request of max_tokens tokens that ignores EOS and returns the chosen logprobs.
inline EngineRequest Greedy(std::string id, std::vector<TokenId> prompt, int max_tokens) {
  EngineRequest r;
  r.request_id = std::move(id);
  r.prompt_ids = std::move(prompt);
  r.params.temperature = 0;
  r.params.max_tokens = max_tokens;
  r.params.logprobs = 0;
  r.params.ignore_eos = true;
  return r;
}

/// 64 requests of mixed lengths; groups of them share prefixes of 0, 40 or 130 tokens. Each
/// generates 4 to 4 + max_extra_tokens - 1 tokens.
inline std::vector<EngineRequest> MixedWorkload(int max_extra_tokens = 40) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<TokenId> tok(3, 511);
  std::vector<std::vector<TokenId>> prefixes(3);
  for (int len : {40, 130}) {
    std::vector<TokenId> p = {1};
    while (static_cast<int>(p.size()) < len) p.push_back(tok(rng));
    prefixes[len == 40 ? 1 : 2] = p;
  }
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 64; ++i) {
    std::vector<TokenId> prompt = prefixes[i % 3];
    if (prompt.empty()) prompt.push_back(1);
    const int extra = 1 + static_cast<int>(rng() % 150);
    for (int j = 0; j < extra; ++j) prompt.push_back(tok(rng));
    requests.push_back(
        Greedy(absl::StrCat("r", i), prompt, 4 + static_cast<int>(rng() % max_extra_tokens)));
  }
  return requests;
}

/// `num_prefixes` "system prompts" of 70 tokens (4 full blocks of 16), asked `rounds` times
/// each with its own 5 to 5 + num_prefixes - 1 token question, prefix by prefix and round after
/// round: with a small KV pool, the later rounds find their prefix dropped by the device pool.
inline std::vector<EngineRequest> SharedPrefixRounds(int num_prefixes, int rounds = 2) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<TokenId> tok(3, 500);
  std::vector<std::vector<TokenId>> prefixes(static_cast<size_t>(num_prefixes));
  for (auto& p : prefixes) {
    p = {1};
    while (p.size() < 70) p.push_back(tok(rng));
  }
  std::vector<EngineRequest> requests;
  for (int round = 0; round < rounds; ++round) {
    for (int i = 0; i < num_prefixes; ++i) {
      std::vector<TokenId> prompt = prefixes[static_cast<size_t>(i)];
      for (int j = 0; j < 5 + i; ++j) prompt.push_back(tok(rng));
      requests.push_back(Greedy(absl::StrCat("r", round, "-", i), prompt, 6 + i % 3));
    }
  }
  return requests;
}

/// Runs the requests one after another on `engine` (each finds what the earlier ones left).
inline std::vector<Collected> RunInTurn(Engine& engine, const std::vector<EngineRequest>& requests) {
  std::vector<Collected> out;
  for (const EngineRequest& r : requests) out.push_back(Drain(**engine.Submit(r))[0]);
  return out;
}

/// A test fixture holding stories260K (GGUF), loaded once per test suite.
class StoriesModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new LoadedModel(*LoadModel(testing_golden::kStoriesGguf));
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  static inline LoadedModel* model_ = nullptr;
};

/// Every block back in the pool, and no invariant broken on the way.
inline void ExpectPoolFree(const Engine& engine) {
  const EngineStats st = engine.stats();
  EXPECT_EQ(st.used_blocks, 0);
  EXPECT_EQ(st.invariant_violations, 0) << st.first_violation;
}

/// The determinism contract for one model: `a` decodes the tokens `alone` holds (its run alone
/// under `base`) when batched with `others`, and with the prompt prefilled in chunks of 8 tokens,
/// both bit for bit; over two tensor-parallel ranks the same tokens, with logprobs within 1e-4
/// (the all-reduce sums partial projections).
inline void ExpectSameBatchedChunkedAndTp(const LoadedModel& m, const EngineRequest& a,
                                          const std::vector<EngineRequest>& others,
                                          const Collected& alone, const EngineOptions& base) {
  {
    std::unique_ptr<Engine> engine = *Engine::Create(&m, base);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (size_t i = 0; i < others.size(); ++i) {
      streams.push_back(*engine->Submit(others[i]));
      if (i == 0) streams.push_back(*engine->Submit(a));  // a between the others
    }
    if (others.empty()) streams.push_back(*engine->Submit(a));
    const Collected batched = Drain(*streams[others.empty() ? 0 : 1])[0];
    for (auto& stream : streams) Drain(*stream);
    EXPECT_EQ(batched.tokens, alone.tokens) << "batched";
    EXPECT_EQ(batched.logprobs, alone.logprobs) << "batched";
    ExpectPoolFree(*engine);
  }
  {
    EngineOptions o = base;
    o.scheduler.max_num_batched_tokens = 8;
    const Collected chunked = RunAlone(m, a, o);
    EXPECT_EQ(chunked.tokens, alone.tokens) << "chunked";
    EXPECT_EQ(chunked.logprobs, alone.logprobs) << "chunked";
  }
  {
    EngineOptions o = base;
    o.tensor_parallel_size = 2;
    const Collected tp = RunAlone(m, a, o);
    EXPECT_EQ(tp.tokens, alone.tokens) << "tp 2";
    ASSERT_EQ(tp.logprobs.size(), alone.logprobs.size());
    for (size_t i = 0; i < tp.logprobs.size(); ++i) {
      EXPECT_NEAR(tp.logprobs[i], alone.logprobs[i], 1e-4) << "tp 2, token " << i;
    }
  }
}

/// The model-family tests' check of the contract above: request "a" (a 29-token prompt, 12
/// tokens) alone, then beside two others (9 and 17 tokens, each changed at one position, 20 and
/// 6 tokens), chunked and over two ranks. `prompt(n)` makes an n-token prompt in the model's
/// vocabulary.
inline void ExpectFamilyBatchInvariance(const LoadedModel& m,
                                        const std::function<std::vector<TokenId>(int)>& prompt) {
  const EngineRequest a = Greedy("a", prompt(29), 12);
  EngineRequest b = Greedy("b", prompt(9), 20);
  b.prompt_ids[3] = 77;
  EngineRequest c = Greedy("c", prompt(17), 6);
  c.prompt_ids[5] = 401;
  const Collected alone = RunAlone(m, a);
  ASSERT_EQ(alone.tokens.size(), 12u);
  ExpectSameBatchedChunkedAndTp(m, a, {b, c}, alone, SmallModelOptions());
}

/// Twelve greedy requests sharing a 40-token prefix in a pool of 24 blocks of 16 (too small for
/// all of them): the engine hits the prefix cache, preempts, and every request still gets the
/// tokens and log-probabilities it has alone, bit for bit. `prompt(n)` as above.
inline void ExpectPrefixSharingAndPreemptionKeepTheTokens(
    const LoadedModel& m, const std::function<std::vector<TokenId>(int)>& prompt) {
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 12; ++i) {
    std::vector<TokenId> p = prompt(40 + i % 3);
    p.back() = static_cast<TokenId>(100 + i);
    requests.push_back(Greedy(absl::StrCat("r", i), p, 16 + i % 4));
  }
  std::vector<Collected> alone;
  for (const EngineRequest& r : requests) alone.push_back(RunAlone(m, r));
  EngineOptions o = SmallModelOptions();
  o.kv_cache_memory = 0;
  o.num_kv_blocks = 24;
  o.block_size = 16;
  std::unique_ptr<Engine> engine = *Engine::Create(&m, o);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const EngineRequest& r : requests) streams.push_back(*engine->Submit(r));
  for (size_t i = 0; i < requests.size(); ++i) {
    const Collected got = Drain(*streams[i])[0];
    EXPECT_EQ(got.tokens, alone[i].tokens) << i;
    EXPECT_EQ(got.logprobs, alone[i].logprobs) << i;
  }
  const EngineStats st = engine->stats();
  EXPECT_GT(st.prefix_hit_tokens, 0);
  EXPECT_GT(st.num_preemptions, 0);
  ExpectPoolFree(*engine);
}

}  // namespace kvserve::testing_engine

#endif  // KVSERVE_TESTS_WORKER_ENGINE_ENGINE_TEST_UTIL_H_
