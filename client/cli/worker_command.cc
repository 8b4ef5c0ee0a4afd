// `kvserve worker`: load a model and serve it over gRPC (kvserve.v1.Inference and
// kvserve.v1.Worker, grpc.health.v1, reflection) and Prometheus /metrics until SIGINT or
// SIGTERM, which drain it: no new requests, running ones finish within --drain-timeout.
//
// Pipeline groups (--pp P > 1): without --pp-leader the process is the group's leader, stage 0,
// which serves as above and accepts the other stages on its port; with --pp-leader it is one of
// those stages: it joins the leader, runs its layers for it and serves only grpc.health.v1.

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cli/command.h"
#include "client/cli/engine_flags.h"
#include "common/logging/logging.h"
#include "worker/engine/engine.h"
#include "worker/kv/kv_offload.h"
#include "worker/model/loaded_model.h"
#include "worker/planner/pipeline_layout.h"
#include "worker/pp/pipeline_group.h"
#include "worker/pp/stage_runner.h"
#include "worker/server/worker_server.h"

namespace kvserve::cli {
namespace {

struct WorkerOptions {
  std::string model;
  std::string listen = "0.0.0.0:50051";
  std::string advertise;
  std::string served_model_name;
  std::string metrics_listen;
  std::string log_format = "text";
  double drain_timeout_s = 30.0;
  auth::ServerTlsFiles tls;
  std::string role = "both";
  // Empty: "always" for a decode worker, else "auto".
  std::string kv_transfer;
  double kv_transfer_bandwidth = KvTransferOptions{}.assumed_bandwidth;
  double kv_transfer_timeout_s = 10.0;
  // Pipeline parallelism.
  int pp = 1;
  int pp_rank = -1;
  std::string pp_leader;
  std::string pp_layers;
  double pp_step_timeout_s = 60.0;
  std::string pp_hand_over = "device";
  EngineOptions engine;
};

/// A stage other than the leader: joins --pp-leader and runs its layers until SIGINT/SIGTERM,
/// serving grpc.health.v1 on --listen (SERVING while part of a formed group's stage).
int RunStage(const WorkerOptions& o, const LoadedModel& model, const sigset_t& stop_signals) {
  PipelineStageOptions options;
  options.leader = o.pp_leader;
  options.pp_size = o.pp;
  options.requested_rank = o.pp_rank;
  options.tensor_parallel.tp_size = o.engine.tensor_parallel_size;
  options.tensor_parallel.num_threads = o.engine.num_threads;
  if (o.engine.device != DeviceChoice::kCpu) {
    // Rank 0's device is opened now, so a missing GPU ends the process instead of each join.
    BackendOptions backend_options;
    backend_options.enable_graphs = o.engine.cuda_graphs;
    backend_options.keep_f32_weights = o.engine.keep_f32_weights;
    backend_options.fp8_weights = o.engine.fp8_weights;
    backend_options.simulator = o.engine.device == DeviceChoice::kCudaSim;
    absl::StatusOr<std::unique_ptr<Backend>> first =
        CreateBackend(o.engine.device, backend_options, nullptr);
    if (!first.ok()) {
      return ReportError("worker", absl::FailedPreconditionError(absl::StrCat(
                                       "--device ", std::string(DeviceChoiceName(o.engine.device)),
                                       ": ", first.status().message())));
    }
    // kAuto without a usable GPU came back as the CPU backend: CPU ranks then.
    if (!(*first)->host_memory()) {
      UseDeviceRanks(&options.tensor_parallel, backend_options, std::move(*first));
      options.device = backend_options.simulator ? "cuda-sim" : "cuda";
    }
  }
  if (o.tls.enabled()) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
        auth::MakePeerChannelCredentials(o.tls);
    if (!credentials.ok()) return ReportError("worker", credentials.status());
    options.credentials = *credentials;
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> server_credentials =
      auth::MakeServerCredentials(o.tls);
  if (!server_credentials.ok()) return ReportError("worker", server_credentials.status());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(o.listen, *server_credentials, &port);
  std::unique_ptr<grpc::Server> health_server = builder.BuildAndStart();
  if (health_server == nullptr || port == 0) {
    return ReportError("worker", absl::UnavailableError(absl::StrCat("cannot listen on '", o.listen,
                                                                     "' (address in use?)")));
  }
  grpc::HealthCheckServiceInterface* health = health_server->GetHealthCheckService();
  health->SetServingStatus("", false);
  PipelineStageRunner runner(model.weights.get(), options);
  runner.SetReadyCallback([health](bool ready) { health->SetServingStatus("", ready); });
  const size_t colon = o.listen.rfind(':');
  std::printf("kvserve pipeline stage listening on %s:%d (gRPC health only), joining %s\n",
              o.listen.substr(0, colon).c_str(), port, o.pp_leader.c_str());
  std::fflush(stdout);
  std::thread stopper([&] {
    int signal_number = 0;
    sigwait(&stop_signals, &signal_number);
    runner.Stop();
  });
  const absl::Status status = runner.Run();
  // Wakes the stopper if no signal came (the leader refused this stage).
  kill(getpid(), SIGTERM);
  stopper.join();
  health->Shutdown();
  health_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  if (!status.ok()) return ReportError("worker", status);
  logging::Log(logging::LogLevel::kInfo, "worker", "pipeline stage stopped",
               {{"steps", runner.stats().steps}, {"joins", runner.stats().joins}});
  return 0;
}

int RunWorker(const WorkerOptions& o) {
  // Block the stop signals before any thread exists, so every thread inherits the mask and the
  // main thread alone takes them with sigwait: no async signal handler touches the server.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  if (!(o.drain_timeout_s >= 0) || o.drain_timeout_s > 86400) {
    return ReportError("worker",
                       absl::InvalidArgumentError("--drain-timeout must be in [0, 86400] seconds"));
  }
  absl::StatusOr<logging::LogFormat> log_format = logging::ParseLogFormat(o.log_format);
  if (!log_format.ok()) return ReportError("worker", log_format.status());
  logging::SetLogFormat(*log_format);
  if (o.pp < 1 || o.pp > 256) {
    return ReportError(
        "worker", absl::InvalidArgumentError(absl::StrCat("--pp must be in [1, 256], got ", o.pp)));
  }
  if (o.pp == 1 && (!o.pp_leader.empty() || o.pp_rank != -1 || !o.pp_layers.empty())) {
    return ReportError("worker", absl::InvalidArgumentError(
                                     "--pp-leader, --pp-rank and --pp-layers need --pp > 1"));
  }
  if (o.pp_leader.empty() && o.pp_rank > 0) {
    return ReportError("worker", absl::InvalidArgumentError(absl::StrCat(
                                     "--pp-rank ", o.pp_rank,
                                     " is a stage other than the leader: it needs --pp-leader")));
  }
  if (!(o.pp_step_timeout_s > 0) || o.pp_step_timeout_s > 86400) {
    return ReportError(
        "worker", absl::InvalidArgumentError("--pp-step-timeout must be in (0, 86400] seconds"));
  }
  absl::StatusOr<LoadedModel> model = LoadModel(o.model);
  if (!model.ok()) return ReportError("worker", model.status());
  if (!o.pp_leader.empty()) return RunStage(o, *model, stop_signals);
  std::unique_ptr<PipelineGroup> group;
  EngineOptions engine_options = o.engine;
  if (o.pp > 1) {
    absl::StatusOr<std::vector<int>> counts = ParseStageLayerCounts(o.pp_layers);
    if (!counts.ok()) return ReportError("worker", counts.status());
    absl::StatusOr<std::vector<StageLayers>> stages =
        SplitLayers(model->config().num_layers, o.pp, *counts);
    if (!stages.ok()) return ReportError("worker", stages.status());
    PipelineGroupOptions group_options;
    group_options.stages = *stages;
    group_options.model_fingerprint = ModelWeightsFingerprint(*model->weights);
    group_options.hidden_size = model->config().hidden_size;
    group_options.vocab_size = model->config().vocab_size;
    group_options.step_timeout =
        absl::Milliseconds(static_cast<int64_t>(o.pp_step_timeout_s * 1000));
    absl::StatusOr<std::unique_ptr<PipelineGroup>> created =
        PipelineGroup::Create(std::move(group_options));
    if (!created.ok()) return ReportError("worker", created.status());
    group = std::move(*created);
    engine_options.pipeline = group.get();
    engine_options.pipeline_device_hand_over = o.pp_hand_over == "device";
    logging::Log(logging::LogLevel::kInfo, "worker", "pipeline leader: waiting for stages",
                 {{"stages", o.pp}, {"layers", DescribeStageLayers(*stages)}});
  }
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(&*model, engine_options);
  if (!engine.ok()) return ReportError("worker", engine.status());

