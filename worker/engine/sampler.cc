#include "worker/engine/sampler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <utility>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

uint64_t RandomSeed() {
  // random_device may throw where no entropy source exists; fall back to the clock there.
  try {
    std::random_device device;
    return (static_cast<uint64_t>(device()) << 32) ^ static_cast<uint64_t>(device());
  } catch (...) {
    return static_cast<uint64_t>(
        std::chrono::high_resolution_clock::now().time_since_epoch().count());
  }
}

/// Checks the logits and returns the index of the largest (lowest index on ties).
///
/// Two passes (this runs over every vocabulary entry of every sequence of every step): the first
/// keeps 16 independent running maxima (SSE2) and an "any NaN or +inf" flag, without an early
/// exit; the second finds the first index holding the maximum. A bad value is located (and
/// named) only when the flag says there is one.
absl::StatusOr<size_t> CheckLogits(std::span<const float> logits, int32_t vocab_size) {
  if (logits.size() != static_cast<size_t>(vocab_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("logits has ", logits.size(), " entries, expected vocab_size ", vocab_size));
  }
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const float* p = logits.data();
  const size_t n = logits.size();
  float max = -kInf;
  bool bad = false;
  size_t i = 0;
#if defined(__SSE2__)
  // Four 4-lane running maxima and a "not below +inf" mask (NaN compares false): no branch, no
  // dependency between lanes.
  const __m128 inf = _mm_set1_ps(kInf);
  __m128 m[4] = {_mm_set1_ps(-kInf), _mm_set1_ps(-kInf), _mm_set1_ps(-kInf), _mm_set1_ps(-kInf)};
  __m128 below = _mm_castsi128_ps(_mm_set1_epi32(-1));
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 4; ++j) {
      const __m128 x = _mm_loadu_ps(p + i + 4 * j);
      below = _mm_and_ps(below, _mm_cmplt_ps(x, inf));
      m[j] = _mm_max_ps(x, m[j]);  // x > m ? x : m
    }
  }
  bad = _mm_movemask_ps(below) != 0xf;
  alignas(16) float lanes[16];
  for (int j = 0; j < 4; ++j) _mm_store_ps(lanes + 4 * j, m[j]);
  for (float v : lanes) max = v > max ? v : max;
#endif
  for (; i < n; ++i) {
    bad |= !(p[i] < kInf);
    max = p[i] > max ? p[i] : max;
  }
  if (bad) {
    for (size_t k = 0; k < n; ++k) {
      if (!(p[k] < kInf)) {
        return absl::InvalidArgumentError(absl::StrCat("logits[", k, "] is ", p[k]));
      }
    }
  }
  if (max == -kInf) {
    return absl::InvalidArgumentError("logits are all -inf: every token is masked");
  }
  return static_cast<size_t>(std::find(p, p + n, max) - p);
}

TokenId Argmax(const CandidateList& candidates) {
  const Candidate* best = &candidates.items.front();
  for (const Candidate& c : candidates.items) {
    if (RanksBefore(c, *best)) best = &c;
  }
  return best->id;
}

}  // namespace

// Cody-Waite reduction x = k ln2 + r, |r| <= ln2 / 2 (ln2 split in a part exact in float and a
// correction), a degree-6 minimax polynomial for exp(r), and 2^k put into the exponent bits.
// Anything below -87.3 (where exp leaves the normal floats) is 0, so masked (-inf) candidates
// weigh exactly nothing. SSE2, four at a time: libm's double exp over a 50k vocabulary for every
// sampled sequence was most of a step's sampling time.
void ExpOfNonPositive(float* x, size_t n) {
  constexpr float kLowest = -87.33654f;  // log(FLT_MIN)
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;   // exact in float: k * kLn2Hi has no rounding error
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f,
                  kP3 = 4.1665795894e-2f, kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;
  size_t i = 0;
#if defined(__SSE2__)
  for (; i + 4 <= n; i += 4) {
    const __m128 v = _mm_loadu_ps(x + i);
    const __m128 keep = _mm_cmpge_ps(v, _mm_set1_ps(kLowest));  // false for -inf too
    const __m128 xv = _mm_max_ps(v, _mm_set1_ps(kLowest));
    // k = round(x / ln2), by floor(x * log2e + 0.5) (truncation of a negative value, fixed up).
    const __m128 t = _mm_add_ps(_mm_mul_ps(xv, _mm_set1_ps(kLog2e)), _mm_set1_ps(0.5f));
    __m128 k = _mm_cvtepi32_ps(_mm_cvttps_epi32(t));
    k = _mm_sub_ps(k, _mm_and_ps(_mm_cmpgt_ps(k, t), _mm_set1_ps(1.0f)));
    __m128 r = _mm_sub_ps(xv, _mm_mul_ps(k, _mm_set1_ps(kLn2Hi)));
    r = _mm_sub_ps(r, _mm_mul_ps(k, _mm_set1_ps(kLn2Lo)));
    __m128 y = _mm_set1_ps(kP0);
    for (float c : {kP1, kP2, kP3, kP4, kP5}) y = _mm_add_ps(_mm_mul_ps(y, r), _mm_set1_ps(c));
    y = _mm_add_ps(_mm_add_ps(_mm_mul_ps(y, _mm_mul_ps(r, r)), r), _mm_set1_ps(1.0f));
    const __m128i e = _mm_slli_epi32(_mm_add_epi32(_mm_cvtps_epi32(k), _mm_set1_epi32(127)), 23);
    _mm_storeu_ps(x + i, _mm_and_ps(keep, _mm_mul_ps(y, _mm_castsi128_ps(e))));
  }
#endif
  for (; i < n; ++i) x[i] = x[i] >= kLowest ? std::exp(x[i]) : 0.0f;
}

