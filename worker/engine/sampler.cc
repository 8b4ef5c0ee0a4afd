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

absl::StatusOr<SampleResult> Sampler::Sample(std::span<const float> raw_logits,
                                             std::span<const TokenId> prompt_ids,
                                             std::span<const TokenId> output_ids,
                                             std::span<const uint64_t> allowed) {
  std::span<const float> logits = raw_logits;
  if (!allowed.empty()) {
    if (allowed.size() * 64 < raw_logits.size()) {
      return absl::InvalidArgumentError("the token mask is shorter than the vocabulary");
    }
    masked_.assign(raw_logits.begin(), raw_logits.end());
    constexpr float kMasked = -std::numeric_limits<float>::infinity();
    bool any = false;
    for (size_t i = 0; i < masked_.size(); ++i) {
      if ((allowed[i >> 6] >> (i & 63)) & 1) {
        any = any || std::isfinite(masked_[i]);
      } else {
        masked_[i] = kMasked;
      }
    }
    if (!any) return absl::InvalidArgumentError("the token mask allows no token");
    logits = masked_;
  }
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
    const LogSoftmax log_softmax(raw_logits);
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
  return items[Pick(weights_.data(), weights_.size(), 0.0f, 1.0f, UniformFromBits(rng_()))].id;
}

TokenId Sampler::DrawPlain(std::span<const float> logits, float max_logit) {
  // The temperature step's arithmetic, (logit - max) * (1 / temperature), then Draw's: the
  // largest is exactly 0 after it, so Draw would subtract 0. Same weights, same token.
  return static_cast<TokenId>(Pick(logits.data(), logits.size(), max_logit,
                                   TemperatureStep::Scale(temperature_),
                                   UniformFromBits(rng_())));
}

size_t Sampler::Pick(const float* x, size_t n, float shift, float scale, double u) {
  block_sums_.resize((n + cpu::kExpBlock - 1) / cpu::kExpBlock);
  return static_cast<size_t>(
      cpu::PickExpWeighted(x, static_cast<int64_t>(n), shift, scale, u, block_sums_.data()));
}

}  // namespace kvserve
