#include "common/metrics/metric_names.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kvserve::metrics {

std::string MetricName(std::string_view subsystem, std::string_view name, std::string_view unit) {
  std::string out = "kvserve_";
  out.append(subsystem).append("_").append(name);
  if (!unit.empty()) out.append("_").append(unit);
  return out;
}

std::string CounterName(std::string_view subsystem, std::string_view name,
                        std::string_view unit) {
  return absl::StrCat(MetricName(subsystem, name, unit), "_total");
}

absl::Status CheckMetricName(std::string_view name) {
  const std::string n(name);
  if (!absl::StartsWith(n, "kvserve_")) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric name '", n, "' must start with 'kvserve_'"));
  }
  for (size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat("metric name '", n, "' has character '",
                                                     std::string(1, c), "' at ", i,
                                                     "; only [a-z0-9_] are allowed"));
    }
    if (c == '_' && i + 1 < n.size() && n[i + 1] == '_') {
      return absl::InvalidArgumentError(
          absl::StrCat("metric name '", n, "' has a double underscore at ", i));
    }
  }
  if (n.back() == '_') {
    return absl::InvalidArgumentError(absl::StrCat("metric name '", n, "' ends with '_'"));
  }
  return absl::OkStatus();
}

}  // namespace kvserve::metrics
