#include "worker/engine/sampler.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/engine/logprobs.h"
#include "worker/engine/sampling_penalties.h"
#include "worker/engine/sampling_steps.h"

namespace kvserve {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

/// Portable pseudo-random logits in [-8, 8) (a 64-bit LCG, independent of the sampler's RNG).
std::vector<float> RandomLogits(size_t n, uint64_t seed) {
  std::vector<float> out(n);
  uint64_t state = seed * 2862933555777941757ull + 3037000493ull;
  for (float& x : out) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>(static_cast<double>(state >> 11) * 0x1.0p-53 * 16.0 - 8.0);
  }
  return out;
}

/// The reference argmax: first index holding the maximum.
TokenId ReferenceArgmax(const std::vector<float>& logits) {
  TokenId best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<TokenId>(i);
  }
  return best;
}

std::vector<float> LogOf(const std::vector<double>& probs) {
  std::vector<float> out;
  for (double p : probs) out.push_back(static_cast<float>(std::log(p)));
  return out;
}

Sampler MakeSampler(const SamplingParams& params, int32_t vocab) {
  absl::StatusOr<Sampler> sampler = Sampler::Create(params, vocab);
  EXPECT_TRUE(sampler.ok()) << sampler.status();
  return std::move(sampler).value();
}

TokenId SampleOne(Sampler& sampler, const std::vector<float>& logits) {
  absl::StatusOr<SampleResult> r = sampler.Sample(logits, {}, {});
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->token : kNoToken;
}

/// Counts how often each token is drawn in `n` samples.
std::vector<int> Histogram(Sampler& sampler, const std::vector<float>& logits, int n) {
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < n; ++i) ++counts[static_cast<size_t>(SampleOne(sampler, logits))];
  return counts;
}

/// Pearson's chi-square statistic of `counts` against `probs`.
double ChiSquare(const std::vector<int>& counts, const std::vector<double>& probs, int n) {
  double chi2 = 0.0;
  for (size_t i = 0; i < probs.size(); ++i) {
    const double expected = probs[i] * n;
    chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
  }
  return chi2;
}

// Critical value of chi-square with 4 degrees of freedom at p = 0.001. The seeds are fixed, so
// the tests cannot flake; the margin shows the draws follow the distribution.
constexpr double kChi2Crit4Dof = 18.47;
constexpr double kChi2Crit2Dof = 13.82;

TEST(SamplerTest, GreedyIsArgmaxWithTiesToLowestId) {
  SamplingParams params;
  params.temperature = 0.0f;
  Sampler sampler = MakeSampler(params, 5);
  EXPECT_EQ(SampleOne(sampler, {1.0f, 3.0f, 2.0f, 3.0f, -1.0f}), 1);
  EXPECT_EQ(SampleOne(sampler, {kNegInf, -5.0f, -5.0f, kNegInf, -7.0f}), 1);
  EXPECT_EQ(SampleOne(sampler, {4.0f, 4.0f, 4.0f, 4.0f, 4.0f}), 0);
}

TEST(SamplerTest, GreedyMatchesReferenceOnLargeVocab) {
  SamplingParams params;
  params.temperature = 0.0f;
  params.top_k = 5;  // Ignored when greedy, as in vLLM.
  constexpr int32_t kVocab = 128256;
  Sampler sampler = MakeSampler(params, kVocab);
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    const std::vector<float> logits = RandomLogits(kVocab, seed);
    EXPECT_EQ(SampleOne(sampler, logits), ReferenceArgmax(logits));
  }
}

