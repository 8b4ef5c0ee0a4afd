#ifndef KVSERVE_ROUTER_ROUTER_METRICS_H_
#define KVSERVE_ROUTER_ROUTER_METRICS_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace kvserve {

class Dispatcher;
class WorkerPool;

/// The router's Prometheus metrics (listed with their meaning in docs/metrics.md).
///
/// Events (routing decisions, retries, rejections, finished requests) are recorded as they
/// happen by the dispatcher and the Generate calls; per-worker gauges (in-flight requests,
/// health state) and the queue length are read from the pool and the dispatcher when scraped.
/// Thread-safe.
class RouterMetrics {
 public:
  /// `policy` labels the routing decisions.
  explicit RouterMetrics(std::string policy);

  /// Where scrape-time gauges come from; both must outlive every scrape. Call before serving.
  void Attach(const WorkerPool* pool, const Dispatcher* dispatcher);
  /// What /metrics serves.
  std::shared_ptr<prometheus::Collectable> collectable() const { return collectable_; }

  /// The policy sent a request to a worker holding `matched_tokens` of its prompt's prefix.
  void RecordRouting(int matched_tokens);
  /// A request was sent to a worker with a hint naming another worker that holds more of its
  /// prompt's leading blocks (GenerateRequest.kv_source).
  void RecordKvTransferHint();
  /// A request failed on a worker before streaming and was sent to another one.
  void RecordRetry();
  /// A disaggregated request's prefill phase on a prefill worker ended after `seconds`:
  /// `outcome` "ok" (the decode worker pulls its blocks) or "failed" (it computes them).
  /// Phases the client cancelled are not recorded.
  void RecordPrefillPhase(std::string_view outcome, double seconds);
  /// A request was refused admission: `reason` is "overloaded" (queue full) or "no_worker".
  void RecordRejection(std::string_view reason);
  /// A Generate call ended with the gRPC code named `code` ("OK", "UNAVAILABLE", ...). Phases
  /// it never reached are negative and not observed: `queue_seconds` (waiting for a worker
  /// slot), `ttft_seconds` (to the first response message).
  void RecordRequest(std::string_view code, double e2e_seconds, double queue_seconds,
                     double ttft_seconds);

 private:
  struct WorkerGauges {
    prometheus::Gauge* in_flight;
    prometheus::Gauge* healthy;
    prometheus::Gauge* draining;
    prometheus::Gauge* unhealthy;
  };
  /// Sets the per-worker gauges and the queue length; forgets workers that left.
  void Refresh();

  const std::string policy_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<prometheus::Collectable> collectable_;

  prometheus::Family<prometheus::Gauge>* in_flight_family_;
  prometheus::Family<prometheus::Gauge>* health_family_;
  prometheus::Gauge* queued_;
  prometheus::Gauge* workers_known_;
  prometheus::Counter* decisions_hit_;
  prometheus::Counter* decisions_miss_;
  prometheus::Histogram* matched_tokens_;
  prometheus::Counter* kv_transfer_hints_;
  prometheus::Counter* retries_;
  prometheus::Counter* prefills_ok_;
  prometheus::Counter* prefills_failed_;
  prometheus::Histogram* prefill_phase_duration_;
  prometheus::Family<prometheus::Counter>* rejections_family_;
  prometheus::Family<prometheus::Counter>* requests_family_;
  prometheus::Histogram* request_duration_;
  prometheus::Histogram* queue_time_;
  prometheus::Histogram* ttft_;

  std::mutex mu_;
  const WorkerPool* pool_ = nullptr;
  const Dispatcher* dispatcher_ = nullptr;
  std::map<std::string, WorkerGauges> workers_;
};

}  // namespace kvserve

#endif  // KVSERVE_ROUTER_ROUTER_METRICS_H_
