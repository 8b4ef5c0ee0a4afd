#include "router/routing_policy.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvserve {

RoutingPolicyRegistry& RoutingPolicyRegistry::Default() {
  // Registered explicitly here rather than by static initialisers in each policy's file: a
  // static library drops object files nothing references, and their registrations with them.
  static RoutingPolicyRegistry* registry = [] {
    auto* r = new RoutingPolicyRegistry;
    r->Register("round_robin", NewRoundRobinPolicy);
    r->Register("least_loaded", NewLeastLoadedPolicy);
    r->Register("kv_aware", NewKvAwarePolicy);
    return r;
  }();
  return *registry;
}

void RoutingPolicyRegistry::Register(std::string name, RoutingPolicyFactory factory) {
  absl::MutexLock lock(&mu_);
  factories_[std::move(name)] = std::move(factory);
}

absl::StatusOr<std::unique_ptr<RoutingPolicy>> RoutingPolicyRegistry::Create(
    std::string_view name, const RoutingPolicyConfig& config) const {
  RoutingPolicyFactory factory;
  {
    absl::MutexLock lock(&mu_);
    auto it = factories_.find(name);
    if (it != factories_.end()) factory = it->second;
  }
  if (!factory) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy: unknown routing policy '", std::string(name),
                     "' (known: ", absl::StrJoin(Names(), ", "), ")"));
  }
  return factory(config);
}

std::vector<std::string> RoutingPolicyRegistry::Names() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> names;
  for (const auto& [name, factory] : factories_) names.push_back(name);
  return names;
}

std::string_view WorkerRoleName(WorkerRole role) {
  switch (role) {
    case WorkerRole::kPrefill:
      return "prefill";
    case WorkerRole::kDecode:
      return "decode";
    case WorkerRole::kBoth:
      break;
  }
  return "both";
}

std::optional<WorkerRole> ParseWorkerRole(std::string_view name) {
  if (name.empty() || name == "both") return WorkerRole::kBoth;
  if (name == "prefill") return WorkerRole::kPrefill;
  if (name == "decode") return WorkerRole::kDecode;
  return std::nullopt;
}

size_t LeastLoadedIndex(std::span<const WorkerView> workers) {
  size_t best = 0;
  for (size_t i = 1; i < workers.size(); ++i) {
    if (workers[i].Load() < workers[best].Load()) best = i;
  }
  return best;
}

}  // namespace kvserve
