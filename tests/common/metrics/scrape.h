#ifndef KVSERVE_TESTS_COMMON_METRICS_SCRAPE_H_
#define KVSERVE_TESTS_COMMON_METRICS_SCRAPE_H_

// Test helper: a minimal HTTP/1.0 GET over loopback, to scrape /metrics like Prometheus does.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/metrics/exposition.h"

namespace kvserve::testing {

/// GET http://127.0.0.1:`port``path`; the body when the status is 200. Bounded by a 10 s socket
/// timeout; UNAVAILABLE on connection errors, INTERNAL on a non-200 answer.
absl::StatusOr<std::string> HttpGet(int port, const std::string& path);

/// HttpGet(port, "/metrics") parsed into samples.
absl::StatusOr<std::vector<metrics::Sample>> Scrape(int port);

}  // namespace kvserve::testing

#endif  // KVSERVE_TESTS_COMMON_METRICS_SCRAPE_H_
