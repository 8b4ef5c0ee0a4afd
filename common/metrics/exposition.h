#ifndef KVSERVE_COMMON_METRICS_EXPOSITION_H_
#define KVSERVE_COMMON_METRICS_EXPOSITION_H_

// The Prometheus text exposition format (version 0.0.4): rendering a collectable and parsing a
// scrape back into samples, so tests and tools can check what /metrics serves.

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"

namespace kvserve::metrics {

/// One sample line: `name{label="value",...} value`.
struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

/// What /metrics would serve for `collectable`, rendered in-process.
std::string RenderText(const prometheus::Collectable& collectable);

/// Parses an exposition: comment lines (# HELP, # TYPE) are skipped, timestamps ignored.
/// INVALID_ARGUMENT names the line number and what is malformed.
absl::StatusOr<std::vector<Sample>> ParseExposition(std::string_view text);

/// The value of the first sample called `name` whose labels include every pair in `labels`.
std::optional<double> FindSample(const std::vector<Sample>& samples, std::string_view name,
                                 const std::map<std::string, std::string>& labels = {});
/// The sum over every sample called `name` whose labels include every pair in `labels` (0 when
/// there is none).
double SumSamples(const std::vector<Sample>& samples, std::string_view name,
                  const std::map<std::string, std::string>& labels = {});

}  // namespace kvserve::metrics

#endif  // KVSERVE_COMMON_METRICS_EXPOSITION_H_
