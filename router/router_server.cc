#include "router/router_server.h"

#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/metrics_server.h"
#include "common/tokenizer_loader/tokenizer_loader.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "router/router_service.h"

namespace kvserve {

std::string ModelNameFromPath(const std::string& path) {
  std::filesystem::path p(path);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();  // trailing '/'
  if (std::filesystem::is_directory(p)) return p.filename().string();
  return p.stem().string();
}

struct RouterServer::State {
  std::unique_ptr<RouterMetrics> metrics;
  std::unique_ptr<ApiKeyGuard> api_keys;
  std::unique_ptr<Tokenizer> tokenizer;
  PrefixIndex index;
  std::unique_ptr<RoutingPolicy> policy;
  /// Picks prefill workers in disaggregated serving (its own state: see SetPrefillPolicy).
  std::unique_ptr<RoutingPolicy> prefill_policy;
  std::unique_ptr<WorkerPool> pool;
  std::unique_ptr<Dispatcher> dispatcher;
  std::unique_ptr<RouterService> service;
  std::unique_ptr<grpc::Server> server;
  std::string model_name;
  int port = 0;
  absl::Mutex shutdown_mu;
  bool shut_down = false;
  // Last, so it stops serving before what its scrapes read is destroyed.
  std::unique_ptr<metrics::MetricsServer> metrics_server;
};

RouterServer::RouterServer(std::unique_ptr<State> state) : state_(std::move(state)) {}

RouterServer::~RouterServer() { Shutdown(); }

absl::StatusOr<std::unique_ptr<RouterServer>> RouterServer::Start(const RouterOptions& options) {
  if (options.model_path.empty()) {
    return absl::InvalidArgumentError("model: a model path (--model) is required");
  }
  if (options.dispatch.block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("block-size: must be positive, got ", options.dispatch.block_size));
  }
  if (options.dispatch.max_inflight_per_worker <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max-inflight-per-worker: must be positive, got ",
                     options.dispatch.max_inflight_per_worker));
  }
  if (options.dispatch.max_queue < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max-queue: must not be negative, got ", options.dispatch.max_queue));
  }
  const double load_weight = options.policy_config.kv_aware.load_weight;
  if (!(load_weight >= 0) || load_weight > 1e6) {
    return absl::InvalidArgumentError(
        absl::StrCat("load-weight: must be a finite value >= 0, got ", load_weight));
  }
  const double transfer_weight = options.policy_config.kv_aware.transfer_weight;
  if (!(transfer_weight >= 0 && transfer_weight <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv-transfer-weight: must be in [0, 1], got ", transfer_weight));
  }
  auto state = std::make_unique<State>();
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> server_credentials =
      auth::MakeServerCredentials(options.tls);
  if (!server_credentials.ok()) return server_credentials.status();
  WorkerPoolOptions pool_options = options.pool;
  if (options.worker_tls.enabled()) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> worker_credentials =
        auth::MakeChannelCredentials(options.worker_tls,
                                     "--worker-ca,--worker-tls-cert,--worker-tls-key");
    if (!worker_credentials.ok()) return worker_credentials.status();
    pool_options.credentials = *std::move(worker_credentials);
    pool_options.tls_server_name = options.worker_tls.server_name;
  }
  if (!options.api_keys_path.empty()) {
    absl::StatusOr<auth::ApiKeyTable> keys = auth::ApiKeyTable::Load(options.api_keys_path);
    if (!keys.ok()) {
      return absl::Status(keys.status().code(),
                          absl::StrCat("api-keys: ", keys.status().message()));
    }
    state->api_keys = std::make_unique<ApiKeyGuard>(*std::move(keys));
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(options.model_path);
  if (!tokenizer.ok()) {
    return absl::Status(tokenizer.status().code(),
                        absl::StrCat("model: ", tokenizer.status().message()));
  }
  state->tokenizer = *std::move(tokenizer);
  absl::StatusOr<std::unique_ptr<RoutingPolicy>> policy =
      RoutingPolicyRegistry::Default().Create(options.policy, options.policy_config);
  if (!policy.ok()) return policy.status();
  state->policy = *std::move(policy);
  absl::StatusOr<std::unique_ptr<RoutingPolicy>> prefill_policy =
      RoutingPolicyRegistry::Default().Create(options.policy, options.policy_config);
  if (!prefill_policy.ok()) return prefill_policy.status();
  state->prefill_policy = *std::move(prefill_policy);
  state->metrics = std::make_unique<RouterMetrics>(std::string(state->policy->name()));

  absl::StatusOr<std::unique_ptr<WorkerPool>> pool =
      WorkerPool::Create(pool_options, &state->index);
  if (!pool.ok()) return pool.status();
  state->pool = *std::move(pool);
  state->dispatcher = std::make_unique<Dispatcher>(options.dispatch, state->pool.get(),
                                                   &state->index, state->policy.get());
  state->dispatcher->SetMetrics(state->metrics.get());
  state->dispatcher->SetPrefillPolicy(state->prefill_policy.get());
  state->metrics->Attach(state->pool.get(), state->dispatcher.get());
  state->pool->SetChangeListener([d = state->dispatcher.get()] { d->Pump(); });

  RouterServiceOptions service_options;
  service_options.model_name =
      options.model_name.empty() ? ModelNameFromPath(options.model_path) : options.model_name;
  state->model_name = service_options.model_name;
  service_options.block_size = options.dispatch.block_size;
  service_options.tenant_cache_isolation = options.tenant_cache_isolation;
  service_options.retry_after = options.dispatch.retry_after;
  RouterServiceDeps deps;
  deps.tokenizer = state->tokenizer.get();
  deps.dispatcher = state->dispatcher.get();
  deps.pool = state->pool.get();
  deps.metrics = state->metrics.get();
  deps.api_keys = state->api_keys.get();
  state->service = std::make_unique<RouterService>(service_options, deps);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, *server_credentials, &state->port);
  builder.RegisterService(state->service.get());
  state->server = builder.BuildAndStart();
  if (state->server == nullptr || state->port == 0) {
    state->pool->Shutdown();
    return absl::UnavailableError(
        absl::StrCat("listen: cannot serve on '", options.listen, "' (address in use or invalid)"));
  }
  if (!options.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<metrics::MetricsServer>> metrics_server =
        metrics::MetricsServer::Start(options.metrics_listen, state->metrics->collectable());
    if (!metrics_server.ok()) {
      state->server->Shutdown();
      state->server->Wait();
      state->pool->Shutdown();
      return metrics_server.status();
    }
    state->metrics_server = *std::move(metrics_server);
  }
  return std::unique_ptr<RouterServer>(new RouterServer(std::move(state)));
}

int RouterServer::port() const { return state_->port; }

int RouterServer::metrics_port() const {
  return state_->metrics_server != nullptr ? state_->metrics_server->port() : 0;
}

RouterMetrics& RouterServer::metrics() { return *state_->metrics; }

void RouterServer::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&state_->shutdown_mu);
    if (state_->shut_down) return;
    state_->shut_down = true;
  }
  // Running calls are cancelled at the deadline; their upstream calls end with them, so the
  // pool and dispatcher they use can be stopped afterwards.
  state_->server->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  state_->server->Wait();
  state_->pool->Shutdown();
}

WorkerPool& RouterServer::pool() { return *state_->pool; }
PrefixIndex& RouterServer::index() { return state_->index; }
Dispatcher& RouterServer::dispatcher() { return *state_->dispatcher; }
ApiKeyGuard* RouterServer::api_keys() { return state_->api_keys.get(); }

std::shared_ptr<grpc::Channel> RouterServer::InProcessChannel() {
  return state_->server->InProcessChannel(grpc::ChannelArguments());
}
const Tokenizer& RouterServer::tokenizer() const { return *state_->tokenizer; }
const std::string& RouterServer::model_name() const { return state_->model_name; }

}  // namespace kvserve
