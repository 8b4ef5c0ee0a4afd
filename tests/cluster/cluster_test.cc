// End-to-end tests of a real cluster on loopback: `kvserve worker` and `kvserve router`
// processes started from the built binary, driven through the C++ SDK.

#include <signal.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/child_process.h"
#include "client/sdk/client.h"
#include "common/block_hash/block_hash.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kvserve/v1/worker.grpc.pb.h"
#include "router/router_server.h"
#include "tests/worker/model/golden.h"
#include "worker/engine/engine.h"

namespace kvserve {
namespace {

using cli::ChildProcess;
using std::chrono::milliseconds;
using std::chrono::seconds;

const char kModel[] = KVSERVE_SHARED_DIR "/models/stories260K/stories260K.gguf";

// A router and its workers, stopped when destroyed.
struct Cluster {
  std::vector<ChildProcess> workers;
  std::vector<std::string> worker_addresses;
  std::unique_ptr<ChildProcess> router;
  // Set instead of `router` by StartInProcess.
  std::unique_ptr<RouterServer> in_process_router;
  std::string router_address;
  std::unique_ptr<Client> client;

  static std::unique_ptr<Cluster> Start(int num_workers, const std::string& policy) {
    auto c = SpawnWorkers(num_workers);
    if (c == nullptr) return nullptr;
    absl::StatusOr<ChildProcess> r = ChildProcess::Spawn(
        {KVSERVE_BINARY, "router", "--listen", "127.0.0.1:0", "--workers",
         absl::StrJoin(c->worker_addresses, ","), "--model", kModel, "--policy", policy});
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return nullptr;
    c->router = std::make_unique<ChildProcess>(std::move(*r));
    absl::StatusOr<std::string> addr =
        c->router->WaitForLine("kvserve router listening on ", seconds(60));
    EXPECT_TRUE(addr.ok()) << addr.status();
    if (!addr.ok()) return nullptr;
    c->router_address = *addr;
    return c->Connect() ? std::move(c) : nullptr;
  }

  // Worker processes and a router in this process, so that a test can see the router's prefix
  // index and in-flight counts. Probes are 30 s apart, so a worker the test pauses with SIGSTOP
  // is not ejected meanwhile.
  static std::unique_ptr<Cluster> StartInProcess(int num_workers, const std::string& policy) {
    auto c = SpawnWorkers(num_workers);
    if (c == nullptr) return nullptr;
    RouterOptions options;
    options.listen = "127.0.0.1:0";
    options.model_path = kModel;
    options.policy = policy;
    options.pool.static_workers = c->worker_addresses;
    options.pool.probe_interval = absl::Seconds(30);
    absl::StatusOr<std::unique_ptr<RouterServer>> router = RouterServer::Start(options);
    EXPECT_TRUE(router.ok()) << router.status();
    if (!router.ok()) return nullptr;
    c->in_process_router = *std::move(router);
    c->router_address = absl::StrCat("127.0.0.1:", c->in_process_router->port());
    return c->Connect() ? std::move(c) : nullptr;
  }

  static std::unique_ptr<Cluster> SpawnWorkers(int num_workers) {
    auto c = std::make_unique<Cluster>();
    for (int i = 0; i < num_workers; ++i) {
      absl::StatusOr<ChildProcess> w = ChildProcess::Spawn(
          {KVSERVE_BINARY, "worker", "--model", kModel, "--listen", "127.0.0.1:0", "--threads",
           "1", "--num-kv-blocks", "2048"});
      EXPECT_TRUE(w.ok()) << w.status();
      if (!w.ok()) return nullptr;
      absl::StatusOr<std::string> addr = w->WaitForLine("kvserve worker listening on ", seconds(60));
      EXPECT_TRUE(addr.ok()) << addr.status();
      if (!addr.ok()) return nullptr;
      c->worker_addresses.push_back(*addr);
      c->workers.push_back(std::move(*w));
    }
    return c;
  }

