#ifndef KVSERVE_WORKER_ENGINE_LOGPROBS_H_
#define KVSERVE_WORKER_ENGINE_LOGPROBS_H_

#include <cstdint>
#include <span>
#include <vector>

#include "common/token.h"

namespace kvserve {

/// A token with its log-probability.
struct TokenLogprob {
  TokenId id = kNoToken;
  float logprob = 0.0f;

  friend bool operator==(const TokenLogprob&, const TokenLogprob&) = default;
};

/// log_softmax over one row of raw logits, computed stably: log p_i = x_i - m - log(sum_j
/// exp(x_j - m)) with m the largest logit and the sum in double. Built once per step in O(vocab);
/// then each query is O(1) (LogprobOf) or O(vocab) with an n-entry buffer (Top).
class LogSoftmax {
 public:
  /// `logits` must hold at least one finite value, no NaN and no +inf (-inf is a masked token);
  /// the span must outlive this object.
  explicit LogSoftmax(std::span<const float> logits);

  /// log p(id); -inf for a masked token.
  float LogprobOf(TokenId id) const;

  /// The n most likely tokens, by logprob descending and then id ascending.
  std::vector<TokenLogprob> Top(int32_t n) const;

 private:
  std::span<const float> logits_;
  /// m + log(sum exp(x - m)), in double.
  double log_normalizer_ = 0.0;
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_ENGINE_LOGPROBS_H_
