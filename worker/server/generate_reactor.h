#ifndef KVSERVE_WORKER_SERVER_GENERATE_REACTOR_H_
#define KVSERVE_WORKER_SERVER_GENERATE_REACTOR_H_

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "grpcpp/support/server_callback.h"
#include "kvserve/v1/inference.pb.h"
#include "worker/engine/engine.h"
#include "worker/server/serving_stats.h"

namespace kvserve {

/// What a GenerateReactor streams and where its request lives.
struct GenerateReactorParams {
  Engine* engine = nullptr;
  /// Null: the request is not submitted yet (its KV blocks are being pulled); Attach follows.
  std::shared_ptr<RequestStream> stream;
  std::string request_id;
  int32_t num_samples = 1;
  /// GenerateResponse.worker of every message.
  std::string worker;
  ServingCounters* counters = nullptr;
};

/// Streams one submitted request's outputs to a Generate client without blocking a thread.
///
/// Event flow: the engine pushes RequestOutputs into the request's RequestStream and the
/// stream's listener wakes this reactor (Pump) on the engine thread; OnWriteDone wakes it on a
/// gRPC thread. Pump takes the next output and starts its write; it never blocks.
///
/// Back-pressure: at most one write is in flight per stream. While a slow client reads, the
/// outputs wait in the RequestStream, which holds only what the engine produced for this request:
/// at most one message per sample per engine step, so at most n * max_tokens messages (plus one
/// final message per sample). The engine is not slowed by a slow reader and KV blocks are freed
/// when the request finishes, whether or not the client has read everything.
///
/// Cancellation: when the client cancels or its deadline expires, OnCancel aborts the request in
/// the engine at once (its KV blocks are freed at the engine's next loop iteration) and finishes
/// the call; the client sees CANCELLED or DEADLINE_EXCEEDED.
///
/// Ending: after the final message of the last sample the call finishes OK. An engine error
/// (other than an abort) finishes it with that error's code. An aborted sample (Worker.Abort, or
/// the engine shutting down) gets a final message with FINISH_REASON_ABORT.
///
/// Deferred start: a reactor made without a stream waits for Attach (the request's KV blocks
/// are being pulled from another worker first). A cancel meanwhile runs `on_cancel_pending`
/// (which cancels the pull) and the call ends once Attach comes.
///
/// The reactor deletes itself in OnDone.
class GenerateReactor final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  explicit GenerateReactor(GenerateReactorParams params);

  /// Deferred start: called once with the submitted request's stream, or with why it could
  /// not be submitted (the call then ends with that status).
  void Attach(absl::StatusOr<std::shared_ptr<RequestStream>> stream);
  /// Deferred start: run on cancellation while no stream is attached (may be called from
  /// OnCancel's thread). Set before the reactor is returned to gRPC.
  void SetOnCancelPending(std::function<void()> on_cancel) {
    on_cancel_pending_ = std::move(on_cancel);
  }
  /// Whether the client cancelled.
  bool cancelled();

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  /// Starts the next write or finishes the call, unless a write is in flight.
  void Pump();

  GenerateReactorParams params_;
  std::function<void()> on_cancel_pending_;
  std::mutex mu_;
  /// Deferred start: the submission failed with this.
  absl::Status attach_error_;
  bool write_in_flight_ = false;
  bool finish_started_ = false;
  bool cancelled_ = false;
  int32_t samples_finished_ = 0;
  // For the "generate finished" log line.
  int64_t completion_tokens_ = 0;
  // The message being written; gRPC reads it until OnWriteDone (or OnDone for the last).
  v1::GenerateResponse response_;
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_SERVER_GENERATE_REACTOR_H_
