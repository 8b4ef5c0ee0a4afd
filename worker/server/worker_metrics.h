#ifndef KVSERVE_WORKER_SERVER_WORKER_METRICS_H_
#define KVSERVE_WORKER_SERVER_WORKER_METRICS_H_

#include <cstdint>
#include <memory>
#include <mutex>

#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "worker/engine/engine.h"
#include "worker/server/serving_stats.h"

namespace kvserve {

/// The worker's Prometheus metrics (listed with their vLLM equivalents in docs/metrics.md).
///
/// Two sources: the engine reports steps and finished requests as they happen (this class is
/// its EngineObserver: histograms and token counters), and the pool and queue state is read
/// from Engine::stats() when scraped (gauges, plus counters mirrored from the engine's
/// cumulative figures). Thread-safe.
class WorkerMetrics final : public EngineObserver {
 public:
  /// `engine` and `counters` must outlive every scrape of collectable().
  WorkerMetrics(const Engine* engine, const ServingCounters* counters);

  /// What /metrics serves: the registry, refreshed from the engine before each collection.
  std::shared_ptr<prometheus::Collectable> collectable() const { return collectable_; }

  /// A pull of KV blocks from another worker ended after `seconds`.
  void ObserveKvPull(double seconds) { kv_pull_seconds_->Observe(seconds); }

  // EngineObserver.
  void OnStep(const StepMetrics& step) override;
  void OnRequestFinished(const RequestMetrics& request) override;

 private:
  /// Sets the gauges and mirrored counters from the engine's latest stats.
  void Refresh();

  const Engine* engine_;
  const ServingCounters* counters_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<prometheus::Collectable> collectable_;

  // Gauges set at scrape time.
  prometheus::Gauge* requests_running_;
  prometheus::Gauge* requests_waiting_;
  prometheus::Gauge* kv_capacity_blocks_;
  prometheus::Gauge* kv_used_blocks_;
  prometheus::Gauge* kv_cached_free_blocks_;
  prometheus::Gauge* kv_free_blocks_;
  prometheus::Gauge* kv_usage_ratio_;
  prometheus::Gauge* draining_;
  prometheus::Gauge* open_generate_streams_;
  // Counters mirrored from cumulative engine/serving figures at scrape time.
  prometheus::Counter* prefix_queries_tokens_;
  prometheus::Counter* prefix_hits_tokens_;
  prometheus::Counter* preemptions_;
  prometheus::Counter* engine_steps_;
  prometheus::Counter* generate_rejected_;
  prometheus::Counter* generate_cancelled_;
  // Fed by the engine.
  // KV tiers below the device pool, by tier ("host", "disk").
  prometheus::Gauge* tier_capacity_bytes_[2];
  prometheus::Gauge* tier_used_bytes_[2];
  prometheus::Counter* tier_restored_blocks_[2];
  prometheus::Counter* offloaded_blocks_;
  prometheus::Counter* prefix_restored_tokens_;
  prometheus::Counter* disk_bad_files_;
  prometheus::Counter* disk_write_drops_;
  // KV block transfer between workers.
  // Pipeline leaders only (null otherwise).
  prometheus::Gauge* pipeline_stages_ = nullptr;
  prometheus::Gauge* pipeline_stages_ready_ = nullptr;
  prometheus::Gauge* pipeline_in_flight_ = nullptr;
  prometheus::Counter* pipeline_steps_ = nullptr;
  prometheus::Counter* pipeline_losses_ = nullptr;
  prometheus::Counter* pipeline_bytes_[2] = {nullptr, nullptr};  // sent, received
  int64_t last_pipeline_[4] = {};
  prometheus::Counter* kv_pulls_;
  prometheus::Counter* kv_pull_failures_;
  prometheus::Counter* kv_pulls_declined_;
  prometheus::Counter* kv_received_blocks_;
  prometheus::Counter* kv_received_bytes_;
  prometheus::Counter* kv_sent_blocks_;
  prometheus::Counter* kv_sent_bytes_;
  prometheus::Counter* kv_transfer_restored_blocks_;
  prometheus::Histogram* kv_pull_seconds_;
  prometheus::Counter* prompt_tokens_;
  prometheus::Counter* generation_tokens_;
  prometheus::Counter* device_sampled_tokens_;
  prometheus::Family<prometheus::Counter>* finished_family_;
  prometheus::Histogram* ttft_;
  prometheus::Histogram* itl_;
  prometheus::Histogram* e2e_;
  prometheus::Histogram* queue_time_;
  prometheus::Histogram* prefill_time_;
  prometheus::Histogram* decode_time_;
  prometheus::Histogram* step_tokens_;

  // Last mirrored values, so each refresh adds only the difference.
  std::mutex mirror_mu_;
  int64_t last_prefix_queries_ = 0;
  int64_t last_prefix_hits_ = 0;
  int64_t last_preemptions_ = 0;
  int64_t last_steps_ = 0;
  int64_t last_rejected_ = 0;
  int64_t last_cancelled_ = 0;
  int64_t last_restored_[2] = {0, 0};
  int64_t last_offloaded_ = 0;
  int64_t last_prefix_restored_ = 0;
  int64_t last_bad_files_ = 0;
  int64_t last_write_drops_ = 0;
  int64_t last_kv_transfer_[8] = {};
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_SERVER_WORKER_METRICS_H_
