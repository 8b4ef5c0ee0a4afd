// `kvserve router`: the KV-aware router in front of a set of workers.

#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/cli/command.h"
#include "common/logging/logging.h"
#include "router/dispatcher.h"
#include "router/http/http_server.h"
#include "router/router_server.h"
#include "router/routing_policy.h"
#include "router/worker_pool.h"

namespace kvserve::cli {
namespace {

struct RouterFlags {
  std::string listen = "0.0.0.0:8000";
  std::string workers;
  std::string workers_dns;
  std::string model;
  std::string model_name;
  std::string policy = std::string(kDefaultRoutingPolicy);
  int block_size = 16;
  int max_inflight_per_worker = 64;
  int max_queue = 256;
  double load_weight = KvAwareConfig{}.load_weight;
  double kv_transfer_weight = KvAwareConfig{}.transfer_weight;
  int balance_threshold = KvAwareConfig{}.balance_threshold;
  std::string disaggregation = "auto";
  int disaggregation_min_tokens = DispatcherOptions{}.disaggregation_min_tokens;
  int probe_interval_ms = 1000;
  int probe_timeout_ms = 500;
  int failure_threshold = 2;
  int dns_interval_ms = 5000;
  std::string metrics_listen;
  std::string http_listen;
  int http_threads = HttpServerOptions{}.threads;
  int http_max_queued_connections = HttpServerOptions{}.max_queued_connections;
  int http_listen_backlog = HttpServerOptions{}.listen_backlog;
  std::string log_format = "text";
  auth::ServerTlsFiles tls;
  auth::ChannelTlsFiles worker_tls;
  std::string api_keys;
  bool no_tenant_cache_isolation = false;
};

absl::StatusOr<RouterOptions> ToOptions(const RouterFlags& flags) {
  RouterOptions options;
  options.listen = flags.listen;
  options.model_path = flags.model;
  options.model_name = flags.model_name;
  options.policy = flags.policy;
  options.policy_config.kv_aware.load_weight = flags.load_weight;
  options.policy_config.kv_aware.transfer_weight = flags.kv_transfer_weight;
  options.policy_config.kv_aware.balance_threshold = flags.balance_threshold;
  options.dispatch.block_size = flags.block_size;
  options.dispatch.max_inflight_per_worker = flags.max_inflight_per_worker;
  options.dispatch.max_queue = flags.max_queue;
  absl::StatusOr<DisaggregationMode> disaggregation = ParseDisaggregationMode(flags.disaggregation);
  if (!disaggregation.ok()) return disaggregation.status();
  options.dispatch.disaggregation = *disaggregation;
  if (flags.disaggregation_min_tokens < 0) {
    return absl::InvalidArgumentError("--disaggregation-min-tokens must be >= 0");
  }
  options.dispatch.disaggregation_min_tokens = flags.disaggregation_min_tokens;
  if (!flags.workers.empty()) {
    absl::StatusOr<std::vector<std::string>> workers = ParseWorkerList(flags.workers, "workers");
    if (!workers.ok()) return workers.status();
    options.pool.static_workers = *std::move(workers);
  }
  options.pool.dns_target = flags.workers_dns;
  if (flags.probe_interval_ms <= 0 || flags.probe_timeout_ms <= 0 || flags.dns_interval_ms <= 0) {
    return absl::InvalidArgumentError(
        "probe-interval-ms/probe-timeout-ms/dns-interval-ms: must be positive");
  }
  options.pool.probe_interval = absl::Milliseconds(flags.probe_interval_ms);
  options.pool.probe_timeout = absl::Milliseconds(flags.probe_timeout_ms);
  options.pool.dns_interval = absl::Milliseconds(flags.dns_interval_ms);
  options.pool.failure_threshold = flags.failure_threshold;
  options.metrics_listen = flags.metrics_listen;
  options.tls = flags.tls;
  options.worker_tls = flags.worker_tls;
  options.api_keys_path = flags.api_keys;
  options.tenant_cache_isolation = !flags.no_tenant_cache_isolation;
  return options;
}

int RunRouter(const RouterFlags& flags) {
  absl::StatusOr<RouterOptions> options = ToOptions(flags);
  if (!options.ok()) return ReportError("router", options.status());
  absl::StatusOr<logging::LogFormat> log_format = logging::ParseLogFormat(flags.log_format);
  if (!log_format.ok()) return ReportError("router", log_format.status());
  logging::SetLogFormat(*log_format);
  // Block SIGINT/SIGTERM before any thread starts (threads inherit the mask), then wait for
  // them here: shutdown runs on the main thread, not in a signal handler.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<std::unique_ptr<RouterServer>> router = RouterServer::Start(*options);
  if (!router.ok()) return ReportError("router", router.status());
  const size_t colon = flags.listen.rfind(':');
  const std::string host =
      colon == std::string::npos ? flags.listen : flags.listen.substr(0, colon);
  if ((*router)->metrics_port() != 0) {
    const size_t mcolon = flags.metrics_listen.rfind(':');
    std::printf("kvserve router metrics on %s:%d\n",
                flags.metrics_listen.substr(0, mcolon).c_str(), (*router)->metrics_port());
  }
  std::printf("kvserve router listening on %s:%d\n", host.c_str(), (*router)->port());
  std::fflush(stdout);
  logging::Log(logging::LogLevel::kInfo, "router", "serving",
               {{"listen", absl::StrCat(host, ":", (*router)->port())},
                {"policy", flags.policy},
                {"metrics_port", (*router)->metrics_port()}});

  std::unique_ptr<HttpServer> http;
  if (!flags.http_listen.empty()) {
    HttpServerOptions http_options;
    http_options.listen = flags.http_listen;
    http_options.threads = flags.http_threads;
    http_options.max_queued_connections = flags.http_max_queued_connections;
    http_options.listen_backlog = flags.http_listen_backlog;
    HttpServerDeps deps;
    deps.channel = (*router)->InProcessChannel();
    deps.tokenizer = &(*router)->tokenizer();
    deps.model_name = (*router)->model_name();
    deps.ready = [r = router->get()] {
      for (const auto& worker : r->pool().Workers()) {
        if (worker->routable()) return true;
      }
      return false;
    };
    absl::StatusOr<std::unique_ptr<HttpServer>> started =
        HttpServer::Start(http_options, std::move(deps));
    if (!started.ok()) return ReportError("router", started.status());
    http = *std::move(started);
    if (!http->chat_template_status().ok()) {
      std::fprintf(stderr, "kvserve router: chat completions disabled: %s\n",
                   std::string(http->chat_template_status().message()).c_str());
    }
    const size_t http_colon = flags.http_listen.rfind(':');
    std::printf("kvserve router HTTP (OpenAI API) on %s:%d\n",
                flags.http_listen.substr(0, http_colon).c_str(), http->port());
    std::fflush(stdout);
  }

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  logging::Log(logging::LogLevel::kInfo, "router", "signal received, shutting down",
               {{"signal", signal_number == SIGINT ? "SIGINT" : "SIGTERM"}});
  if (http != nullptr) http->Shutdown(absl::Seconds(5));
  (*router)->Shutdown(absl::Seconds(5));
  return 0;
}

}  // namespace

Command AddRouterCommand(CLI::App& app) {
  auto flags = std::make_shared<RouterFlags>();
  CLI::App* sub = app.add_subcommand(
      "router", "Serve kvserve.v1.Inference, routing each request to a worker by policy.");
  sub->add_option("--listen", flags->listen, "HOST:PORT to serve on (port 0 picks one)")
      ->capture_default_str();
  auto* workers = sub->add_option("--workers", flags->workers, "Worker addresses: A,B,...");
  auto* dns = sub->add_option("--workers-dns", flags->workers_dns,
                              "NAME:PORT re-resolved periodically (Kubernetes headless service)");
  workers->excludes(dns);
  dns->excludes(workers);
  sub->add_option("--model", flags->model,
                  "The workers' model (GGUF file or model directory): its tokenizer is used")
      ->required();
  sub->add_option("--model-name", flags->model_name,
                  "Name reported by ListModels (default: the model file or directory name)");
  sub->add_option("--policy", flags->policy, "round_robin, least_loaded or kv_aware")
      ->capture_default_str();
  sub->add_option("--block-size", flags->block_size, "KV block size in tokens (as the workers)")
      ->capture_default_str();
  sub->add_option("--max-inflight-per-worker", flags->max_inflight_per_worker,
                  "Requests in flight per worker before queueing")
      ->capture_default_str();
  sub->add_option("--max-queue", flags->max_queue,
                  "Requests queued when all workers are full; beyond: RESOURCE_EXHAUSTED")
      ->capture_default_str();
  sub->add_option("--load-weight", flags->load_weight,
                  "kv_aware: cost of relative load against prefix reuse")
      ->capture_default_str();
  sub->add_option("--kv-transfer-weight", flags->kv_transfer_weight,
                  "kv_aware: worth of a prefix block another worker holds (and this one would "
                  "pull) against one on this worker's device, in [0, 1]; 0 disables transfer "
                  "hints")
      ->capture_default_str();
  sub->add_option("--balance-threshold", flags->balance_threshold,
                  "kv_aware: load gap (requests) above which the least loaded worker is used; "
                  "negative disables")
      ->capture_default_str();
  sub->add_option("--disaggregation", flags->disaggregation,
                  "auto: workers started with --role prefill compute prompts, whose KV blocks "
                  "the decode worker serving the request pulls; off: every worker serves whole "
                  "requests, whatever its role")
      ->check(CLI::IsMember({"auto", "off"}))
      ->capture_default_str();
  sub->add_option("--disaggregation-min-tokens", flags->disaggregation_min_tokens,
                  "Prompts whose part the decode worker lacks is shorter than this are computed "
                  "by the decode worker (no prefill phase)")
      ->capture_default_str();
  sub->add_option("--probe-interval-ms", flags->probe_interval_ms, "Health and load probe period")
      ->capture_default_str();
  sub->add_option("--probe-timeout-ms", flags->probe_timeout_ms, "Deadline of each probe")
      ->capture_default_str();
  sub->add_option("--failure-threshold", flags->failure_threshold,
                  "Consecutive failed probes that eject a worker")
      ->capture_default_str();
  sub->add_option("--dns-interval-ms", flags->dns_interval_ms, "DNS re-resolution period")
      ->capture_default_str();
  sub->add_option("--http-listen", flags->http_listen,
                  "HOST:PORT serving the OpenAI-compatible HTTP API (port 0 picks one); empty: off");
  sub->add_option("--http-threads", flags->http_threads,
                  "HTTP connections served at once (a streaming response holds one)")
      ->capture_default_str();
  sub->add_option("--http-max-queued-connections", flags->http_max_queued_connections,
                  "HTTP connections waiting for a thread; beyond: 503 with Retry-After")
      ->capture_default_str();
  sub->add_option("--http-listen-backlog", flags->http_listen_backlog,
                  "Listen backlog of the HTTP port (capped by net.core.somaxconn)")
      ->capture_default_str();
  sub->add_option("--metrics-listen", flags->metrics_listen,
                  "HOST:PORT serving Prometheus /metrics (port 0 picks one); empty: off");
  sub->add_option("--tls-cert", flags->tls.cert_path,
                  "PEM certificate chain of the client-facing gRPC port (enables TLS)");
  sub->add_option("--tls-key", flags->tls.key_path, "PEM private key of --tls-cert");
  sub->add_option("--tls-client-ca", flags->tls.client_ca_path,
                  "PEM CA: clients must present a certificate it signed (mutual TLS)");
  sub->add_option("--worker-ca", flags->worker_tls.ca_path,
                  "PEM CA that signed the workers' certificates (enables TLS to workers)");
  sub->add_option("--worker-tls-cert", flags->worker_tls.cert_path,
                  "PEM client certificate presented to workers (mutual TLS)");
  sub->add_option("--worker-tls-key", flags->worker_tls.key_path,
                  "PEM private key of --worker-tls-cert");
  sub->add_option("--worker-tls-server-name", flags->worker_tls.server_name,
                  "Name the workers' certificates are checked against (default: each address)");
  sub->add_option("--api-keys", flags->api_keys,
                  "API key file: one '<key> [<tenant> [<max_concurrent>]]' per line; callers "
                  "must send 'authorization: Bearer <key>' (see docs/reliability.md)");
  sub->add_flag("--no-tenant-cache-isolation", flags->no_tenant_cache_isolation,
                "With --api-keys, let different tenants share prefix-cache blocks (by default "
                "each tenant's requests get their own cache salt)");
  sub->add_option("--log-format", flags->log_format, "Log lines as 'text' or 'json'")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  return {sub, [flags] {
            if (flags->workers.empty() == flags->workers_dns.empty()) {
              return ReportError("router",
                                 absl::InvalidArgumentError(
                                     "workers: give exactly one of --workers and --workers-dns"));
            }
            return RunRouter(*flags);
          }};
}

}  // namespace kvserve::cli
