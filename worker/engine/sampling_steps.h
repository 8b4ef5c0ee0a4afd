#ifndef KVSERVE_WORKER_ENGINE_SAMPLING_STEPS_H_
#define KVSERVE_WORKER_ENGINE_SAMPLING_STEPS_H_

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "common/token.h"
#include "worker/engine/sampling_params.h"

namespace kvserve {

/// One token still in the running, with its (transformed) logit.
struct Candidate {
  TokenId id;
  float logit;
};

/// The sampler's working set. It starts dense (items[i].id == i for the whole vocabulary, in id
/// order) and only ever shrinks; every order it takes is fully determined by the logits, so a
/// seed gives the same tokens on every platform.
struct CandidateList {
  std::vector<Candidate> items;
  /// True once items are in descending logit order, ties by ascending id.
  bool sorted = false;
};

/// The total order the sampling steps share: higher logit first, then lower id.
inline bool RanksBefore(const Candidate& a, const Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

/// One transformation of the candidate list (temperature, a filter, ...). Steps are chained in
/// vLLM's order by BuildSamplingSteps; penalties, which need the request's tokens, live in
/// sampling_penalties.h.
class SamplingStep {
 public:
  virtual ~SamplingStep() = default;
  /// A short name for logs and tests ("temperature", "min_p", "top_k", "top_p").
  virtual std::string_view name() const = 0;
  /// Transforms `candidates` in place. Requires at least one candidate with a finite logit and
  /// keeps that true.
  virtual void Apply(CandidateList& candidates) const = 0;
};

/// Divides the logits by the temperature (multiplies by Scale) after subtracting the largest, so
/// the result is <= 0 and cannot overflow however small the temperature.
class TemperatureStep : public SamplingStep {
 public:
  /// `temperature` must be >= kGreedyTemperature.
  explicit TemperatureStep(float temperature) : temperature_(temperature) {}
  std::string_view name() const override { return "temperature"; }
  void Apply(CandidateList& candidates) const override;
  /// What the logits are multiplied by: 1 / temperature (a multiply per logit, not a divide;
  /// Sampler's no-candidate-list path uses the same factor).
  static float Scale(float temperature) { return 1.0f / temperature; }

 private:
  float temperature_;
};

/// min-p: keeps tokens with p >= min_p * p_max. In the log domain that is
/// logit >= max_logit + log(min_p), so no softmax is needed. The top token always survives.
class MinPStep : public SamplingStep {
 public:
  /// `min_p` in (0, 1].
  explicit MinPStep(float min_p) : min_p_(min_p) {}
  std::string_view name() const override { return "min_p"; }
  void Apply(CandidateList& candidates) const override;

 private:
  float min_p_;
};

/// top-k: keeps the k best candidates. nth_element selects them in O(n) and only those k are
/// sorted, so a small k over a 128k vocabulary never pays for a full sort.
class TopKStep : public SamplingStep {
 public:
  /// `top_k` >= 1.
  explicit TopKStep(int32_t top_k) : top_k_(top_k) {}
  std::string_view name() const override { return "top_k"; }
  void Apply(CandidateList& candidates) const override;

 private:
  int32_t top_k_;
};

/// top-p (nucleus): sorts the candidates (cheap when top-k already cut them), then keeps the
/// best ones while the probability mass ranked strictly above a token is < top_p — the same
/// set as vLLM's ascending-cumsum mask. The top token always survives.
class TopPStep : public SamplingStep {
 public:
  /// `top_p` in (0, 1).
  explicit TopPStep(float top_p) : top_p_(top_p) {}
  std::string_view name() const override { return "top_p"; }
  void Apply(CandidateList& candidates) const override;

 private:
  float top_p_;
};

/// The steps a non-greedy request runs after penalties, in vLLM's order: temperature, min_p,
/// top_k, top_p. Steps that would not change anything (temperature 1, top_p 1, ...) are left out.
/// `params` must be valid and not greedy.
std::vector<std::unique_ptr<SamplingStep>> BuildSamplingSteps(const SamplingParams& params);

/// The largest logit in `candidates` (non-empty).
float MaxLogit(const CandidateList& candidates);

}  // namespace kvserve

#endif  // KVSERVE_WORKER_ENGINE_SAMPLING_STEPS_H_
