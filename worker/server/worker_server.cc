#include "worker/server/worker_server.h"

#include <filesystem>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/io/socket_flush.h"
#include "common/logging/logging.h"
#include "common/metrics/metrics_server.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "worker/server/inference_service.h"
#include "worker/server/worker_metrics.h"
#include "worker/server/worker_service.h"

namespace kvserve {
namespace {

constexpr char kWarmupRequestId[] = "kvserve-warmup";

}  // namespace

std::string DefaultModelName(const std::string& model_path) {
  std::filesystem::path path(model_path);
  while (!path.empty() && !path.has_filename()) path = path.parent_path();
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return path.filename().string();
  return path.stem().string();
}

WorkerServer::WorkerServer(const LoadedModel* model, Engine* engine, WorkerServerOptions options)
    : model_(model), engine_(engine), options_(std::move(options)) {
  inference_ = std::make_unique<InferenceService>(model_, engine_, options_.model_name, &counters_);
  worker_ = std::make_unique<WorkerService>(model_, engine_, options_.model_name, &counters_,
                                            [this] { SetServing(false); });
  metrics_ = std::make_shared<WorkerMetrics>(engine_, &counters_);
}

WorkerServer::~WorkerServer() {
  Shutdown();
  // The metrics read counters_, which dies with this server.
  engine_->SetObserver(nullptr);
}

int WorkerServer::metrics_port() const {
  return metrics_server_ != nullptr ? metrics_server_->port() : 0;
}

std::shared_ptr<prometheus::Collectable> WorkerServer::metrics() const {
  return metrics_->collectable();
}

absl::StatusOr<int> WorkerServer::Start(const std::string& listen_address) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (server_ != nullptr || shut_down_) {
      return absl::FailedPreconditionError("WorkerServer::Start called twice");
    }
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      auth::MakeServerCredentials(options_.tls);
  if (!credentials.ok()) return credentials.status();
  if (options_.role != "both" && options_.role != "prefill" && options_.role != "decode") {
    return absl::InvalidArgumentError(
        absl::StrCat("--role must be prefill, decode or both, got '", options_.role, "'"));
  }
  worker_->SetRole(options_.role);
  if (options_.kv_transfer.mode != KvTransferMode::kNever) {
    KvTransferOptions transfer = options_.kv_transfer;
    if (transfer.credentials == nullptr && options_.tls.enabled()) {
      absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> channel =
          auth::MakePeerChannelCredentials(options_.tls);
      if (!channel.ok()) return channel.status();
      transfer.credentials = *channel;
    }
    fetcher_ = std::make_unique<KvFetcher>(
        engine_, std::move(transfer), [this](const KvFetchResult& result) {
          if (!result.status.ok()) {
            counters_.kv_pull_failures.fetch_add(1);
            logging::Log(logging::LogLevel::kWarning, "worker",
                         "KV pull failed; computing the rest",
                         {{"error", std::string(result.status.message())},
                          {"blocks_received", static_cast<int64_t>(result.blocks.size())}});
          }
          counters_.kv_pulled_blocks.fetch_add(static_cast<int64_t>(result.blocks.size()));
          counters_.kv_pulled_bytes.fetch_add(result.bytes);
          metrics_->ObserveKvPull(result.seconds);
        });
    inference_->SetKvFetcher(fetcher_.get());
  }
  // Both are process-wide switches read when a server is built.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen_address, *credentials, &port);
  builder.RegisterService(inference_.get());
  builder.RegisterService(worker_.get());
  if (options_.pipeline != nullptr) {
    builder.RegisterService(options_.pipeline->service());
    builder.SetMaxReceiveMessageSize(1 << 30);
    builder.SetMaxSendMessageSize(1 << 30);
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on '", listen_address,
                                               "' (address in use or malformed HOST:PORT?)"));
  }
  port_ = port;
  advertise_ = options_.advertise;
  if (advertise_.empty()) {
    const size_t colon = listen_address.rfind(':');
    const std::string host =
        colon == std::string::npos ? listen_address : listen_address.substr(0, colon);
    advertise_ = absl::StrCat(host, ":", port);
  }
  inference_->SetWorkerName(advertise_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    server_ = std::move(server);
  }
  SetServing(false);
  if (options_.warmup && options_.pipeline == nullptr) {
    if (absl::Status s = Warmup(); !s.ok()) {
      Shutdown();
      return absl::Status(s.code(), absl::StrCat("warm-up request failed: ", s.message()));
    }
  }
  engine_->SetObserver(metrics_);
  if (!options_.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<metrics::MetricsServer>> metrics_server =
        metrics::MetricsServer::Start(options_.metrics_listen, metrics_->collectable());
    if (!metrics_server.ok()) {
      Shutdown();
      return metrics_server.status();
    }
    metrics_server_ = *std::move(metrics_server);
  }
  if (options_.pipeline != nullptr) {
    PipelineGroup* group = options_.pipeline;
    group->SetFormedCallback([this](bool formed) { SetServing(formed && !engine_->draining()); });
    if (!engine_->draining() && group->formed()) SetServing(true);
    return port;
  }
  if (!engine_->draining()) SetServing(true);
  return port;
}