TEST(SamplerTest, TemperatureToZeroApproachesGreedy) {
  const std::vector<float> logits = {0.0f, 2.5f, 1.0f, 2.4f, -3.0f};
  // T = 0.001: a non-argmax token has probability < exp(-100).
  SamplingParams params;
  params.temperature = 0.001f;
  params.seed = 7;
  Sampler sampler = MakeSampler(params, 5);
  for (int i = 0; i < 200; ++i) ASSERT_EQ(SampleOne(sampler, logits), 1);

  // The argmax's share grows as T shrinks: p(argmax) = 1 / (1 + e^{-0.1/T} + ...).
  int previous = 0;
  for (float t : {2.0f, 0.5f, 0.1f, 0.02f}) {
    params.temperature = t;
    Sampler s = MakeSampler(params, 5);
    const int top = Histogram(s, logits, 4000)[1];
    EXPECT_GT(top, previous) << "temperature " << t;
    previous = top;
  }
  EXPECT_GT(previous, 3900);

  // Below kGreedyTemperature the sampler is greedy (ties to the lowest id, no randomness).
  params.temperature = 1e-7f;
  Sampler greedy = MakeSampler(params, 5);
  EXPECT_EQ(SampleOne(greedy, {1.0f, 3.0f, 2.0f, 3.0f, -1.0f}), 1);
}

TEST(SamplerTest, SameSeedSameTokensDifferentSeedsDiffer) {
  constexpr int32_t kVocab = 1000;
  SamplingParams params;
  params.temperature = 1.3f;
  params.top_p = 0.95f;
  params.seed = 1234;
  Sampler a = MakeSampler(params, kVocab);
  Sampler b = MakeSampler(params, kVocab);
  params.seed = 1235;
  Sampler c = MakeSampler(params, kVocab);
  std::vector<TokenId> seq_a, seq_b, seq_c;
  for (uint64_t step = 0; step < 64; ++step) {
    const std::vector<float> logits = RandomLogits(kVocab, step);
    seq_a.push_back(SampleOne(a, logits));
    // Another request interleaved with `b` must not disturb it.
    SampleOne(c, logits);
    seq_b.push_back(SampleOne(b, logits));
  }
  EXPECT_EQ(seq_a, seq_b);
  Sampler d = MakeSampler(params, kVocab);  // seed 1235
  for (uint64_t step = 0; step < 64; ++step)
    seq_c.push_back(SampleOne(d, RandomLogits(kVocab, step)));
  EXPECT_NE(seq_a, seq_c);
  EXPECT_EQ(a.seed(), 1234u);
}

TEST(SamplerTest, UnseededRequestsGetDistinctSeeds) {
  SamplingParams params;
  Sampler a = MakeSampler(params, 10);
  Sampler b = MakeSampler(params, 10);
  EXPECT_NE(a.seed(), b.seed());
}

TEST(SamplerTest, UniformFromBitsIsExact) {
  EXPECT_EQ(Sampler::UniformFromBits(0), 0.0);
  EXPECT_EQ(Sampler::UniformFromBits(uint64_t{1} << 63), 0.5);
  EXPECT_EQ(Sampler::UniformFromBits(~uint64_t{0}), 1.0 - 0x1.0p-53);
  EXPECT_EQ(Sampler::UniformFromBits(uint64_t{0x7ff}), 0.0);  // Low 11 bits are dropped.
}

// The draw is the inverse CDF, in id order, of u = top 53 bits of the standard mt19937_64
// (whose output sequence the C++ standard fixes). The expected tokens come from that definition.
TEST(SamplerTest, DrawIsInverseCdfOfStandardEngine) {
  const std::vector<double> probs = {0.1, 0.2, 0.3, 0.4};
  SamplingParams params;
  params.seed = 99;
  Sampler sampler = MakeSampler(params, 4);
  std::mt19937_64 reference(99);
  for (int i = 0; i < 500; ++i) {
    const double u = static_cast<double>(reference() >> 11) * 0x1.0p-53;
    TokenId expected = 0;
    double cumulative = probs[0];
    while (u >= cumulative) cumulative += probs[static_cast<size_t>(++expected)];
    ASSERT_EQ(SampleOne(sampler, LogOf(probs)), expected) << "draw " << i << " u=" << u;
  }
}

TEST(SamplerTest, TopKOneIsGreedy) {
  constexpr int32_t kVocab = 5000;
  SamplingParams params;
  params.temperature = 1.7f;
  params.top_k = 1;
  params.seed = 5;
  Sampler sampler = MakeSampler(params, kVocab);
  for (uint64_t step = 0; step < 20; ++step) {
    const std::vector<float> logits = RandomLogits(kVocab, 100 + step);
    EXPECT_EQ(SampleOne(sampler, logits), ReferenceArgmax(logits));
  }
}

