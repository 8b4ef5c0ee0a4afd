#include "router/router_service.h"

#include <optional>
#include <random>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/block_hash/block_hash.h"
#include "grpcpp/server_context.h"
#include "router/generate_call.h"

namespace kvserve {
namespace {

grpc::Status ToGrpc(const absl::Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

/// A Generate that fails before reaching any worker.
class FailedGenerate final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  FailedGenerate(grpc::CallbackServerContext* context, const absl::Status& status,
                 absl::Duration retry_after) {
    if (absl::IsResourceExhausted(status)) {
      context->AddTrailingMetadata(std::string(kRetryAfterMetadata),
                                   absl::StrCat(absl::ToInt64Milliseconds(retry_after)));
    }
    Finish(ToGrpc(status));
  }
  void OnDone() override { delete this; }
};

grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context,
                                      const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpc(status));
  return reactor;
}

}  // namespace

RouterService::RouterService(const RouterServiceOptions& options, const RouterServiceDeps& deps)
    : options_(options), deps_(deps), id_nonce_(std::random_device{}()) {}

absl::StatusOr<const auth::ApiKey*> RouterService::Authenticate(
    const grpc::CallbackServerContext& context) {
  if (deps_.api_keys == nullptr) return nullptr;
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  std::optional<std::string_view> value;
  if (it != metadata.end()) value = std::string_view(it->second.data(), it->second.size());
  return deps_.api_keys->Authenticate(value);
}

absl::Status RouterService::CheckModel(const std::string& model) const {
  if (model.empty() || model == options_.model_name) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "model: '", model, "' is not served here (serving '", options_.model_name, "')"));
}

absl::StatusOr<v1::GenerateRequest> RouterService::PrepareRequest(
    const v1::GenerateRequest& request) {
  if (absl::Status status = CheckModel(request.model()); !status.ok()) return status;
  v1::GenerateRequest out = request;
  out.clear_model();
  // Only the dispatcher names a worker to pull KV blocks from: a client's hint would make a
  // worker dial an address of the client's choosing.
  out.clear_kv_source();
  const bool has_text = !request.prompt().empty();
  const bool has_ids = request.prompt_token_ids_size() > 0;
  if (has_text == has_ids) {
    return absl::InvalidArgumentError(
        "prompt/prompt_token_ids: exactly one of prompt and prompt_token_ids must be set");
  }
  const int vocab_size = deps_.tokenizer->vocab_size();
  if (has_text) {
    EncodeOptions encode;
    encode.add_special_tokens = !request.has_add_special_tokens() || request.add_special_tokens();
    absl::StatusOr<std::vector<TokenId>> ids = deps_.tokenizer->Encode(request.prompt(), encode);
    if (!ids.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("prompt: ", ids.status().message()));
    }
    if (ids->empty()) return absl::InvalidArgumentError("prompt: encodes to no tokens");
    out.clear_prompt();
    for (TokenId id : *ids) out.add_prompt_token_ids(static_cast<uint32_t>(id));
  } else {
    for (int i = 0; i < request.prompt_token_ids_size(); ++i) {
      if (request.prompt_token_ids(i) >= static_cast<uint32_t>(vocab_size)) {
        return absl::InvalidArgumentError(
            absl::StrCat("prompt_token_ids[", i, "]: ", request.prompt_token_ids(i),
                         " is outside the vocabulary (size ", vocab_size, ")"));
      }
    }
  }
  if (out.request_id().empty()) {
    out.set_request_id(absl::StrFormat("rtr-%016x-%d", id_nonce_, next_id_.fetch_add(1)));
  }
  return out;
}

