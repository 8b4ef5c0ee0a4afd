// `kvserve up`: a local cluster — one router and N worker processes on 127.0.0.1 — in the
// foreground, stopped with Ctrl-C or SIGTERM.

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/child_process.h"
#include "client/cli/command.h"

namespace kvserve::cli {
namespace {

namespace fs = std::filesystem;

struct UpOptions {
  std::string model;
  int workers = 2;
  std::string listen = "127.0.0.1:50051";
  std::string policy = "kv_aware";
  int threads_per_worker = 1;
  int startup_timeout_s = 120;
  std::string api_keys;
  std::string tls_cert;
  std::string tls_key;
  std::string http_listen;     // the router's OpenAI-compatible HTTP front; empty: off
  std::string metrics_listen;  // the router's Prometheus /metrics; empty: off
};

// The default model: ../shared/models/stories260K beside the checkout, found from the working
// directory or from the binary (build/kvserve).
std::string DefaultModel(const fs::path& exe) {
  const fs::path rel = fs::path("shared") / "models" / "stories260K";
  for (const fs::path& base : {fs::current_path() / "..", exe.parent_path() / ".." / "..",
                               exe.parent_path() / ".."}) {
    std::error_code ec;
    if (fs::exists(base / rel, ec)) return fs::weakly_canonical(base / rel, ec).string();
  }
  return "../shared/models/stories260K";
}

// A directory without config.json but with exactly one .gguf file means that file.
std::string ResolveModelPath(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec) || fs::exists(fs::path(path) / "config.json", ec)) return path;
  std::vector<fs::path> ggufs;
  for (const auto& entry : fs::directory_iterator(path, ec)) {
    if (entry.path().extension() == ".gguf") ggufs.push_back(entry.path());
  }
  return ggufs.size() == 1 ? ggufs[0].string() : path;
}

