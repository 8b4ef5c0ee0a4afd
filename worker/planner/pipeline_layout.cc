#include "worker/planner/pipeline_layout.h"

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace kvserve {

absl::StatusOr<std::vector<StageLayers>> SplitLayers(int num_layers, int pp,
                                                     std::span<const int> explicit_counts) {
  if (pp < 1) return absl::InvalidArgumentError(absl::StrCat("--pp must be >= 1, got ", pp));
  if (num_layers < pp) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pp ", pp, " needs at least one layer per stage; the model has ", num_layers, " layers"));
  }
  std::vector<int> counts;
  if (explicit_counts.empty()) {
    for (int s = 0; s < pp; ++s) counts.push_back(num_layers / pp + (s < num_layers % pp ? 1 : 0));
  } else {
    if (static_cast<int>(explicit_counts.size()) != pp) {
      return absl::InvalidArgumentError(
          absl::StrCat("--pp-layers lists ", explicit_counts.size(), " stages; --pp is ", pp));
    }
    int64_t sum = 0;
    for (size_t s = 0; s < explicit_counts.size(); ++s) {
      if (explicit_counts[s] < 1) {
        return absl::InvalidArgumentError(absl::StrCat("--pp-layers: stage ", s, " gets ",
                                                       explicit_counts[s],
                                                       " layers; every stage needs at least 1"));
      }
      sum += explicit_counts[s];
    }
    if (sum != num_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("--pp-layers ", absl::StrJoin(explicit_counts, ","), " adds up to ", sum,
                       " layers; the model has ", num_layers));
    }
    counts.assign(explicit_counts.begin(), explicit_counts.end());
  }
  std::vector<StageLayers> stages;
  int first = 0;
  for (int count : counts) {
    stages.push_back({first, count});
    first += count;
  }
  return stages;
}

absl::StatusOr<std::vector<int>> ParseStageLayerCounts(std::string_view text) {
  // Debian's abseil has its own string_view type, not an alias of std::string_view.
  const absl::string_view value(text.data(), text.size());
  std::vector<int> counts;
  if (absl::StripAsciiWhitespace(value).empty()) return counts;
  for (absl::string_view part : absl::StrSplit(value, ',')) {
    part = absl::StripAsciiWhitespace(part);
    int n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--pp-layers: '", part, "' is not a positive layer count (expected e.g. 31,30)"));
    }
    counts.push_back(n);
  }
  return counts;
}

std::string DescribeStageLayers(std::span<const StageLayers> stages) {
  return absl::StrJoin(
      stages, "+", [](std::string* out, const StageLayers& s) { absl::StrAppend(out, s.count); });
}

}  // namespace kvserve
