// Operability end to end: /metrics of a real worker and router after a run, SIGTERM draining a
// real worker during 16 streams, the router leaving a draining worker at once, and one request
// id in both the router's and the worker's log lines.

#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/cli/child_process.h"
#include "client/sdk/client.h"
#include "common/logging/logging.h"
#include "common/metrics/exposition.h"
#include "gtest/gtest.h"
#include "router/router_server.h"
#include "tests/common/metrics/scrape.h"
#include "worker/engine/engine.h"
#include "worker/model/loaded_model.h"
#include "worker/server/worker_server.h"

namespace kvserve {
namespace {

using cli::ChildProcess;
using metrics::FindSample;
using metrics::Sample;
using metrics::SumSamples;
using std::chrono::seconds;

const char kModel[] = KVSERVE_SHARED_DIR "/models/stories260K/stories260K.gguf";

// The port of "HOST:PORT".
int PortOf(const std::string& address) {
  int port = 0;
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) return 0;
  return port;
}

std::vector<TokenId> Prompt(TokenId first, int length) {
  std::vector<TokenId> ids;
  for (int i = 0; i < length; ++i) ids.push_back(static_cast<TokenId>(first + (i * 7) % 200));
  return ids;
}

GenerateParams Greedy(std::vector<TokenId> prompt, uint32_t max_tokens) {
  GenerateParams p;
  p.prompt_token_ids = std::move(prompt);
  p.max_tokens = max_tokens;
  p.sampling.temperature = 0.0f;
  p.ignore_eos = true;
  return p;
}

std::unique_ptr<Client> Connect(const std::string& address) {
  ClientOptions options;
  options.default_deadline = absl::Seconds(60);
  options.connect_timeout = absl::Seconds(10);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(address, options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

TEST(OperabilityTest, WorkerAndRouterMetricsAfterARun) {
  absl::StatusOr<ChildProcess> worker = ChildProcess::Spawn(
      {KVSERVE_BINARY, "worker", "--model", kModel, "--listen", "127.0.0.1:0", "--threads", "1",
       "--num-kv-blocks", "512", "--metrics-listen", "127.0.0.1:0", "--log-format", "json"});
  ASSERT_TRUE(worker.ok()) << worker.status();
  absl::StatusOr<std::string> worker_metrics =
      worker->WaitForLine("kvserve worker metrics on ", seconds(60));
  ASSERT_TRUE(worker_metrics.ok()) << worker_metrics.status();
  absl::StatusOr<std::string> worker_address =
      worker->WaitForLine("kvserve worker listening on ", seconds(60));
  ASSERT_TRUE(worker_address.ok()) << worker_address.status();
  absl::StatusOr<ChildProcess> router = ChildProcess::Spawn(
      {KVSERVE_BINARY, "router", "--listen", "127.0.0.1:0", "--workers", *worker_address,
       "--model", kModel, "--policy", "kv_aware", "--metrics-listen", "127.0.0.1:0"});
  ASSERT_TRUE(router.ok()) << router.status();
  absl::StatusOr<std::string> router_metrics =
      router->WaitForLine("kvserve router metrics on ", seconds(60));
  ASSERT_TRUE(router_metrics.ok()) << router_metrics.status();
  absl::StatusOr<std::string> router_address =
      router->WaitForLine("kvserve router listening on ", seconds(60));
  ASSERT_TRUE(router_address.ok()) << router_address.status();

  std::unique_ptr<Client> client = Connect(*router_address);
  ASSERT_NE(client, nullptr);
  // P twice (the second finds P's two full blocks cached), then an unrelated Q.
  const std::vector<TokenId> p = Prompt(5, 40);
  const std::vector<TokenId> q = Prompt(300, 20);
  for (const auto& prompt : {p, p, q}) {
    absl::StatusOr<Completion> c = client->GenerateSync(Greedy(prompt, 8));
    ASSERT_TRUE(c.ok()) << c.status();
  }

  absl::StatusOr<std::vector<Sample>> w = testing::Scrape(PortOf(*worker_metrics));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(FindSample(*w, "kvserve_worker_time_to_first_token_seconds_count"), 3);
  EXPECT_EQ(FindSample(*w, "kvserve_worker_e2e_request_latency_seconds_count"), 3);
  EXPECT_EQ(FindSample(*w, "kvserve_worker_request_queue_time_seconds_count"), 3);
  EXPECT_EQ(FindSample(*w, "kvserve_worker_request_prefill_time_seconds_count"), 3);
  EXPECT_EQ(FindSample(*w, "kvserve_worker_request_decode_time_seconds_count"), 3);
  EXPECT_EQ(FindSample(*w, "kvserve_worker_inter_token_latency_seconds_count"), 3 * 7);
  EXPECT_EQ(FindSample(*w, "kvserve_worker_requests_finished_total", {{"finish_reason", "length"}}),
            3);
  EXPECT_EQ(SumSamples(*w, "kvserve_worker_requests_finished_total"), 3);
  EXPECT_EQ(FindSample(*w, "kvserve_worker_generation_tokens_total"), 24);
  EXPECT_EQ(FindSample(*w, "kvserve_worker_prompt_tokens_total"), 40 + 40 + 20);
  EXPECT_GE(*FindSample(*w, "kvserve_worker_prefix_cache_hits_tokens_total"), 32);
  EXPECT_GE(*FindSample(*w, "kvserve_worker_prefix_cache_queries_tokens_total"), 100);
  EXPECT_EQ(FindSample(*w, "kvserve_worker_requests_running"), 0);
  EXPECT_EQ(FindSample(*w, "kvserve_worker_requests_waiting"), 0);
  EXPECT_EQ(FindSample(*w, "kvserve_worker_kv_cache_used_blocks"), 0);
  EXPECT_EQ(FindSample(*w, "kvserve_worker_kv_cache_usage_ratio"), 0);
  EXPECT_GT(*FindSample(*w, "kvserve_worker_kv_cache_cached_free_blocks"), 0);
  EXPECT_EQ(FindSample(*w, "kvserve_worker_cache_config_info",
                       {{"block_size", "16"}, {"kv_cache_dtype", "f32"}, {"num_blocks", "512"}}),
            1);
  EXPECT_GT(*FindSample(*w, "kvserve_worker_engine_step_tokens_count"), 0);
  EXPECT_EQ(FindSample(*w, "kvserve_worker_preemptions_total"), 0);
  EXPECT_EQ(FindSample(*w, "kvserve_worker_draining"), 0);

  absl::StatusOr<std::vector<Sample>> r = testing::Scrape(PortOf(*router_metrics));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(SumSamples(*r, "kvserve_router_routing_decisions_total", {{"policy", "kv_aware"}}), 3);
  EXPECT_EQ(FindSample(*r, "kvserve_router_matched_prefix_tokens_count"), 3);
  EXPECT_EQ(FindSample(*r, "kvserve_router_requests_total", {{"code", "OK"}}), 3);
  EXPECT_EQ(FindSample(*r, "kvserve_router_request_duration_seconds_count"), 3);
  EXPECT_EQ(FindSample(*r, "kvserve_router_time_to_first_token_seconds_count"), 3);
  EXPECT_EQ(FindSample(*r, "kvserve_router_retries_total"), 0);
  EXPECT_EQ(SumSamples(*r, "kvserve_router_admission_rejections_total"), 0);
  EXPECT_EQ(FindSample(*r, "kvserve_router_worker_health_state",
                       {{"worker", *worker_address}, {"state", "healthy"}}),
            1);
  EXPECT_EQ(FindSample(*r, "kvserve_router_worker_in_flight_requests",
                       {{"worker", *worker_address}}),
            0);
  EXPECT_EQ(FindSample(*r, "kvserve_router_workers"), 1);

  // The router's graceful gRPC shutdown can wait out its whole 5 s grace; its exit status is
  // not what this test checks.
  router->Stop(seconds(1));
  const int worker_exit = worker->Stop(seconds(10));
  EXPECT_TRUE(WIFEXITED(worker_exit) && WEXITSTATUS(worker_exit) == 0) << worker_exit;
}

TEST(OperabilityTest, SigtermDrainsSixteenStreamsThenExitsZero) {
  absl::StatusOr<ChildProcess> worker = ChildProcess::Spawn(
      {KVSERVE_BINARY, "worker", "--model", kModel, "--listen", "127.0.0.1:0", "--threads", "1",
       "--num-kv-blocks", "1024", "--drain-timeout", "60"});
  ASSERT_TRUE(worker.ok()) << worker.status();
  absl::StatusOr<std::string> address =
      worker->WaitForLine("kvserve worker listening on ", seconds(60));
  ASSERT_TRUE(address.ok()) << address.status();
  std::unique_ptr<Client> client = Connect(*address);
  ASSERT_NE(client, nullptr);

  constexpr int kStreams = 16;
  constexpr uint32_t kMaxTokens = 200;
  // Every stream holds in its first chunk's callback until SIGTERM was sent, so SIGTERM
  // arrives while all 16 calls are open.
  std::mutex mu;
  std::condition_variable cv;
  int started = 0;
  bool signalled = false;
  std::vector<absl::Status> status(kStreams);
  std::vector<uint32_t> tokens(kStreams, 0);
  std::vector<CompletionFinishReason> reasons(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      bool first = true;
      status[i] = client->Generate(
          Greedy(Prompt(static_cast<TokenId>(1 + i), 12), kMaxTokens),
          [&, i](const GenerateChunk& chunk) {
            tokens[i] += static_cast<uint32_t>(chunk.token_ids.size());
            if (chunk.finish_reason != CompletionFinishReason::kUnspecified) {
              reasons[i] = chunk.finish_reason;
            }
            if (!first) return;
            first = false;
            std::unique_lock<std::mutex> lock(mu);
            ++started;
            cv.notify_all();
            cv.wait(lock, [&] { return signalled; });
          });
    });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, seconds(60), [&] { return started == kStreams; }));
    ASSERT_EQ(kill(worker->pid(), SIGTERM), 0);
    signalled = true;
  }
  cv.notify_all();
  for (auto& t : threads) t.join();
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_TRUE(status[i].ok()) << "stream " << i << ": " << status[i];
    EXPECT_EQ(tokens[i], kMaxTokens) << "stream " << i;
    EXPECT_EQ(reasons[i], CompletionFinishReason::kLength) << "stream " << i;
  }
  // After SIGTERM the worker takes no new request (it is draining, or already gone).
  CallOptions call;
  call.deadline = absl::Seconds(10);
  absl::StatusOr<Completion> late = client->GenerateSync(Greedy(Prompt(9, 4), 2), call);
  EXPECT_FALSE(late.ok());
  // Stop sends another SIGTERM (ignored: the worker is already draining) and reaps it.
  const int exit_status = worker->Stop(seconds(30));
  ASSERT_TRUE(WIFEXITED(exit_status)) << "status " << exit_status;
  EXPECT_EQ(WEXITSTATUS(exit_status), 0);
}

