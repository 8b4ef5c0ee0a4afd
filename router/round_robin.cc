// round_robin: ignores load and cache; the n-th request goes to candidate (n mod count).
//
// The candidates are the routable workers with a free slot, in the pool's order (the order of
// --workers, or of DNS answers sorted by address). While that set is stable the policy cycles
// through it exactly; when it changes the cycle simply continues over the new set. A baseline
// for benchmarks, and a fair spreader when every request is unique.

#include <cstdint>
#include <memory>

#include "router/routing_policy.h"

namespace kvserve {
namespace {

class RoundRobinPolicy final : public RoutingPolicy {
 public:
  std::string_view name() const override { return "round_robin"; }

  WorkerChoice Choose(const RoutingRequest& /*request*/,
                      std::span<const WorkerView> workers) override {
    const uint64_t turn = next_++;
    return {static_cast<size_t>(turn % workers.size())};
  }

 private:
  uint64_t next_ = 0;
};

}  // namespace

std::unique_ptr<RoutingPolicy> NewRoundRobinPolicy(const RoutingPolicyConfig& /*config*/) {
  return std::make_unique<RoundRobinPolicy>();
}

}  // namespace kvserve
