#include "worker/engine/sampling_params.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace kvserve {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view range, double got) {
  return absl::InvalidArgumentError(absl::StrCat(field, " must be ", range, ", got ", got));
}

}  // namespace

bool SamplingParams::IsGreedy() const { return temperature < kGreedyTemperature; }

absl::Status SamplingParams::Validate(int vocab_size) const {
  if (vocab_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab_size must be positive, got ", vocab_size));
  }
  // Each comparison is written so that NaN fails it.
  if (!(std::isfinite(temperature) && temperature >= 0.0f)) {
    return Invalid("temperature", "a finite number >= 0", temperature);
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) return Invalid("top_p", "in (0, 1]", top_p);
  if (top_k < -1) {
    return Invalid("top_k", "-1 or 0 (disabled) or a positive count", top_k);
  }
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return Invalid("min_p", "in [0, 1]", min_p);
  if (!(std::isfinite(repetition_penalty) && repetition_penalty > 0.0f)) {
    return Invalid("repetition_penalty", "a finite number > 0", repetition_penalty);
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return Invalid("presence_penalty", "in [-2, 2]", presence_penalty);
  }
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return Invalid("frequency_penalty", "in [-2, 2]", frequency_penalty);
  }
  if (max_tokens < 1) return Invalid("max_tokens", ">= 1", max_tokens);
  if (stop.size() > kMaxStopStrings) {
    return absl::InvalidArgumentError(absl::StrCat("stop has ", stop.size(),
                                                   " strings; at most ", kMaxStopStrings,
                                                   " are allowed"));
  }
  for (size_t i = 0; i < stop.size(); ++i) {
    if (stop[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("stop[", i, "] must not be empty"));
    }
    if (stop[i].size() > kMaxStopStringBytes) {
      return absl::InvalidArgumentError(absl::StrCat("stop[", i, "] is ", stop[i].size(),
                                                     " bytes long; at most ",
                                                     kMaxStopStringBytes, " are allowed"));
    }
  }
  if (stop_token_ids.size() > kMaxStopTokenIds) {
    return absl::InvalidArgumentError(absl::StrCat("stop_token_ids has ", stop_token_ids.size(),
                                                   " ids; at most ", kMaxStopTokenIds,
                                                   " are allowed"));
  }
  for (size_t i = 0; i < stop_token_ids.size(); ++i) {
    const TokenId id = stop_token_ids[i];
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop_token_ids[", i, "] must be in [0, ", vocab_size, "), got ", id));
    }
  }
  if (logprobs < -1 || logprobs > kMaxLogprobs) {
    return Invalid("logprobs", absl::StrCat("-1 (none) or in [0, ", kMaxLogprobs, "]"), logprobs);
  }
  return absl::OkStatus();
}

}  // namespace kvserve
