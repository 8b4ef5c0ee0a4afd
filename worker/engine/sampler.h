#ifndef KVSERVE_WORKER_ENGINE_SAMPLER_H_
#define KVSERVE_WORKER_ENGINE_SAMPLER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "common/token.h"
#include "worker/engine/logprobs.h"
#include "worker/engine/sampling_params.h"
#include "worker/engine/sampling_penalties.h"
#include "worker/engine/sampling_steps.h"

namespace kvserve {

/// One sampled token.
struct SampleResult {
  TokenId token = kNoToken;
  /// log p(token) under the raw logits; set when SamplingParams::logprobs >= 0.
  std::optional<float> logprob;
  /// The `logprobs` most likely tokens under the raw logits, logprob descending, ties by id.
  std::vector<TokenLogprob> top_logprobs;
};

/// Chooses one request's tokens from its logits, one step at a time.
///
/// Pipeline (vLLM's order): penalties -> argmax if greedy, else temperature -> min_p -> top_k ->
/// top_p -> one draw from the renormalised survivors. Log-probabilities are log_softmax of the
/// raw logits, before penalties and temperature (vLLM's default "raw_logprobs").
///
/// Each Sampler owns a std::mt19937_64 seeded from SamplingParams::seed (random when unset) and
/// turns its output into doubles with its own bit arithmetic, and every candidate order is a
/// strict total order on (logit, id); so a seed yields the same tokens on every run and
/// platform, whatever other requests do. Not thread-safe; one per request.
class Sampler {
 public:
  /// Validates `params` against the vocabulary (SamplingParams::Validate's errors).
  static absl::StatusOr<Sampler> Create(const SamplingParams& params, int32_t vocab_size);

  Sampler(Sampler&&) = default;
  Sampler& operator=(Sampler&&) = default;

  /// Samples the next token. `logits` holds vocab_size raw model outputs (NaN and +inf are
  /// rejected; -inf masks a token, but at least one must be finite). The ids feed the penalties
  /// and may only grow by appending between calls for the O(new tokens) path (see
  /// TokenHistory::Sync); ids outside the vocabulary are INVALID_ARGUMENT when a penalty reads
  /// them. The Sampler does not record the token it returns: the caller appends it to
  /// output_ids.
  ///
  /// `allowed`, when not empty, is a bitmask over the vocabulary (bit id % 64 of word id / 64;
  /// constrained decoding): only tokens whose bit is set can be drawn, at least one must be, and
  /// log-probabilities are still those of the raw logits.
  absl::StatusOr<SampleResult> Sample(std::span<const float> logits,
                                      std::span<const TokenId> prompt_ids,
                                      std::span<const TokenId> output_ids,
                                      std::span<const uint64_t> allowed = {});

  /// The seed in use (the drawn one when SamplingParams::seed was unset), for logs and replays.
  uint64_t seed() const { return seed_; }

  /// A uniform double in [0, 1) from the top 53 bits of one 64-bit draw (exact, portable).
  static double UniformFromBits(uint64_t bits);

  /// The uniform the next non-greedy Sample would draw its token with, consumed from the RNG as
  /// Sample consumes it (one 64-bit draw per token): for a device kernel that reproduces Sample
  /// (worker/engine/device_sampler.h), so that a request's tokens do not depend on where it was
  /// sampled. Greedy requests draw nothing.
  double NextUniform() { return UniformFromBits(rng_()); }

 private:
  Sampler(const SamplingParams& params, int32_t vocab_size, uint64_t seed);

  /// Draws from softmax(candidates) in their current order.
  TokenId Draw(const CandidateList& candidates);
  /// Draws from softmax((logits - max_logit) / temperature_) straight from the raw logits: what
  /// Draw gives after the temperature step alone, without building the candidate list.
  TokenId DrawPlain(std::span<const float> logits, float max_logit);
  /// The index the inverse CDF of the weights exp((x[i] - shift) * scale), i < n, picks for a
  /// uniform u in [0, 1).
  size_t Pick(const float* x, size_t n, float shift, float scale, double u);

  int32_t vocab_size_;
  bool greedy_;
  int32_t logprobs_;
  uint64_t seed_;
  std::mt19937_64 rng_;
  /// Null when no penalty is asked for.
  std::unique_ptr<PenaltyStep> penalties_;
  std::vector<std::unique_ptr<SamplingStep>> steps_;
  /// Temperature alone (no penalty, min_p, top_k or top_p): DrawPlain, no candidate list.
  bool plain_ = false;
  float temperature_ = 1.0f;
  /// Reused between steps to avoid a vocab-sized allocation per token.
  CandidateList candidates_;
  /// logit - max per candidate, parallel to candidates_.items during Draw; the sums of their
  /// exps per block of cpu::kExpBlock during Pick.
  std::vector<float> weights_;
  std::vector<float> block_sums_;
  /// The logits with disallowed tokens at -inf, when a mask is given.
  std::vector<float> masked_;
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_ENGINE_SAMPLER_H_