// In-process workers and router sharing this process's logger.
class InProcessClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = new LoadedModel(*LoadModel(kModel)); }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }

  void StartWorkers(int count) {
    for (int i = 0; i < count; ++i) {
      EngineOptions options;
      options.num_threads = 1;
      options.num_kv_blocks = 256;
      engines_.push_back(*Engine::Create(model_, options));
      WorkerServerOptions server_options;
      server_options.model_name = "stories260K";
      servers_.push_back(
          std::make_unique<WorkerServer>(model_, engines_.back().get(), server_options));
      absl::StatusOr<int> port = servers_.back()->Start("127.0.0.1:0");
      ASSERT_TRUE(port.ok()) << port.status();
      addresses_.push_back(absl::StrCat("127.0.0.1:", *port));
    }
  }

  void StartRouter(const std::string& policy) {
    RouterOptions options;
    options.listen = "127.0.0.1:0";
    options.model_path = kModel;
    options.policy = policy;
    options.pool.static_workers = addresses_;
    // Only the initial probe round: what the test checks must not depend on probe timing.
    options.pool.probe_interval = absl::Hours(1);
    absl::StatusOr<std::unique_ptr<RouterServer>> router = RouterServer::Start(options);
    ASSERT_TRUE(router.ok()) << router.status();
    router_ = *std::move(router);
    client_ = Connect(absl::StrCat("127.0.0.1:", router_->port()));
  }

  void TearDown() override {
    client_.reset();
    if (router_ != nullptr) router_->Shutdown();
    router_.reset();
    servers_.clear();
    engines_.clear();
  }

  static LoadedModel* model_;
  std::vector<std::unique_ptr<Engine>> engines_;
  std::vector<std::unique_ptr<WorkerServer>> servers_;
  std::vector<std::string> addresses_;
  std::unique_ptr<RouterServer> router_;
  std::unique_ptr<Client> client_;
};