  bool Connect() {
    ClientOptions options;
    options.default_deadline = absl::Seconds(60);
    options.connect_timeout = absl::Seconds(10);
    absl::StatusOr<std::unique_ptr<Client>> connected = Client::Connect(router_address, options);
    EXPECT_TRUE(connected.ok()) << connected.status();
    if (!connected.ok()) return false;
    client = *std::move(connected);
    return true;
  }

  // Blocks of `prompt` that the in-process router's index says `worker` holds.
  int IndexedBlocks(const std::string& worker, const std::vector<TokenId>& prompt) {
    const std::vector<BlockKey> keys = HashFullBlocks(prompt, 16, "");
    return static_cast<int>(in_process_router->index().MatchedBlocks(
        in_process_router->pool().Find(worker)->id(), keys));
  }

  // Requests waiting in the workers' queues, as their last load reports to the router say.
  int ReportedWaiting() {
    int total = 0;
    for (const std::string& w : worker_addresses) {
      total += in_process_router->pool().Find(w)->load().waiting_requests;
    }
    return total;
  }

  // Requests the in-process router has dispatched to workers and not yet seen end.
  int InFlight() {
    int total = 0;
    for (const std::string& w : worker_addresses) {
      total += in_process_router->pool().Find(w)->in_flight();
    }
    return total;
  }

  ~Cluster() {
    client.reset();
    in_process_router.reset();
    if (router) router->Stop(seconds(5));
    for (ChildProcess& w : workers) w.Stop(seconds(5));
  }

  // The worker's KV pool use, through kvserve.v1.Worker/GetLoad.
  static absl::StatusOr<v1::LoadReport> Load(const std::string& worker) {
    auto stub = v1::Worker::NewStub(grpc::CreateChannel(worker, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(5));
    v1::LoadReport report;
    grpc::Status s = stub->GetLoad(&ctx, v1::GetLoadRequest(), &report);
    if (!s.ok()) return absl::UnavailableError(s.error_message());
    return report;
  }

  // Waits (bounded) until the worker holds no KV blocks; returns how long it took.
  static absl::StatusOr<milliseconds> WaitPoolFree(const std::string& worker, milliseconds limit) {
    const auto start = std::chrono::steady_clock::now();
    while (true) {
      absl::StatusOr<v1::LoadReport> load = Load(worker);
      const auto took = std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - start);
      if (load.ok() && load->used_blocks() == 0 && load->running_requests() == 0) return took;
      if (took > limit) {
        return absl::DeadlineExceededError(absl::StrCat(
            worker, " still holds ", load.ok() ? load->used_blocks() : -1, " blocks"));
      }
      std::this_thread::sleep_for(milliseconds(10));  // polling interval of a bounded wait
    }
  }
};

// Polls `condition` every 10 ms until it holds or `limit` passes; returns whether it held.
bool WaitUntil(const std::function<bool()>& condition, milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(10));  // polling interval of a bounded wait
  }
  return true;
}

GenerateParams Greedy(std::vector<TokenId> prompt, uint32_t max_tokens) {
  GenerateParams p;
  p.prompt_token_ids = std::move(prompt);
  p.max_tokens = max_tokens;
  p.sampling.temperature = 0.0f;
  p.ignore_eos = true;
  return p;
}

std::vector<TokenId> RandomPrompt(std::mt19937& rng, std::vector<TokenId> prefix, int extra) {
  for (int i = 0; i < extra; ++i) prefix.push_back(3 + static_cast<TokenId>(rng() % 500));
  return prefix;
}

