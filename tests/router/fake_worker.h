#ifndef KVSERVE_TESTS_ROUTER_FAKE_WORKER_H_
#define KVSERVE_TESTS_ROUTER_FAKE_WORKER_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/block_hash/block_hash.h"
#include "grpcpp/grpcpp.h"
#include "kvserve/v1/inference.grpc.pb.h"
#include "kvserve/v1/worker.grpc.pb.h"

namespace kvserve::testing {

/// A test-only worker: kvserve.v1.Inference + kvserve.v1.Worker + grpc.health.v1 on loopback.
/// Generate streams canned tokens (kTokens, one per message) and can fail before or after the
/// first message, or hold after it until released or cancelled. Load, health and the cached
/// block keys (streamed as KV events) are set by the test, and so is the role it reports.
class FakeWorker {
 public:
  enum class Mode {
    kNormal,
    /// Finish with fail_code before any message.
    kFailBeforeFirst,
    /// One message, then UNAVAILABLE.
    kFailAfterFirst,
    /// One message, then wait for ReleaseHeld() (rest + OK) or cancellation.
    kHoldAfterFirst,
  };
  /// The generated token ids of a normal stream.
  static constexpr uint32_t kTokens[] = {7, 8, 9};

  FakeWorker();
  ~FakeWorker();

  const std::string& address() const { return address_; }

  void set_mode(Mode mode, grpc::StatusCode fail_code = grpc::StatusCode::UNAVAILABLE);
  /// Normal streams write these texts instead (one message each, token ids 7, 8, 9, 7, ...),
  /// the last with `finish` and completion_tokens = texts.size(). Empty: the default "t" x 3.
  void set_texts(std::vector<std::string> texts, v1::FinishReason finish = v1::FINISH_REASON_STOP);
  void set_load(const v1::LoadReport& load);
  /// The role GetLoad reports ("prefill", "decode", "both"; empty as an older worker), kept
  /// across set_load.
  void set_role(std::string role);
  void SetServing(bool serving);
  /// Adds keys to one tier of the cache (STORED events to connected streams; new streams get a
  /// snapshot of every tier).
  void StoreKeys(const std::vector<BlockKey>& keys, KvTier tier = KvTier::kDevice);
  /// Removes keys from one tier (EVICTED events).
  void EvictKeys(const std::vector<BlockKey>& keys, KvTier tier = KvTier::kDevice);
  /// Lets held streams finish normally, including ones that reach the hold point later (until
  /// the next set_mode).
  void ReleaseHeld();
  /// Ends every open StreamKvEvents stream with `code`, as a worker whose event stream broke
  /// (UNAVAILABLE) or whose subscriber fell too far behind (RESOURCE_EXHAUSTED) while it stays
  /// healthy; later subscriptions are served as usual (snapshot first).
  void DropKvStreams(grpc::StatusCode code = grpc::StatusCode::UNAVAILABLE);
  /// StreamKvEvents calls received so far, and a wait for `n` of them.
  int kv_subscriptions() const;
  bool WaitForKvSubscriptions(int n, absl::Duration timeout = absl::Seconds(10)) const;

  /// Generate calls received so far (in order).
  std::vector<v1::GenerateRequest> requests() const;
  int generate_count() const;
  /// The deadline of the last Generate call as the worker saw it.
  std::chrono::system_clock::time_point last_deadline() const;
  /// Blocks until `n` Generate calls arrived / `n` were cancelled, or the timeout passes.
  bool WaitForGenerates(int n, absl::Duration timeout = absl::Seconds(10)) const;
  bool WaitForCancelled(int n, absl::Duration timeout = absl::Seconds(10)) const;

 private:
  class InferenceImpl;
  class WorkerImpl;
  class GenerateReactor;
  class KvStreamReactor;

  void Broadcast(const v1::KvEventBatch& batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  Mode mode_ ABSL_GUARDED_BY(mu_) = Mode::kNormal;
  grpc::StatusCode fail_code_ ABSL_GUARDED_BY(mu_) = grpc::StatusCode::UNAVAILABLE;
  v1::LoadReport load_ ABSL_GUARDED_BY(mu_);
  std::string role_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> texts_ ABSL_GUARDED_BY(mu_) = {"t", "t", "t"};
  v1::FinishReason finish_ ABSL_GUARDED_BY(mu_) = v1::FINISH_REASON_LENGTH;
  std::vector<v1::GenerateRequest> requests_ ABSL_GUARDED_BY(mu_);
  std::chrono::system_clock::time_point last_deadline_ ABSL_GUARDED_BY(mu_);
  int cancelled_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<GenerateReactor*> held_ ABSL_GUARDED_BY(mu_);
  bool hold_released_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<KvStreamReactor*> kv_streams_ ABSL_GUARDED_BY(mu_);
  int kv_subscriptions_ ABSL_GUARDED_BY(mu_) = 0;
  /// Key -> bit per tier holding it.
  absl::flat_hash_map<BlockKey, uint8_t> keys_ ABSL_GUARDED_BY(mu_);

  std::unique_ptr<InferenceImpl> inference_;
  std::unique_ptr<WorkerImpl> worker_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

/// What a client got from one Generate call.
struct Outcome {
  grpc::Status status;
  std::vector<v1::GenerateResponse> responses;
  /// The worker field of the first response (empty when none).
  std::string worker() const { return responses.empty() ? "" : responses[0].worker(); }
};

/// A Generate request for these prompt ids.
inline v1::GenerateRequest Prompt(const std::vector<uint32_t>& ids, std::string salt = "") {
  v1::GenerateRequest request;
  for (uint32_t id : ids) request.add_prompt_token_ids(id);
  request.set_cache_salt(std::move(salt));
  return request;
}

/// Runs one Generate through `stub` to its end (or `timeout`).
inline Outcome GenerateVia(v1::Inference::Stub& stub, const v1::GenerateRequest& request,
                           absl::Duration timeout = absl::Seconds(20)) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  auto reader = stub.Generate(&context, request);
  Outcome outcome;
  v1::GenerateResponse response;
  while (reader->Read(&response)) outcome.responses.push_back(response);
  outcome.status = reader->Finish();
  return outcome;
}

}  // namespace kvserve::testing

#endif  // KVSERVE_TESTS_ROUTER_FAKE_WORKER_H_
