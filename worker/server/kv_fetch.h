#ifndef KVSERVE_WORKER_SERVER_KV_FETCH_H_
#define KVSERVE_WORKER_SERVER_KV_FETCH_H_

// The pulling side of KV block transfer: a worker handed a request with GenerateRequest.kv_source
// decides whether pulling the named blocks from the holder beats computing them, and pulls them
// with Worker/FetchKvBlocks without blocking a thread.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/auth/tls_credentials.h"
#include "common/rpc/live_calls.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "kvserve/v1/worker.grpc.pb.h"
#include "worker/engine/engine.h"

namespace kvserve {

/// When a worker pulls blocks a hint names (--kv-transfer).
enum class KvTransferMode {
  /// When the cost model says pulling is faster than computing (the default).
  kAuto,
  /// Whenever a hint names blocks (tests, disaggregated decode workers).
  kAlways,
  /// Never: hints are ignored.
  kNever,
};

/// "auto", "always", "never"; INVALID_ARGUMENT for anything else.
absl::StatusOr<KvTransferMode> ParseKvTransferMode(const std::string& name);

struct KvTransferOptions {
  KvTransferMode mode = KvTransferMode::kAuto;
  /// Bytes per second assumed for a peer before a pull from it was measured
  /// (--kv-transfer-bandwidth); measured pulls then keep a moving average per peer.
  double assumed_bandwidth = 1e9;
  /// Seconds every pull costs on top of its bytes (connection, first block).
  double fixed_cost_seconds = 0.002;
  /// A pull that takes longer is cancelled; the blocks received until then are used.
  std::chrono::milliseconds timeout{10000};
  /// Credentials for dialling peers (insecure when null).
  std::shared_ptr<grpc::ChannelCredentials> credentials;
};

/// How one pull went.
struct KvFetchResult {
  /// The blocks received, in prompt order, each checked against the receiver's own chain hash
  /// and block size (a leading run of the blocks asked for; empty on failure).
  std::vector<KvBlockPayload> blocks;
  /// OK when every block asked for arrived (or the holder ran out of blocks); otherwise why not.
  absl::Status status;
  int64_t bytes = 0;
  double seconds = 0.0;
};

/// Cancels a pull; safe to call at any time, before it started or after it ended.
class KvFetchHandle {
 public:
  void Cancel();

 private:
  friend class KvFetchCall;
  std::mutex mu_;
  grpc::ClientContext* context_ = nullptr;  // null once the call ended
  bool cancelled_ = false;
};

/// Pulls prefix blocks from peers for one engine. Thread-safe. Destroying it waits for the pulls
/// in flight to end (each is bounded by the options' timeout).
class KvFetcher {
 public:
  /// `engine` must outlive the fetcher; `on_pull` (may be null) is told of every finished pull
  /// (for metrics), on a gRPC thread.
  KvFetcher(const Engine* engine, KvTransferOptions options,
            std::function<void(const KvFetchResult&)> on_pull = nullptr);

  /// Whether to pull `num_blocks` blocks from `peer`: never / always by mode, else when
  /// bytes / bandwidth(peer) + fixed cost < tokens / the engine's measured prefill rate (and
  /// always before the engine measured one).
  bool ShouldPull(const std::string& peer, int64_t num_blocks) const;

  /// Pulls full blocks [first_block, end_block) of `tokens` (salted with `cache_salt`) from
  /// `peer` and calls `done` once with what arrived, on a gRPC thread (or on this one when
  /// there is nothing to pull). `done` must not block. `handle` cancels the pull, also when
  /// cancelled before this call.
  void Fetch(const std::string& peer, std::span<const TokenId> tokens,
             const std::string& cache_salt, int32_t first_block, int32_t end_block,
             std::shared_ptr<KvFetchHandle> handle, std::function<void(KvFetchResult)> done);

  /// The bandwidth the cost model uses for `peer`, bytes per second.
  double Bandwidth(const std::string& peer) const;
  const KvTransferOptions& options() const { return options_; }

 private:
  friend class KvFetchCall;
  std::shared_ptr<v1::Worker::Stub> StubFor(const std::string& peer);
  void Record(const std::string& peer, const KvFetchResult& result);

  const Engine* engine_;
  KvTransferOptions options_;
  std::function<void(const KvFetchResult&)> on_pull_;
  mutable std::mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<v1::Worker::Stub>> stubs_;
  absl::flat_hash_map<std::string, double> bandwidth_;
  // Last, so destroyed first: waits for every call to be gone (they use this fetcher to the end)
  // before the stubs release their channels (LiveCalls says why that order matters).
  LiveCalls calls_;
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_SERVER_KV_FETCH_H_
