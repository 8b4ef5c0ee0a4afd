#include "worker/engine/sampler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/logits.h"

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

/// Checks the logits and returns the index of the largest (lowest index on ties): one
/// vectorized pass (cpu::ArgMaxChecked) that also finds the first NaN or +inf.
absl::StatusOr<size_t> CheckLogits(std::span<const float> logits, int32_t vocab_size) {
  if (logits.size() != static_cast<size_t>(vocab_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("logits has ", logits.size(), " entries, expected vocab_size ", vocab_size));
  }
  const cpu::ArgMaxResult r =
      cpu::ArgMaxChecked(logits.data(), static_cast<int64_t>(logits.size()));
  if (r.bad >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("logits[", r.bad, "] is ", logits[static_cast<size_t>(r.bad)]));
  }
  if (logits[static_cast<size_t>(r.index)] == -std::numeric_limits<float>::infinity()) {
    return absl::InvalidArgumentError("logits are all -inf: every token is masked");
  }
  return static_cast<size_t>(r.index);
}

TokenId Argmax(const CandidateList& candidates) {
  const Candidate* best = &candidates.items.front();
  for (const Candidate& c : candidates.items) {
    if (RanksBefore(c, *best)) best = &c;
  }
  return best->id;
}

}  // namespace

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
  cpu::ExpShifted(weights_.data(), static_cast<int64_t>(weights_.size()), 0.0f, 1.0f,
                  weights_.data());
  return items[PickByWeight(UniformFromBits(rng_()))].id;
}

TokenId Sampler::DrawPlain(std::span<const float> logits, float max_logit) {
  // The temperature step's arithmetic, (logit - max) / temperature, then Draw's: the largest is
  // exactly 0 after it, so Draw would subtract 0. Same weights, same token.
  weights_.resize(logits.size());
  cpu::ExpShifted(logits.data(), static_cast<int64_t>(logits.size()), max_logit, temperature_,
                  weights_.data());
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
