#include "router/router_metrics.h"

#include <set>
#include <utility>

#include "common/metrics/buckets.h"
#include "common/metrics/metric_names.h"
#include "common/metrics/metrics_server.h"
#include "router/dispatcher.h"
#include "router/worker_pool.h"

namespace kvserve {
namespace {

using metrics::CounterName;
using metrics::MetricName;

constexpr char kSub[] = "router";

}  // namespace

RouterMetrics::RouterMetrics(std::string policy)
    : policy_(std::move(policy)), registry_(std::make_shared<prometheus::Registry>()) {
  prometheus::Registry& r = *registry_;
  in_flight_family_ = &prometheus::BuildGauge()
                           .Name(MetricName(kSub, "worker_in_flight_requests"))
                           .Help("Requests this router has in flight on each worker.")
                           .Register(r);
  health_family_ = &prometheus::BuildGauge()
                        .Name(MetricName(kSub, "worker_health_state"))
                        .Help("1 for each worker's current state (healthy, draining or "
                              "unhealthy), 0 for the others.")
                        .Register(r);
  queued_ = &prometheus::BuildGauge()
                 .Name(MetricName(kSub, "queued_requests"))
                 .Help("Requests waiting for a worker slot.")
                 .Register(r)
                 .Add({});
  workers_known_ = &prometheus::BuildGauge()
                        .Name(MetricName(kSub, "workers"))
                        .Help("Workers in the pool (static list or DNS).")
                        .Register(r)
                        .Add({});
  auto& decisions = prometheus::BuildCounter()
                        .Name(CounterName(kSub, "routing_decisions"))
                        .Help("Requests sent to a worker, by policy and by outcome: prefix_hit "
                              "when the worker held at least one block of the prompt.")
                        .Register(r);
  decisions_hit_ = &decisions.Add({{"policy", policy_}, {"outcome", "prefix_hit"}});
  decisions_miss_ = &decisions.Add({{"policy", policy_}, {"outcome", "prefix_miss"}});
  matched_tokens_ = &prometheus::BuildHistogram()
                         .Name(MetricName(kSub, "matched_prefix", "tokens"))
                         .Help("Prompt tokens the chosen worker already held in its prefix "
                               "cache, per routing decision (0 for a miss).")
                         .Register(r)
                         .Add({}, [] {
                           std::vector<double> b = {0};
                           for (double v : metrics::TokenCountBuckets()) b.push_back(v);
                           return b;
                         }());
  kv_transfer_hints_ =
      &prometheus::BuildCounter()
           .Name(CounterName(kSub, "kv_transfer_hints"))
           .Help(
               "Requests sent to a worker with a hint naming another worker that holds more "
               "of the prompt's leading KV blocks, for the worker to pull them (kv_aware with "
               "--kv-transfer-weight > 0).")
           .Register(r)
           .Add({});
  retries_ = &prometheus::BuildCounter()
                  .Name(CounterName(kSub, "retries"))
                  .Help("Requests retried on another worker after failing before streaming.")
                  .Register(r)
                  .Add({});
  auto& prefills = prometheus::BuildCounter()
                       .Name(CounterName(kSub, "disaggregated_prefills"))
                       .Help(
                           "Prefill phases run on a prefill-role worker before the decode "
                           "worker streams, by outcome: ok (the decode worker was told to "
                           "pull the prompt's blocks) or failed (it computes them itself).")
                       .Register(r);
  prefills_ok_ = &prefills.Add({{"outcome", "ok"}});
  prefills_failed_ = &prefills.Add({{"outcome", "failed"}});
  prefill_phase_duration_ = &prometheus::BuildHistogram()
                                 .Name(MetricName(kSub, "prefill_phase_duration", "seconds"))
                                 .Help(
                                     "Prefill phases on a prefill-role worker, from sending "
                                     "the prompt to the end of that call (either outcome).")
                                 .Register(r)
                                 .Add({}, metrics::TimeToFirstTokenBuckets());
  rejections_family_ = &prometheus::BuildCounter()
                            .Name(CounterName(kSub, "admission_rejections"))
                            .Help("Requests refused admission, by reason: overloaded (every "
                                  "worker full and the queue full) or no_worker.")
                            .Register(r);
  rejections_family_->Add({{"reason", "overloaded"}});
  rejections_family_->Add({{"reason", "no_worker"}});
  requests_family_ = &prometheus::BuildCounter()
                          .Name(CounterName(kSub, "requests"))
                          .Help("Generate calls that ended, by gRPC status code.")
                          .Register(r);
  requests_family_->Add({{"code", "OK"}});
  request_duration_ = &prometheus::BuildHistogram()
                           .Name(MetricName(kSub, "request_duration", "seconds"))
                           .Help("Generate calls from arrival at the router to their end.")
                           .Register(r)
                           .Add({}, metrics::RequestPhaseBuckets());
  queue_time_ = &prometheus::BuildHistogram()
                     .Name(MetricName(kSub, "request_queue_time", "seconds"))
                     .Help("From arrival at the router to the first worker slot.")
                     .Register(r)
                     .Add({}, metrics::RequestPhaseBuckets());
  ttft_ = &prometheus::BuildHistogram()
               .Name(MetricName(kSub, "time_to_first_token", "seconds"))
               .Help("From arrival at the router to the first response message.")
               .Register(r)
               .Add({}, metrics::TimeToFirstTokenBuckets());
  collectable_ = std::make_shared<metrics::RefreshingCollectable>(registry_, [this] { Refresh(); });
}

void RouterMetrics::Attach(const WorkerPool* pool, const Dispatcher* dispatcher) {
  std::lock_guard<std::mutex> lock(mu_);
  pool_ = pool;
  dispatcher_ = dispatcher;
}

void RouterMetrics::Refresh() {
  std::lock_guard<std::mutex> lock(mu_);
  if (pool_ == nullptr) return;
  std::set<std::string> present;
  const auto workers = pool_->Workers();
  workers_known_->Set(static_cast<double>(workers.size()));
  for (const auto& worker : workers) {
    const std::string& address = worker->address();
    present.insert(address);
    auto it = workers_.find(address);
    if (it == workers_.end()) {
      WorkerGauges g;
      g.in_flight = &in_flight_family_->Add({{"worker", address}});
      g.healthy = &health_family_->Add({{"worker", address}, {"state", "healthy"}});
      g.draining = &health_family_->Add({{"worker", address}, {"state", "draining"}});
      g.unhealthy = &health_family_->Add({{"worker", address}, {"state", "unhealthy"}});
      it = workers_.emplace(address, g).first;
    }
    const bool healthy = worker->healthy();
    const bool draining = worker->draining();
    it->second.in_flight->Set(worker->in_flight());
    it->second.healthy->Set(healthy && !draining ? 1 : 0);
    it->second.draining->Set(healthy && draining ? 1 : 0);
    it->second.unhealthy->Set(healthy ? 0 : 1);
  }
  // Workers that left the pool: drop their series so labels stay bounded by the pool's size.
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (present.contains(it->first)) {
      ++it;
      continue;
    }
    in_flight_family_->Remove(it->second.in_flight);
    health_family_->Remove(it->second.healthy);
    health_family_->Remove(it->second.draining);
    health_family_->Remove(it->second.unhealthy);
    it = workers_.erase(it);
  }
  if (dispatcher_ != nullptr) queued_->Set(static_cast<double>(dispatcher_->queued()));
}

void RouterMetrics::RecordRouting(int matched_tokens) {
  (matched_tokens > 0 ? decisions_hit_ : decisions_miss_)->Increment();
  matched_tokens_->Observe(matched_tokens);
}

void RouterMetrics::RecordKvTransferHint() { kv_transfer_hints_->Increment(); }

void RouterMetrics::RecordRetry() { retries_->Increment(); }

void RouterMetrics::RecordPrefillPhase(std::string_view outcome, double seconds) {
  (outcome == "ok" ? prefills_ok_ : prefills_failed_)->Increment();
  prefill_phase_duration_->Observe(seconds);
}

void RouterMetrics::RecordRejection(std::string_view reason) {
  rejections_family_->Add({{"reason", std::string(reason)}}).Increment();
}

void RouterMetrics::RecordRequest(std::string_view code, double e2e_seconds, double queue_seconds,
                                  double ttft_seconds) {
  requests_family_->Add({{"code", std::string(code)}}).Increment();
  request_duration_->Observe(e2e_seconds);
  if (queue_seconds >= 0) queue_time_->Observe(queue_seconds);
  if (ttft_seconds >= 0) ttft_->Observe(ttft_seconds);
}

}  // namespace kvserve
