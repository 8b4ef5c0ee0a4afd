#ifndef KVSERVE_WORKER_SERVER_INFERENCE_SERVICE_H_
#define KVSERVE_WORKER_SERVER_INFERENCE_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "kvserve/v1/inference.grpc.pb.h"
#include "worker/engine/engine.h"
#include "worker/model/loaded_model.h"
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

  const LoadedModel* model_;
  Engine* engine_;
  const std::string model_name_;
  ServingCounters* counters_;
  // Generated request ids: "<prefix>-<counter>", the prefix random per service so ids from two
  // workers behind one router do not collide.
  std::string id_prefix_;
  std::atomic<uint64_t> next_id_{0};
  std::mutex mu_;
  std::string worker_;
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_SERVER_INFERENCE_SERVICE_H_
