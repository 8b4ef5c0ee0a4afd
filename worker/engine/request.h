#ifndef KVSERVE_WORKER_ENGINE_REQUEST_H_
#define KVSERVE_WORKER_ENGINE_REQUEST_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/token.h"
#include "worker/constraint/constraint.h"
#include "worker/engine/sampler.h"
#include "worker/engine/sampling_params.h"
#include "worker/engine/stop_checker.h"
#include "worker/kv/block_pool.h"
#include "worker/kv/kv_transfer.h"

namespace kvserve {

/// A generation request as the engine takes it (already tokenized).
struct EngineRequest {
  /// Unique among live requests; used by Abort.
  std::string request_id;
  std::vector<TokenId> prompt_ids;
  SamplingParams params;
  /// Independent samples of the same prompt; they share the prompt's KV blocks.
  int32_t n = 1;
  /// Requests only share cached prefix blocks with requests of the same salt.
  std::string cache_salt;
  /// What the output must match (a JSON schema, a regular expression, a grammar); kNone: free.
  /// Each sample only ever draws tokens that keep its text a valid prefix, may end (EOS) only
  /// where the text is complete, and ends with finish reason "stop" once nothing may follow.
  constraint::ConstraintSpec constraint;
  /// K/V of the prompt's leading blocks pulled from another worker (FetchKvBlocks): the prefix
  /// lookup restores them instead of computing them. Blocks of another prompt or salt are
  /// never found (they are looked up by chain hash); wrongly sized ones are refused.
  std::vector<KvBlockPayload> kv_blocks;
};

/// What a finished sample reports.
struct SequenceUsage {
  int32_t prompt_tokens = 0;
  /// Prompt tokens whose K/V came from the prefix cache instead of being computed.
  int32_t cached_prompt_tokens = 0;
  int32_t completion_tokens = 0;
  /// Most KV blocks the sample's block table held at once.
  int32_t peak_kv_blocks = 0;
};

/// One message of a request's output stream: the next token(s) of one sample, and on the last
/// message of that sample its finish reason and usage.
struct RequestOutput {
  int32_t sample_index = 0;
  std::vector<TokenId> token_ids;
  /// Text released since the previous message of this sample.
  std::string text;
  /// Parallel to token_ids when logprobs were asked for.
  std::vector<SampleResult> logprobs;
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  std::string stop_string;
  SequenceUsage usage;
  /// Not OK when the request failed or was aborted (then `finished` is true).
  absl::Status status;
};

/// What one engine step did, for metrics (EngineObserver::OnStep).
struct StepMetrics {
  /// Tokens fed to the model in the step (prefill chunks plus decodes).
  int32_t num_tokens = 0;
  /// Prompt lengths of the requests whose first token was sampled in this step.
  int32_t prompt_tokens = 0;
  /// Tokens sampled in the step, over every sample.
  int32_t generation_tokens = 0;
  /// The part of generation_tokens sampled on the device (EngineOptions::device_sampling).
  int32_t device_sampled_tokens = 0;
  /// Per request that got its first token: seconds from Submit to that token.
  std::vector<double> time_to_first_token_seconds;
  /// Per later token of a sample: seconds since that sample's previous token.
  std::vector<double> inter_token_latency_seconds;
};

/// Timings of one request that ended (EngineObserver::OnRequestFinished). A phase the request
/// never reached is -1.
struct RequestMetrics {
  std::string request_id;
  /// Why its last sample ended; kNone when it was aborted or failed (see status_code).
  FinishReason finish_reason = FinishReason::kNone;
  /// kCancelled for an abort, another code for a failure, kOk otherwise.
  absl::StatusCode status_code = absl::StatusCode::kOk;
  int32_t prompt_tokens = 0;
  /// Tokens generated over every sample.
  int32_t generation_tokens = 0;
  /// Submit to end.
  double e2e_seconds = -1;
  /// Submit to first scheduled in a step.
  double queue_seconds = -1;
  /// First scheduled to first token.
  double prefill_seconds = -1;
  /// First token to last token.
  double decode_seconds = -1;
};

/// Receives the engine's step and request metrics. Both calls run on the engine's loop thread
/// (or StepOnce's caller) and must be quick and must not call back into the engine.
class EngineObserver {
 public:
  virtual ~EngineObserver() = default;
  /// After every step that ran the model.
  virtual void OnStep(const StepMetrics& step) = 0;
  /// When a request ended: all its samples finished, or it was aborted or failed.
  virtual void OnRequestFinished(const RequestMetrics& request) = 0;
};

/// A batch of prefix-cache changes for the router's global index.
struct KvEventBatch {
  /// Replace everything known about this worker with `events` (a snapshot of cached blocks).
  bool reset = false;
  std::vector<KvEvent> events;
};

/// The queue of KV events one subscriber reads. The engine pushes after every step that changed
/// the prefix cache; a subscriber that stops reading is bounded: past `kMaxPending` batches the
/// queue collapses into "resubscribe" (closed()) instead of growing.
class KvEventStream {
 public:
  static constexpr size_t kMaxPending = 4096;

  /// Waits up to `timeout` for a batch; false on timeout or when closed.
  bool Next(KvEventBatch* out, std::chrono::milliseconds timeout);
  /// Non-blocking variant: false when nothing is queued right now or when closed.
  bool TryNext(KvEventBatch* out);
  /// Stops the subscription; the engine drops it at its next push.
  void Close();
  bool closed() const;

  /// Registers a callback run after every Push and on Close (on the pushing or closing thread,
  /// outside the queue's lock, so it may call TryNext), letting an event-driven reader (a gRPC
  /// reactor) be woken instead of blocking a thread in Next. Replaces any previous listener; an
  /// empty function removes it. Once SetListener returns, the previous listener is not running
  /// and will not be called again. The listener must not call SetListener itself.
  void SetListener(std::function<void()> listener);

  /// Engine side. Returns false once closed.
  bool Push(KvEventBatch batch);

 private:
  void NotifyListener();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<KvEventBatch> queue_;
  bool closed_ = false;
  // Separate from mu_ so the listener can read the queue while it runs.
  std::mutex listener_mu_;
  std::function<void()> listener_;
};

/// The thread-safe queue between the engine loop (producer) and a request's consumer. Bounded
/// by the request's length: the engine pushes at most one message per sample per step.
class RequestStream {
 public:
  explicit RequestStream(int32_t num_samples) : samples_left_(num_samples) {}

  /// Blocks until a message is available; returns false once every sample has finished and
  /// every message was read.
  bool Next(RequestOutput* out);
  /// Non-blocking variant: false when nothing is queued right now.
  bool TryNext(RequestOutput* out);

  /// Registers a callback run after every Push (on the engine thread, outside the queue's lock,
  /// so it may call TryNext), letting an event-driven reader (a gRPC reactor) be woken instead of
  /// blocking a thread in Next. It must be quick and must not block. Replaces any previous
  /// listener; an empty function removes it. Once SetListener returns, the previous listener is
  /// not running and will not be called again, so its captures may be destroyed. Messages pushed
  /// before the listener was set do not call it: read them with TryNext after setting it. The
  /// listener must not call SetListener itself.
  void SetListener(std::function<void()> listener);

  /// Engine side.
  void Push(RequestOutput output);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestOutput> queue_;
  int32_t samples_left_;
  // Separate from mu_ so the listener can read the queue while it runs.
  std::mutex listener_mu_;
  std::function<void()> listener_;
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_ENGINE_REQUEST_H_
