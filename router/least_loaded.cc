// least_loaded: the candidate with the smallest load, load = requests this router has in flight
// on the worker + requests waiting in the worker's queue (its last GetLoad report). Ties go to
// the earlier candidate in the pool's order, so the choice is deterministic. Ignores the prefix
// cache entirely: the policy to compare kv_aware against.

#include <memory>

#include "router/routing_policy.h"

namespace kvserve {
namespace {

class LeastLoadedPolicy final : public RoutingPolicy {
 public:
  std::string_view name() const override { return "least_loaded"; }

  WorkerChoice Choose(const RoutingRequest& /*request*/,
                      std::span<const WorkerView> workers) override {
    return {LeastLoadedIndex(workers)};
  }
};

}  // namespace

std::unique_ptr<RoutingPolicy> NewLeastLoadedPolicy(const RoutingPolicyConfig& /*config*/) {
  return std::make_unique<LeastLoadedPolicy>();
}

}  // namespace kvserve
