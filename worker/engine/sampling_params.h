#ifndef KVSERVE_WORKER_ENGINE_SAMPLING_PARAMS_H_
#define KVSERVE_WORKER_ENGINE_SAMPLING_PARAMS_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/token.h"

namespace kvserve {

/// The most alternatives a request may ask for per token (OpenAI's `top_logprobs` limit and
/// vLLM's default `max_logprobs`).
inline constexpr int32_t kMaxLogprobs = 20;

/// Most stop strings a request may give, and the longest one in bytes: together they bound the
/// stop checker's work per token and the text it holds back.
inline constexpr size_t kMaxStopStrings = 32;
inline constexpr size_t kMaxStopStringBytes = 1024;
/// Most stop token ids a request may give.
inline constexpr size_t kMaxStopTokenIds = 256;

/// Temperatures below this decode greedily (vLLM's _SAMPLING_EPS).
inline constexpr float kGreedyTemperature = 1e-5f;

/// Per-request decoding options, with the meaning vLLM and the OpenAI API give them.
/// Defaults sample from the model's distribution unchanged, 16 tokens, no stop strings.
struct SamplingParams {
  /// Divides the logits; 0 means greedy (argmax, ties go to the lowest id). Temperatures below
  /// kGreedyTemperature are treated as 0, as vLLM does, so the division cannot overflow.
  float temperature = 1.0f;
  /// Nucleus sampling: keep the most likely tokens whose probabilities sum to top_p; (0, 1].
  float top_p = 1.0f;
  /// Keep only the top_k most likely tokens; 0 or -1 disables; above the vocabulary size it
  /// keeps every token (as in vLLM).
  int32_t top_k = 0;
  /// Drop tokens whose probability is below min_p times the top token's; [0, 1].
  float min_p = 0.0f;
  /// > 0. For every token in the prompt or the output: logit > 0 ? logit / p : logit * p
  /// (Hugging Face / vLLM semantics); applied once per distinct token.
  float repetition_penalty = 1.0f;
  /// [-2, 2]. Subtracted once from the logit of every token already in the output (OpenAI).
  float presence_penalty = 0.0f;
  /// [-2, 2]. Subtracted count times from the logit of each token in the output (OpenAI).
  float frequency_penalty = 0.0f;
  /// Set: the request's tokens depend only on the seed and the logits. Unset: a random seed.
  std::optional<uint64_t> seed;
  /// Most tokens to generate; >= 1.
  int32_t max_tokens = 16;
  /// Generation stops when the output text contains one of these (non-empty) strings; at most
  /// kMaxStopStrings of at most kMaxStopStringBytes each.
  std::vector<std::string> stop;
  /// Generation stops on these ids (at most kMaxStopTokenIds), in addition to the model's EOS ids.
  std::vector<TokenId> stop_token_ids;
  /// Keep generating past the model's EOS ids (stop_token_ids still stop).
  bool ignore_eos = false;
  /// Keep the matched stop string (or stop token's text) at the end of the output.
  bool include_stop_str_in_output = false;
  /// -1: no log-probabilities. N in [0, kMaxLogprobs]: the chosen token's log-probability plus
  /// the N most likely alternatives.
  int32_t logprobs = -1;

  /// True when decoding takes the argmax (temperature 0 or below kGreedyTemperature).
  bool IsGreedy() const;

  /// Returns INVALID_ARGUMENT naming the field (e.g. "top_p must be in (0, 1], got 1.5"); NaN
  /// and infinities are rejected wherever a float is expected.
  absl::Status Validate(int vocab_size) const;
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_ENGINE_SAMPLING_PARAMS_H_
