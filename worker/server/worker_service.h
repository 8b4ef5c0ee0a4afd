#ifndef KVSERVE_WORKER_SERVER_WORKER_SERVICE_H_
#define KVSERVE_WORKER_SERVER_WORKER_SERVICE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kvserve/v1/worker.grpc.pb.h"
#include "worker/engine/engine.h"
#include "worker/model/loaded_model.h"
#include "worker/server/serving_stats.h"

namespace kvserve {

/// kvserve.v1.Worker over one engine: what the router calls to watch and steer this worker.
class WorkerService final : public v1::Worker::CallbackService {
 public:
  /// `model`, `engine` and `counters` must outlive the service. `on_drain` runs after the engine
  /// stopped admitting requests (the server uses it to report NOT_SERVING).
  WorkerService(const LoadedModel* model, Engine* engine, std::string model_name,
                ServingCounters* counters, std::function<void()> on_drain);

  /// Ends every open StreamKvEvents stream with OK and answers new ones UNAVAILABLE. Called by
  /// the server before it shuts down, so those endless streams do not hold it up. Waits (up to
  /// `limit`) until those calls have sent their status, so the server's own shutdown does not
  /// turn their OK into CANCELLED.
  void Shutdown(std::chrono::milliseconds limit = std::chrono::milliseconds(1000));
  /// LoadReport.role ("both" until set). Set before serving.
  void SetRole(std::string role) { role_ = std::move(role); }
  /// True once Shutdown was called.
  bool shutting_down() const { return shutting_down_.load(); }

  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* context,
                                    const v1::GetLoadRequest* request,
                                    v1::LoadReport* response) override;
  grpc::ServerWriteReactor<v1::KvEventBatch>* StreamKvEvents(
      grpc::CallbackServerContext* context, const v1::StreamKvEventsRequest* request) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* context,
                                  const v1::AbortRequest* request,
                                  v1::AbortResponse* response) override;
  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* context,
                                  const v1::DrainRequest* request,
                                  v1::DrainResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request,
                                         v1::ModelInfo* response) override;
  grpc::ServerWriteReactor<v1::KvBlockData>* FetchKvBlocks(
      grpc::CallbackServerContext* context, const v1::FetchKvBlocksRequest* request) override;

 private:
  friend class KvEventsReactor;
  /// Forgets a subscription whose call ended.
  void Unregister(const KvEventStream* stream);

  const LoadedModel* model_;
  Engine* engine_;
  const std::string model_name_;
  ServingCounters* counters_;
  std::function<void()> on_drain_;
  std::string role_ = "both";
  std::atomic<bool> shutting_down_{false};
  std::mutex mu_;
  std::condition_variable unregistered_;
  // Subscriptions of the open StreamKvEvents calls.
  std::vector<std::shared_ptr<KvEventStream>> subscriptions_;
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_SERVER_WORKER_SERVICE_H_
