#ifndef KVSERVE_COMMON_METRICS_METRICS_SERVER_H_
#define KVSERVE_COMMON_METRICS_METRICS_SERVER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "prometheus/registry.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace kvserve::metrics {

/// A registry whose values are refreshed right before every collection: gauges that mirror
/// another component's state (an engine's pool, a router's workers) are set by `refresh` when
/// scraped instead of on every change. `refresh` runs on the scraping thread; concurrent
/// scrapes call it concurrently, so it must be thread-safe.
class RefreshingCollectable final : public prometheus::Collectable {
 public:
  RefreshingCollectable(std::shared_ptr<prometheus::Registry> registry,
                        std::function<void()> refresh);
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::function<void()> refresh_;
};

/// Serves one collectable over HTTP at /metrics (prometheus-cpp's civetweb Exposer).
/// Destroying a server that has answered a request takes about 2 s (civetweb's shutdown).
class MetricsServer {
 public:
  /// Listens on `listen` ("HOST:PORT"; port 0 picks a free one). UNAVAILABLE when the address
  /// cannot be bound or is malformed, naming the flag `--metrics-listen`.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& listen, std::shared_ptr<prometheus::Collectable> collectable);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  /// The bound port.
  int port() const { return port_; }

 private:
  MetricsServer() = default;

  std::shared_ptr<prometheus::Collectable> collectable_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

}  // namespace kvserve::metrics

#endif  // KVSERVE_COMMON_METRICS_METRICS_SERVER_H_
