#ifndef KVSERVE_ROUTER_ROUTER_SERVER_H_
#define KVSERVE_ROUTER_ROUTER_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/auth/tls_credentials.h"
#include "router/api_key_guard.h"
#include "router/dispatcher.h"
#include "router/router_metrics.h"
#include "router/routing_policy.h"
#include "router/worker_pool.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace kvserve {

class Tokenizer;

/// Everything `kvserve router` is configured with.
struct RouterOptions {
  /// HOST:PORT to serve on; port 0 picks a free one (see RouterServer::port()).
  std::string listen = "0.0.0.0:8000";
  /// The model's tokenizer: a GGUF file, tokenizer.json or a model directory (the same files
  /// the workers load).
  std::string model_path;
  /// Name ListModels reports; empty derives it from model_path (file or directory name without
  /// extension).
  std::string model_name;
  /// Routing policy registry name and tuning.
  std::string policy = std::string(kDefaultRoutingPolicy);
  RoutingPolicyConfig policy_config;
  /// Admission limits and the KV block size (must match the workers').
  DispatcherOptions dispatch;
  /// Worker discovery and health checking.
  WorkerPoolOptions pool;
  /// HOST:PORT serving Prometheus /metrics (port 0 picks a free one); empty: none.
  std::string metrics_listen;
  /// TLS of the client-facing port (--tls-cert, --tls-key, --tls-client-ca); none: plaintext.
  auth::ServerTlsFiles tls;
  /// TLS (mutual when a certificate is given) of the connections to workers (--worker-ca,
  /// --worker-tls-cert, --worker-tls-key, --worker-tls-server-name); none: plaintext.
  auth::ChannelTlsFiles worker_tls;
  /// API key file (--api-keys, format in common/auth/api_keys.h); empty: no authentication.
  std::string api_keys_path;
  /// With API keys, keep tenants' prefix-cache blocks apart (--no-tenant-cache-isolation).
  bool tenant_cache_isolation = true;
};

/// The name ListModels reports for a model path: "stories260K" for ".../stories260K.gguf".
std::string ModelNameFromPath(const std::string& path);

/// The router process: loads the tokenizer, builds the worker pool, prefix index, policy and
/// dispatcher, and serves kvserve.v1.Inference, grpc.health.v1 and reflection.
class RouterServer {
 public:
  /// Validates the options and starts serving; errors name the option.
  static absl::StatusOr<std::unique_ptr<RouterServer>> Start(const RouterOptions& options);
  ~RouterServer();
  RouterServer(const RouterServer&) = delete;
  RouterServer& operator=(const RouterServer&) = delete;

  /// The port actually bound.
  int port() const;
  /// The port /metrics is served on (0 when RouterOptions::metrics_listen is empty).
  int metrics_port() const;
  /// The router's metrics (also what /metrics serves), for in-process rendering.
  RouterMetrics& metrics();
  /// Stops accepting calls, cancels the running ones after `grace`, then stops the pool.
  /// Idempotent; the destructor calls it with no grace.
  void Shutdown(absl::Duration grace = absl::ZeroDuration());

  WorkerPool& pool();
  PrefixIndex& index();
  Dispatcher& dispatcher();
  /// The API key check; nullptr when RouterOptions::api_keys_path is empty.
  ApiKeyGuard* api_keys();

  /// A channel to this router's own kvserve.v1.Inference that skips the network (gRPC's
  /// in-process transport): fronts in the same process, such as the HTTP server, call through
  /// it and so get the same validation, routing, limits and errors as gRPC clients.
  std::shared_ptr<grpc::Channel> InProcessChannel();
  /// The tokenizer loaded from model_path (for the HTTP front's chat template).
  const Tokenizer& tokenizer() const;
  /// The name ListModels reports.
  const std::string& model_name() const;

 private:
  struct State;
  explicit RouterServer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace kvserve

#endif  // KVSERVE_ROUTER_ROUTER_SERVER_H_