LoadedModel* InProcessClusterTest::model_ = nullptr;

TEST_F(InProcessClusterTest, RequestIdAppearsInRouterAndWorkerLogLines) {
  StartWorkers(1);
  StartRouter("round_robin");
  std::mutex mu;
  std::vector<std::string> lines;
  logging::SetLogFormat(logging::LogFormat::kJson);
  logging::SetLogSink([&](std::string_view line) {
    std::lock_guard<std::mutex> lock(mu);
    lines.emplace_back(line);
  });
  GenerateParams params = Greedy(Prompt(3, 10), 4);
  params.request_id = "trace-4242";
  absl::StatusOr<Completion> c = client_->GenerateSync(params);
  logging::SetLogSink(nullptr);
  logging::SetLogFormat(logging::LogFormat::kText);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->request_id, "trace-4242");

  auto has = [&](const std::string& component, const std::string& msg) {
    for (const std::string& line : lines) {
      if (line.find("\"component\":\"" + component + "\"") != std::string::npos &&
          line.find("\"msg\":\"" + msg + "\"") != std::string::npos &&
          line.find("\"request_id\":\"trace-4242\"") != std::string::npos) {
        return true;
      }
    }
    return false;
  };
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_TRUE(has("router", "request routed"));
  EXPECT_TRUE(has("router", "request finished"));
  EXPECT_TRUE(has("worker", "generate accepted"));
  EXPECT_TRUE(has("worker", "generate finished"));

  // The same request in both processes' metrics, rendered in-process.
  absl::StatusOr<std::vector<Sample>> w =
      metrics::ParseExposition(metrics::RenderText(*servers_[0]->metrics()));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(FindSample(*w, "kvserve_worker_time_to_first_token_seconds_count"), 1);
  absl::StatusOr<std::vector<Sample>> r =
      metrics::ParseExposition(metrics::RenderText(*router_->metrics().collectable()));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(SumSamples(*r, "kvserve_router_routing_decisions_total", {{"policy", "round_robin"}}),
            1);
}