TEST(SamplerTest, TinyTopPIsGreedy) {
  constexpr int32_t kVocab = 5000;
  SamplingParams params;
  params.top_p = 1e-6f;
  params.seed = 6;
  Sampler sampler = MakeSampler(params, kVocab);
  for (uint64_t step = 0; step < 20; ++step) {
    const std::vector<float> logits = RandomLogits(kVocab, 200 + step);
    EXPECT_EQ(SampleOne(sampler, logits), ReferenceArgmax(logits));
  }
  Sampler small = MakeSampler(params, 4);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(SampleOne(small, {1.0f, 3.0f, 3.0f, 2.0f}), 1);
}

TEST(SamplerTest, MinPDropsUnlikelyTokens) {
  const std::vector<double> probs = {0.5, 0.3, 0.15, 0.05};
  SamplingParams params;
  params.min_p = 0.5f;  // Keeps p >= 0.25: tokens 0 and 1, renormalised to 5/8 and 3/8.
  params.seed = 11;
  Sampler sampler = MakeSampler(params, 4);
  const std::vector<int> counts = Histogram(sampler, LogOf(probs), 8000);
  EXPECT_EQ(counts[2], 0);
  EXPECT_EQ(counts[3], 0);
  EXPECT_LT(ChiSquare({counts[0], counts[1]}, {5.0 / 8, 3.0 / 8}, 8000), 10.83);  // 1 dof.

  params.min_p = 1.0f;  // Only the top token (and exact ties with it).
  Sampler top_only = MakeSampler(params, 4);
  EXPECT_EQ(Histogram(top_only, LogOf(probs), 200)[0], 200);
}

TEST(SamplerTest, TopKAndTopPKeepTheExpectedSets) {
  const std::vector<double> probs = {0.15, 0.5, 0.05, 0.3};
  SamplingParams params;
  params.seed = 12;
  params.top_k = 2;  // Tokens 1 and 3.
  Sampler top_k = MakeSampler(params, 4);
  std::vector<int> counts = Histogram(top_k, LogOf(probs), 8000);
  EXPECT_EQ(counts[0] + counts[2], 0);
  EXPECT_LT(ChiSquare({counts[1], counts[3]}, {5.0 / 8, 3.0 / 8}, 8000), 10.83);

  params.top_k = 0;
  params.top_p = 0.75f;  // Mass above token 3 is 0.5 < 0.75, above token 0 is 0.8: {1, 3}.
  Sampler top_p = MakeSampler(params, 4);
  counts = Histogram(top_p, LogOf(probs), 8000);
  EXPECT_EQ(counts[0] + counts[2], 0);
  EXPECT_LT(ChiSquare({counts[1], counts[3]}, {5.0 / 8, 3.0 / 8}, 8000), 10.83);

  params.top_p = 0.85f;  // Mass above token 0 is 0.8 < 0.85: {1, 3, 0}, renormalised by 0.95.
  Sampler wider = MakeSampler(params, 4);
  counts = Histogram(wider, LogOf(probs), 8000);
  EXPECT_EQ(counts[2], 0);
  EXPECT_LT(
      ChiSquare({counts[1], counts[3], counts[0]}, {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95}, 8000),
      kChi2Crit2Dof);
}

TEST(SamplerTest, TopPBoundaryIsStrictAndTiesGoToLowIds) {
  // Four equal tokens (exact 0.25 each), top_p = 0.5: the mass above token 2 is exactly 0.5,
  // which is not < 0.5, so only the two lowest ids survive.
  SamplingParams params;
  params.top_p = 0.5f;
  params.seed = 13;
  Sampler sampler = MakeSampler(params, 4);
  const std::vector<int> counts = Histogram(sampler, {0.0f, 0.0f, 0.0f, 0.0f}, 1000);
  EXPECT_EQ(counts[2] + counts[3], 0);
  EXPECT_GT(counts[0], 400);
  EXPECT_GT(counts[1], 400);
}

