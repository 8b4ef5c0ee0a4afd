#ifndef KVSERVE_WORKER_ENGINE_STOP_CHECKER_H_
#define KVSERVE_WORKER_ENGINE_STOP_CHECKER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/token.h"
#include "worker/engine/sampling_params.h"

namespace kvserve {

/// Why a sequence finished, as the OpenAI API reports it.
enum class FinishReason {
  /// Still running.
  kNone,
  /// EOS, a stop token id or a stop string.
  kStop,
  /// max_tokens generated, or the context (max_total_tokens) is full.
  kLength,
};

/// "stop", "length", or "" for kNone.
std::string_view FinishReasonName(FinishReason reason);

/// What the model and engine add to a request's SamplingParams.
struct StopCheckerOptions {
  /// The model's EOS ids (ModelConfig::eos_token_ids); ignored when ignore_eos.
  std::vector<TokenId> eos_token_ids;
  /// Tokens in the prompt, counted against max_total_tokens.
  int32_t prompt_tokens = 0;
  /// Context limit on prompt + output tokens (the model's max length); 0 means no limit.
  int32_t max_total_tokens = 0;
};

/// The verdict after one token.
struct StopDecision {
  /// kNone: keep generating.
  FinishReason finish_reason = FinishReason::kNone;
  /// Output text that is safe to send to the client now (may be empty).
  std::string text;
  /// The stop string that matched (vLLM's stop_reason), else empty.
  std::string stop_string;
  /// The stop_token_ids entry that matched, else kNoToken (EOS leaves it kNoToken, like vLLM).
  TokenId stop_token_id = kNoToken;

  bool finished() const { return finish_reason != FinishReason::kNone; }
};

/// Decides when one sequence stops and which of its text may be released.
///
/// Checks per token, in vLLM's order: EOS (unless ignore_eos) -> stop_token_ids -> stop strings
/// -> max_tokens / max_total_tokens. EOS text is never emitted; a stop token's text only with
/// include_stop_str_in_output.
///
/// Stop strings are matched on bytes of the text so far, across token boundaries. The longest
/// tail of the unsent text that is a proper prefix of some stop string is held back until the
/// next token shows whether it completes one; when the sequence finishes for any other reason,
/// held text is released. If several stop strings match, the one that completes first in the
/// text wins (on a tie, the one starting first), so the result does not depend on how the text
/// was split into tokens. The output is cut just before the match, or just after it with
/// include_stop_str_in_output.
class StopChecker {
 public:
  /// Checks the fields it uses (max_tokens, stop, the option counts); full SamplingParams
  /// validation is the caller's. A prompt that already fills max_total_tokens is
  /// INVALID_ARGUMENT.
  static absl::StatusOr<StopChecker> Create(const SamplingParams& params,
                                            StopCheckerOptions options);

  /// Feeds the next generated token and the text the detokenizer produced for it. After the
  /// sequence finished, further calls change nothing and repeat the finish reason with no text.
  StopDecision Append(TokenId token, std::string_view new_text);

  /// Tokens fed so far (EOS and stop tokens included).
  int32_t num_output_tokens() const { return num_output_tokens_; }
  /// The finish reason so far (kNone while running).
  FinishReason finish_reason() const { return finish_reason_; }
  /// Text received but not yet released because it may start a stop string.
  std::string_view held_back() const { return pending_; }

 private:
  StopChecker(const SamplingParams& params, StopCheckerOptions options);

  bool IsEos(TokenId token) const;
  bool IsStopToken(TokenId token) const;
  /// Finishes with `reason`, releasing all pending text into `decision`.
  void Finish(FinishReason reason, StopDecision& decision);
  /// Looks for a stop string in pending_; on a match finishes and returns true.
  bool MatchStopString(StopDecision& decision);
  /// Length of the longest suffix of pending_ that is a proper prefix of a stop string.
  size_t HeldBackLength() const;

  std::vector<std::string> stop_strings_;
  std::vector<TokenId> stop_token_ids_;
  std::vector<TokenId> eos_token_ids_;
  bool ignore_eos_;
  bool include_stop_str_;
  int32_t max_tokens_;
  int32_t prompt_tokens_;
  int32_t max_total_tokens_;

  int32_t num_output_tokens_ = 0;
  FinishReason finish_reason_ = FinishReason::kNone;
  /// Text received and not yet released (only ever a held-back stop-string prefix between
  /// calls).
  std::string pending_;
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_ENGINE_STOP_CHECKER_H_
