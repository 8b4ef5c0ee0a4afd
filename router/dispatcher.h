#ifndef KVSERVE_ROUTER_DISPATCHER_H_
#define KVSERVE_ROUTER_DISPATCHER_H_

#include <cstddef>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "router/prefix_index.h"
#include "router/routing_policy.h"
#include "router/worker_pool.h"

namespace kvserve {

class RouterMetrics;

/// Trailing metadata of a RESOURCE_EXHAUSTED answer: how many milliseconds the client should
/// wait before trying again (a hint, not a promise).
inline constexpr std::string_view kRetryAfterMetadata = "retry-after-ms";

/// Where the chosen worker can pull K/V of the prompt's leading blocks from instead of computing
/// them; becomes GenerateRequest.kv_source. Only the dispatcher makes one, from its own view of
/// the workers' caches (never from what a client sent).
struct KvTransferHint {
  /// The holding worker's address, as the router dials it.
  std::string worker;
  /// Leading blocks the chosen worker holds itself (not pulled).
  int first_block = 0;
  /// Leading full blocks the holder has; the chosen worker may pull [first_block, num_blocks).
  int num_blocks = 0;
};

/// Whether the router splits requests between prefill-role and decode workers
/// (--disaggregation).
enum class DisaggregationMode {
  /// Workers reporting role "prefill" compute prompts and serve no token stream while a decode
  /// or "both" worker is routable (the default).
  kAuto,
  /// Every worker is treated as "both", whatever role it reports.
  kOff,
};

/// "auto" or "off"; INVALID_ARGUMENT naming the disaggregation option otherwise.
absl::StatusOr<DisaggregationMode> ParseDisaggregationMode(std::string_view name);

/// A worker slot reserved for a request.
struct Reservation {
  /// The worker that streams the tokens (its in-flight count already includes the request);
  /// nullptr: none had room.
  std::shared_ptr<WorkerHandle> worker;
  /// Set when another routable worker holds more of the prompt's leading blocks than `worker`
  /// and the policy weighs such blocks (RoutingPolicy::wants_kv_transfer_hints). Never names
  /// `worker` itself.
  std::optional<KvTransferHint> kv_source;
  /// Disaggregated serving: a prefill-role worker that computes the prompt first (its in-flight
  /// count already includes the request too); null when `worker` computes the prompt itself.
  /// Set only on a first attempt, when `worker` lacks some of the prompt's usable blocks (all
  /// full blocks but one containing the last token, (prompt_tokens - 1) / block_size) and a
  /// prefill worker has room.
  std::shared_ptr<WorkerHandle> prefill_worker;
  /// With prefill_worker: the hint `worker` gets once the prefill succeeded (pull the usable
  /// blocks beyond its own run from prefill_worker). After a failed prefill `worker` gets
  /// kv_source instead (or none), and computes what it does not pull.
  std::optional<KvTransferHint> prefill_kv_source;
};

/// A request that needs a worker slot. Implemented by the Generate forwarding call.
class PendingRequest {
 public:
  virtual ~PendingRequest() = default;
  /// What the policy sees of the request (block_size is filled in by the dispatcher); the
  /// keys stay valid while the request is pending.
  virtual RoutingRequest routing_request() const = 0;
  /// True for workers the request must not go to (one that already failed it).
  virtual bool Excludes(WorkerId worker) const = 0;
  /// A slot on `reservation.worker` (never null) is reserved for the request (its in-flight
  /// count already includes it); the request must call Dispatcher::Release(worker) when it is
  /// done with it, and sends `reservation.kv_source` with this attempt only. The same holds for
  /// `reservation.prefill_worker` when set: the request runs its prefill there first. Called
  /// without the dispatcher's lock held.
  virtual void Start(Reservation reservation) = 0;
  /// The request was queued and can no longer be served (no routable worker is left).
  virtual void Reject(absl::Status status) = 0;
};

/// Admission limits.
struct DispatcherOptions {
  /// Requests in flight per worker, > 0; a full worker is not offered to the policy.
  int max_inflight_per_worker = 64;
  /// Requests waiting for a slot when every routable worker is full, >= 0; beyond it new
  /// requests fail with RESOURCE_EXHAUSTED.
  int max_queue = 256;
  /// Tokens per KV block (for the policy's hit ratio).
  int block_size = 16;
  /// The retry hint of an overload refusal (message text and `retry-after-ms` metadata).
  absl::Duration retry_after = absl::Milliseconds(500);
  /// Whether workers' roles are honoured (prefill phases on prefill-role workers).
  DisaggregationMode disaggregation = DisaggregationMode::kAuto;
  /// Disaggregation: a prompt whose part the decode worker lacks is shorter than this many
  /// tokens is computed by the decode worker itself (no prefill phase): a short prefill costs
  /// the decode worker little, and the prefill pool's queue of long prompts would cost the
  /// request more (--disaggregation-min-tokens).
  int disaggregation_min_tokens = 256;
};

/// Admission control and worker choice: reserves a slot on the worker the policy picks among
/// the routable workers with room, queues requests (FIFO) while all are full, and starts
/// queued requests as slots free up or workers come back. Thread-safe; the policy runs under
/// the dispatcher's lock.
///
/// Disaggregation (DisaggregationMode::kAuto): while both prefill-role workers and decode or
/// "both" workers are routable, only the latter stream tokens. When the chosen one lacks some of
/// the prompt's usable blocks, a prefill worker with room, chosen by the prefill policy among the
/// prefill workers (kv_aware reuses their prefix caches), is reserved too: the request computes
/// its prompt there and the decode worker pulls the blocks. No prefill worker with room, or
/// another worker already holding every usable block, means no prefill phase: the decode worker
/// computes (or pulls) the prompt itself rather than waiting. With no decode-capable worker
/// routable, prefill workers serve requests like any other.
class Dispatcher {
 public:
  /// The pointers must outlive the dispatcher.
  Dispatcher(const DispatcherOptions& options, WorkerPool* pool, PrefixIndex* index,
             RoutingPolicy* policy);

