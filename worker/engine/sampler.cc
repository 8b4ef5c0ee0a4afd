#include "worker/engine/sampler.h"

#include <chrono>
#include <cmath>
#include <limits>
#include <utility>

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
absl::StatusOr<size_t> CheckLogits(std::span<const float> logits, int32_t vocab_size) {
  if (logits.size() != static_cast<size_t>(vocab_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("logits has ", logits.size(), " entries, expected vocab_size ", vocab_size));
  }
  size_t best = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float x = logits[i];
    if (std::isnan(x) || x == std::numeric_limits<float>::infinity()) {
      return absl::InvalidArgumentError(absl::StrCat("logits[", i, "] is ", x));
    }
    if (x > logits[best]) best = i;
  }
  if (logits[best] == -std::numeric_limits<float>::infinity()) {
    return absl::InvalidArgumentError("logits are all -inf: every token is masked");
  }
  return best;
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
  const double max_logit = MaxLogit(candidates);
  weights_.resize(items.size());
  double total = 0.0;
  for (size_t i = 0; i < items.size(); ++i) {
    weights_[i] = std::exp(static_cast<double>(items[i].logit) - max_logit);
    total += weights_[i];
  }
  // Inverse CDF: the first candidate whose cumulative weight exceeds u * total, u in [0, 1).
  // The running sum repeats total's additions in the same order, so it reaches total exactly
  // and the loop always returns; zero-weight (-inf) candidates never can, the test is strict.
  const double target = UniformFromBits(rng_()) * total;
  double cumulative = 0.0;
  for (size_t i = 0; i < items.size(); ++i) {
    cumulative += weights_[i];
    if (cumulative > target) return items[i].id;
  }
  return Argmax(candidates);  // Unreachable: cumulative == total > target.
}

}  // namespace kvserve
