#ifndef KVSERVE_WORKER_SERVER_INFERENCE_SERVICE_H_
#define KVSERVE_WORKER_SERVER_INFERENCE_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>

#include "kvserve/v1/inference.grpc.pb.h"
#include "worker/engine/engine.h"
#include "worker/model/loaded_model.h"
#include "worker/server/kv_fetch.h"
#include "worker/server/serving_stats.h"

namespace kvserve {

/// kvserve.v1.Inference over one engine and its model, with the callback API: no thread waits
/// per call. Generate tokenizes a text prompt on the calling gRPC thread (CPU work proportional
/// to the prompt, no blocking), submits to the engine and streams through a GenerateReactor.
class InferenceService final : public v1::Inference::CallbackService {
 public:
  /// `model`, `engine` and `counters` must outlive the service. `model_name` is what ListModels
  /// reports and what a request's `model` must equal (or be empty).
  InferenceService(const LoadedModel* model, Engine* engine, std::string model_name,
                   ServingCounters* counters);

  /// GenerateResponse.worker; set once the server knows its bound port.
  void SetWorkerName(std::string worker);
  /// Where a request with GenerateRequest.kv_source pulls its blocks from the named worker
  /// (null, the default: hints are ignored). Not owned; set before serving.
  void SetKvFetcher(KvFetcher* fetcher) { fetcher_ = fetcher; }

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* context,
                                       const v1::DetokenizeRequest* request,
                                       v1::DetokenizeResponse* response) override;

 private:
  /// OK when `model` is empty or names the served model, else INVALID_ARGUMENT (as the router).
  absl::Status CheckModel(const std::string& model) const;
  std::string NewRequestId();
  std::string worker_name();
  /// The blocks [first, end) of the request's prompt that its kv_source hint says to pull, or
  /// an empty range when the hint is absent or unusable, or the cost model declines.
  std::pair<int32_t, int32_t> BlocksToPull(const v1::GenerateRequest& request,
                                           const EngineRequest& engine_request);
  /// Counts and logs a Generate refused before or by the engine.
  void LogRejected(const std::string& request_id, const absl::Status& status);
  /// Submits to the engine, counting and logging the request as accepted or rejected.
  absl::StatusOr<std::shared_ptr<RequestStream>> SubmitToEngine(EngineRequest request);

  const LoadedModel* model_;
  Engine* engine_;
  const std::string model_name_;
  ServingCounters* counters_;
  KvFetcher* fetcher_ = nullptr;
  // Generated request ids: "<prefix>-<counter>", the prefix random per service so ids from two
  // workers behind one router do not collide.
  std::string id_prefix_;
  std::atomic<uint64_t> next_id_{0};
  std::mutex mu_;
  std::string worker_;
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_SERVER_INFERENCE_SERVICE_H_
