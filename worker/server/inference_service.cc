#include "worker/server/inference_service.h"

#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging/logging.h"
#include "worker/server/generate_reactor.h"
#include "worker/server/grpc_status.h"
#include "worker/server/proto_convert.h"

namespace kvserve {
namespace {

/// A Generate call that failed before streaming: finishes at once with `status`.
class RejectedGenerate final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  explicit RejectedGenerate(const absl::Status& status) { Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context,
                                      const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

InferenceService::InferenceService(const LoadedModel* model, Engine* engine, std::string model_name,
                                   ServingCounters* counters)
    : model_(model), engine_(engine), model_name_(std::move(model_name)), counters_(counters) {
  std::random_device rd;
  id_prefix_ = absl::StrFormat("%08x", rd());
}

void InferenceService::SetWorkerName(std::string worker) {
  std::lock_guard<std::mutex> lock(mu_);
  worker_ = std::move(worker);
}

std::string InferenceService::worker_name() {
  std::lock_guard<std::mutex> lock(mu_);
  return worker_;
}

std::string InferenceService::NewRequestId() {
  return absl::StrCat("req-", id_prefix_, "-", next_id_.fetch_add(1));
}

absl::Status InferenceService::CheckModel(const std::string& model) const {
  if (model.empty() || model == model_name_) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "model: '", model, "' is not served here; this worker serves '", model_name_, "'"));
}

grpc::ServerWriteReactor<v1::GenerateResponse>* InferenceService::Generate(
    grpc::CallbackServerContext* /*context*/, const v1::GenerateRequest* request) {
  absl::Status status = CheckModel(request->model());
  absl::StatusOr<EngineRequest> engine_request = absl::UnknownError("unset");
  if (status.ok()) {
    engine_request = ToEngineRequest(*request, *model_);
    status = engine_request.status();
  }
  absl::StatusOr<std::shared_ptr<RequestStream>> stream = absl::UnknownError("unset");
  std::string request_id;
  int32_t num_samples = 1;
  if (status.ok()) {
    if (engine_request->request_id.empty()) engine_request->request_id = NewRequestId();
    request_id = engine_request->request_id;
    num_samples = engine_request->n;
    stream = engine_->Submit(std::move(*engine_request));
    status = stream.status();
  }
  if (!status.ok()) {
    counters_->generate_rejected.fetch_add(1);
    logging::Log(logging::LogLevel::kWarning, "worker", "generate rejected",
                 {{"request_id", request_id.empty() ? request->request_id() : request_id},
                  {"code", absl::StatusCodeToString(status.code())},
                  {"error", std::string(status.message())}});
    return new RejectedGenerate(status);
  }
  counters_->generate_requests.fetch_add(1);
  logging::Log(logging::LogLevel::kInfo, "worker", "generate accepted",
               {{"request_id", request_id}, {"n", num_samples}});
  GenerateReactorParams params;
  params.engine = engine_;
  params.stream = std::move(*stream);
  params.request_id = std::move(request_id);
  params.num_samples = num_samples;
  params.worker = worker_name();
  params.counters = counters_;
  return new GenerateReactor(std::move(params));
}

grpc::ServerUnaryReactor* InferenceService::ListModels(grpc::CallbackServerContext* context,
                                                       const v1::ListModelsRequest* /*request*/,
                                                       v1::ListModelsResponse* response) {
  v1::ModelCard* card = response->add_models();
  card->set_name(model_name_);
  card->set_max_model_len(static_cast<uint32_t>(model_->config().max_position_embeddings));
  card->set_vocab_size(static_cast<uint32_t>(model_->config().vocab_size));
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::Tokenize(grpc::CallbackServerContext* context,
                                                     const v1::TokenizeRequest* request,
                                                     v1::TokenizeResponse* response) {
  if (absl::Status s = CheckModel(request->model()); !s.ok()) return FinishUnary(context, s);
  EncodeOptions options;
  options.add_special_tokens =
      request->has_add_special_tokens() ? request->add_special_tokens() : true;
  absl::StatusOr<std::vector<TokenId>> ids = model_->tokenizer->Encode(request->text(), options);
  if (!ids.ok()) {
    return FinishUnary(context,
                       absl::InvalidArgumentError(absl::StrCat("text: ", ids.status().message())));
  }
  for (TokenId id : *ids) response->add_token_ids(static_cast<uint32_t>(id));
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* InferenceService::Detokenize(grpc::CallbackServerContext* context,
                                                       const v1::DetokenizeRequest* request,
                                                       v1::DetokenizeResponse* response) {
  if (absl::Status s = CheckModel(request->model()); !s.ok()) return FinishUnary(context, s);
  const uint32_t vocab = static_cast<uint32_t>(model_->tokenizer->vocab_size());
  std::vector<TokenId> ids;
  ids.reserve(static_cast<size_t>(request->token_ids_size()));
  for (int i = 0; i < request->token_ids_size(); ++i) {
    const uint32_t id = request->token_ids(i);
    if (id >= vocab) {
      return FinishUnary(context, absl::InvalidArgumentError(absl::StrCat(
                                      "token_ids[", i, "] = ", id, " is outside the vocabulary of ",
                                      vocab, " tokens")));
    }
    ids.push_back(static_cast<TokenId>(id));
  }
  DecodeOptions options;
  options.skip_special_tokens = request->skip_special_tokens();
  absl::StatusOr<std::string> text = model_->tokenizer->Decode(ids, options);
  if (!text.ok()) {
    return FinishUnary(
        context, absl::InvalidArgumentError(absl::StrCat("token_ids: ", text.status().message())));
  }
  response->set_text(std::move(*text));
  return FinishUnary(context, absl::OkStatus());
}

}  // namespace kvserve