TEST_F(InProcessClusterTest, RouterStopsRoutingToADrainingWorkerAtOnce) {
  StartWorkers(2);
  StartRouter("round_robin");
  // Probes are an hour apart: only the refusal can tell the router.
  servers_[0]->Drain();
  for (int i = 0; i < 6; ++i) {
    absl::StatusOr<Completion> c = client_->GenerateSync(Greedy(Prompt(2 + i, 6), 2));
    ASSERT_TRUE(c.ok()) << "request " << i << ": " << c.status();
    EXPECT_EQ(c->worker, addresses_[1]) << "request " << i;
  }
  std::shared_ptr<WorkerHandle> drained = router_->pool().Find(addresses_[0]);
  ASSERT_NE(drained, nullptr);
  EXPECT_TRUE(drained->draining());
  EXPECT_TRUE(drained->healthy());  // a drain is not a failure
  // Exactly one request went to the draining worker (and was retried on the other).
  EXPECT_EQ(servers_[0]->stats().generate_rejected, 1);
  absl::StatusOr<std::vector<Sample>> r =
      metrics::ParseExposition(metrics::RenderText(*router_->metrics().collectable()));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(FindSample(*r, "kvserve_router_retries_total"), 1);
  EXPECT_EQ(FindSample(*r, "kvserve_router_worker_health_state",
                       {{"worker", addresses_[0]}, {"state", "draining"}}),
            1);
  EXPECT_EQ(FindSample(*r, "kvserve_router_requests_total", {{"code", "OK"}}), 6);
}

}  // namespace
}  // namespace kvserve
