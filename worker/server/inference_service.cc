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
  if (!status.ok()) {
    LogRejected(request->request_id(), status);
    return new RejectedGenerate(status);
  }
  if (engine_request->request_id.empty()) engine_request->request_id = NewRequestId();
  GenerateReactorParams params;
  params.engine = engine_;
  params.request_id = engine_request->request_id;
  params.num_samples = engine_request->n;
  params.worker = worker_name();
  params.counters = counters_;
  const std::pair<int32_t, int32_t> pull = BlocksToPull(*request, *engine_request);
  if (pull.first >= pull.second) {
    absl::StatusOr<std::shared_ptr<RequestStream>> stream =
        SubmitToEngine(std::move(*engine_request));
    if (!stream.ok()) return new RejectedGenerate(stream.status());
    params.stream = *std::move(stream);
    return new GenerateReactor(std::move(params));
  }
  // Pull the prefix's blocks first; the request is submitted when the pull ends, however it
  // ends (what did not arrive is computed).
  auto* reactor = new GenerateReactor(std::move(params));
  auto handle = std::make_shared<KvFetchHandle>();
  reactor->SetOnCancelPending([handle] { handle->Cancel(); });
  counters_->kv_pulls.fetch_add(1);
  logging::Log(logging::LogLevel::kInfo, "worker", "pulling KV blocks",
               {{"request_id", engine_request->request_id},
                {"from", request->kv_source().worker()},
                {"first_block", pull.first},
                {"blocks", pull.second - pull.first}});
  auto pending = std::make_shared<EngineRequest>(std::move(*engine_request));
  fetcher_->Fetch(request->kv_source().worker(), pending->prompt_ids, pending->cache_salt,
                  pull.first, pull.second, std::move(handle),
                  [this, reactor, pending](KvFetchResult result) {
                    if (reactor->cancelled()) {
                      reactor->Attach(absl::CancelledError("generate call cancelled"));
                      return;
                    }
                    pending->kv_blocks = std::move(result.blocks);
                    reactor->Attach(SubmitToEngine(std::move(*pending)));
                  });
  return reactor;
}

void InferenceService::LogRejected(const std::string& request_id, const absl::Status& status) {
  counters_->generate_rejected.fetch_add(1);
  logging::Log(logging::LogLevel::kWarning, "worker", "generate rejected",
               {{"request_id", request_id},
                {"code", absl::StatusCodeToString(status.code())},
                {"error", std::string(status.message())}});
}

absl::StatusOr<std::shared_ptr<RequestStream>> InferenceService::SubmitToEngine(
    EngineRequest request) {
  const std::string request_id = request.request_id;
  const int32_t n = request.n;
  absl::StatusOr<std::shared_ptr<RequestStream>> stream = engine_->Submit(std::move(request));
  if (!stream.ok()) {
    LogRejected(request_id, stream.status());
    return stream;
  }
  counters_->generate_requests.fetch_add(1);
  logging::Log(logging::LogLevel::kInfo, "worker", "generate accepted",
               {{"request_id", request_id}, {"n", n}});
  return stream;
}

std::pair<int32_t, int32_t> InferenceService::BlocksToPull(const v1::GenerateRequest& request,
                                                           const EngineRequest& engine_request) {
  if (fetcher_ == nullptr || !request.has_kv_source()) return {0, 0};
  const v1::KvSourceHint& hint = request.kv_source();
  if (hint.worker().empty() || hint.worker() == worker_name()) return {0, 0};
  // The prefix lookup leaves the prompt's last token to compute, so never uses a last block
  // that ends the prompt.
  const int64_t usable =
      (static_cast<int64_t>(engine_request.prompt_ids.size()) - 1) / engine_->options().block_size;
  const int32_t first = static_cast<int32_t>(std::min<int64_t>(hint.first_block(), usable));
  const int32_t end = static_cast<int32_t>(std::min<int64_t>(hint.num_blocks(), usable));
  if (first >= end) return {0, 0};
  if (!fetcher_->ShouldPull(hint.worker(), end - first)) {
    counters_->kv_pulls_declined.fetch_add(1);
    return {0, 0};
  }
  return {first, end};
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
