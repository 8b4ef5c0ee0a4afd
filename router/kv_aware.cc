// kv_aware (the default): send a request where its prompt's prefix is already cached, unless
// that worker is too busy.
//
// For each candidate worker w (healthy, not draining, with a free in-flight slot):
//
//   hit(w)   = min(1, matched(w) * block_size / prompt_tokens)           in [0, 1]
//   matched(w) = device_blocks(w) + lower_tier_weight * (matched_blocks(w) - device_blocks(w))
//              + transfer_weight * max(0, pullable_blocks(w) - matched_blocks(w))
//   load(w)  = in_flight(w) + waiting_requests(w)                        (WorkerView::Load)
//   score(w) = hit(w) - load_weight * load(w) / capacity(w)
//
// matched_blocks(w) is the longest leading run of the request's block keys that w's KV events
// say it holds, in any tier: only a leading run is reusable, because each key hashes its whole
// prefix. Blocks held only in the worker's host or disk tier count lower_tier_weight (0.8) of
// one in its device pool: the worker restores them, which costs a copy.
// pullable_blocks(w) is the longest such run any other routable worker holds, a full one
// included: w can pull the blocks beyond its own run from that worker (Worker/FetchKvBlocks)
// instead of computing them, so they count transfer_weight (0.5) of a device block. This is
// what lets a busy holder of a hot prefix hand requests to an idle worker without losing the
// cache: the dispatcher then names the holder in the request (GenerateRequest.kv_source), and
// the worker pulls only when its own cost model agrees. Keys hash the cache salt, so a holder
// of another tenant's blocks never matches. transfer_weight 0 turns this off (no hints).
// The best worker has the highest score; ties go to the lower load, then the earlier candidate.
//
// Balance guard: a popular prefix (a shared system prompt) would otherwise draw every request
// to the one worker that cached it first. When load(best) - load(least loaded) exceeds
// balance_threshold, the request goes to the least loaded worker instead; it computes (or
// pulls) the prefix once and later requests then find it cached in two places.
//
// With no cache hits anywhere (or a prompt shorter than one block) every hit is 0 and the
// policy reduces to least_loaded (for equal capacities).

#include <algorithm>
#include <memory>

#include "router/routing_policy.h"

namespace kvserve {
namespace {

class KvAwarePolicy final : public RoutingPolicy {
 public:
  explicit KvAwarePolicy(const KvAwareConfig& config) : config_(config) {}

  std::string_view name() const override { return "kv_aware"; }
  bool wants_kv_transfer_hints() const override { return config_.transfer_weight > 0; }

  WorkerChoice Choose(const RoutingRequest& request, std::span<const WorkerView> workers) override {
    size_t best = 0;
    double best_score = Score(request, workers[0]);
    for (size_t i = 1; i < workers.size(); ++i) {
      const double score = Score(request, workers[i]);
      if (score > best_score || (score == best_score && workers[i].Load() < workers[best].Load())) {
        best = i;
        best_score = score;
      }
    }
    if (config_.balance_threshold >= 0) {
      const size_t least = LeastLoadedIndex(workers);
      if (workers[best].Load() - workers[least].Load() > config_.balance_threshold) {
        return {least};
      }
    }
    return {best};
  }

 private:
  double Score(const RoutingRequest& request, const WorkerView& worker) const {
    double hit = 0.0;
    if (request.prompt_tokens > 0) {
      const int pulled = std::max(0, worker.pullable_blocks - worker.matched_blocks);
      const double matched =
          worker.matched_device_blocks +
          config_.lower_tier_weight * (worker.matched_blocks - worker.matched_device_blocks) +
          config_.transfer_weight * pulled;
      hit = matched * request.block_size / request.prompt_tokens;
      hit = std::min(hit, 1.0);
    }
    const double capacity = std::max(worker.capacity, 1);
    return hit - config_.load_weight * worker.Load() / capacity;
  }

  KvAwareConfig config_;
};

}  // namespace

std::unique_ptr<RoutingPolicy> NewKvAwarePolicy(const RoutingPolicyConfig& config) {
  return std::make_unique<KvAwarePolicy>(config.kv_aware);
}

}  // namespace kvserve
