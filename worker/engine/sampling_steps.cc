#include "worker/engine/sampling_steps.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/logits.h"

namespace kvserve {

float MaxLogit(const CandidateList& candidates) {
  float best = -std::numeric_limits<float>::infinity();
  for (const Candidate& c : candidates.items) best = std::max(best, c.logit);
  return best;
}

void TemperatureStep::Apply(CandidateList& candidates) const {
  const float max_logit = MaxLogit(candidates);
  // Subtracting the same value and dividing by a positive one keep the ranking, so `sorted`
  // stays valid.
  const float scale = Scale(temperature_);
  for (Candidate& c : candidates.items) c.logit = (c.logit - max_logit) * scale;
}

void MinPStep::Apply(CandidateList& candidates) const {
  const float threshold = MaxLogit(candidates) + std::log(min_p_);
  std::erase_if(candidates.items, [threshold](const Candidate& c) { return c.logit < threshold; });
  // min_p == 1 gives threshold == max exactly, so the top token is never erased.
}

void TopKStep::Apply(CandidateList& candidates) const {
  std::vector<Candidate>& items = candidates.items;
  const size_t k = static_cast<size_t>(top_k_);
  if (k >= items.size()) return;
  if (!candidates.sorted) {
    // With a strict total order the selected set does not depend on the library.
    std::nth_element(items.begin(), items.begin() + k, items.end(), RanksBefore);
    items.resize(k);
    std::sort(items.begin(), items.end(), RanksBefore);
    candidates.sorted = true;
  } else {
    items.resize(k);
  }
}

void TopPStep::Apply(CandidateList& candidates) const {
  std::vector<Candidate>& items = candidates.items;
  if (!candidates.sorted) {
    std::sort(items.begin(), items.end(), RanksBefore);
    candidates.sorted = true;
  }
  if (items.empty()) return;
  items.resize(static_cast<size_t>(
      cpu::NucleusSize(static_cast<int64_t>(items.size()), top_p_,
                       [&items](int64_t i) { return items[static_cast<size_t>(i)].logit; })));
}

std::vector<std::unique_ptr<SamplingStep>> BuildSamplingSteps(const SamplingParams& params) {
  std::vector<std::unique_ptr<SamplingStep>> steps;
  if (params.temperature != 1.0f) {
    steps.push_back(std::make_unique<TemperatureStep>(params.temperature));
  }
  if (params.min_p > 0.0f) steps.push_back(std::make_unique<MinPStep>(params.min_p));
  if (params.top_k > 0) steps.push_back(std::make_unique<TopKStep>(params.top_k));
  if (params.top_p < 1.0f) steps.push_back(std::make_unique<TopPStep>(params.top_p));
  return steps;
}

}  // namespace kvserve
