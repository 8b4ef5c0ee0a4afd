#ifndef KVSERVE_ROUTER_WORKER_POOL_H_
#define KVSERVE_ROUTER_WORKER_POOL_H_

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/rpc/live_calls.h"
#include "grpcpp/generic/generic_stub.h"
#include "kvserve/v1/inference.grpc.pb.h"
#include "kvserve/v1/worker.grpc.pb.h"
#include "router/prefix_index.h"
#include "router/routing_policy.h"

namespace grpc {
class ChannelCredentials;
class ClientContext;
}  // namespace grpc

namespace kvserve {

/// How the router finds and watches its workers.
struct WorkerPoolOptions {
  /// Fixed worker addresses (HOST:PORT). Exactly one of static_workers and dns_target is set.
  std::vector<std::string> static_workers;
  /// NAME:PORT resolved with getaddrinfo every dns_interval (a Kubernetes headless service
  /// answers with one address per ready pod); workers come and go with the answers.
  std::string dns_target;
  absl::Duration dns_interval = absl::Seconds(5);
  /// Health (grpc.health.v1) and GetLoad probes of every worker, in parallel.
  absl::Duration probe_interval = absl::Seconds(1);
  /// Deadline of each probe RPC.
  absl::Duration probe_timeout = absl::Milliseconds(500);
  /// Consecutive failed probes (or failed requests) that eject a worker; one good probe
  /// re-admits it.
  int failure_threshold = 2;
  /// KV event stream reconnects: exponential backoff between these bounds.
  absl::Duration kv_backoff_min = absl::Milliseconds(100);
  absl::Duration kv_backoff_max = absl::Seconds(5);
  /// Run the periodic probe / DNS thread. Tests turn it off and call ProbeNow themselves.
  bool background_probes = true;
  /// How the router's channels to workers authenticate (TLS, mutual TLS); null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  /// With TLS: the name workers' certificates are checked against instead of the dialled
  /// address (needed when workers are reached by pod IP). Empty: the address's host.
  std::string tls_server_name;
};

/// Splits "A,B,C" into addresses; INVALID_ARGUMENT naming `field` for empty or duplicate ones.
absl::StatusOr<std::vector<std::string>> ParseWorkerList(std::string_view list,
                                                         std::string_view field);
/// Resolves NAME:PORT with getaddrinfo into sorted, distinct HOST:PORT addresses (IPv6 as
/// [addr]:port). INVALID_ARGUMENT for a malformed target, UNAVAILABLE when resolution fails.
absl::StatusOr<std::vector<std::string>> ResolveWorkers(std::string_view target);

/// One worker as the router sees it: stubs on a shared channel, health, last load, and the
/// router's in-flight count. Shared by the pool and the requests running on it, so a worker
/// that leaves the pool stays usable until its last request ends.
class WorkerHandle {
 public:
  /// `credentials` null means plaintext; `tls_server_name` overrides the checked name.
  WorkerHandle(WorkerId id, std::string address,
               std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr,
               const std::string& tls_server_name = "");
  ~WorkerHandle();
  WorkerHandle(const WorkerHandle&) = delete;
  WorkerHandle& operator=(const WorkerHandle&) = delete;

  WorkerId id() const { return id_; }
  const std::string& address() const { return address_; }
  v1::Inference::Stub& inference() { return *inference_; }
  v1::Worker::Stub& control() { return *control_; }

  /// Healthy by the last probes and not draining: new requests may go here.
  bool routable() const;
  bool healthy() const;
  bool draining() const;
  /// The last successful GetLoad report.
  WorkerLoad load() const;
  /// The role of the last GetLoad report (kBoth until the first one).
  WorkerRole role() const;
  /// The worker's GetModelInfo answer, once fetched.
  std::optional<v1::ModelInfo> model_info() const;