  WorkerServerOptions server_options;
  server_options.model_name =
      o.served_model_name.empty() ? DefaultModelName(o.model) : o.served_model_name;
  server_options.advertise = o.advertise;
  server_options.metrics_listen = o.metrics_listen;
  server_options.tls = o.tls;
  server_options.role = o.role;
  server_options.pipeline = group.get();
  if (group != nullptr &&
      (o.role != "both" || (!o.kv_transfer.empty() && o.kv_transfer != "never"))) {
    return ReportError(
        "worker", absl::InvalidArgumentError("a pipeline group cannot take part in KV transfer or "
                                             "disaggregated serving yet (--role, --kv-transfer)"));
  }
  absl::StatusOr<KvTransferMode> transfer_mode =
      ParseKvTransferMode(!o.kv_transfer.empty() ? o.kv_transfer
                          : group != nullptr     ? "never"
                          : o.role == "decode"   ? "always"
                                                 : "auto");
  if (!transfer_mode.ok()) return ReportError("worker", transfer_mode.status());
  if (!(o.kv_transfer_bandwidth > 0)) {
    return ReportError(
        "worker", absl::InvalidArgumentError("--kv-transfer-bandwidth must be positive (bytes/s)"));
  }
  if (!(o.kv_transfer_timeout_s > 0) || o.kv_transfer_timeout_s > 3600) {
    return ReportError(
        "worker", absl::InvalidArgumentError("--kv-transfer-timeout must be in (0, 3600] seconds"));
  }
  server_options.kv_transfer.mode = *transfer_mode;
  server_options.kv_transfer.assumed_bandwidth = o.kv_transfer_bandwidth;
  server_options.kv_transfer.timeout =
      std::chrono::milliseconds(static_cast<int64_t>(o.kv_transfer_timeout_s * 1000));
  WorkerServer server(&*model, engine->get(), server_options);
  absl::StatusOr<int> port = server.Start(o.listen);
  if (!port.ok()) return ReportError("worker", port.status());

