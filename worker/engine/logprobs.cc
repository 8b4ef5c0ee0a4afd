#include "worker/engine/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvserve {

LogSoftmax::LogSoftmax(std::span<const float> logits) : logits_(logits) {
  float max_logit = -std::numeric_limits<float>::infinity();
  for (float x : logits) max_logit = std::max(max_logit, x);
  const double m = max_logit;
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - m);
  log_normalizer_ = m + std::log(sum);
}

float LogSoftmax::LogprobOf(TokenId id) const {
  return static_cast<float>(static_cast<double>(logits_[static_cast<size_t>(id)]) -
                            log_normalizer_);
}

std::vector<TokenLogprob> LogSoftmax::Top(int32_t n) const {
  const size_t want = std::min(static_cast<size_t>(std::max(n, 0)), logits_.size());
  // `best` stays sorted best-first; most logits lose against its last entry and cost one
  // comparison, so this is O(vocab) for the small n a request may ask for.
  std::vector<TokenId> best;
  best.reserve(want + 1);
  auto ranks_before = [this](TokenId a, TokenId b) {
    const float la = logits_[static_cast<size_t>(a)];
    const float lb = logits_[static_cast<size_t>(b)];
    return la > lb || (la == lb && a < b);
  };
  if (want > 0) {
    for (size_t i = 0; i < logits_.size(); ++i) {
      const TokenId id = static_cast<TokenId>(i);
      if (best.size() == want && !ranks_before(id, best.back())) continue;
      best.insert(std::upper_bound(best.begin(), best.end(), id, ranks_before), id);
      if (best.size() > want) best.pop_back();
    }
  }
  std::vector<TokenLogprob> out;
  out.reserve(best.size());
  for (TokenId id : best) out.push_back({id, LogprobOf(id)});
  return out;
}

}  // namespace kvserve
