#include "worker/server/worker_metrics.h"

#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/metrics/buckets.h"
#include "common/metrics/metric_names.h"
#include "common/metrics/metrics_server.h"
#include "kernels/kv_dtype.h"

namespace kvserve {
namespace {

using metrics::CounterName;
using metrics::MetricName;

constexpr char kSub[] = "worker";

prometheus::Gauge* AddGauge(prometheus::Registry& r, const std::string& name,
                            const std::string& help) {
  return &prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({});
}

prometheus::Counter* AddCounter(prometheus::Registry& r, const std::string& name,
                                const std::string& help) {
  return &prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
}

prometheus::Histogram* AddHistogram(prometheus::Registry& r, const std::string& name,
                                    const std::string& help, const std::vector<double>& buckets) {
  return &prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add({}, buckets);
}

// Adds `now - *last` to a counter that mirrors a cumulative figure.
void Mirror(prometheus::Counter* counter, int64_t now, int64_t* last) {
  if (now > *last) counter->Increment(static_cast<double>(now - *last));
  *last = now;
}

std::string FinishLabel(const RequestMetrics& m) {
  if (m.status_code == absl::StatusCode::kCancelled) return "abort";
  if (m.status_code != absl::StatusCode::kOk) return "error";
  return m.finish_reason == FinishReason::kStop ? "stop" : "length";
}

}  // namespace

WorkerMetrics::WorkerMetrics(const Engine* engine, const ServingCounters* counters)
    : engine_(engine), counters_(counters), registry_(std::make_shared<prometheus::Registry>()) {
  prometheus::Registry& r = *registry_;
  requests_running_ = AddGauge(r, MetricName(kSub, "requests_running"),
                               "Requests in the engine's running batch.");
  requests_waiting_ = AddGauge(r, MetricName(kSub, "requests_waiting"),
                               "Requests queued in the engine, waiting for KV blocks or a slot.");
  kv_capacity_blocks_ = AddGauge(r, MetricName(kSub, "kv_cache_capacity", "blocks"),
                                 "KV blocks in the pool (excluding the reserved null block).");
  kv_used_blocks_ = AddGauge(r, MetricName(kSub, "kv_cache_used", "blocks"),
                             "KV blocks referenced by running or preempted sequences.");
  kv_cached_free_blocks_ =
      AddGauge(r, MetricName(kSub, "kv_cache_cached_free", "blocks"),
               "Unreferenced KV blocks still holding a cached prefix (evictable).");
  kv_free_blocks_ = AddGauge(r, MetricName(kSub, "kv_cache_free", "blocks"),
                             "KV blocks free to allocate (including cached-free ones).");
  kv_usage_ratio_ = AddGauge(r, MetricName(kSub, "kv_cache_usage", "ratio"),
                             "Used KV blocks over capacity, 0 to 1.");
  draining_ = AddGauge(r, MetricName(kSub, "draining"),
                       "1 once the worker stopped admitting requests (drain or shutdown).");
  open_generate_streams_ = AddGauge(r, MetricName(kSub, "open_generate_streams"),
                                    "Generate calls streaming now.");
  prefix_queries_tokens_ =
      AddCounter(r, CounterName(kSub, "prefix_cache_queries", "tokens"),
                 "Prompt tokens looked up in the prefix cache when requests were admitted.");
  prefix_hits_tokens_ = AddCounter(r, CounterName(kSub, "prefix_cache_hits", "tokens"),
                                   "Prompt tokens found in the prefix cache (not recomputed).");
  auto& tier_capacity = prometheus::BuildGauge()
                            .Name(MetricName(kSub, "kv_tier_capacity", "bytes"))
                            .Help(
                                "Size of a KV tier below the device pool (0: off), by tier: "
                                "host memory or disk.")
                            .Register(r);
  auto& tier_used = prometheus::BuildGauge()
                        .Name(MetricName(kSub, "kv_tier_used", "bytes"))
                        .Help("Bytes of KV blocks held in a tier below the device pool.")
                        .Register(r);
  auto& tier_restored = prometheus::BuildCounter()
                            .Name(CounterName(kSub, "kv_tier_restored", "blocks"))
                            .Help(
                                "KV blocks restored into the device pool from a tier on a "
                                "prefix hit, by tier.")
                            .Register(r);
  for (int t = 0; t < 2; ++t) {
    const std::map<std::string, std::string> labels{{"tier", t == 0 ? "host" : "disk"}};
    tier_capacity_bytes_[t] = &tier_capacity.Add(labels);
    tier_used_bytes_[t] = &tier_used.Add(labels);
    tier_restored_blocks_[t] = &tier_restored.Add(labels);
  }
  offloaded_blocks_ = AddCounter(r, CounterName(kSub, "kv_offloaded", "blocks"),
                                 "Newly cached KV blocks copied from the device pool to the "
                                 "host tier (or to disk without one).");
  prefix_restored_tokens_ =
      AddCounter(r, CounterName(kSub, "prefix_cache_restored", "tokens"),
                 "Part of the prefix-cache hits restored from the host or disk tier.");
  disk_bad_files_ = AddCounter(r, CounterName(kSub, "kv_disk_bad_files"),
                               "Block files found truncated, corrupted or written for another "
                               "model or layout, and removed.");
  disk_write_drops_ = AddCounter(r, CounterName(kSub, "kv_disk_write_drops"),
                                 "Block writes to disk dropped because too many were queued.");
  kv_pulls_ = AddCounter(r, CounterName(kSub, "kv_transfer_pulls"),
                         "Pulls of KV blocks from another worker (GenerateRequest.kv_source).");
  kv_pull_failures_ = AddCounter(r, CounterName(kSub, "kv_transfer_pull_failures"),
                                 "Pulls that failed or were cut short; the blocks that did not "
                                 "arrive were computed.");
  kv_pulls_declined_ = AddCounter(r, CounterName(kSub, "kv_transfer_pulls_declined"),
                                  "Hints not followed: the cost model found computing cheaper "
                                  "(or --kv-transfer never).");
  kv_received_blocks_ = AddCounter(r, CounterName(kSub, "kv_transfer_received", "blocks"),
                                   "KV blocks received from other workers.");
  kv_received_bytes_ = AddCounter(r, CounterName(kSub, "kv_transfer_received", "bytes"),
                                  "Bytes of KV blocks received from other workers.");
  kv_sent_blocks_ = AddCounter(r, CounterName(kSub, "kv_transfer_sent", "blocks"),
                               "KV blocks sent to other workers (Worker/FetchKvBlocks).");
  kv_sent_bytes_ = AddCounter(r, CounterName(kSub, "kv_transfer_sent", "bytes"),
                              "Bytes of KV blocks sent to other workers.");
  kv_transfer_restored_blocks_ =
      AddCounter(r, CounterName(kSub, "kv_transfer_restored", "blocks"),
                 "Received KV blocks restored into the device pool by a prefix lookup.");
  kv_pull_seconds_ = AddHistogram(r, MetricName(kSub, "kv_transfer_pull_duration", "seconds"),
                                  "From asking a worker for KV blocks to the last block's "
                                  "arrival (or the failure).",
                                  metrics::RequestPhaseBuckets());
  preemptions_ = AddCounter(r, CounterName(kSub, "preemptions"),
                            "Sequences preempted (blocks freed, recomputed later).");
  engine_steps_ = AddCounter(r, CounterName(kSub, "engine_steps"), "Engine steps run.");
  generate_rejected_ = AddCounter(r, CounterName(kSub, "generate_rejected"),
                                  "Generate calls refused before or by the engine's Submit.");
  generate_cancelled_ = AddCounter(r, CounterName(kSub, "generate_cancelled"),
                                   "Generate calls cancelled by the client or its deadline.");
  prompt_tokens_ = AddCounter(r, CounterName(kSub, "prompt", "tokens"),
                              "Prompt tokens of requests that produced their first token.");
  generation_tokens_ =
      AddCounter(r, CounterName(kSub, "generation", "tokens"), "Tokens generated (all samples).");
  device_sampled_tokens_ =
      AddCounter(r, CounterName(kSub, "device_sampled", "tokens"),
                 "Tokens sampled on the device, where the logits are (the rest: on the host).");
  finished_family_ = &prometheus::BuildCounter()
                          .Name(CounterName(kSub, "requests_finished"))
                          .Help("Requests that ended, by finish_reason: stop, length, abort "
                                "(cancelled) or error.")
                          .Register(r);
  for (const char* reason : {"stop", "length", "abort", "error"}) {
    finished_family_->Add({{"finish_reason", reason}});
  }
  ttft_ = AddHistogram(r, MetricName(kSub, "time_to_first_token", "seconds"),
                       "From the engine accepting a request to its first token.",
                       metrics::TimeToFirstTokenBuckets());
  itl_ = AddHistogram(r, MetricName(kSub, "inter_token_latency", "seconds"),
                      "Between consecutive tokens of one sample.",
                      metrics::InterTokenLatencyBuckets());
  e2e_ = AddHistogram(r, MetricName(kSub, "e2e_request_latency", "seconds"),
                      "From the engine accepting a request to its end.",
                      metrics::RequestPhaseBuckets());
  queue_time_ = AddHistogram(r, MetricName(kSub, "request_queue_time", "seconds"),
                             "From accepting a request to its first engine step.",
                             metrics::RequestPhaseBuckets());
  prefill_time_ = AddHistogram(r, MetricName(kSub, "request_prefill_time", "seconds"),
                               "From a request's first engine step to its first token.",
                               metrics::RequestPhaseBuckets());
  decode_time_ = AddHistogram(r, MetricName(kSub, "request_decode_time", "seconds"),
                              "From a request's first token to its last.",
                              metrics::RequestPhaseBuckets());
  step_tokens_ = AddHistogram(r, MetricName(kSub, "engine_step", "tokens"),
                              "Tokens fed to the model per engine step.",
                              metrics::TokenCountBuckets());
  const EngineOptions& options = engine_->options();
  if (options.pipeline != nullptr) {
    pipeline_stages_ = AddGauge(r, MetricName(kSub, "pipeline_stages"),
                                "Stages of this leader's pipeline group (--pp).");
    pipeline_stages_ready_ =
        AddGauge(r, MetricName(kSub, "pipeline_stages_ready"),
                 "Stages joined and ready, the leader included; the group serves when this "
                 "equals kvserve_worker_pipeline_stages.");
    pipeline_in_flight_ = AddGauge(r, MetricName(kSub, "pipeline_steps_in_flight"),
                                   "Steps (micro-batches) on their way through the stages.");
    pipeline_steps_ =
        AddCounter(r, CounterName(kSub, "pipeline_steps"), "Steps that went through every stage.");
    pipeline_losses_ = AddCounter(r, CounterName(kSub, "pipeline_stage_losses"),
                                  "Stages dropped from the group (closed, failed or timed out); "
                                  "each failed the group's requests.");
    auto& bytes = prometheus::BuildCounter()
                      .Name(CounterName(kSub, "pipeline_transfer", "bytes"))
                      .Help(
                          "Hand-over and logits bytes between the leader and its stages, by "
                          "direction (sent, received).")
                      .Register(r);
    pipeline_bytes_[0] = &bytes.Add({{"direction", "sent"}});
    pipeline_bytes_[1] = &bytes.Add({{"direction", "received"}});
  }
  prometheus::BuildGauge()
      .Name(MetricName(kSub, "cache_config_info"))
      .Help("The KV cache configuration, as labels; the value is always 1.")
      .Register(r)
      .Add({{"block_size", absl::StrCat(options.block_size)},
            {"kv_cache_dtype", std::string(KvCacheDTypeName(options.kv_cache_dtype))},
            {"num_blocks", absl::StrCat(engine_->num_kv_blocks())},
            {"enable_prefix_caching", options.scheduler.enable_prefix_caching ? "true" : "false"}})
      .Set(1);
  collectable_ = std::make_shared<metrics::RefreshingCollectable>(registry_, [this] { Refresh(); });
}

void WorkerMetrics::Refresh() {
  const EngineStats s = engine_->stats();
  requests_running_->Set(s.num_running);
  requests_waiting_->Set(s.num_waiting);
  kv_capacity_blocks_->Set(s.total_blocks);
  kv_used_blocks_->Set(s.used_blocks);
  kv_cached_free_blocks_->Set(s.cached_free_blocks);
  kv_free_blocks_->Set(s.free_blocks);
  kv_usage_ratio_->Set(s.total_blocks > 0 ? static_cast<double>(s.used_blocks) / s.total_blocks
                                          : 0.0);
  draining_->Set(engine_->draining() ? 1 : 0);
  const ServingStats serving = counters_->Snapshot();
  open_generate_streams_->Set(static_cast<double>(serving.open_generate_streams));
  std::lock_guard<std::mutex> lock(mirror_mu_);
  Mirror(prefix_queries_tokens_, s.prefix_query_tokens, &last_prefix_queries_);
  Mirror(prefix_hits_tokens_, s.prefix_hit_tokens, &last_prefix_hits_);
  Mirror(preemptions_, s.num_preemptions, &last_preemptions_);
  const KvOffloader::Stats& tiers = s.kv_tiers;
  tier_capacity_bytes_[0]->Set(static_cast<double>(tiers.host_capacity_blocks * tiers.block_bytes));
  tier_used_bytes_[0]->Set(static_cast<double>(tiers.host_blocks * tiers.block_bytes));
  tier_capacity_bytes_[1]->Set(static_cast<double>(tiers.disk.capacity_bytes));
  tier_used_bytes_[1]->Set(static_cast<double>(tiers.disk.bytes));
  Mirror(tier_restored_blocks_[0], tiers.restored_from_host, &last_restored_[0]);
  Mirror(tier_restored_blocks_[1], tiers.restored_from_disk, &last_restored_[1]);
  Mirror(offloaded_blocks_, tiers.offloaded_blocks, &last_offloaded_);
  Mirror(prefix_restored_tokens_, s.prefix_restored_tokens, &last_prefix_restored_);
  Mirror(disk_bad_files_, tiers.disk.bad_files, &last_bad_files_);
  Mirror(disk_write_drops_, tiers.disk.write_drops, &last_write_drops_);
  Mirror(engine_steps_, s.num_steps, &last_steps_);
  Mirror(generate_rejected_, serving.generate_rejected, &last_rejected_);
  Mirror(generate_cancelled_, serving.generate_cancelled, &last_cancelled_);
  Mirror(kv_pulls_, serving.kv_pulls, &last_kv_transfer_[0]);
  Mirror(kv_pull_failures_, serving.kv_pull_failures, &last_kv_transfer_[1]);
  Mirror(kv_pulls_declined_, serving.kv_pulls_declined, &last_kv_transfer_[2]);
  Mirror(kv_received_blocks_, serving.kv_pulled_blocks, &last_kv_transfer_[3]);
  Mirror(kv_received_bytes_, serving.kv_pulled_bytes, &last_kv_transfer_[4]);
  Mirror(kv_sent_blocks_, serving.kv_served_blocks, &last_kv_transfer_[5]);
  Mirror(kv_sent_bytes_, serving.kv_served_bytes, &last_kv_transfer_[6]);
  Mirror(kv_transfer_restored_blocks_, s.kv_transfer.restored_blocks, &last_kv_transfer_[7]);
  if (PipelineLink* pipeline = engine_->options().pipeline; pipeline != nullptr) {
    const PipelineGroupStats p = pipeline->stats();
    pipeline_stages_->Set(p.stages);
    pipeline_stages_ready_->Set(p.stages_ready);
    pipeline_in_flight_->Set(static_cast<double>(p.in_flight));
    Mirror(pipeline_steps_, p.steps, &last_pipeline_[0]);
    Mirror(pipeline_losses_, p.losses, &last_pipeline_[1]);
    Mirror(pipeline_bytes_[0], p.bytes_sent, &last_pipeline_[2]);
    Mirror(pipeline_bytes_[1], p.bytes_received, &last_pipeline_[3]);
  }
}

void WorkerMetrics::OnStep(const StepMetrics& step) {
  step_tokens_->Observe(step.num_tokens);
  if (step.prompt_tokens > 0) prompt_tokens_->Increment(step.prompt_tokens);
  if (step.generation_tokens > 0) generation_tokens_->Increment(step.generation_tokens);
  if (step.device_sampled_tokens > 0) {
    device_sampled_tokens_->Increment(step.device_sampled_tokens);
  }
  for (double s : step.time_to_first_token_seconds) ttft_->Observe(s);
  for (double s : step.inter_token_latency_seconds) itl_->Observe(s);
}

void WorkerMetrics::OnRequestFinished(const RequestMetrics& request) {
  finished_family_->Add({{"finish_reason", FinishLabel(request)}}).Increment();
  e2e_->Observe(request.e2e_seconds);
  if (request.queue_seconds >= 0) queue_time_->Observe(request.queue_seconds);
  if (request.prefill_seconds >= 0) prefill_time_->Observe(request.prefill_seconds);
  if (request.decode_seconds >= 0) decode_time_->Observe(request.decode_seconds);
}

}  // namespace kvserve