  const size_t colon = o.listen.rfind(':');
  const std::string host = colon == std::string::npos ? o.listen : o.listen.substr(0, colon);
  if (server.metrics_port() != 0) {
    const size_t mcolon = o.metrics_listen.rfind(':');
    std::printf("kvserve worker metrics on %s:%d\n", o.metrics_listen.substr(0, mcolon).c_str(),
                server.metrics_port());
  }
  std::printf("kvserve worker listening on %s:%d\n", host.c_str(), *port);
  std::fflush(stdout);
  logging::Log(logging::LogLevel::kInfo, "worker", "serving",
               {{"listen", absl::StrCat(host, ":", *port)},
                {"model", server_options.model_name},
                {"metrics_port", server.metrics_port()}});

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  logging::Log(logging::LogLevel::kInfo, "worker", "signal received, draining",
               {{"signal", signal_number == SIGINT ? "SIGINT" : "SIGTERM"},
                {"drain_timeout_s", o.drain_timeout_s}});
  // Stop admitting work (health goes NOT_SERVING, Submit answers UNAVAILABLE "draining", which
  // the router reacts to at once), let running requests finish within the drain timeout, then
  // cancel what is left.
  server.Drain();
  const auto start = std::chrono::steady_clock::now();
  const absl::Time deadline = absl::Now() + absl::Seconds(o.drain_timeout_s);
  // Connections stay open until every stream's last bytes reached its client: closing them
  // earlier can reset a connection while the end of a finished stream is still unsent.
  if (!server.AwaitDrained(deadline)) {
    logging::Log(logging::LogLevel::kWarning, "worker",
                 "drain timeout reached before every stream ended and reached its client",
                 {{"open_generate_streams", server.stats().open_generate_streams}});
  }
  server.Shutdown(std::chrono::milliseconds(
      std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()))));
  logging::Log(logging::LogLevel::kInfo, "worker", "drained, exiting",
               {{"drain_seconds", std::chrono::duration<double>(
                                      std::chrono::steady_clock::now() - start)
                                      .count()}});
  return 0;
}

}  // namespace