TEST(SamplerTest, EmpiricalDistributionMatches) {
  const std::vector<double> probs = {0.1, 0.2, 0.3, 0.25, 0.15};
  constexpr int kSamples = 20000;
  SamplingParams params;
  params.seed = 2024;
  Sampler plain = MakeSampler(params, 5);
  EXPECT_LT(ChiSquare(Histogram(plain, LogOf(probs), kSamples), probs, kSamples), kChi2Crit4Dof);

  // Logits scaled by 2 at temperature 2 give back the same distribution.
  std::vector<float> doubled = LogOf(probs);
  for (float& x : doubled) x *= 2.0f;
  params.temperature = 2.0f;
  params.seed = 2025;
  Sampler hot = MakeSampler(params, 5);
  EXPECT_LT(ChiSquare(Histogram(hot, doubled, kSamples), probs, kSamples), kChi2Crit4Dof);

  // And a sampler that draws uniformly would fail the same test.
  const std::vector<int> uniform(5, kSamples / 5);
  EXPECT_GT(ChiSquare(uniform, probs, kSamples), kChi2Crit4Dof);
}

TEST(SamplerTest, MaskedTokensAreNeverDrawn) {
  SamplingParams params;
  params.seed = 3;
  params.temperature = 5.0f;
  Sampler sampler = MakeSampler(params, 4);
  const std::vector<int> counts = Histogram(sampler, {0.0f, kNegInf, 0.0f, kNegInf}, 2000);
  EXPECT_EQ(counts[1] + counts[3], 0);
  EXPECT_GT(counts[0], 800);
  EXPECT_GT(counts[2], 800);
}

CandidateList Dense(const std::vector<float>& logits) {
  CandidateList list;
  for (size_t i = 0; i < logits.size(); ++i)
    list.items.push_back({static_cast<TokenId>(i), logits[i]});
  return list;
}

std::vector<float> Logits(const CandidateList& list) {
  std::vector<float> out;
  for (const Candidate& c : list.items) out.push_back(c.logit);
  return out;
}

// logits = [2, -1, 0.5, 3, -2], prompt = {0, 1}, output = {3, 3, 2}.
const std::vector<float> kPenaltyLogits = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f};
const std::vector<TokenId> kPrompt = {0, 1, 0};
const std::vector<TokenId> kOutput = {3, 3, 2};

std::vector<float> Penalised(const SamplingParams& params, std::span<const TokenId> prompt,
                             std::span<const TokenId> output) {
  PenaltyStep step(params, 5);
  EXPECT_TRUE(step.Sync(prompt, output).ok());
  CandidateList list = Dense(kPenaltyLogits);
  step.Apply(list);
  return Logits(list);
}

TEST(PenaltyTest, RepetitionPenaltyDividesPositiveMultipliesNegative) {
  SamplingParams params;
  params.repetition_penalty = 2.0f;
  // Prompt and output tokens, each once: 2/2, -1*2, 0.5/2, 3/2; token 4 unseen.
  EXPECT_EQ(Penalised(params, kPrompt, kOutput),
            (std::vector<float>{1.0f, -2.0f, 0.25f, 1.5f, -2.0f}));
  // A token in both prompt and output (here 3, twice) is penalised once, not per occurrence.
  const std::vector<TokenId> prompt = {3};
  EXPECT_EQ(Penalised(params, prompt, kOutput),
            (std::vector<float>{2.0f, -1.0f, 0.25f, 1.5f, -2.0f}));
}

TEST(PenaltyTest, PresencePenaltyOncePerOutputToken) {
  SamplingParams params;
  params.presence_penalty = 0.5f;
  // Output tokens 3 and 2 lose 0.5; prompt tokens are untouched.
  EXPECT_EQ(Penalised(params, kPrompt, kOutput),
            (std::vector<float>{2.0f, -1.0f, 0.0f, 2.5f, -2.0f}));
}

