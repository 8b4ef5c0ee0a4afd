// `kvserve worker`: load a model and serve it over gRPC (kvserve.v1.Inference and
// kvserve.v1.Worker, grpc.health.v1, reflection) until SIGINT or SIGTERM.

#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/cli/command.h"
#include "client/cli/engine_flags.h"
#include "worker/engine/engine.h"
#include "worker/model/loaded_model.h"
#include "worker/server/worker_server.h"

namespace kvserve::cli {
namespace {

struct WorkerOptions {
  std::string model;
  std::string listen = "0.0.0.0:50051";
  std::string advertise;
  std::string served_model_name;
  int64_t shutdown_grace_ms = 5000;
  EngineOptions engine;
};

int RunWorker(const WorkerOptions& o) {
  // Block the stop signals before any thread exists, so every thread inherits the mask and the
  // main thread alone takes them with sigwait: no async signal handler touches the server.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  if (o.shutdown_grace_ms < 0) {
    return ReportError("worker", absl::InvalidArgumentError("--shutdown-grace-ms must be >= 0"));
  }
  absl::StatusOr<LoadedModel> model = LoadModel(o.model);
  if (!model.ok()) return ReportError("worker", model.status());
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(&*model, o.engine);
  if (!engine.ok()) return ReportError("worker", engine.status());

  WorkerServerOptions server_options;
  server_options.model_name =
      o.served_model_name.empty() ? DefaultModelName(o.model) : o.served_model_name;
  server_options.advertise = o.advertise;
  WorkerServer server(&*model, engine->get(), server_options);
  absl::StatusOr<int> port = server.Start(o.listen);
  if (!port.ok()) return ReportError("worker", port.status());

  const size_t colon = o.listen.rfind(':');
  const std::string host = colon == std::string::npos ? o.listen : o.listen.substr(0, colon);
  std::printf("kvserve worker listening on %s:%d\n", host.c_str(), *port);
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  std::fprintf(stderr, "kvserve worker: %s, shutting down\n", strsignal(signal_number));
  // Stop admitting work, give running requests the grace period, then cancel what is left.
  server.Drain();
  server.Shutdown(std::chrono::milliseconds(o.shutdown_grace_ms));
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
  sub->add_option("--shutdown-grace-ms", o->shutdown_grace_ms,
                  "On SIGINT/SIGTERM, how long running requests may finish before they are "
                  "cancelled")
      ->capture_default_str();
  AddEngineFlags(sub, &o->engine);
  return {sub, [o] { return RunWorker(*o); }};
}

}  // namespace kvserve::cli