int RunUp(const UpOptions& opts) {
  const fs::path exe = fs::read_symlink("/proc/self/exe");
  const std::string model = ResolveModelPath(opts.model.empty() ? DefaultModel(exe) : opts.model);
  if (opts.workers < 1) {
    return ReportError("up", absl::InvalidArgumentError("--workers must be at least 1"));
  }
  // Signals are taken synchronously below; children get the default mask back.
  sigset_t waited;
  sigemptyset(&waited);
  sigaddset(&waited, SIGINT);
  sigaddset(&waited, SIGTERM);
  sigaddset(&waited, SIGCHLD);
  sigprocmask(SIG_BLOCK, &waited, nullptr);

  const auto timeout = std::chrono::seconds(opts.startup_timeout_s);
  std::vector<ChildProcess> workers;
  std::vector<std::string> addresses;
  for (int i = 0; i < opts.workers; ++i) {
    absl::StatusOr<ChildProcess> worker = ChildProcess::Spawn(
        {exe.string(), "worker", "--model", model, "--listen", "127.0.0.1:0", "--threads",
         std::to_string(opts.threads_per_worker)});
    if (!worker.ok()) return ReportError("up", worker.status());
    absl::StatusOr<std::string> address = worker->WaitForLine("kvserve worker listening on ", timeout);
    if (!address.ok()) return ReportError("up", address.status());
    addresses.push_back(*address);
    workers.push_back(std::move(*worker));
  }
  std::vector<std::string> router_argv = {
      exe.string(), "router", "--listen", opts.listen, "--workers", absl::StrJoin(addresses, ","),
      "--model", model, "--policy", opts.policy};
  if (!opts.api_keys.empty()) router_argv.insert(router_argv.end(), {"--api-keys", opts.api_keys});
  if (!opts.tls_cert.empty()) router_argv.insert(router_argv.end(), {"--tls-cert", opts.tls_cert});
  if (!opts.tls_key.empty()) router_argv.insert(router_argv.end(), {"--tls-key", opts.tls_key});
  if (!opts.http_listen.empty()) {
    router_argv.insert(router_argv.end(), {"--http-listen", opts.http_listen});
  }
  if (!opts.metrics_listen.empty()) {
    router_argv.insert(router_argv.end(), {"--metrics-listen", opts.metrics_listen});
  }
  absl::StatusOr<ChildProcess> router = ChildProcess::Spawn(router_argv);
  if (!router.ok()) return ReportError("up", router.status());
  // The router prints its metrics address, then its gRPC address, then its HTTP address.
  absl::StatusOr<std::string> metrics;
  if (!opts.metrics_listen.empty()) {
    metrics = router->WaitForLine("kvserve router metrics on ", timeout);
    if (!metrics.ok()) return ReportError("up", metrics.status());
  }
  absl::StatusOr<std::string> endpoint = router->WaitForLine("kvserve router listening on ", timeout);
  if (!endpoint.ok()) return ReportError("up", endpoint.status());
  absl::StatusOr<std::string> http;
  if (!opts.http_listen.empty()) {
    http = router->WaitForLine("kvserve router HTTP (OpenAI API) on ", timeout);
    if (!http.ok()) return ReportError("up", http.status());
  }
  std::printf("kvserve up: model %s\n", model.c_str());
  std::printf("kvserve up: workers %s\n", absl::StrJoin(addresses, ", ").c_str());
  if (!opts.http_listen.empty()) {
    std::printf(
        "kvserve up: OpenAI API on http://%s/v1 (try: curl -s http://%s/v1/completions "
        "-d '{\"prompt\": \"Once upon a time\", \"max_tokens\": 20}')\n",
        http->c_str(), http->c_str());
  }
  if (!opts.metrics_listen.empty()) {
    std::printf("kvserve up: Prometheus metrics on http://%s/metrics\n", metrics->c_str());
  }
  std::printf("kvserve up: serving on %s (Ctrl-C stops the cluster)\n", endpoint->c_str());
  std::fflush(stdout);

  int exit_code = 0;
  while (true) {
    int sig = 0;
    sigwait(&waited, &sig);
    if (sig != SIGCHLD) break;
    int status = 0;
    bool died = router->Exited(&status);
    for (ChildProcess& w : workers) died = w.Exited(&status) || died;
    if (died) {
      std::fprintf(stderr, "kvserve up: a cluster process exited (status %d); stopping\n", status);
      exit_code = 1;
      break;
    }
  }
  router->Stop(std::chrono::seconds(10));
  for (ChildProcess& w : workers) w.Stop(std::chrono::seconds(10));
  return exit_code;
}

}  // namespace

Command AddUpCommand(CLI::App& app) {
  auto o = std::make_shared<UpOptions>();
  CLI::App* sub = app.add_subcommand(
      "up", "Run a local cluster: a router and N workers on 127.0.0.1, until Ctrl-C/SIGTERM.");
  sub->add_option("--model", o->model,
                  "GGUF file or model directory (default ../shared/models/stories260K)");
  sub->add_option("--workers", o->workers, "Worker processes")->capture_default_str();
  sub->add_option("--listen", o->listen, "Router address")->capture_default_str();
  sub->add_option("--policy", o->policy, "Routing policy: kv_aware, least_loaded, round_robin")
      ->capture_default_str();
  sub->add_option("--threads-per-worker", o->threads_per_worker, "Compute threads per worker")
      ->capture_default_str();
  sub->add_option("--startup-timeout", o->startup_timeout_s,
                  "Seconds to wait for each process to come up")
      ->capture_default_str();
  sub->add_option("--api-keys", o->api_keys, "The router's API key file (see kvserve router)");
  sub->add_option("--tls-cert", o->tls_cert, "PEM certificate of the router's port (TLS)");
  sub->add_option("--tls-key", o->tls_key, "PEM private key of --tls-cert");
  sub->add_option("--http-listen", o->http_listen,
                  "HOST:PORT of the router's OpenAI-compatible HTTP API (default: off)");
  sub->add_option("--metrics-listen", o->metrics_listen,
                  "HOST:PORT of the router's Prometheus /metrics (default: off)");
  return {sub, [o] { return RunUp(*o); }};
}

}  // namespace kvserve::cli
