#ifndef KVSERVE_BENCH_LOADGEN_WORKLOAD_H_
#define KVSERVE_BENCH_LOADGEN_WORKLOAD_H_

// Synthetic request streams for `kvserve bench`. Prompts are token ids drawn uniformly from the
// model's ordinary ids (3 .. vocab-1, skipping <unk>, <s>, </s>), so no tokenizer is involved and
// the prompt length is exact. Request i is a pure function of (seed, i): the same run is the same
// whatever thread issues which request.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/token.h"

namespace kvserve::bench {

/// The traffic shapes.
enum class WorkloadKind {
  /// Chat-like: prompt and output lengths lognormal around their medians (sigma 0.6 and 0.4),
  /// every prompt distinct.
  kChat,
  /// Prefix-heavy: every prompt starts with the same system prompt of `prefix_len` tokens,
  /// followed by a lognormal user turn around `prompt_len`.
  kSharedPrefix,
  /// Long context: prompts of exactly `prompt_len` tokens (default 3/4 of the context).
  kLongContext,
};

/// Parses "chat", "shared-prefix" or "long-context".
absl::StatusOr<WorkloadKind> ParseWorkloadKind(const std::string& name);
/// The flag spelling of `kind`.
std::string WorkloadKindName(WorkloadKind kind);

/// Shape of the requests. Zero lengths select the workload's defaults (documented in
/// docs/benchmarks.md): chat 48 / 32, shared-prefix 256 + 16 / 16, long-context 3/4 of the
/// context / 16.
struct WorkloadOptions {
  WorkloadKind kind = WorkloadKind::kChat;
  /// Median prompt length (chat), user-turn length (shared-prefix) or exact prompt length
  /// (long-context).
  int prompt_len = 0;
  /// Median (chat, shared-prefix) or exact (long-context) number of generated tokens.
  int output_len = 0;
  /// Shared system prompt length (shared-prefix only).
  int prefix_len = 0;
  /// The model's vocabulary and context (ListModels); prompt + output is kept within the
  /// context.
  int vocab_size = 0;
  int max_model_len = 0;
  uint64_t seed = 1;
};

/// One request to send.
struct BenchRequest {
  std::vector<TokenId> prompt;
  int max_tokens = 0;
};

/// A deterministic source of requests.
class Workload {
 public:
  /// Validates the options (errors name the flag: --prompt-len, --output-len, ...).
  static absl::StatusOr<Workload> Create(const WorkloadOptions& options);

  /// Request number `index`; thread-safe (const).
  BenchRequest Make(int64_t index) const;

  const WorkloadOptions& options() const { return options_; }

 private:
  explicit Workload(WorkloadOptions options) : options_(std::move(options)) {}

  WorkloadOptions options_;
  std::vector<TokenId> system_prompt_;
};

}  // namespace kvserve::bench

#endif  // KVSERVE_BENCH_LOADGEN_WORKLOAD_H_