TEST(PenaltyTest, FrequencyPenaltyPerOccurrence) {
  SamplingParams params;
  params.frequency_penalty = 0.25f;
  // Token 3 twice: 3 - 0.5; token 2 once: 0.5 - 0.25.
  EXPECT_EQ(Penalised(params, kPrompt, kOutput),
            (std::vector<float>{2.0f, -1.0f, 0.25f, 2.5f, -2.0f}));
  params.frequency_penalty = -1.0f;  // Negative values encourage repetition.
  EXPECT_EQ(Penalised(params, kPrompt, kOutput),
            (std::vector<float>{2.0f, -1.0f, 1.5f, 5.0f, -2.0f}));
}

TEST(PenaltyTest, AllPenaltiesRepetitionFirst) {
  SamplingParams params;
  params.repetition_penalty = 2.0f;
  params.presence_penalty = 0.5f;
  params.frequency_penalty = 0.25f;
  // Token 3: 3/2 - 0.5 - 2*0.25 = 0.5. Token 2: 0.5/2 - 0.5 - 0.25 = -0.5.
  EXPECT_EQ(Penalised(params, kPrompt, kOutput),
            (std::vector<float>{1.0f, -2.0f, -0.5f, 0.5f, -2.0f}));
}

TEST(PenaltyTest, IncrementalSyncMatchesFreshHistory) {
  SamplingParams params;
  params.repetition_penalty = 1.5f;
  params.frequency_penalty = 0.5f;
  PenaltyStep step(params, 5);
  const std::vector<TokenId> output = {4, 3, 3, 2, 4, 4};
  for (size_t n = 0; n <= output.size(); ++n) {
    ASSERT_TRUE(step.Sync(kPrompt, std::span(output).first(n)).ok());
  }
  // Shrink (rejected speculative tokens) and diverge: must rebuild.
  const std::vector<TokenId> other = {4, 3, 1};
  ASSERT_TRUE(step.Sync(kPrompt, other).ok());
  CandidateList list = Dense(kPenaltyLogits);
  step.Apply(list);
  EXPECT_EQ(Logits(list), Penalised(params, kPrompt, other));
  // Same length, different last token: also rebuilt.
  const std::vector<TokenId> replaced = {4, 3, 0};
  ASSERT_TRUE(step.Sync(kPrompt, replaced).ok());
  list = Dense(kPenaltyLogits);
  step.Apply(list);
  EXPECT_EQ(Logits(list), Penalised(params, kPrompt, replaced));
}

TEST(PenaltyTest, OutOfVocabIdsAreRejected) {
  SamplingParams params;
  params.repetition_penalty = 1.2f;
  PenaltyStep step(params, 5);
  const std::vector<TokenId> bad_prompt = {0, 5};
  absl::Status s = step.Sync(bad_prompt, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("prompt_ids[1] = 5"), std::string::npos) << s;
  const std::vector<TokenId> bad_output = {1, -3};
  s = step.Sync(kPrompt, bad_output);
  EXPECT_NE(s.message().find("output_ids[1] = -3"), std::string::npos) << s;
}

TEST(SamplerTest, PenaltiesChangeTheGreedyChoice) {
  SamplingParams params;
  params.temperature = 0.0f;
  params.presence_penalty = 0.2f;
  Sampler sampler = MakeSampler(params, 3);
  const std::vector<float> logits = {2.0f, 1.9f, 0.0f};
  const std::vector<TokenId> output = {0};
  absl::StatusOr<SampleResult> r = sampler.Sample(logits, {}, output);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->token, 1);
}

/// log_softmax in long double, straight from the definition.
long double RefLogprob(const std::vector<float>& logits, size_t i) {
  long double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<long double>(x));
  return static_cast<long double>(logits[i]) - std::log(sum);
}

