#include "worker/engine/sampling_penalties.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace kvserve {
namespace {

absl::Status CheckIds(std::span<const TokenId> ids, size_t first_index, int32_t vocab_size,
                      absl::string_view what) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(what, "[", first_index + i, "] = ", ids[i],
                                                     " is outside the vocabulary [0, ", vocab_size,
                                                     ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool TokenHistory::InPrompt(TokenId id) const {
  return std::binary_search(prompt_distinct_.begin(), prompt_distinct_.end(), id);
}

absl::Status TokenHistory::CountOutput(std::span<const TokenId> new_ids, size_t first_index) {
  if (absl::Status s = CheckIds(new_ids, first_index, vocab_size_, "output_ids"); !s.ok()) {
    return s;
  }
  for (TokenId id : new_ids) ++output_counts_[id];
  return absl::OkStatus();
}

absl::Status TokenHistory::Sync(std::span<const TokenId> prompt_ids,
                                std::span<const TokenId> output_ids) {
  if (track_prompt_ && (!prompt_synced_ || prompt_ids.size() != prompt_len_)) {
    prompt_synced_ = false;
    prompt_distinct_.clear();
    if (absl::Status s = CheckIds(prompt_ids, 0, vocab_size_, "prompt_ids"); !s.ok()) return s;
    prompt_distinct_.assign(prompt_ids.begin(), prompt_ids.end());
    std::sort(prompt_distinct_.begin(), prompt_distinct_.end());
    prompt_distinct_.erase(std::unique(prompt_distinct_.begin(), prompt_distinct_.end()),
                           prompt_distinct_.end());
    prompt_len_ = prompt_ids.size();
    prompt_synced_ = true;
  }

  const bool appended = output_ids.size() >= output_len_ &&
                        (output_len_ == 0 || output_ids[output_len_ - 1] == last_output_);
  size_t from = output_len_;
  if (!appended) {
    output_counts_.clear();
    from = 0;
  }
  // Mark the history empty until the new ids are known to be valid, so a failed call cannot
  // leave counts that disagree with output_len_.
  output_len_ = 0;
  last_output_ = kNoToken;
  if (absl::Status s = CountOutput(output_ids.subspan(from), from); !s.ok()) {
    output_counts_.clear();
    return s;
  }
  output_len_ = output_ids.size();
  if (!output_ids.empty()) last_output_ = output_ids.back();
  return absl::OkStatus();
}

PenaltyStep::PenaltyStep(const SamplingParams& params, int32_t vocab_size)
    : repetition_penalty_(params.repetition_penalty),
      presence_penalty_(params.presence_penalty),
      frequency_penalty_(params.frequency_penalty),
      history_(vocab_size, /*track_prompt=*/params.repetition_penalty != 1.0f) {}

bool PenaltyStep::Needed(const SamplingParams& params) {
  return params.repetition_penalty != 1.0f || params.presence_penalty != 0.0f ||
         params.frequency_penalty != 0.0f;
}

void PenaltyStep::Apply(CandidateList& candidates) const {
  std::vector<Candidate>& items = candidates.items;
  if (repetition_penalty_ != 1.0f) {
    const float r = repetition_penalty_;
    auto penalise = [&items, r](TokenId id) {
      float& logit = items[static_cast<size_t>(id)].logit;
      logit = logit > 0.0f ? logit / r : logit * r;
    };
    for (TokenId id : history_.prompt_ids()) penalise(id);
    for (const auto& [id, count] : history_.output_counts()) {
      if (!history_.InPrompt(id)) penalise(id);
    }
  }
  if (presence_penalty_ != 0.0f || frequency_penalty_ != 0.0f) {
    for (const auto& [id, count] : history_.output_counts()) {
      items[static_cast<size_t>(id)].logit -=
          frequency_penalty_ * static_cast<float>(count) + presence_penalty_;
    }
  }
}

}  // namespace kvserve