absl::Status WorkerServer::Warmup() {
  EngineRequest request;
  request.request_id = kWarmupRequestId;
  const TokenId bos = model_->tokenizer->bos_id();
  request.prompt_ids = {bos == kNoToken ? 0 : bos};
  request.params.temperature = 0.0f;
  request.params.max_tokens = 1;
  request.params.ignore_eos = true;
  // Its own salt keeps the warm-up's blocks from ever matching a client's prefix.
  request.cache_salt = kWarmupRequestId;
  absl::StatusOr<std::shared_ptr<RequestStream>> stream = engine_->Submit(std::move(request));
  if (!stream.ok()) return stream.status();
  RequestOutput out;
  if (engine_->options().run_loop_thread) {
    while ((*stream)->Next(&out)) {
      if (out.finished) return out.status;
    }
  } else {
    // Manual-step engine (tests): step it ourselves until the request ends.
    while (true) {
      const bool busy = engine_->StepOnce();
      while ((*stream)->TryNext(&out)) {
        if (out.finished) return out.status;
      }
      if (!busy) break;
    }
  }
  return absl::InternalError("warm-up request ended without a final message");
}

void WorkerServer::SetServing(bool serving) {
  std::lock_guard<std::mutex> lock(mu_);
  if (server_ == nullptr || shut_down_) return;
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  if (health == nullptr) return;
  health->SetServingStatus("", serving);
  health->SetServingStatus(v1::Inference::service_full_name(), serving);
  health->SetServingStatus(v1::Worker::service_full_name(), serving);
}

void WorkerServer::Drain() {
  engine_->Drain();
  SetServing(false);
  logging::Log(logging::LogLevel::kInfo, "worker", "draining: not accepting requests",
               {{"worker", advertise_},
                {"open_generate_streams", counters_.open_generate_streams.load()}});
}

bool WorkerServer::AwaitDrained(absl::Time deadline) {
  while (counters_.open_generate_streams.load() > 0) {
    if (absl::Now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return WaitForSocketsFlushed(deadline);
}

void WorkerServer::Shutdown(std::chrono::milliseconds grace) {
  grpc::Server* server = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    server = server_.get();
    if (server == nullptr) return;
    // Marks everything NOT_SERVING and ends Watch calls.
    if (grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService()) {
      health->Shutdown();
    }
  }
  worker_->Shutdown();
  // Ends the stages' Join calls, which would otherwise hold the server open.
  if (options_.pipeline != nullptr) {
    options_.pipeline->SetFormedCallback(nullptr);
    options_.pipeline->Shutdown();
  }
  server->Shutdown(std::chrono::system_clock::now() + grace);
  server->Wait();
}

}  // namespace kvserve