grpc::ServerWriteReactor<v1::GenerateResponse>* RouterService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  absl::StatusOr<const auth::ApiKey*> key = Authenticate(*context);
  if (!key.ok()) return new FailedGenerate(context, key.status(), options_.retry_after);
  absl::StatusOr<v1::GenerateRequest> prepared = PrepareRequest(*request);
  if (!prepared.ok()) {
    return new FailedGenerate(context, prepared.status(), options_.retry_after);
  }
  ApiKeyGuard::Lease lease;
  if (*key != nullptr) {
    absl::StatusOr<ApiKeyGuard::Lease> acquired = deps_.api_keys->Acquire(**key);
    if (!acquired.ok()) return new FailedGenerate(context, acquired.status(), options_.retry_after);
    lease = *std::move(acquired);
    if (options_.tenant_cache_isolation) {
      prepared->set_cache_salt(auth::TenantCacheSalt((*key)->tenant, prepared->cache_salt()));
    }
  }
  std::vector<TokenId> ids(prepared->prompt_token_ids().begin(),
                           prepared->prompt_token_ids().end());
  std::vector<BlockKey> keys = HashFullBlocks(ids, options_.block_size, prepared->cache_salt());
  auto* call = new GenerateCall(context, *std::move(prepared), std::move(keys), deps_.dispatcher,
                                deps_.pool, deps_.metrics);
  call->HoldUntilDone(std::move(lease));
  call->SetRetryAfter(options_.retry_after);
  call->Begin();
  return call;
}

grpc::ServerUnaryReactor* RouterService::ListModels(grpc::CallbackServerContext* context,
                                                    const v1::ListModelsRequest* /*request*/,
                                                    v1::ListModelsResponse* response) {
  if (absl::StatusOr<const auth::ApiKey*> key = Authenticate(*context); !key.ok()) {
    return FinishUnary(context, key.status());
  }
  v1::ModelCard* card = response->add_models();
  card->set_name(options_.model_name);
  card->set_vocab_size(static_cast<uint32_t>(deps_.tokenizer->vocab_size()));
  // The context length is the workers' (they hold the weights); the first one that answered.
  for (const auto& worker : deps_.pool->Workers()) {
    if (std::optional<v1::ModelInfo> info = worker->model_info()) {
      card->set_max_model_len(info->max_model_len());
      break;
    }
  }
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* RouterService::Tokenize(grpc::CallbackServerContext* context,
                                                  const v1::TokenizeRequest* request,
                                                  v1::TokenizeResponse* response) {
  if (absl::StatusOr<const auth::ApiKey*> key = Authenticate(*context); !key.ok()) {
    return FinishUnary(context, key.status());
  }
  if (absl::Status status = CheckModel(request->model()); !status.ok()) {
    return FinishUnary(context, status);
  }
  EncodeOptions encode;
  encode.add_special_tokens = !request->has_add_special_tokens() || request->add_special_tokens();
  absl::StatusOr<std::vector<TokenId>> ids = deps_.tokenizer->Encode(request->text(), encode);
  if (!ids.ok()) {
    return FinishUnary(context,
                       absl::InvalidArgumentError(absl::StrCat("text: ", ids.status().message())));
  }
  for (TokenId id : *ids) response->add_token_ids(static_cast<uint32_t>(id));
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* RouterService::Detokenize(grpc::CallbackServerContext* context,
                                                    const v1::DetokenizeRequest* request,
                                                    v1::DetokenizeResponse* response) {
  if (absl::StatusOr<const auth::ApiKey*> key = Authenticate(*context); !key.ok()) {
    return FinishUnary(context, key.status());
  }
  if (absl::Status status = CheckModel(request->model()); !status.ok()) {
    return FinishUnary(context, status);
  }
  std::vector<TokenId> ids;
  ids.reserve(request->token_ids_size());
  const int vocab_size = deps_.tokenizer->vocab_size();
  for (int i = 0; i < request->token_ids_size(); ++i) {
    if (request->token_ids(i) >= static_cast<uint32_t>(vocab_size)) {
      return FinishUnary(context, absl::InvalidArgumentError(absl::StrCat(
                                      "token_ids[", i, "]: ", request->token_ids(i),
                                      " is outside the vocabulary (size ", vocab_size, ")")));
    }
    ids.push_back(static_cast<TokenId>(request->token_ids(i)));
  }
  DecodeOptions decode;
  decode.skip_special_tokens = request->skip_special_tokens();
  absl::StatusOr<std::string> text = deps_.tokenizer->Decode(ids, decode);
  if (!text.ok()) {
    return FinishUnary(
        context, absl::InvalidArgumentError(absl::StrCat("token_ids: ", text.status().message())));
  }
  response->set_text(*std::move(text));
  return FinishUnary(context, absl::OkStatus());
}

}  // namespace kvserve