TEST(LogprobsTest, RawLogSoftmaxAndTopN) {
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f, 0.5f, 2.0f};
  SamplingParams params;
  params.temperature = 0.0f;
  params.logprobs = 3;
  Sampler sampler = MakeSampler(params, 5);
  absl::StatusOr<SampleResult> r = sampler.Sample(logits, {}, {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->token, 2);
  ASSERT_TRUE(r->logprob.has_value());
  EXPECT_NEAR(*r->logprob, RefLogprob(logits, 2), 1e-6);
  ASSERT_EQ(r->top_logprobs.size(), 3u);
  // Descending, and the tie between ids 1 and 4 goes to the lower id.
  const std::array<TokenId, 3> ids = {2, 1, 4};
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(r->top_logprobs[k].id, ids[k]);
    EXPECT_NEAR(r->top_logprobs[k].logprob, RefLogprob(logits, static_cast<size_t>(ids[k])), 1e-6);
  }
}

TEST(LogprobsTest, ZeroAlternativesStillGivesChosenLogprob) {
  SamplingParams params;
  params.logprobs = 0;
  params.seed = 1;
  Sampler sampler = MakeSampler(params, 3);
  const std::vector<float> logits = {0.0f, 0.0f, 0.0f};
  absl::StatusOr<SampleResult> r = sampler.Sample(logits, {}, {});
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(*r->logprob, -std::log(3.0), 1e-6);
  EXPECT_TRUE(r->top_logprobs.empty());

  params.logprobs = -1;
  Sampler none = MakeSampler(params, 3);
  r = none.Sample(logits, {}, {});
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->logprob.has_value());
}

TEST(LogprobsTest, AreOfRawLogitsNotPenalisedOrTempered) {
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f};
  SamplingParams params;
  params.temperature = 0.3f;
  params.repetition_penalty = 3.0f;
  params.logprobs = 1;
  params.seed = 8;
  Sampler sampler = MakeSampler(params, 3);
  const std::vector<TokenId> prompt = {2};
  absl::StatusOr<SampleResult> r = sampler.Sample(logits, prompt, {});
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(*r->logprob, RefLogprob(logits, static_cast<size_t>(r->token)), 1e-6);
  EXPECT_EQ(r->top_logprobs[0].id, 2);
  EXPECT_NEAR(r->top_logprobs[0].logprob, RefLogprob(logits, 2), 1e-6);
}

TEST(LogprobsTest, StableForHugeLogitsAndMaskedTokens) {
  const std::vector<float> logits = {1000.0f, 999.0f, kNegInf};
  const LogSoftmax log_softmax(logits);
  EXPECT_NEAR(log_softmax.LogprobOf(0), -std::log1p(std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(log_softmax.LogprobOf(1), -1.0 - std::log1p(std::exp(-1.0)), 1e-6);
  EXPECT_EQ(log_softmax.LogprobOf(2), kNegInf);
  const std::vector<TokenLogprob> all = log_softmax.Top(10);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[2].id, 2);
}

TEST(LogprobsTest, TopNOnLargeVocabMatchesFullSort) {
  const std::vector<float> logits = RandomLogits(128256, 77);
  std::vector<TokenId> order(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<TokenId>(i);
  std::stable_sort(order.begin(), order.end(), [&](TokenId a, TokenId b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)];
  });
  const std::vector<TokenLogprob> top = LogSoftmax(logits).Top(kMaxLogprobs);
  ASSERT_EQ(top.size(), static_cast<size_t>(kMaxLogprobs));
  for (size_t k = 0; k < top.size(); ++k) EXPECT_EQ(top[k].id, order[k]) << k;
}

