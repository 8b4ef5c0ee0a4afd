#ifndef KVSERVE_WORKER_ENGINE_SAMPLING_PENALTIES_H_
#define KVSERVE_WORKER_ENGINE_SAMPLING_PENALTIES_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/token.h"
#include "worker/engine/sampling_params.h"
#include "worker/engine/sampling_steps.h"

namespace kvserve {

/// The tokens a request has seen, kept incrementally so a decode step costs O(new tokens) rather
/// than O(prompt + output): the distinct prompt ids and a count per output id.
class TokenHistory {
 public:
  /// `track_prompt`: remember the prompt's ids (only repetition_penalty needs them).
  TokenHistory(int32_t vocab_size, bool track_prompt)
      : vocab_size_(vocab_size), track_prompt_(track_prompt) {}

  /// Brings the history in line with the request's tokens. The usual case, output_ids extending
  /// the previous call's by appended tokens, costs O(appended). A prompt of another length, an
  /// output that shrank (rejected speculative tokens) or whose last counted id changed rebuilds
  /// from scratch. INVALID_ARGUMENT names the first id outside [0, vocab_size).
  absl::Status Sync(std::span<const TokenId> prompt_ids, std::span<const TokenId> output_ids);

  /// Sorted distinct prompt ids (empty unless track_prompt).
  const std::vector<TokenId>& prompt_ids() const { return prompt_distinct_; }
  /// How many times each id occurs in the output.
  const absl::flat_hash_map<TokenId, int32_t>& output_counts() const { return output_counts_; }
  /// True if `id` is in the tracked prompt.
  bool InPrompt(TokenId id) const;

 private:
  absl::Status CountOutput(std::span<const TokenId> new_ids, size_t first_index);

  int32_t vocab_size_;
  bool track_prompt_;
  bool prompt_synced_ = false;
  size_t prompt_len_ = 0;
  std::vector<TokenId> prompt_distinct_;
  size_t output_len_ = 0;
  TokenId last_output_ = kNoToken;
  absl::flat_hash_map<TokenId, int32_t> output_counts_;
};

/// Repetition, presence and frequency penalties, in vLLM's order:
///   1. repetition (HF): for each distinct id in prompt or output,
///      logit = logit > 0 ? logit / r : logit * r;
///   2. logit -= frequency_penalty * count(output) + presence_penalty * [count(output) > 0].
/// It runs first on the dense candidate list, which it indexes by id, and keeps the request's
/// TokenHistory, so it is not a SamplingStep.
class PenaltyStep {
 public:
  /// `params` must be valid; `vocab_size` > 0.
  PenaltyStep(const SamplingParams& params, int32_t vocab_size);

  /// True when `params` asks for any penalty (otherwise the step is not built at all).
  static bool Needed(const SamplingParams& params);

  /// Updates the history (see TokenHistory::Sync).
  absl::Status Sync(std::span<const TokenId> prompt_ids, std::span<const TokenId> output_ids) {
    return history_.Sync(prompt_ids, output_ids);
  }

  /// Applies the penalties to a dense list (items[i].id == i) in O(distinct tokens seen).
  void Apply(CandidateList& candidates) const;

 private:
  float repetition_penalty_;
  float presence_penalty_;
  float frequency_penalty_;
  TokenHistory history_;
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_ENGINE_SAMPLING_PENALTIES_H_