TEST(ClusterTest, SixtyFourStreamsMatchTheLocalEngine) {
  std::mt19937 rng(11);
  const std::vector<TokenId> shared = RandomPrompt(rng, {1}, 60);
  std::vector<GenerateParams> requests;
  for (int i = 0; i < 64; ++i) {
    requests.push_back(Greedy(RandomPrompt(rng, i % 2 ? shared : std::vector<TokenId>{1},
                                           1 + static_cast<int>(rng() % 100)),
                              4 + static_cast<uint32_t>(rng() % 24)));
  }
  // Reference: the same requests one by one through an in-process engine.
  LoadedModel model = *LoadModel(kModel);
  EngineOptions options;
  options.num_threads = 1;
  std::unique_ptr<Engine> engine = *Engine::Create(&model, options);
  std::vector<std::vector<TokenId>> expected;
  for (size_t i = 0; i < requests.size(); ++i) {
    EngineRequest r;
    r.request_id = absl::StrCat(i);
    r.prompt_ids = requests[i].prompt_token_ids;
    r.params.temperature = 0;
    r.params.max_tokens = static_cast<int32_t>(requests[i].max_tokens);
    r.params.ignore_eos = true;
    std::shared_ptr<RequestStream> s = *engine->Submit(r);
    std::vector<TokenId> tokens;
    RequestOutput msg;
    while (s->Next(&msg)) tokens.insert(tokens.end(), msg.token_ids.begin(), msg.token_ids.end());
    expected.push_back(tokens);
  }

  auto cluster = Cluster::Start(2, "kv_aware");
  ASSERT_NE(cluster, nullptr);
  std::vector<absl::StatusOr<Completion>> got(requests.size(), absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < requests.size(); ++i) {
    threads.emplace_back([&, i] { got[i] = cluster->client->GenerateSync(requests[i]); });
  }
  for (std::thread& t : threads) t.join();
  std::set<std::string> workers_used;
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << i << ": " << got[i].status();
    EXPECT_EQ(got[i]->samples[0].token_ids, expected[i]) << "request " << i;
    workers_used.insert(got[i]->worker);
  }
  EXPECT_EQ(workers_used.size(), 2u);
  for (const std::string& w : cluster->worker_addresses) {
    EXPECT_TRUE(Cluster::WaitPoolFree(w, seconds(5)).ok());
  }
}

// Sends `rounds` requests for each of several 256-token prefixes, interleaved and one at a
// time; returns (requests that landed on the prefix's first worker, cached prompt tokens).
// After each request it waits until the router's prefix index holds the serving worker's blocks
// for that prompt (all but the last full block, as in fault_test), so that no route depends on
// how fast the KV events travel.
std::pair<int, int64_t> SharedPrefixTraffic(Cluster& cluster, int num_prefixes, int rounds,
                                            uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<std::vector<TokenId>> prefixes;
  for (int p = 0; p < num_prefixes; ++p) prefixes.push_back(RandomPrompt(rng, {1}, 255));
  std::vector<std::string> home(num_prefixes);
  int on_home = 0;
  int64_t cached = 0;
  for (int round = 0; round < rounds; ++round) {
    for (int p = 0; p < num_prefixes; ++p) {
      const std::vector<TokenId> prompt = RandomPrompt(rng, prefixes[p], 8);
      absl::StatusOr<Completion> c = cluster.client->GenerateSync(Greedy(prompt, 4));
      EXPECT_TRUE(c.ok()) << c.status();
      if (!c.ok()) continue;
      cached += c->samples[0].usage.cached_prompt_tokens;
      const int full_blocks = static_cast<int>(prompt.size()) / 16;
      EXPECT_TRUE(WaitUntil(
          [&] { return cluster.IndexedBlocks(c->worker, prompt) >= full_blocks - 1; }, seconds(60)))
          << "the router never indexed the blocks of round " << round << ", prefix " << p;
      if (round == 0) {
        home[p] = c->worker;
      } else if (c->worker == home[p]) {
        ++on_home;
      }
    }
  }
  return {on_home, cached};
}

