#ifndef KVSERVE_ROUTER_GENERATE_CALL_H_
#define KVSERVE_ROUTER_GENERATE_CALL_H_

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/block_hash/block_hash.h"
#include "grpcpp/support/server_callback.h"
#include "kvserve/v1/inference.pb.h"
#include "router/api_key_guard.h"
#include "router/dispatcher.h"
#include "router/worker_pool.h"

namespace grpc {
class CallbackServerContext;
}  // namespace grpc

namespace kvserve {

class RouterMetrics;

/// The request a prefill-role worker gets for `request`'s prompt: the same prompt token ids,
/// cache salt and model; one greedy token (ignore_eos, n = 1), no stop, logprob or constraint
/// fields, no kv_source; request_id with "-prefill" appended.
v1::GenerateRequest PrefillRequestFor(const v1::GenerateRequest& request);

/// One Generate RPC forwarded through the router.
///
/// Threading: callback reactors on both sides, so no thread blocks per stream. The server side
/// is this ServerWriteReactor; each attempt on a worker is an Upstream ClientReadReactor. One
/// response is in flight at a time: the upstream's next read starts only when the client's
/// write of the previous message completes, so a slow client slows its worker stream instead
/// of buffering without bound. A mutex orders the two sides' callbacks.
///
/// Lifecycle: Begin() submits to the dispatcher (started now, queued, or refused). Once started
/// on a worker, a failure before the first response message is retried once on another worker
/// (codes UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED, UNKNOWN, INTERNAL; the failed worker is
/// excluded); a failure after it ends the stream with UNAVAILABLE. Client cancellation and the
/// client's deadline cancel the upstream call; the deadline is also set on it. A worker that
/// refuses the request with UNAVAILABLE because it is draining is marked draining in the pool
/// at once (no new request goes there) and the request is retried elsewhere. Each attempt
/// carries its own reservation's transfer hint (kv_source) or none: a retry never repeats the
/// first attempt's hint.
///
/// Disaggregated serving: when the reservation names a prefill worker, the call first sends it
/// the prompt alone (PrefillRequestFor: one greedy token, discarded) under the client's
/// deadline, and holds the decode worker's slot meanwhile. When that call ends OK the decode
/// worker gets the request with a hint to pull the prompt's blocks from the prefill worker;
/// when it fails (any status) the decode worker gets the ordinary hint or none and computes
/// the prompt: a failed prefill costs time, never the answer. Either way the prefill worker's
/// slot is freed first. Client cancellation (or its deadline) during the prefill cancels it and
/// ends the call. A retry of the decode attempt runs no prefill again.
///
/// Finish is called once, only after the upstream calls have ended and no write is pending;
/// OnDone deletes the object.
class GenerateCall final : public grpc::ServerWriteReactor<v1::GenerateResponse>,
                           public PendingRequest {
 public:
  /// `request` is already validated and carries prompt_token_ids and a request_id;
  /// `block_keys` are its prompt's keys. `metrics` (may be null) records the call's outcome,
  /// latencies and retries.
  GenerateCall(grpc::CallbackServerContext* context, v1::GenerateRequest request,
               std::vector<BlockKey> block_keys, Dispatcher* dispatcher, WorkerPool* pool,
               RouterMetrics* metrics = nullptr);
  ~GenerateCall() override;

  /// Keeps `lease` (the caller's API key slot) until the call finishes (released before the
  /// client sees the status). Call before Begin.
  void HoldUntilDone(ApiKeyGuard::Lease lease) { lease_ = std::move(lease); }
  /// A RESOURCE_EXHAUSTED end carries trailing metadata `retry-after-ms` with this value.
  /// Call before Begin.
  void SetRetryAfter(absl::Duration retry_after) { retry_after_ = retry_after; }
  /// Hands the request to the dispatcher; finishes at once when it is refused.
  void Begin();

  // PendingRequest.
  RoutingRequest routing_request() const override;
  bool Excludes(WorkerId worker) const override;
  void Start(Reservation reservation) override;
  void Reject(absl::Status status) override;

  // grpc::ServerWriteReactor.
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  class Upstream;
  class PrefillUpstream;

  /// A new attempt on `worker` with `kv_source` (if any) as its hint; the caller begins it
  /// after unlocking.
  std::shared_ptr<Upstream> NewAttemptLocked(std::shared_ptr<WorkerHandle> worker,
                                             const std::optional<KvTransferHint>& kv_source)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnUpstreamRead(Upstream* upstream, v1::GenerateResponse* message);
  void OnUpstreamDone(const grpc::Status& status);
  /// The prefill phase's call ended: frees its slot, then starts the decode attempt, or
  /// finishes the call when the client cancelled or its deadline passed.
  void OnPrefillDone(const grpc::Status& status);
  /// Records the final status and finishes when nothing is outstanding.
  void RequestFinish(const grpc::Status& status);
  /// Finish when requested and nothing is outstanding; called with mu_ held, returns whether
  /// the caller must call Finish(final_status_) after unlocking.
  bool ReadyToFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  /// Records the call's metrics and log line, then finishes it. Recording before Finish means
  /// a client that has seen the status also sees the call in /metrics.
  void Complete(const grpc::Status& status);

  grpc::CallbackServerContext* const context_;
  const v1::GenerateRequest request_;
  const std::vector<BlockKey> block_keys_;
  Dispatcher* const dispatcher_;
  WorkerPool* const pool_;
  RouterMetrics* const metrics_;
  const std::chrono::steady_clock::time_point arrival_;

  mutable absl::Mutex mu_;
  std::shared_ptr<WorkerHandle> worker_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Upstream> upstream_ ABSL_GUARDED_BY(mu_);
  // During a prefill phase: its call, and the reservation whose decode worker waits for it
  // (reservation.prefill_worker is the prefill worker).
  std::shared_ptr<PrefillUpstream> prefill_ ABSL_GUARDED_BY(mu_);
  Reservation prefill_reservation_ ABSL_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point prefill_started_ ABSL_GUARDED_BY(mu_){};
  absl::flat_hash_set<WorkerId> excluded_ ABSL_GUARDED_BY(mu_);
  int attempts_ ABSL_GUARDED_BY(mu_) = 0;
  bool first_received_ ABSL_GUARDED_BY(mu_) = false;
  bool write_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  // Metrics: when the first worker slot was reserved and the first message arrived (epoch:
  // not yet).
  std::chrono::steady_clock::time_point started_ ABSL_GUARDED_BY(mu_){};
  std::chrono::steady_clock::time_point first_message_ ABSL_GUARDED_BY(mu_){};
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
  /// The message being written to the client; touched only while no write is pending.
  v1::GenerateResponse outgoing_;
  /// Released in Complete, just before Finish.
  ApiKeyGuard::Lease lease_;
  absl::Duration retry_after_ = absl::Milliseconds(500);
};

}  // namespace kvserve

#endif  // KVSERVE_ROUTER_GENERATE_CALL_H_
