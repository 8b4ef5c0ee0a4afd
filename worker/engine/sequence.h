#ifndef KVSERVE_WORKER_ENGINE_SEQUENCE_H_
#define KVSERVE_WORKER_ENGINE_SEQUENCE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/token.h"
#include "common/tokenizer/tokenizer.h"
#include "worker/constraint/constraint.h"
#include "worker/engine/sampler.h"
#include "worker/engine/sampling_params.h"
#include "worker/engine/stop_checker.h"
#include "worker/kv/kv_manager.h"

namespace kvserve {

struct RequestState;

/// One stream of tokens the engine generates: a request with n = 1 has one sequence; with n > 1
/// the prompt is prefilled once and then forked into n sequences sharing its KV blocks.
///
/// `tokens` = prompt followed by the generated tokens. `num_computed` of them have K/V in the
/// cache; the scheduler feeds tokens [num_computed, tokens.size()) next — the whole rest of the
/// prompt (or a chunk of it) in prefill, exactly one token in decode. After preemption
/// num_computed drops to 0 and the sequence recomputes prompt and output alike.
struct Sequence {
  enum class Status { kWaiting, kRunning, kFinished };

  SeqId id = 0;
  /// Index of this sample within its request (0 .. n-1).
  int sample_index = 0;
  /// The request this sample belongs to (owned by the engine).
  RequestState* request = nullptr;
  Status status = Status::kWaiting;

  std::vector<TokenId> tokens;
  /// Prefix-cache namespace: sequences only share blocks with sequences of the same salt.
  std::string cache_salt;
  int32_t num_prompt_tokens = 0;
  int32_t num_computed = 0;
  /// Prompt tokens served from the prefix cache when the sequence was first admitted.
  int32_t num_cached_prompt_tokens = 0;
  /// True once admitted to the pool at least once (prefix matches are counted on first admission).
  bool admitted_before = false;
  int32_t peak_kv_blocks = 0;
  /// Pipeline groups: a step computing this sequence's pending tokens is on its way through the
  /// stages; the scheduler leaves the sequence alone (no new tokens, no preemption) until the
  /// step completes.
  bool in_flight = false;
  /// When the sample's latest token was sampled (epoch: none yet), for inter-token latency.
  std::chrono::steady_clock::time_point last_token_time{};

  std::optional<Sampler> sampler;
  std::optional<StopChecker> stop;
  std::unique_ptr<IncrementalDecoder> detokenizer;
  /// The constrained-decoding parser of this sample; null when the request has no constraint.
  std::unique_ptr<constraint::ConstraintState> constraint;

  int32_t num_output_tokens() const {
    return static_cast<int32_t>(tokens.size()) - num_prompt_tokens;
  }
  int32_t num_pending() const { return static_cast<int32_t>(tokens.size()) - num_computed; }
  bool in_prefill() const { return num_computed < num_prompt_tokens; }
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_ENGINE_SEQUENCE_H_