double Sampler::UniformFromBits(uint64_t bits) {
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

absl::StatusOr<Sampler> Sampler::Create(const SamplingParams& params, int32_t vocab_size) {
  if (absl::Status s = params.Validate(vocab_size); !s.ok()) return s;
  return Sampler(params, vocab_size, params.seed.has_value() ? *params.seed : RandomSeed());
}

Sampler::Sampler(const SamplingParams& params, int32_t vocab_size, uint64_t seed)
    : vocab_size_(vocab_size),
      greedy_(params.IsGreedy()),
      logprobs_(params.logprobs),
      seed_(seed),
      rng_(seed) {
  if (PenaltyStep::Needed(params)) penalties_ = std::make_unique<PenaltyStep>(params, vocab_size);
  if (!greedy_) steps_ = BuildSamplingSteps(params);
  plain_ = !greedy_ && penalties_ == nullptr &&
           std::all_of(steps_.begin(), steps_.end(), [](const auto& step) {
             return step->name() == "temperature";
           });
  temperature_ = params.temperature;
}

absl::StatusOr<SampleResult> Sampler::Sample(std::span<const float> logits,
                                             std::span<const TokenId> prompt_ids,
                                             std::span<const TokenId> output_ids) {
  absl::StatusOr<size_t> raw_argmax = CheckLogits(logits, vocab_size_);
  if (!raw_argmax.ok()) return raw_argmax.status();

  SampleResult result;
  if (greedy_ && penalties_ == nullptr) {
    // The common greedy path needs no copy of the logits.
    result.token = static_cast<TokenId>(*raw_argmax);
  } else if (plain_) {
    result.token = DrawPlain(logits, logits[*raw_argmax]);
  } else {
    std::vector<Candidate>& items = candidates_.items;
    items.resize(logits.size());
    for (size_t i = 0; i < logits.size(); ++i) items[i] = {static_cast<TokenId>(i), logits[i]};
    candidates_.sorted = false;
    if (penalties_ != nullptr) {
      if (absl::Status s = penalties_->Sync(prompt_ids, output_ids); !s.ok()) return s;
      penalties_->Apply(candidates_);
    }
    if (greedy_) {
      result.token = Argmax(candidates_);
    } else {
      for (const std::unique_ptr<SamplingStep>& step : steps_) step->Apply(candidates_);
      result.token = Draw(candidates_);
    }
  }

  if (logprobs_ >= 0) {
    const LogSoftmax log_softmax(logits);
    result.logprob = log_softmax.LogprobOf(result.token);
    result.top_logprobs = log_softmax.Top(logprobs_);
  }
  return result;
}

TokenId Sampler::Draw(const CandidateList& candidates) {
  const std::vector<Candidate>& items = candidates.items;
  const float max_logit = MaxLogit(candidates);
  weights_.resize(items.size());
  for (size_t i = 0; i < items.size(); ++i) weights_[i] = items[i].logit - max_logit;
  ExpOfNonPositive(weights_.data(), weights_.size());
  return items[PickByWeight(UniformFromBits(rng_()))].id;
}

TokenId Sampler::DrawPlain(std::span<const float> logits, float max_logit) {
  // The temperature step's arithmetic, (logit - max) / temperature, then Draw's: the largest is
  // exactly 0 after it, so Draw would subtract 0. Same weights, same token.
  weights_.resize(logits.size());
  const float t = temperature_;
  for (size_t i = 0; i < logits.size(); ++i) weights_[i] = (logits[i] - max_logit) / t;
  ExpOfNonPositive(weights_.data(), weights_.size());
  return static_cast<TokenId>(PickByWeight(UniformFromBits(rng_())));
}

size_t Sampler::PickByWeight(double u) {
  // Inverse CDF: the first index whose cumulative weight exceeds u * total. Sums are in double,
  // per block of kBlock weights (independent chains the CPU overlaps) and then over the blocks,
  // instead of one 50k-long chain of dependent additions. The search walks the block sums and
  // then one block, repeating total's additions in the same order, so the running sum reaches
  // total exactly and some index is always picked; a zero weight (-inf logit) never is, since
  // the test is strict.
  constexpr size_t kBlock = 16;
  const size_t n = weights_.size();
  const size_t blocks = (n + kBlock - 1) / kBlock;
  block_sums_.resize(blocks);
  for (size_t b = 0; b < blocks; ++b) {
    double sum = 0.0;
    for (size_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) sum += weights_[i];
    block_sums_[b] = sum;
  }
  double total = 0.0;
  for (double s : block_sums_) total += s;
  const double target = u * total;
  double before = 0.0;
  for (size_t b = 0; b < blocks; ++b) {
    if (before + block_sums_[b] > target) {
      double run = 0.0;
      for (size_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) {
        run += weights_[i];
        if (before + run > target) return i;
      }
    }
    before += block_sums_[b];
  }
  // Unreachable: the last block's test is total > target, and its run ends at its block sum.
  return static_cast<size_t>(std::max_element(weights_.begin(), weights_.end()) -
                             weights_.begin());
}

}  // namespace kvserve