TEST(SamplerTest, RejectsBadLogits) {
  SamplingParams params;
  params.seed = 1;
  Sampler sampler = MakeSampler(params, 3);
  EXPECT_EQ(sampler.Sample(std::vector<float>{1.0f, 2.0f}, {}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status nan =
      sampler.Sample(std::vector<float>{1.0f, std::nanf(""), 0.0f}, {}, {}).status();
  EXPECT_NE(nan.message().find("logits[1]"), std::string::npos) << nan;
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(sampler.Sample(std::vector<float>{1.0f, 0.0f, inf}, {}, {}).ok());
  const absl::Status masked =
      sampler.Sample(std::vector<float>{kNegInf, kNegInf, kNegInf}, {}, {}).status();
  EXPECT_NE(masked.message().find("-inf"), std::string::npos) << masked;
}

TEST(SamplerTest, GreedyFindsTheFirstMaximumAndBadValuesAnywhere) {
  // The logits check runs in 16-lane blocks plus a scalar tail: put ties, the maximum and bad
  // values in lanes, across blocks and in the tail of an odd-sized vocabulary.
  constexpr int32_t kVocab = 16 * 7 + 5;
  SamplingParams params;
  params.temperature = 0;
  Sampler sampler = MakeSampler(params, kVocab);
  for (int32_t at : {0, 1, 15, 16, 17, 50, 111, 112, kVocab - 1}) {
    std::vector<float> logits = RandomLogits(kVocab, static_cast<uint64_t>(at) + 5);
    logits[static_cast<size_t>(at)] = 20.0f;
    if (at + 3 < kVocab) logits[static_cast<size_t>(at) + 3] = 20.0f;  // a later tie loses
    absl::StatusOr<SampleResult> r = sampler.Sample(logits, {}, {});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->token, at);
    EXPECT_EQ(r->token, ReferenceArgmax(logits));
    for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
      std::vector<float> broken = logits;
      broken[static_cast<size_t>(kVocab - 1 - at)] = bad;
      const absl::Status s = sampler.Sample(broken, {}, {}).status();
      EXPECT_NE(s.message().find(absl::StrCat("logits[", kVocab - 1 - at, "]")),
                std::string::npos)
          << s;
    }
  }
}

TEST(SamplerTest, PlainTemperatureDrawsWhatTheCandidatePathDraws) {
  // Temperature alone skips the candidate list (Sampler::DrawPlain). A min_p so small that it
  // removes nothing sends the same request down the candidate path: every token must agree.
  constexpr int32_t kVocab = 50257;
  for (float temperature : {1.0f, 0.7f, 1.9f}) {
    SamplingParams params;
    params.temperature = temperature;
    params.seed = 77;
    Sampler plain = MakeSampler(params, kVocab);
    params.min_p = 1e-30f;
    Sampler listed = MakeSampler(params, kVocab);
    for (uint64_t step = 0; step < 200; ++step) {
      std::vector<float> logits = RandomLogits(kVocab, 300 + step);
      logits[step * 97 % kVocab] = -std::numeric_limits<float>::infinity();  // masked
      EXPECT_EQ(SampleOne(plain, logits), SampleOne(listed, logits))
          << "temperature " << temperature << ", step " << step;
    }
  }
}

TEST(SamplerTest, CreateValidatesParams) {
  SamplingParams params;
  params.top_p = 1.5f;
  const absl::StatusOr<Sampler> sampler = Sampler::Create(params, 10);
  EXPECT_EQ(sampler.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(sampler.status().message().find("top_p"), std::string::npos);
}

TEST(SamplerTest, LargeVocabFullPipelineStaysInTopK) {
  constexpr int32_t kVocab = 128256;
  SamplingParams params;
  params.temperature = 0.8f;
  params.top_k = 40;
  params.top_p = 0.9f;
  params.min_p = 0.01f;
  params.repetition_penalty = 1.1f;
  params.seed = 42;
  Sampler sampler = MakeSampler(params, kVocab);
  std::vector<TokenId> output;
  for (uint64_t step = 0; step < 30; ++step) {
    const std::vector<float> logits = RandomLogits(kVocab, 300 + step);
    std::vector<float> sorted = logits;
    std::nth_element(sorted.begin(), sorted.begin() + 70, sorted.end(), std::greater<float>());
    absl::StatusOr<SampleResult> r = sampler.Sample(logits, {}, output);
    ASSERT_TRUE(r.ok()) << r.status();
    // Penalised tokens only move down, so the choice is within the raw top 40 + 30 seen ones
    // (rank < 70);
    // a loose bound that still catches sampling from the whole vocabulary.
    EXPECT_GE(logits[static_cast<size_t>(r->token)], sorted[70]);
    output.push_back(r->token);
  }
}

}  // namespace
}  // namespace kvserve
