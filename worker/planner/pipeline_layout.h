#ifndef KVSERVE_WORKER_PLANNER_PIPELINE_LAYOUT_H_
#define KVSERVE_WORKER_PLANNER_PIPELINE_LAYOUT_H_

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kvserve {

/// The decoder layers one pipeline stage holds: [first, first + count).
struct StageLayers {
  int first = 0;
  int count = 0;
  int end() const { return first + count; }
};

/// Splits `num_layers` decoder layers over `pp` pipeline stages, in order. With no explicit
/// partition the layers split as evenly as possible and the earlier stages take the extra ones
/// (61 layers over 2 stages: 31 + 30). `explicit_counts` (from --pp-layers) gives each stage's
/// count; it must have pp entries, each >= 1, summing to num_layers. INVALID_ARGUMENT naming the
/// numbers otherwise (pp < 1, more stages than layers, a bad partition).
absl::StatusOr<std::vector<StageLayers>> SplitLayers(int num_layers, int pp,
                                                     std::span<const int> explicit_counts = {});

/// Parses a --pp-layers value: comma-separated positive layer counts ("31,30"). An empty string
/// gives an empty list (the even split). INVALID_ARGUMENT naming the bad entry.
absl::StatusOr<std::vector<int>> ParseStageLayerCounts(std::string_view text);

/// "31+30": the counts of `stages`, for messages and plans.
std::string DescribeStageLayers(std::span<const StageLayers> stages);

}  // namespace kvserve

#endif  // KVSERVE_WORKER_PLANNER_PIPELINE_LAYOUT_H_
