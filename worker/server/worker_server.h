#ifndef KVSERVE_WORKER_SERVER_WORKER_SERVER_H_
#define KVSERVE_WORKER_SERVER_WORKER_SERVER_H_

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/auth/tls_credentials.h"
#include "worker/engine/engine.h"
#include "worker/model/loaded_model.h"
#include "worker/pp/pipeline_group.h"
#include "worker/server/kv_fetch.h"
#include "worker/server/serving_stats.h"

namespace grpc {
class Server;
}  // namespace grpc
namespace prometheus {
class Collectable;
}  // namespace prometheus

namespace kvserve {

class InferenceService;
class WorkerMetrics;
class WorkerService;
namespace metrics {
class MetricsServer;
}  // namespace metrics

/// How a WorkerServer presents itself.
struct WorkerServerOptions {
  /// The name ListModels reports; a request's `model` must equal it or be empty.
  std::string model_name = "default";
  /// GenerateResponse.worker: how clients and the router reach this worker. Empty: the listen
  /// address with the bound port.
  std::string advertise;
  /// Run one short request through the engine before reporting SERVING, so the first client
  /// request does not pay for lazy initialisation.
  bool warmup = true;
  /// HOST:PORT serving Prometheus /metrics (port 0 picks a free one); empty: none.
  std::string metrics_listen;
  /// TLS of the gRPC port (--tls-cert, --tls-key); with client_ca_path (--tls-client-ca) every
  /// caller, the router included, must present a certificate that CA signed. None: plaintext.
  auth::ServerTlsFiles tls;
  /// Pulling KV blocks that GenerateRequest.kv_source names (--kv-transfer). Peers are dialled
  /// with the server's TLS files: --tls-cert/--tls-key as the client certificate and
  /// --tls-client-ca as the CA of the peers' certificates; plaintext without TLS.
  KvTransferOptions kv_transfer;
  /// The worker's part in disaggregated serving, reported in LoadReport.role (--role):
  /// "prefill", "decode" or "both".
  std::string role = "both";
  /// A pipeline leader's group (--pp > 1; must outlive the server): its kvserve.v1.Pipeline
  /// service is served on the same port (messages up to 1 GiB: hand-overs), health is SERVING
  /// only while every stage is there, and no warm-up runs (the stages may join later).
  PipelineGroup* pipeline = nullptr;
};

/// One worker's gRPC endpoint: kvserve.v1.Inference and kvserve.v1.Worker over one engine, plus
/// grpc.health.v1 and server reflection (and kvserve.v1.Pipeline on a pipeline leader).
///
/// Health: the server-wide service "" and both service names report NOT_SERVING from the moment
/// the port is bound until the warm-up request has run, then SERVING; NOT_SERVING again once the
/// worker drains (Drain RPC or Drain()) or shuts down.
///
/// Metrics: the engine reports to this server's WorkerMetrics from the end of the warm-up on (so
/// the warm-up request is not counted); /metrics is served on options.metrics_listen.
///
/// Threading: every RPC uses gRPC's callback API; no thread blocks per call. The model and the
/// engine are not owned and must outlive the server (destroy the server first: shutting down
/// aborts open Generate calls in the engine).
class WorkerServer {
 public:
  WorkerServer(const LoadedModel* model, Engine* engine, WorkerServerOptions options);
  /// Shuts down if still running.
  ~WorkerServer();
  WorkerServer(const WorkerServer&) = delete;
  WorkerServer& operator=(const WorkerServer&) = delete;

  /// Binds `listen_address` ("host:port"; port 0 picks a free one), starts serving, runs the
  /// warm-up, starts /metrics when asked and reports SERVING. Returns the bound port.
  /// UNAVAILABLE when an address cannot be bound; FAILED_PRECONDITION when called twice;
  /// NOT_FOUND / INVALID_ARGUMENT naming the flag for unreadable or incomplete TLS files.
  absl::StatusOr<int> Start(const std::string& listen_address);

  /// Stops admitting requests and reports NOT_SERVING; running requests finish.
  void Drain();

  /// After Drain(): waits until every Generate call has ended and every byte the process wrote
  /// to its clients has reached their kernels, or until `deadline`. Returns true when both
  /// happened. Call it before Shutdown when the process exits next: Shutdown closes the
  /// connections, and a close with output still unsent can cost a client the end of its stream.
  bool AwaitDrained(absl::Time deadline);

  /// Stops the server: health goes NOT_SERVING, StreamKvEvents calls end OK at once, Generate
  /// calls get `grace` to finish and are then cancelled (and aborted in the engine). Returns
  /// once every call has ended. Idempotent.
  void Shutdown(std::chrono::milliseconds grace = std::chrono::milliseconds(0));

  /// The port Start bound (0 before).
  int port() const { return port_; }
  /// What GenerateResponse.worker reports.
  const std::string& advertised_address() const { return advertise_; }
  ServingStats stats() const { return counters_.Snapshot(); }
  /// The port /metrics is served on (0 when options.metrics_listen is empty or before Start).
  int metrics_port() const;
  /// The worker's metrics as /metrics serves them (for in-process rendering). Valid while the
  /// server exists.
  std::shared_ptr<prometheus::Collectable> metrics() const;

 private:
  /// Sets "" and both service names to `serving` in grpc.health.v1.
  void SetServing(bool serving);
  /// Runs one greedy one-token request and waits for it.
  absl::Status Warmup();

  const LoadedModel* model_;
  Engine* engine_;
  WorkerServerOptions options_;
  ServingCounters counters_;
  std::shared_ptr<WorkerMetrics> metrics_;
  std::unique_ptr<metrics::MetricsServer> metrics_server_;
  std::unique_ptr<InferenceService> inference_;
  std::unique_ptr<WorkerService> worker_;
  std::unique_ptr<KvFetcher> fetcher_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string advertise_;
  std::mutex mu_;
  bool shut_down_ = false;
};

/// The name a model is served under by default: the file name without its extension for a file
/// ("models/stories260K.gguf" -> "stories260K"), the last path component for a directory.
std::string DefaultModelName(const std::string& model_path);

}  // namespace kvserve

#endif  // KVSERVE_WORKER_SERVER_WORKER_SERVER_H_