  /// Requests this router has in flight on the worker. Changed only by the dispatcher.
  int in_flight() const { return in_flight_.load(std::memory_order_relaxed); }
  void AddInFlight(int delta) { in_flight_.fetch_add(delta, std::memory_order_relaxed); }

 private:
  friend class WorkerPool;

  const WorkerId id_;
  const std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Inference::Stub> inference_;
  std::unique_ptr<v1::Worker::Stub> control_;
  std::unique_ptr<grpc::GenericStub> generic_;
  std::atomic<int> in_flight_{0};

  mutable absl::Mutex mu_;
  bool healthy_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  int consecutive_failures_ ABSL_GUARDED_BY(mu_) = 0;
  WorkerLoad load_ ABSL_GUARDED_BY(mu_);
  /// LoadReport.role as last reported (empty until then), to log changes only.
  std::string reported_role_ ABSL_GUARDED_BY(mu_);
  std::optional<v1::ModelInfo> model_info_ ABSL_GUARDED_BY(mu_);

  // The KV event stream thread and what stops it.
  std::thread kv_thread_;
  bool kv_stop_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* kv_context_ ABSL_GUARDED_BY(mu_) = nullptr;
};

/// The router's workers: membership (static or DNS), periodic health and load probes with
/// ejection and re-admission, and one KV event stream thread per worker feeding the prefix
/// index. Thread-safe.
class WorkerPool {
 public:
  /// Validates the options, resolves the workers, starts their KV streams, runs one probe
  /// round (so workers already up are routable on return) and starts the probe thread.
  static absl::StatusOr<std::unique_ptr<WorkerPool>> Create(const WorkerPoolOptions& options,
                                                            PrefixIndex* index);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  /// The current members, in order (static list order, or sorted addresses).
  std::vector<std::shared_ptr<WorkerHandle>> Workers() const;
  /// The member with this address, or nullptr.
  std::shared_ptr<WorkerHandle> Find(std::string_view address) const;

  /// One probe round now (health + GetLoad of every worker in parallel, each bounded by
  /// probe_timeout), then the change listener runs. Serialised with the background round.
  void ProbeNow();
  /// Re-resolves the DNS target now (no-op for a static list).
  void ResolveNow();
  /// Counts a failed request against the worker, as a failed probe does.
  void ReportFailure(WorkerHandle& worker);
  /// The worker refused a request because it is draining: stop routing to it now, without
  /// waiting for the next probe (which keeps it draining, or clears the mark once the worker
  /// reports it is not draining any more).
  void MarkDraining(WorkerHandle& worker);
  /// Called after every probe round and membership change (capacity may have appeared).
  void SetChangeListener(std::function<void()> listener);
  /// Counts a callback call on a worker's channel until its reactor (which holds the token) is
  /// destroyed: the channels are released only after every such call (LiveCalls says why).
  LiveCalls::Token TrackCall() { return calls_.Track(); }
  /// Stops the probe thread and every KV stream, then waits for the tracked calls to be gone
  /// (callers end them first: the router shuts its server down before its pool). Idempotent;
  /// the destructor calls it.
  void Shutdown();

 private:
  WorkerPool(const WorkerPoolOptions& options, PrefixIndex* index);
  void SetMembers(const std::vector<std::string>& addresses);
  void StartKvStream(const std::shared_ptr<WorkerHandle>& worker);
  void StopKvStream(WorkerHandle& worker);
  void RunKvStream(WorkerHandle* worker);
  void RunBackground();
  void NotifyChange();

  const WorkerPoolOptions options_;
  PrefixIndex* const index_;

  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<WorkerHandle>> workers_ ABSL_GUARDED_BY(mu_);
  WorkerId next_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void()> listener_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;

  /// Serialises probe rounds and membership changes.
  absl::Mutex probe_mu_;

  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread background_;

  LiveCalls calls_;
};

}  // namespace kvserve

#endif  // KVSERVE_ROUTER_WORKER_POOL_H_
