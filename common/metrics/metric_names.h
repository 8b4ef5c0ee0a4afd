#ifndef KVSERVE_COMMON_METRICS_METRIC_NAMES_H_
#define KVSERVE_COMMON_METRICS_METRIC_NAMES_H_

// kvserve's metric naming rule: kvserve_<subsystem>_<name>[_<unit>][_total], snake_case, base
// units (seconds, bytes, tokens, blocks, requests), no colons (those are for recording rules).

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace kvserve::metrics {

/// "kvserve_<subsystem>_<name>" with "_<unit>" appended when `unit` is not empty.
std::string MetricName(std::string_view subsystem, std::string_view name,
                       std::string_view unit = {});
/// MetricName + "_total", for counters (prometheus-cpp does not append it itself).
std::string CounterName(std::string_view subsystem, std::string_view name,
                        std::string_view unit = {});

/// OK when `name` follows the rule: prefix "kvserve_", then lowercase letters, digits and
/// single underscores, no colon, no trailing underscore. INVALID_ARGUMENT says what is wrong.
absl::Status CheckMetricName(std::string_view name);

}  // namespace kvserve::metrics

#endif  // KVSERVE_COMMON_METRICS_METRIC_NAMES_H_
