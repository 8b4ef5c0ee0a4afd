#include "worker/engine/stop_checker.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvserve {

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kNone:
      break;
  }
  return "";
}

absl::StatusOr<StopChecker> StopChecker::Create(const SamplingParams& params,
                                                StopCheckerOptions options) {
  if (params.max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens must be >= 1, got ", params.max_tokens));
  }
  for (size_t i = 0; i < params.stop.size(); ++i) {
    if (params.stop[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("stop[", i, "] must not be empty"));
    }
  }
  if (options.prompt_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt_tokens must be >= 0, got ", options.prompt_tokens));
  }
  if (options.max_total_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_total_tokens must be >= 0, got ", options.max_total_tokens));
  }
  if (options.max_total_tokens > 0 && options.prompt_tokens >= options.max_total_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the prompt has ", options.prompt_tokens,
        " tokens, which leaves no room under max_total_tokens ", options.max_total_tokens));
  }
  return StopChecker(params, std::move(options));
}

StopChecker::StopChecker(const SamplingParams& params, StopCheckerOptions options)
    : stop_strings_(params.stop),
      stop_token_ids_(params.stop_token_ids),
      eos_token_ids_(std::move(options.eos_token_ids)),
      ignore_eos_(params.ignore_eos),
      include_stop_str_(params.include_stop_str_in_output),
      max_tokens_(params.max_tokens),
      prompt_tokens_(options.prompt_tokens),
      max_total_tokens_(options.max_total_tokens) {}

bool StopChecker::IsEos(TokenId token) const {
  return std::find(eos_token_ids_.begin(), eos_token_ids_.end(), token) != eos_token_ids_.end();
}

bool StopChecker::IsStopToken(TokenId token) const {
  return std::find(stop_token_ids_.begin(), stop_token_ids_.end(), token) != stop_token_ids_.end();
}

void StopChecker::Finish(FinishReason reason, StopDecision& decision) {
  finish_reason_ = reason;
  decision.finish_reason = reason;
  decision.text += pending_;
  pending_.clear();
}

bool StopChecker::MatchStopString(StopDecision& decision) {
  // pending_ held no complete stop string before this token, so the first occurrence of each
  // string is the only candidate; the winner ends first, then starts first.
  size_t best_pos = std::string::npos;
  size_t best_end = std::string::npos;
  const std::string* best = nullptr;
  for (const std::string& stop : stop_strings_) {
    const size_t pos = pending_.find(stop);
    if (pos == std::string::npos) continue;
    const size_t end = pos + stop.size();
    if (best == nullptr || end < best_end || (end == best_end && pos < best_pos)) {
      best = &stop;
      best_pos = pos;
      best_end = end;
    }
  }
  if (best == nullptr) return false;
  pending_.resize(include_stop_str_ ? best_end : best_pos);
  decision.stop_string = *best;
  Finish(FinishReason::kStop, decision);
  return true;
}

size_t StopChecker::HeldBackLength() const {
  size_t held = 0;
  for (const std::string& stop : stop_strings_) {
    // Longest k < |stop| with pending_ ending in stop[0, k); longer k first, so stop early.
    for (size_t k = std::min(stop.size() - 1, pending_.size()); k > held; --k) {
      if (std::string_view(pending_).substr(pending_.size() - k) ==
          std::string_view(stop).substr(0, k)) {
        held = k;
        break;
      }
    }
  }
  return held;
}

StopDecision StopChecker::Append(TokenId token, std::string_view new_text) {
  StopDecision decision;
  if (finish_reason_ != FinishReason::kNone) {
    decision.finish_reason = finish_reason_;
    return decision;
  }
  ++num_output_tokens_;
  const bool eos = IsEos(token);
  if (eos && !ignore_eos_) {
    Finish(FinishReason::kStop, decision);
    return decision;
  }
  if (IsStopToken(token)) {
    if (include_stop_str_ && !eos) pending_.append(new_text);
    decision.stop_token_id = token;
    Finish(FinishReason::kStop, decision);
    return decision;
  }
  if (!eos) pending_.append(new_text);
  if (!stop_strings_.empty() && MatchStopString(decision)) return decision;

  const bool max_tokens_reached = num_output_tokens_ >= max_tokens_;
  const bool context_full =
      max_total_tokens_ > 0 && prompt_tokens_ + num_output_tokens_ >= max_total_tokens_;
  if (max_tokens_reached || context_full) {
    Finish(FinishReason::kLength, decision);
    return decision;
  }
  const size_t release = pending_.size() - HeldBackLength();
  decision.text = pending_.substr(0, release);
  pending_.erase(0, release);
  return decision;
}

}  // namespace kvserve