Command AddWorkerCommand(CLI::App& app) {
  auto o = std::make_shared<WorkerOptions>();
  CLI::App* sub = app.add_subcommand(
      "worker",
      "Serve a model over gRPC (kvserve.v1.Inference and kvserve.v1.Worker) until "
      "SIGINT or SIGTERM.");
  sub->add_option("--model", o->model, "GGUF file or Hugging Face model directory")->required();
  sub->add_option("--listen", o->listen, "HOST:PORT to listen on; port 0 picks a free one")
      ->capture_default_str();
  sub->add_option("--advertise", o->advertise,
                  "How clients and the router reach this worker, reported in every response "
                  "(default: the listen address with the bound port)");
  sub->add_option("--served-model-name", o->served_model_name,
                  "Model name for ListModels and requests (default: the model file's name "
                  "without extension)");
  sub->add_option("--drain-timeout", o->drain_timeout_s,
                  "On SIGINT/SIGTERM, seconds running requests may take to finish before they "
                  "are cancelled and the worker exits")
      ->capture_default_str();
  sub->add_option("--metrics-listen", o->metrics_listen,
                  "HOST:PORT serving Prometheus /metrics (port 0 picks one); empty: off");
  sub->add_option("--tls-cert", o->tls.cert_path,
                  "PEM certificate chain of the gRPC port (enables TLS)");
  sub->add_option("--tls-key", o->tls.key_path, "PEM private key of --tls-cert");
  sub->add_option("--tls-client-ca", o->tls.client_ca_path,
                  "PEM CA: callers (the router) must present a certificate it signed");
  sub->add_option("--kv-transfer", o->kv_transfer,
                  "Pull a prompt's cached KV blocks from the worker the router names instead "
                  "of computing them: 'auto' when the measured link beats the measured prefill, "
                  "'always', or 'never' (default: always with --role decode, else auto)")
      ->check(CLI::IsMember({"auto", "always", "never"}));
  sub->add_option("--role", o->role,
                  "Part in disaggregated serving, reported to the router: 'prefill' (the router "
                  "sends it prompts to compute, whose KV blocks decode workers pull), 'decode' "
                  "(streams tokens after pulling the prompt's blocks), or 'both'")
      ->check(CLI::IsMember({"prefill", "decode", "both"}))
      ->capture_default_str();
  sub->add_option("--kv-transfer-bandwidth", o->kv_transfer_bandwidth,
                  "Bytes per second assumed for a peer until a pull from it is measured")
      ->capture_default_str();
  sub->add_option("--kv-transfer-timeout", o->kv_transfer_timeout_s,
                  "Seconds a pull may take; blocks not received by then are computed")
      ->capture_default_str();
  sub->add_option("--pp", o->pp,
                  "Pipeline stages of the model group: each stage is a worker process holding a "
                  "contiguous slice of the layers (the leader, without --pp-leader, is stage 0)")
      ->capture_default_str();
  sub->add_option("--pp-leader", o->pp_leader,
                  "HOST:PORT of the group's leader: this process is a stage other than the "
                  "leader, joins it and serves only gRPC health on --listen");
  sub->add_option("--pp-rank", o->pp_rank,
                  "The stage this process wants (1..pp-1); default: any free one");
  sub->add_option("--pp-layers", o->pp_layers,
                  "Leader: layers per stage, e.g. 31,30 (default: as even as possible, earlier "
                  "stages taking the extra ones)");
  sub->add_option("--pp-step-timeout", o->pp_step_timeout_s,
                  "Leader: seconds a stage may take to answer a step before it is dropped and "
                  "the group's requests fail with UNAVAILABLE")
      ->capture_default_str();
  sub->add_option("--pp-hand-over", o->pp_hand_over,
                  "Leader on CUDA: 'device' sends activations between the stages' GPUs over "
                  "NCCL; 'host' relays them through the leader over gRPC (CPU stages always do)")
      ->check(CLI::IsMember({"device", "host"}))
      ->capture_default_str();
  sub->add_option("--log-format", o->log_format, "Log lines as 'text' or 'json'")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  AddEngineFlags(sub, &o->engine);
  return {sub, [o] { return RunWorker(*o); }};
}

}  // namespace kvserve::cli
