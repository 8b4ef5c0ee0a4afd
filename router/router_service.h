#ifndef KVSERVE_ROUTER_ROUTER_SERVICE_H_
#define KVSERVE_ROUTER_ROUTER_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tokenizer/tokenizer.h"
#include "kvserve/v1/inference.grpc.pb.h"
#include "router/api_key_guard.h"
#include "router/dispatcher.h"
#include "router/router_metrics.h"
#include "router/worker_pool.h"

namespace kvserve {

/// Settings of the router's Inference service.
struct RouterServiceOptions {
  /// The name ListModels reports and Generate/Tokenize/Detokenize accept (empty is accepted
  /// too and means this model).
  std::string model_name;
  /// Tokens per KV block: must equal the workers' so the block keys match theirs.
  int block_size = 16;
  /// With API keys: derive each request's cache salt from its key's tenant (combined with the
  /// client's salt), so tenants never share prefix-cache blocks. Default on.
  bool tenant_cache_isolation = true;
  /// RESOURCE_EXHAUSTED answers carry this in the trailing metadata `retry-after-ms`.
  absl::Duration retry_after = absl::Milliseconds(500);
};

/// What the service uses; everything must outlive it.
struct RouterServiceDeps {
  const Tokenizer* tokenizer = nullptr;
  Dispatcher* dispatcher = nullptr;
  WorkerPool* pool = nullptr;
  /// Optional: Generate outcomes, latencies and retries are recorded here.
  RouterMetrics* metrics = nullptr;
  /// Optional: when set, every Inference RPC needs `authorization: Bearer <key>` metadata
  /// naming one of its keys, and Generate counts against the key's concurrency limit.
  ApiKeyGuard* api_keys = nullptr;
};

/// kvserve.v1.Inference served by the router. Generate is validated and tokenized here (so the
/// prompt's block keys can be hashed), then forwarded to the worker the dispatcher picks (see
/// GenerateCall); the forwarded request always carries prompt_token_ids, the cache salt, a
/// request_id (generated when empty), an empty model (the worker's only one) and the client's
/// deadline. ListModels, Tokenize and Detokenize are answered locally.
///
/// Authentication: with RouterServiceDeps::api_keys, every RPC first checks the caller's
/// `authorization` metadata (UNAUTHENTICATED when missing or unknown); a Generate then takes
/// one of its key's concurrent slots (RESOURCE_EXHAUSTED at the limit) until the call ends, and
/// its forwarded cache_salt becomes auth::TenantCacheSalt(tenant, client salt) unless
/// tenant_cache_isolation is off. Every RESOURCE_EXHAUSTED Generate carries the trailing
/// metadata `retry-after-ms`.
///
/// Threading: all methods are gRPC callback handlers; tokenization runs inline on gRPC's
/// callback thread (prompts are short next to generation), nothing else blocks.
class RouterService final : public v1::Inference::CallbackService {
 public:
  RouterService(const RouterServiceOptions& options, const RouterServiceDeps& deps);

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

  /// The request as it is forwarded: validated, prompt tokenized into prompt_token_ids, model
  /// and kv_source cleared, request_id filled in. INVALID_ARGUMENT names the offending field.
  absl::StatusOr<v1::GenerateRequest> PrepareRequest(const v1::GenerateRequest& request);

 private:
  absl::Status CheckModel(const std::string& model) const;
  /// The caller's key (nullptr when the router has no API keys), or UNAUTHENTICATED.
  absl::StatusOr<const auth::ApiKey*> Authenticate(const grpc::CallbackServerContext& context);

  const RouterServiceOptions options_;
  const RouterServiceDeps deps_;
  /// Makes generated request ids unique across router restarts.
  const uint64_t id_nonce_;
  std::atomic<uint64_t> next_id_{0};
};

}  // namespace kvserve

#endif  // KVSERVE_ROUTER_ROUTER_SERVICE_H_
