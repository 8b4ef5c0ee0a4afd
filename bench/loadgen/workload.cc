#include "bench/loadgen/workload.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvserve::bench {
namespace {

constexpr TokenId kFirstOrdinaryId = 3;

// A lognormal draw with the given median, rounded and clamped to [1, max].
int LogNormal(std::mt19937_64& rng, int median, double sigma, int max) {
  std::lognormal_distribution<double> dist(std::log(static_cast<double>(median)), sigma);
  const double x = std::round(dist(rng));
  return static_cast<int>(std::clamp(x, 1.0, static_cast<double>(std::max(1, max))));
}

void AppendRandomTokens(std::mt19937_64& rng, int vocab, int n, std::vector<TokenId>* out) {
  std::uniform_int_distribution<TokenId> dist(kFirstOrdinaryId, vocab - 1);
  for (int i = 0; i < n; ++i) out->push_back(dist(rng));
}

}  // namespace

absl::StatusOr<WorkloadKind> ParseWorkloadKind(const std::string& name) {
  if (name == "chat") return WorkloadKind::kChat;
  if (name == "shared-prefix") return WorkloadKind::kSharedPrefix;
  if (name == "long-context") return WorkloadKind::kLongContext;
  return absl::InvalidArgumentError(
      absl::StrCat("--workload '", name, "' is not one of chat, shared-prefix, long-context"));
}

std::string WorkloadKindName(WorkloadKind kind) {
  switch (kind) {
    case WorkloadKind::kChat:
      return "chat";
    case WorkloadKind::kSharedPrefix:
      return "shared-prefix";
    case WorkloadKind::kLongContext:
      return "long-context";
  }
  return "?";
}

absl::StatusOr<Workload> Workload::Create(const WorkloadOptions& options) {
  WorkloadOptions o = options;
  if (o.vocab_size <= kFirstOrdinaryId) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model's vocabulary (", o.vocab_size, " tokens) is too small"));
  }
  if (o.max_model_len < 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model's context (", o.max_model_len, " tokens) is too small"));
  }
  for (auto [flag, value] : {std::pair<const char*, int>{"--prompt-len", o.prompt_len},
                             std::pair<const char*, int>{"--output-len", o.output_len},
                             std::pair<const char*, int>{"--prefix-len", o.prefix_len}}) {
    if (value < 0) return absl::InvalidArgumentError(absl::StrCat(flag, " must be >= 0"));
  }
  switch (o.kind) {
    case WorkloadKind::kChat:
      if (o.prompt_len == 0) o.prompt_len = 48;
      if (o.output_len == 0) o.output_len = 32;
      break;
    case WorkloadKind::kSharedPrefix:
      if (o.prefix_len == 0) o.prefix_len = 256;
      if (o.prompt_len == 0) o.prompt_len = 16;
      if (o.output_len == 0) o.output_len = 16;
      break;
    case WorkloadKind::kLongContext:
      if (o.output_len == 0) o.output_len = 16;
      if (o.prompt_len == 0) o.prompt_len = o.max_model_len * 3 / 4;
      break;
  }
  const int fixed = o.kind == WorkloadKind::kSharedPrefix ? o.prefix_len : 0;
  if (fixed + 1 + o.output_len >= o.max_model_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--prefix-len ", fixed, " + --output-len ", o.output_len,
        " leaves no room for a prompt in the model's context of ", o.max_model_len, " tokens"));
  }
  if (o.kind == WorkloadKind::kLongContext && o.prompt_len + o.output_len > o.max_model_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prompt-len ", o.prompt_len, " + --output-len ", o.output_len,
                     " exceeds the model's context of ", o.max_model_len, " tokens"));
  }
  Workload w(o);
  if (o.kind == WorkloadKind::kSharedPrefix) {
    std::mt19937_64 rng(o.seed ^ 0x5157e3ull);
    AppendRandomTokens(rng, o.vocab_size, o.prefix_len, &w.system_prompt_);
  }
  return w;
}

BenchRequest Workload::Make(int64_t index) const {
  const WorkloadOptions& o = options_;
  std::seed_seq seq{static_cast<uint32_t>(o.seed), static_cast<uint32_t>(o.seed >> 32),
                    static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32)};
  std::mt19937_64 rng(seq);
  BenchRequest r;
  switch (o.kind) {
    case WorkloadKind::kChat: {
      r.max_tokens = LogNormal(rng, o.output_len, 0.4, o.max_model_len / 4);
      const int prompt = LogNormal(rng, o.prompt_len, 0.6, o.max_model_len - r.max_tokens - 1);
      AppendRandomTokens(rng, o.vocab_size, prompt, &r.prompt);
      break;
    }
    case WorkloadKind::kSharedPrefix: {
      r.max_tokens = LogNormal(rng, o.output_len, 0.4, o.output_len * 4);
      r.max_tokens = std::min(r.max_tokens, o.max_model_len - o.prefix_len - 2);
      const int room = o.max_model_len - o.prefix_len - r.max_tokens - 1;
      r.prompt = system_prompt_;
      AppendRandomTokens(rng, o.vocab_size, LogNormal(rng, o.prompt_len, 0.6, room), &r.prompt);
      break;
    }
    case WorkloadKind::kLongContext:
      r.max_tokens = o.output_len;
      AppendRandomTokens(rng, o.vocab_size, o.prompt_len, &r.prompt);
      break;
  }
  return r;
}

}  // namespace kvserve::bench
