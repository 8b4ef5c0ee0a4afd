#include "common/metrics/metrics_server.h"

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "prometheus/exposer.h"

namespace kvserve::metrics {

RefreshingCollectable::RefreshingCollectable(std::shared_ptr<prometheus::Registry> registry,
                                             std::function<void()> refresh)
    : registry_(std::move(registry)), refresh_(std::move(refresh)) {}

std::vector<prometheus::MetricFamily> RefreshingCollectable::Collect() const {
  if (refresh_) refresh_();
  return registry_->Collect();
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& listen, std::shared_ptr<prometheus::Collectable> collectable) {
  if (listen.empty() || listen.rfind(':') == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics-listen: expected HOST:PORT, got '", listen, "'"));
  }
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->collectable_ = std::move(collectable);
  try {
    // One worker thread: scrapes are rare and each is cheap.
    server->exposer_ = std::make_unique<prometheus::Exposer>(listen, 1);
  } catch (const std::exception&) {
    // civetweb's message is a raw internal string; say what we know instead.
    return absl::UnavailableError(absl::StrCat(
        "metrics-listen: cannot serve /metrics on '", listen, "' (address in use or invalid)"));
  }
  const std::vector<int> ports = server->exposer_->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(
        absl::StrCat("metrics-listen: '", listen, "' bound no port"));
  }
  server->port_ = ports.front();
  server->exposer_->RegisterCollectable(server->collectable_);
  return server;
}

MetricsServer::~MetricsServer() = default;

}  // namespace kvserve::metrics