  /// Starts `request` on a worker now, or queues it. RESOURCE_EXHAUSTED when every routable
  /// worker is full and the queue too; UNAVAILABLE when no worker is routable. On OK the
  /// request has been started or will be started or rejected later.
  absl::Status Submit(PendingRequest* request);
  /// Reserves a slot for a retry, bypassing the queue (the request already waited its turn),
  /// with a transfer hint of its own: a null worker when no routable, non-excluded worker has
  /// room.
  Reservation ReserveNow(PendingRequest* request);
  /// Removes a queued request; false when it is not queued (already started or rejected).
  bool Withdraw(PendingRequest* request);
  /// Frees the request's slot on `worker` and starts queued requests that now fit.
  void Release(WorkerHandle& worker);
  /// Starts queued requests that fit; rejects them all when no worker is routable. Run when
  /// the pool's view changes.
  void Pump();

  /// Records routing decisions, transfer hints and admission rejections in `metrics` (nullptr:
  /// none). Call before the first Submit; must outlive the dispatcher.
  void SetMetrics(RouterMetrics* metrics) { metrics_ = metrics; }
  /// The policy that picks prefill workers: another instance of the routing policy, so a
  /// stateful one (round_robin) keeps its own turn over them. nullptr (the default): the main
  /// policy. Call before the first Submit; must outlive the dispatcher.
  void SetPrefillPolicy(RoutingPolicy* policy) { prefill_policy_ = policy; }

  /// Requests waiting in the queue.
  size_t queued() const;
  /// Blocks until exactly `count` requests are queued or `timeout` passes.
  bool WaitForQueued(size_t count, absl::Duration timeout) const;

 private:
  /// Whether a reservation may plan a prefill phase: a retry gets none.
  enum class PrefillPhase { kAllowed, kNever };

  /// Picks a worker for `request` and reserves its slot, with a transfer hint when the policy
  /// wants them and a prefill worker when `phase` allows one; a null worker when none has room.
  Reservation ReserveLocked(const PendingRequest& request, PrefillPhase phase)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const DispatcherOptions options_;
  WorkerPool* const pool_;
  PrefixIndex* const index_;
  RoutingPolicy* const policy_;
  RoutingPolicy* prefill_policy_ = nullptr;
  RouterMetrics* metrics_ = nullptr;

  mutable absl::Mutex mu_;
  std::deque<PendingRequest*> queue_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvserve

#endif  // KVSERVE_ROUTER_DISPATCHER_H_