TEST(ClusterTest, KvAwareFollowsThePrefixAndBeatsRoundRobin) {
  int64_t kv_aware_cached = 0;
  {
    auto cluster = Cluster::StartInProcess(2, "kv_aware");
    ASSERT_NE(cluster, nullptr);
    // 3 prefixes (odd, so round robin moves each prefix between the workers) x 6 repeats.
    auto [on_home, cached] = SharedPrefixTraffic(*cluster, 3, 7, 5);
    EXPECT_EQ(on_home, 18) << "of 18 repeats landed on the worker holding the prefix";
    kv_aware_cached = cached;
    // Unrelated concurrent load still spreads over both workers, exactly evenly. Both workers
    // are paused until the router has dispatched all 24 requests, so each choice sees the
    // in-flight counts of the ones before it (the dispatcher chooses and counts under one lock)
    // rather than whichever finished first. No prompt matches a cached block (every hit is 0), so
    // kv_aware's score is -load_weight * load / capacity with the same capacity for both: the
    // least loaded worker wins, a tie goes to the earlier one, and the choices alternate, 12 and
    // 12. load = in flight + the waiting count of the worker's last load report, which stays
    // frozen while it is paused: first wait for reports that show the idle workers (0 waiting).
    ASSERT_TRUE(WaitUntil([&] { return cluster->ReportedWaiting() == 0; }, seconds(60)))
        << cluster->ReportedWaiting() << " waiting";
    for (ChildProcess& w : cluster->workers) ASSERT_EQ(::kill(w.pid(), SIGSTOP), 0);
    std::mt19937 rng(3);
    std::vector<std::thread> threads;
    std::vector<std::string> served(24);
    for (int i = 0; i < 24; ++i) {
      threads.emplace_back([&, i, prompt = RandomPrompt(rng, {1}, 40)] {
        absl::StatusOr<Completion> c = cluster->client->GenerateSync(Greedy(prompt, 60));
        if (c.ok()) served[i] = c->worker;
      });
    }
    const bool all_dispatched = WaitUntil([&] { return cluster->InFlight() == 24; }, seconds(60));
    for (ChildProcess& w : cluster->workers) ASSERT_EQ(::kill(w.pid(), SIGCONT), 0);
    for (std::thread& t : threads) t.join();
    EXPECT_TRUE(all_dispatched) << cluster->InFlight() << " of 24 dispatched";
    const auto first = std::count(served.begin(), served.end(), cluster->worker_addresses[0]);
    const auto second = std::count(served.begin(), served.end(), cluster->worker_addresses[1]);
    EXPECT_EQ(first, 12) << first << " vs " << second;
    EXPECT_EQ(second, 12) << first << " vs " << second;
  }
  auto rr = Cluster::StartInProcess(2, "round_robin");
  ASSERT_NE(rr, nullptr);
  const int64_t rr_cached = SharedPrefixTraffic(*rr, 3, 7, 5).second;
  EXPECT_LT(rr_cached, kv_aware_cached);
  std::printf("prefix-cache hits: kv_aware %lld tokens, round_robin %lld tokens\n",
              static_cast<long long>(kv_aware_cached), static_cast<long long>(rr_cached));
}

TEST(ClusterTest, CancelAndDeadlineFreeBlocks) {
  auto cluster = Cluster::Start(1, "kv_aware");
  ASSERT_NE(cluster, nullptr);
  GenerateParams long_request = Greedy({1, 403, 407, 261, 378}, 400);
  long_request.n = 4;
  auto handle = std::make_shared<CallHandle>();
  std::atomic<int> chunks{0};
  absl::Status status = cluster->client->Generate(
      long_request,
      [&](const GenerateChunk&) {
        if (++chunks == 3) handle->Cancel();
      },
      CallOptions{std::nullopt, handle});
  EXPECT_TRUE(absl::IsCancelled(status)) << status;
  // The limits of these waits only bound a pool that never frees; they say nothing about speed.
  absl::StatusOr<milliseconds> freed =
      Cluster::WaitPoolFree(cluster->worker_addresses[0], seconds(60));
  EXPECT_TRUE(freed.ok()) << freed.status();

  // The worker is paused (SIGSTOP) so the deadline expires before it can answer on any machine;
  // once it resumes it sees the call cancelled and must free whatever the request took.
  ASSERT_EQ(::kill(cluster->workers[0].pid(), SIGSTOP), 0);
  absl::StatusOr<Completion> late =
      cluster->client->GenerateSync(long_request, CallOptions{absl::Milliseconds(200), nullptr});
  ASSERT_EQ(::kill(cluster->workers[0].pid(), SIGCONT), 0);
  EXPECT_TRUE(absl::IsDeadlineExceeded(late.status())) << late.status();
  EXPECT_TRUE(Cluster::WaitPoolFree(cluster->worker_addresses[0], seconds(60)).ok());
}

