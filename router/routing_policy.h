#ifndef KVSERVE_ROUTER_ROUTING_POLICY_H_
#define KVSERVE_ROUTER_ROUTING_POLICY_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/block_hash/block_hash.h"

namespace kvserve {

/// What a routing policy knows about one request.
struct RoutingRequest {
  /// Keys of the prompt's full blocks: HashFullBlocks(prompt ids, block_size, cache_salt).
  std::span<const BlockKey> block_keys;
  /// Length of the prompt in tokens (the trailing partial block included).
  int prompt_tokens = 0;
  /// Tokens per block, the same on the router and every worker.
  int block_size = 16;
};

/// A worker's part in disaggregated serving (its --role, LoadReport.role).
enum class WorkerRole {
  /// Computes prompts and streams tokens (the default, and what older workers report).
  kBoth,
  /// Computes prompts only: the router sends it a request's prefill, whose KV blocks the decode
  /// worker then pulls.
  kPrefill,
  /// Streams tokens; its prompts' blocks usually come from a prefill worker.
  kDecode,
};

/// "both", "prefill" or "decode".
std::string_view WorkerRoleName(WorkerRole role);
/// The role a LoadReport names: "prefill", "decode", "both", or empty (an older worker: both).
/// Nullopt for any other text.
std::optional<WorkerRole> ParseWorkerRole(std::string_view name);

/// A worker's load as its last GetLoad reported it (zeros until the first report).
struct WorkerLoad {
  int running_requests = 0;
  int waiting_requests = 0;
  int total_blocks = 0;
  int free_blocks = 0;
  /// The role the worker reports (kBoth until the first report).
  WorkerRole role = WorkerRole::kBoth;
};

/// What a routing policy knows about one candidate worker: only healthy, non-draining workers
/// with a free in-flight slot are offered.
struct WorkerView {
  /// The worker's address, for logs and tie-breaking by position only.
  std::string_view address;
  /// Requests this router has sent to the worker that have not finished yet.
  int in_flight = 0;
  /// The router's in-flight bound per worker (--max-inflight-per-worker), > 0.
  int capacity = 1;
  /// The worker's last load report.
  WorkerLoad load;
  /// Length, in blocks, of the longest leading run of the request's block keys that the worker
  /// holds in its prefix cache, in any tier (from the prefix index).
  int matched_blocks = 0;
  /// How many of those blocks are in the worker's device pool; the others would be restored
  /// from its host or disk tier.
  int matched_device_blocks = 0;
  /// The longest leading run of the request's block keys that any other routable worker holds
  /// (full ones included), in any tier: what this worker could pull from that one
  /// (Worker/FetchKvBlocks) instead of computing. 0 when no other worker holds any.
  int pullable_blocks = 0;

  /// The load every policy compares: requests in flight from this router plus requests waiting
  /// in the worker's own queue (the latter may include other routers' requests).
  int Load() const { return in_flight + load.waiting_requests; }
};

/// A policy's decision: an index into the span of WorkerViews it was given.
struct WorkerChoice {
  size_t index = 0;
};

/// Tuning of the kv_aware policy (see kv_aware.cc for the algorithm).
struct KvAwareConfig {
  /// How much one unit of relative load costs against one unit of prefix reuse:
  ///   score = matched_tokens / prompt_tokens - load_weight * Load() / capacity.
  /// With the default 0.5, a worker holding the whole prompt wins over an idle worker holding
  /// nothing until it is half full. 0 ignores load; large values approach least_loaded.
  double load_weight = 0.5;
  /// Balance guard: when the best-scoring worker's Load() exceeds the least loaded worker's by
  /// more than this many requests, route to the least loaded one instead, so that one hot
  /// prefix cannot pile all traffic onto one worker. Negative disables the guard.
  int balance_threshold = 8;
  /// What a matched block held only in a worker's host or disk tier is worth against one in its
  /// device pool (1): restoring it costs a copy, far less than recomputing it (docs/benchmarks.md,
  /// "KV tiers": ~17 ms against ~112 ms to the first token), but not nothing.
  double lower_tier_weight = 0.8;
  /// What a block the worker does not hold but could pull from another worker
  /// (WorkerView::pullable_blocks) is worth against one in its device pool (1): a pull costs a
  /// network copy, more than restoring from the worker's own host tier. In [0, 1]; 0 ignores
  /// other workers' blocks and sends no transfer hints.
  double transfer_weight = 0.5;
};

/// Tuning of every built-in policy; each policy reads its own part.
struct RoutingPolicyConfig {
  KvAwareConfig kv_aware;
};

/// Picks the worker for a request. Choose is called by the router's dispatcher under its lock,
/// so calls never overlap; implementations may keep unsynchronised state.
class RoutingPolicy {
 public:
  virtual ~RoutingPolicy() = default;
  /// The registry name of the policy.
  virtual std::string_view name() const = 0;
  /// Picks one of `workers`, which is never empty. Must be deterministic given its inputs and
  /// the policy's own state.
  virtual WorkerChoice Choose(const RoutingRequest& request,
                              std::span<const WorkerView> workers) = 0;
  /// True when the policy counts blocks a worker could pull from another one
  /// (WorkerView::pullable_blocks): the dispatcher then tells the chosen worker where to pull
  /// them from (GenerateRequest.kv_source). A policy that ignores them would send workers
  /// pulls nobody weighed.
  virtual bool wants_kv_transfer_hints() const { return false; }
};

/// Makes a policy from the configuration.
using RoutingPolicyFactory =
    std::function<std::unique_ptr<RoutingPolicy>(const RoutingPolicyConfig& config)>;

/// Policies by name. Default() holds the built-ins: round_robin, least_loaded and kv_aware.
/// Thread-safe.
class RoutingPolicyRegistry {
 public:
  /// The process-wide registry with the built-in policies registered.
  static RoutingPolicyRegistry& Default();

  /// Adds or replaces the policy called `name`.
  void Register(std::string name, RoutingPolicyFactory factory);
  /// A new policy called `name`; INVALID_ARGUMENT listing the known names when there is none.
  absl::StatusOr<std::unique_ptr<RoutingPolicy>> Create(std::string_view name,
                                                        const RoutingPolicyConfig& config) const;
  /// The registered names, sorted.
  std::vector<std::string> Names() const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, RoutingPolicyFactory, std::less<>> factories_ ABSL_GUARDED_BY(mu_);
};

/// The policy `kvserve router` uses when --policy is not given.
inline constexpr std::string_view kDefaultRoutingPolicy = "kv_aware";

/// Built-in policies (each defined in its own file).
std::unique_ptr<RoutingPolicy> NewRoundRobinPolicy(const RoutingPolicyConfig& config);
std::unique_ptr<RoutingPolicy> NewLeastLoadedPolicy(const RoutingPolicyConfig& config);
std::unique_ptr<RoutingPolicy> NewKvAwarePolicy(const RoutingPolicyConfig& config);

/// The index of the worker with the smallest Load(); ties go to the earlier worker. Shared by
/// least_loaded and kv_aware's balance guard. `workers` must not be empty.
size_t LeastLoadedIndex(std::span<const WorkerView> workers);

}  // namespace kvserve

#endif  // KVSERVE_ROUTER_ROUTING_POLICY_H_