TEST(ClusterTest, KilledWorkerEndsStreamsCleanly) {
  auto cluster = Cluster::Start(2, "round_robin");
  ASSERT_NE(cluster, nullptr);
  constexpr int kStreams = 32;
  constexpr int kTokens = 300;
  // Per stream, written by its own thread: the worker named by its chunks, tokens received, and
  // whether its last chunk (a finish reason) arrived.
  struct Stream {
    std::string worker;
    int tokens = 0;
    bool finished = false;
    absl::Status status;
  };
  std::vector<Stream> streams(kStreams);
  std::atomic<int> started{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      Stream& st = streams[i];
      st.status = cluster->client->Generate(
          Greedy({1, 403, 407, 261, static_cast<TokenId>(300 + i)}, kTokens),
          [&](const GenerateChunk& chunk) {
            if (st.worker.empty()) ++started;
            st.worker = chunk.worker;
            st.tokens += static_cast<int>(chunk.token_ids.size());
            if (chunk.finish_reason != CompletionFinishReason::kUnspecified) st.finished = true;
          });
    });
  }
  // Every stream is running (round robin put 16 on each worker) when worker 0 is frozen and then
  // killed; the limit only bounds a cluster that never starts them.
  const auto until = std::chrono::steady_clock::now() + seconds(120);
  while (started < kStreams && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(5));  // polling interval of a bounded wait
  }
  ASSERT_EQ(::kill(cluster->workers[0].pid(), SIGSTOP), 0);
  const int started_before_kill = started;
  ASSERT_EQ(::kill(cluster->workers[0].pid(), SIGKILL), 0);
  for (std::thread& t : threads) t.join();  // every call has a 60 s deadline: none can hang
  ASSERT_EQ(started_before_kill, kStreams);

  // Exact accounting: every stream on the surviving worker completes; a stream on the killed
  // worker completes if and only if its last chunk arrived, and otherwise ends UNAVAILABLE
  // (it had started, so the router may not retry it elsewhere).
  const std::string& killed = cluster->worker_addresses[0];
  const std::string& survivor = cluster->worker_addresses[1];
  int on_killed = 0, on_survivor = 0, ok = 0, unavailable = 0, cut_short = 0;
  for (int i = 0; i < kStreams; ++i) {
    const Stream& st = streams[i];
    if (st.status.ok()) ++ok;
    if (absl::IsUnavailable(st.status)) ++unavailable;
    if (st.worker == survivor) {
      ++on_survivor;
      EXPECT_TRUE(st.status.ok()) << "stream " << i << ": " << st.status;
      EXPECT_EQ(st.tokens, kTokens) << "stream " << i;
    } else {
      EXPECT_EQ(st.worker, killed) << "stream " << i;
      ++on_killed;
      if (st.finished) {
        EXPECT_TRUE(st.status.ok()) << "stream " << i << ": " << st.status;
        EXPECT_EQ(st.tokens, kTokens) << "stream " << i;
      } else {
        ++cut_short;
        EXPECT_TRUE(absl::IsUnavailable(st.status)) << "stream " << i << ": " << st.status;
        EXPECT_LT(st.tokens, kTokens) << "stream " << i;
      }
    }
  }
  EXPECT_EQ(on_killed, kStreams / 2);
  EXPECT_EQ(on_survivor, kStreams / 2);
  EXPECT_EQ(unavailable, cut_short);
  EXPECT_EQ(ok, kStreams - cut_short);
  std::printf("after SIGKILL: %d streams completed, %d ended UNAVAILABLE\n", ok, unavailable);
  EXPECT_TRUE(Cluster::WaitPoolFree(survivor, seconds(60)).ok());
}

}  // namespace
}  // namespace kvserve
