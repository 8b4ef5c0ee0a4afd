// Pipeline groups in one process over real gRPC on loopback: a leader (engine + worker server
// with a PipelineGroup) and PipelineStageRunner stages. Every token and log-probability must be
// what one whole-model worker gives for the same request; lost, silent and refused stages must
// end requests with UNAVAILABLE (never a hang), flip health, leak no KV block, and the group must
// serve again once a stage rejoins.

#include "worker/pp/pipeline_group.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "kvserve/v1/inference.grpc.pb.h"
#include "kvserve/v1/pipeline.grpc.pb.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "tests/worker/model/golden.h"
#include "tests/worker/server/health.grpc.pb.h"
#include "worker/kv/kv_offload.h"
#include "worker/pp/stage_runner.h"
#include "worker/server/worker_server.h"

namespace kvserve {
namespace {

using std::chrono::milliseconds;
using HealthStatus = grpc::health::v1::HealthCheckResponse;

constexpr int kBlockSize = 16;

bool WaitFor(const std::function<bool()>& condition, milliseconds limit = milliseconds(20000)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(2));
  }
  return true;
}

std::vector<TokenId> Prompt(uint32_t seed, int n) {
  std::vector<TokenId> ids;
  uint32_t x = seed * 2654435761u + 12345u;
  for (int i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    ids.push_back(static_cast<TokenId>(1 + (x >> 8) % 500));
  }
  return ids;
}

v1::GenerateRequest Request(const std::vector<TokenId>& prompt, uint32_t max_tokens) {
  v1::GenerateRequest r;
  for (TokenId id : prompt) r.add_prompt_token_ids(static_cast<uint32_t>(id));
  r.set_max_tokens(max_tokens);
  r.mutable_sampling()->set_temperature(0.0f);
  r.set_ignore_eos(true);
  r.set_logprobs(2);
  return r;
}

struct Output {
  grpc::Status status;
  // Per sample: token ids then log-probabilities (chosen and alternatives) in order.
  std::vector<std::vector<uint32_t>> ids;
  std::vector<std::vector<float>> logprobs;
};

struct Server {
  std::unique_ptr<PipelineGroup> group;  // leaders only
  std::unique_ptr<Engine> engine;
  std::unique_ptr<WorkerServer> server;
  std::string address;
  std::unique_ptr<v1::Inference::Stub> inference;
  std::unique_ptr<grpc::health::v1::Health::Stub> health;

  Output Generate(const v1::GenerateRequest& request, milliseconds limit = milliseconds(30000)) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + limit);
    Output out;
    const size_t n = std::max<uint32_t>(1, request.n());
    out.ids.resize(n);
    out.logprobs.resize(n);
    auto reader = inference->Generate(&context, request);
    v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
      const uint32_t i = msg.index();
      if (i >= n) continue;
      out.ids[i].insert(out.ids[i].end(), msg.token_ids().begin(), msg.token_ids().end());
      for (const v1::Logprobs& lp : msg.logprobs()) {
        out.logprobs[i].push_back(lp.logprob());
        for (const v1::TokenLogprob& t : lp.top()) out.logprobs[i].push_back(t.logprob());
      }
    }
    out.status = reader->Finish();
    return out;
  }

  HealthStatus::ServingStatus Health() {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::health::v1::HealthCheckRequest request;
    HealthStatus response;
    if (!health->Check(&context, request, &response).ok()) return HealthStatus::UNKNOWN;
    return response.status();
  }

  int32_t UsedBlocks() const { return engine->stats().used_blocks; }
};

// NCCL's stand-in for CPU stages of one process, so the device hand-over's protocol (formation,
// steps sent to every stage at once, regrouping after a loss) runs here: each formation id has
// FIFO channels between ranks (stage * tp + t). As with ncclCommAbort, Abort ends only the
// aborting stage's links: a peer waiting on them fails when its own side aborts (the stage
// runner does once its call ends, the leader's group when it drops a stage).
struct LinkHub {
  std::mutex mu;
  std::condition_variable cv;
  int next_id = 0;
  std::map<std::tuple<std::string, int, int>, std::deque<std::vector<float>>> channels;
  std::set<std::pair<std::string, int>> aborted;  // (formation, stage)
  int64_t floats_moved = 0;
};

class FakeLink final : public StageLink {
 public:
  FakeLink(std::shared_ptr<LinkHub> hub, std::string id, int stage, int me, int prev, int next)
      : hub_(std::move(hub)),
        id_(std::move(id)),
        stage_(stage),
        me_(me),
        prev_(prev),
        next_(next) {}
  absl::Status Recv(float* data, int64_t n) override {
    std::unique_lock<std::mutex> lock(hub_->mu);
    auto& q = hub_->channels[{id_, prev_, me_}];
    hub_->cv.wait(lock, [&] { return !q.empty() || Aborted(); });
    if (Aborted()) return StageLinkError("fake link aborted");
    std::vector<float> m = std::move(q.front());
    q.pop_front();
    if (static_cast<int64_t>(m.size()) != n) {
      return StageLinkError(absl::StrCat("fake link: ", m.size(), " floats sent, ", n, " wanted"));
    }
    std::memcpy(data, m.data(), m.size() * sizeof(float));
    return absl::OkStatus();
  }
  absl::Status Send(const float* data, int64_t n) override {
    std::lock_guard<std::mutex> lock(hub_->mu);
    if (Aborted()) return StageLinkError("fake link aborted");
    hub_->channels[{id_, me_, next_}].emplace_back(data, data + n);
    hub_->floats_moved += n;
    hub_->cv.notify_all();
    return absl::OkStatus();
  }
  void Abort() override {
    std::lock_guard<std::mutex> lock(hub_->mu);
    hub_->aborted.insert({id_, stage_});
    hub_->cv.notify_all();
  }

 private:
  bool Aborted() const { return hub_->aborted.count({id_, stage_}) > 0; }
  std::shared_ptr<LinkHub> hub_;
  std::string id_;
  int stage_, me_, prev_, next_;
};

StageLinkFactory FakeLinks(std::shared_ptr<LinkHub> hub, int tp) {
  StageLinkFactory f;
  f.new_id = [hub]() -> absl::StatusOr<std::string> {
    std::lock_guard<std::mutex> lock(hub->mu);
    return absl::StrCat("formation-", ++hub->next_id);
  };
  f.open = [hub, tp](const std::string& id, int pp, int stage,
                     absl::Duration) -> absl::StatusOr<std::vector<std::shared_ptr<StageLink>>> {
    std::vector<std::shared_ptr<StageLink>> links;
    for (int t = 0; t < tp; ++t) {
      links.push_back(std::make_shared<FakeLink>(hub, id, stage, stage * tp + t,
                                                 stage > 0 ? (stage - 1) * tp + t : -1,
                                                 stage + 1 < pp ? (stage + 1) * tp + t : -1));
    }
    return links;
  };
  return f;
}

// A stage runner on its own thread.
struct Stage {
  std::unique_ptr<PipelineStageRunner> runner;
  std::thread thread;
  absl::Status result;
  std::atomic<bool> ready{false};

  ~Stage() { Stop(); }
  void Stop() {
    if (runner != nullptr) runner->Stop();
    if (thread.joinable()) thread.join();
  }
};

class PipelineGroupTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new LoadedModel(*LoadModel(testing_golden::kStoriesGguf));
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }

  static EngineOptions Options(int64_t num_kv_blocks, int tp) {
    EngineOptions o;
    o.num_threads = tp;
    o.tensor_parallel_size = tp;
    o.block_size = kBlockSize;
    o.num_kv_blocks = num_kv_blocks;
    o.check_invariants = true;
    return o;
  }

  static std::unique_ptr<Server> Serve(std::unique_ptr<PipelineGroup> group, EngineOptions o) {
    auto s = std::make_unique<Server>();
    s->group = std::move(group);
    o.pipeline = s->group.get();
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(model_, o);
    EXPECT_TRUE(engine.ok()) << engine.status();
    if (!engine.ok()) return nullptr;
    s->engine = std::move(*engine);
    WorkerServerOptions server_options;
    server_options.model_name = "stories260K";
    server_options.pipeline = s->group.get();
    s->server = std::make_unique<WorkerServer>(model_, s->engine.get(), server_options);
    absl::StatusOr<int> port = s->server->Start("127.0.0.1:0");
    EXPECT_TRUE(port.ok()) << port.status();
    s->address = absl::StrCat("127.0.0.1:", *port);
    auto channel = grpc::CreateChannel(s->address, grpc::InsecureChannelCredentials());
    s->inference = v1::Inference::NewStub(channel);
    s->health = grpc::health::v1::Health::NewStub(channel);
    return s;
  }

  // A whole-model worker with the same tensor parallelism: the reference (tensor-parallel sums
  // round differently from tp 1).
  static std::unique_ptr<Server> Reference(int64_t num_kv_blocks = 256, int tp = 1) {
    return Serve(nullptr, Options(num_kv_blocks, tp));
  }

  static std::unique_ptr<Server> Leader(std::vector<int> counts, int tp = 1,
                                        int64_t num_kv_blocks = 256,
                                        absl::Duration step_timeout = absl::Seconds(30),
                                        std::shared_ptr<LinkHub> links = nullptr) {
    PipelineGroupOptions g;
    g.stages = *SplitLayers(model_->config().num_layers, static_cast<int>(counts.size()), counts);
    g.model_fingerprint = ModelWeightsFingerprint(*model_->weights);
    g.hidden_size = model_->config().hidden_size;
    g.vocab_size = model_->config().vocab_size;
    g.step_timeout = step_timeout;
    absl::StatusOr<std::unique_ptr<PipelineGroup>> group = PipelineGroup::Create(g);
    EXPECT_TRUE(group.ok()) << group.status();
    if (links != nullptr) (*group)->EnableDeviceHandOver(tp, "cpu", FakeLinks(links, tp));
    return Serve(std::move(*group), Options(num_kv_blocks, tp));
  }

  static std::unique_ptr<Stage> StartStage(const std::string& leader, int pp, int rank = -1,
                                           int tp = 1, std::shared_ptr<LinkHub> links = nullptr) {
    PipelineStageOptions o;
    o.leader = leader;
    o.pp_size = pp;
    o.requested_rank = rank;
    o.tensor_parallel.tp_size = tp;
    o.tensor_parallel.num_threads = tp;
    o.retry_interval = absl::Milliseconds(50);
    if (links != nullptr) o.tensor_parallel.stage_links = FakeLinks(links, tp);
    auto stage = std::make_unique<Stage>();
    stage->runner = std::make_unique<PipelineStageRunner>(model_->weights.get(), o);
    Stage* raw = stage.get();
    stage->runner->SetReadyCallback([raw](bool ready) { raw->ready = ready; });
    stage->thread = std::thread([raw] { raw->result = raw->runner->Run(); });
    return stage;
  }

  static LoadedModel* model_;
};

LoadedModel* PipelineGroupTest::model_ = nullptr;

void ExpectSame(const Output& got, const Output& want, const std::string& what) {
  ASSERT_TRUE(want.status.ok()) << what << ": " << want.status.error_message();
  ASSERT_TRUE(got.status.ok()) << what << ": " << got.status.error_message();
  EXPECT_EQ(got.ids, want.ids) << what;
  EXPECT_EQ(got.logprobs, want.logprobs) << what;
}

TEST_F(PipelineGroupTest, StagesGiveTheTokensAndLogprobsOfOneProcess) {
  struct Layout {
    std::vector<int> counts;
    int tp;
  };
  for (const Layout& layout : {Layout{{3, 2}, 1}, Layout{{3, 2}, 2}, Layout{{1, 2, 2}, 1}}) {
    const std::string what = absl::StrCat(layout.counts.size(), " stages (first ", layout.counts[0],
                                          "), tp ", layout.tp);
    std::unique_ptr<Server> reference = Reference(256, layout.tp);
    std::unique_ptr<Server> leader = Leader(layout.counts, layout.tp);
    EXPECT_EQ(leader->Health(), HealthStatus::NOT_SERVING) << what;
    const Output early = leader->Generate(Request(Prompt(1, 20), 4));
    EXPECT_EQ(early.status.error_code(), grpc::StatusCode::UNAVAILABLE) << what;
    EXPECT_NE(early.status.error_message().find("waiting for stage 1"), std::string::npos)
        << early.status.error_message();
    std::vector<std::unique_ptr<Stage>> stages;
    const int pp = static_cast<int>(layout.counts.size());
    for (int r = 1; r < pp; ++r) stages.push_back(StartStage(leader->address, pp, -1, layout.tp));
    ASSERT_TRUE(WaitFor([&] { return leader->Health() == HealthStatus::SERVING; })) << what;
    // Prompts of one block, several, and a partial block; then several at once.
    for (int length : {5, 16, 37, 70}) {
      const v1::GenerateRequest request =
          Request(Prompt(static_cast<uint32_t>(length), length), 24);
      ExpectSame(leader->Generate(request), reference->Generate(request),
                 absl::StrCat(what, ", prompt of ", length));
    }
    std::vector<Output> together(6);
    std::vector<std::thread> threads;
    for (int i = 0; i < 6; ++i) {
      threads.emplace_back(
          [&, i] { together[i] = leader->Generate(Request(Prompt(100 + i, 10 + 13 * i), 20)); });
    }
    for (std::thread& t : threads) t.join();
    for (int i = 0; i < 6; ++i) {
      ExpectSame(together[i], reference->Generate(Request(Prompt(100 + i, 10 + 13 * i), 20)),
                 absl::StrCat(what, ", concurrent request ", i));
    }
    EXPECT_TRUE(WaitFor([&] { return leader->UsedBlocks() == 0; })) << what;
    EXPECT_EQ(leader->engine->stats().invariant_violations, 0) << what;
    EXPECT_GT(leader->group->stats().steps, 0) << what;
    EXPECT_LE(leader->group->stats().max_in_flight, pp) << what;
    for (auto& stage : stages) stage->Stop();
  }
}

// The device hand-over's protocol with in-process links: every stage gets each step at once,
// hand-overs go link to link (none through the leader), and only logits come back.
TEST_F(PipelineGroupTest, DeviceHandOverGivesTheTokensOfOneProcess) {
  struct Layout {
    std::vector<int> counts;
    int tp;
  };
  for (const Layout& layout : {Layout{{3, 2}, 1}, Layout{{1, 2, 2}, 1}, Layout{{2, 3}, 2}}) {
    const std::string what = absl::StrCat(layout.counts.size(), " stages (first ", layout.counts[0],
                                          "), tp ", layout.tp);
    auto hub = std::make_shared<LinkHub>();
    std::unique_ptr<Server> reference = Reference(256, layout.tp);
    std::unique_ptr<Server> leader = Leader(layout.counts, layout.tp, 256, absl::Seconds(30), hub);
    EXPECT_TRUE(leader->group->device_hand_over());
    std::vector<std::unique_ptr<Stage>> stages;
    const int pp = static_cast<int>(layout.counts.size());
    for (int r = 1; r < pp; ++r) {
      stages.push_back(StartStage(leader->address, pp, -1, layout.tp, hub));
    }
    ASSERT_TRUE(WaitFor([&] { return leader->Health() == HealthStatus::SERVING; }))
        << what << ": " << leader->group->NotFormedReason();
    for (int length : {5, 37}) {
      const v1::GenerateRequest request =
          Request(Prompt(static_cast<uint32_t>(length), length), 24);
      ExpectSame(leader->Generate(request), reference->Generate(request),
                 absl::StrCat(what, ", prompt of ", length));
    }
    std::vector<Output> together(5);
    std::vector<std::thread> threads;
    for (int i = 0; i < 5; ++i) {
      threads.emplace_back(
          [&, i] { together[i] = leader->Generate(Request(Prompt(100 + i, 10 + 13 * i), 20)); });
    }
    for (std::thread& t : threads) t.join();
    for (int i = 0; i < 5; ++i) {
      ExpectSame(together[i], reference->Generate(Request(Prompt(100 + i, 10 + 13 * i), 20)),
                 absl::StrCat(what, ", concurrent request ", i));
    }
    const PipelineGroupStats stats = leader->group->stats();
    EXPECT_GT(stats.steps, 0) << what;
    EXPECT_EQ(stats.bytes_sent, 0) << what << ": hand-overs went through the leader";
    EXPECT_LE(stats.max_in_flight, pp) << what;
    {
      std::lock_guard<std::mutex> lock(hub->mu);
      EXPECT_GT(hub->floats_moved, 0) << what;
    }
    EXPECT_TRUE(WaitFor([&] { return leader->UsedBlocks() == 0; })) << what;
    EXPECT_EQ(leader->engine->stats().invariant_violations, 0) << what;
    for (auto& stage : stages) stage->Stop();
  }
}

// A lost stage takes the formation's links with it: every stage is dropped and joins again, the
// group forms anew with fresh links, and tokens are exact again.
TEST_F(PipelineGroupTest, DeviceHandOverRegroupsAfterALostStage) {
  auto hub = std::make_shared<LinkHub>();
  std::unique_ptr<Server> reference = Reference();
  std::unique_ptr<Server> leader = Leader({1, 2, 2}, 1, 256, absl::Seconds(30), hub);
  std::unique_ptr<Stage> one = StartStage(leader->address, 3, 1, 1, hub);
  std::unique_ptr<Stage> two = StartStage(leader->address, 3, 2, 1, hub);
  ASSERT_TRUE(WaitFor([&] { return leader->Health() == HealthStatus::SERVING; }));
  const v1::GenerateRequest warm = Request(Prompt(7, 40), 8);
  ExpectSame(leader->Generate(warm), reference->Generate(warm), "before the loss");

  std::vector<Output> long_ones(3);
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back(
        [&, i] { long_ones[i] = leader->Generate(Request(Prompt(8 + i, 30), 470)); });
  }
  ASSERT_TRUE(WaitFor([&] { return leader->engine->stats().num_running > 0; }));
  const auto lost_at = std::chrono::steady_clock::now();
  two->Stop();
  for (std::thread& t : threads) t.join();
  int unavailable = 0;
  for (const Output& out : long_ones) {
    if (out.status.ok()) continue;
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::UNAVAILABLE) << out.status.error_message();
    ++unavailable;
  }
  EXPECT_GT(unavailable, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - lost_at, std::chrono::seconds(10));
  EXPECT_TRUE(WaitFor([&] { return leader->Health() == HealthStatus::NOT_SERVING; }));
  EXPECT_TRUE(WaitFor([&] { return leader->UsedBlocks() == 0; }));
  // Stage 1 was dropped with it and joins again by itself; stage 2 restarts.
  EXPECT_TRUE(WaitFor([&] { return one->runner->stats().joins >= 2; }));
  std::unique_ptr<Stage> again = StartStage(leader->address, 3, 2, 1, hub);
  ASSERT_TRUE(WaitFor([&] { return leader->Health() == HealthStatus::SERVING; }))
      << leader->group->NotFormedReason();
  ExpectSame(leader->Generate(warm), reference->Generate(warm), "after the regroup");
  EXPECT_EQ(leader->group->stats().losses, 1);
  std::vector<std::shared_ptr<StageLink>> links;
  EXPECT_GE(leader->group->LeaderLinks(&links), 2u);
  EXPECT_EQ(links.size(), 1u);
  EXPECT_TRUE(WaitFor([&] { return leader->UsedBlocks() == 0; }));
  EXPECT_EQ(leader->engine->stats().invariant_violations, 0);
}

// A pool sized from a memory budget fits every stage: the one with the most layers sets the
// blocks, whichever stage that is.
TEST_F(PipelineGroupTest, ThePoolIsSizedForTheStageWithTheMostLayers) {
  auto blocks = [](std::vector<int> counts) {
    PipelineGroupOptions g;
    g.stages = *SplitLayers(model_->config().num_layers, 2, counts);
    g.model_fingerprint = ModelWeightsFingerprint(*model_->weights);
    g.hidden_size = model_->config().hidden_size;
    g.vocab_size = model_->config().vocab_size;
    std::unique_ptr<PipelineGroup> group = *PipelineGroup::Create(g);
    EngineOptions o = Options(0, 1);
    o.kv_cache_memory = int64_t{8} << 20;
    o.run_loop_thread = false;
    o.pipeline = group.get();
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(model_, o);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? (*engine)->num_kv_blocks() : int64_t{0};
  };
  // The budget over the bytes of one block of `layers` layers.
  const int64_t per_layer_block = KvCache::BytesPerToken(model_->config(), KvCacheDType::kF32) /
                                  model_->config().num_layers * kBlockSize;
  auto fits = [&](int64_t layers) { return (int64_t{8} << 20) / (layers * per_layer_block); };
  EXPECT_EQ(blocks({1, 4}), fits(4));  // the stage sets it, not the leader's one layer
  EXPECT_EQ(blocks({4, 1}), fits(4));
  EXPECT_EQ(blocks({3, 2}), fits(3));
  EXPECT_GT(fits(3), fits(4));
}

TEST_F(PipelineGroupTest, ForkedSamplesAndPreemptionStayExact) {
  // 40 blocks for 8 requests of up to 7 blocks each: the scheduler must preempt; n = 3 samples
  // share the prompt's blocks, so the first write into the shared last block is a copy that the
  // stages apply too.
  std::unique_ptr<Server> reference = Reference(40);
  std::unique_ptr<Server> leader = Leader({3, 2}, 1, 40);
  std::unique_ptr<Stage> stage = StartStage(leader->address, 2);
  ASSERT_TRUE(WaitFor([&] { return leader->Health() == HealthStatus::SERVING; }));
  auto request = [](int i) {
    v1::GenerateRequest r = Request(Prompt(200 + i, 21 + 3 * i), 60);
    r.set_n(3);
    r.mutable_sampling()->set_temperature(0.9f);
    r.mutable_sampling()->set_seed(1000 + i);
    return r;
  };
  std::vector<Output> got(8);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] { got[i] = leader->Generate(request(i)); });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < 8; ++i) {
    ExpectSame(got[i], reference->Generate(request(i)), absl::StrCat("request ", i));
  }
  EXPECT_GT(leader->engine->stats().num_preemptions, 0);
  EXPECT_GT(leader->group->stats().block_copies, 0);
  // Micro-batches: at most one step per stage in flight.
  EXPECT_LE(leader->group->stats().max_in_flight, 2);
  EXPECT_TRUE(WaitFor([&] { return leader->UsedBlocks() == 0; }));
  EXPECT_EQ(leader->engine->stats().invariant_violations, 0);
}

TEST_F(PipelineGroupTest, ALostStageFailsRequestsAndTheGroupServesAgainWhenItRejoins) {
  std::unique_ptr<Server> reference = Reference();
  std::unique_ptr<Server> leader = Leader({3, 2});
  std::unique_ptr<Stage> stage = StartStage(leader->address, 2, 1);
  ASSERT_TRUE(WaitFor([&] { return leader->Health() == HealthStatus::SERVING; }));
  const v1::GenerateRequest warm = Request(Prompt(7, 40), 8);
  ExpectSame(leader->Generate(warm), reference->Generate(warm), "before the loss");

  // Long requests in flight when the stage goes (each runs up to the model's 512 positions).
  std::vector<Output> long_ones(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back(
        [&, i] { long_ones[i] = leader->Generate(Request(Prompt(8 + i, 30), 470)); });
  }
  ASSERT_TRUE(WaitFor([&] { return leader->engine->stats().num_running > 0; }));
  const auto lost_at = std::chrono::steady_clock::now();
  stage->Stop();
  for (std::thread& t : threads) t.join();
  int unavailable = 0;
  for (const Output& out : long_ones) {
    if (out.status.ok()) continue;  // finished before the stage went
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::UNAVAILABLE) << out.status.error_message();
    ++unavailable;
  }
  EXPECT_GT(unavailable, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - lost_at, std::chrono::seconds(10));
  EXPECT_TRUE(WaitFor([&] { return leader->Health() == HealthStatus::NOT_SERVING; }));
  const Output refused = leader->Generate(warm);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(refused.status.error_message().find("stage 1 (layers 3..4)"), std::string::npos)
      << refused.status.error_message();
  EXPECT_TRUE(WaitFor([&] { return leader->UsedBlocks() == 0; }));

  // A new stage process (here: runner) takes the rank; the prefix the old one held is
  // recomputed, not trusted, and tokens are exact again.
  std::unique_ptr<Stage> again = StartStage(leader->address, 2, 1);
  ASSERT_TRUE(WaitFor([&] { return leader->Health() == HealthStatus::SERVING; }));
  ExpectSame(leader->Generate(warm), reference->Generate(warm), "after the rejoin");
  EXPECT_EQ(leader->group->stats().losses, 1);
  EXPECT_EQ(leader->group->stats().joins, 2);
  // The same figures on /metrics.
  std::map<std::string, double> metrics;
  for (const prometheus::MetricFamily& family : leader->server->metrics()->Collect()) {
    if (family.name.rfind("kvserve_worker_pipeline_", 0) != 0) continue;
    for (const prometheus::ClientMetric& m : family.metric) {
      std::string name = family.name;
      for (const auto& label : m.label) name += "{" + label.value + "}";
      metrics[name] =
          family.type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value;
    }
  }
  EXPECT_EQ(metrics["kvserve_worker_pipeline_stages"], 2);
  EXPECT_EQ(metrics["kvserve_worker_pipeline_stages_ready"], 2);
  EXPECT_EQ(metrics["kvserve_worker_pipeline_stage_losses_total"], 1);
  EXPECT_GT(metrics["kvserve_worker_pipeline_steps_total"], 0);
  EXPECT_GT(metrics["kvserve_worker_pipeline_transfer_bytes_total{sent}"], 0);
  EXPECT_GT(metrics["kvserve_worker_pipeline_transfer_bytes_total{received}"], 0);
  EXPECT_TRUE(WaitFor([&] { return leader->UsedBlocks() == 0; }));
  EXPECT_EQ(leader->engine->stats().invariant_violations, 0);
}

TEST_F(PipelineGroupTest, MicroBatchesKeepOneStepPerStageInFlight) {
  // A manually stepped leader, so the steps are counted exactly: 4 decoding sequences split into
  // two micro-batches of 2, and while the stage computes one the leader computes the other.
  PipelineGroupOptions g;
  g.stages = *SplitLayers(model_->config().num_layers, 2);
  g.model_fingerprint = ModelWeightsFingerprint(*model_->weights);
  g.hidden_size = model_->config().hidden_size;
  g.vocab_size = model_->config().vocab_size;
  std::unique_ptr<PipelineGroup> group = *PipelineGroup::Create(g);
  EngineOptions o = Options(256, 1);
  o.run_loop_thread = false;
  o.pipeline = group.get();
  std::unique_ptr<Engine> engine = *Engine::Create(model_, o);
  WorkerServerOptions server_options;
  server_options.pipeline = group.get();
  WorkerServer server(model_, engine.get(), server_options);
  absl::StatusOr<int> port = server.Start("127.0.0.1:0");
  ASSERT_TRUE(port.ok()) << port.status();
  std::unique_ptr<Stage> stage = StartStage(absl::StrCat("127.0.0.1:", *port), 2);
  ASSERT_TRUE(WaitFor([&] { return group->formed(); }));

  o.pipeline = nullptr;
  std::unique_ptr<Engine> reference = *Engine::Create(model_, o);
  auto submit = [](Engine& e, int i) {
    EngineRequest r;
    r.request_id = absl::StrCat("r", i);
    r.prompt_ids = Prompt(300 + i, 9 + 5 * i);
    r.params.temperature = 0.0f;
    r.params.max_tokens = 12;
    r.params.ignore_eos = true;
    return *e.Submit(std::move(r));
  };
  auto run = [](Engine& e, std::vector<std::shared_ptr<RequestStream>>& streams) {
    std::vector<std::vector<TokenId>> tokens(streams.size());
    int64_t steps = 0;
    while (e.StepOnce()) {
      ++steps;
      for (size_t i = 0; i < streams.size(); ++i) {
        RequestOutput out;
        while (streams[i]->TryNext(&out)) {
          EXPECT_TRUE(out.status.ok()) << out.status;
          tokens[i].insert(tokens[i].end(), out.token_ids.begin(), out.token_ids.end());
        }
      }
    }
    return std::pair{tokens, steps};
  };
  std::vector<std::shared_ptr<RequestStream>> got, want;
  for (int i = 0; i < 4; ++i) got.push_back(submit(*engine, i));
  for (int i = 0; i < 4; ++i) want.push_back(submit(*reference, i));
  const auto [got_tokens, got_steps] = run(*engine, got);
  const auto [want_tokens, want_steps] = run(*reference, want);
  EXPECT_EQ(got_tokens, want_tokens);
  for (const auto& t : got_tokens) EXPECT_EQ(t.size(), 12u);
  const PipelineGroupStats stats = group->stats();
  EXPECT_EQ(stats.max_in_flight, 2);
  // 12 tokens per sequence, half the sequences per micro-batch: twice the steps of one batch.
  EXPECT_EQ(stats.steps, 2 * 12);
  EXPECT_EQ(want_steps, 12);
  EXPECT_EQ(engine->stats().used_blocks, 0);
  EXPECT_EQ(engine->stats().invariant_violations, 0);
  server.Shutdown();
}

// Joins by hand over the raw API.
struct RawStage {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Pipeline::Stub> stub;
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<v1::StageMessage, v1::LeaderMessage>> stream;

  explicit RawStage(const std::string& address)
      : channel(grpc::CreateChannel(address, grpc::InsecureChannelCredentials())),
        stub(v1::Pipeline::NewStub(channel)) {
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    stream = stub->Join(&context);
  }

  // Sends a join; returns the assignment or the call's final status.
  absl::StatusOr<v1::StageAssignment> Join(int rank, int pp, BlockKey fingerprint) {
    v1::StageMessage out;
    out.mutable_join()->set_requested_rank(rank);
    out.mutable_join()->set_pp_size(pp);
    out.mutable_join()->set_model_fingerprint_hi(fingerprint.hi);
    out.mutable_join()->set_model_fingerprint_lo(fingerprint.lo);
    v1::LeaderMessage in;
    if (stream->Write(out) && stream->Read(&in) && in.has_assignment()) return in.assignment();
    stream->WritesDone();
    const grpc::Status s = stream->Finish();
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  }
};

TEST_F(PipelineGroupTest, TheLeaderRefusesStagesThatCannotBelong) {
  std::unique_ptr<Server> leader = Leader({3, 2});
  const BlockKey fingerprint = ModelWeightsFingerprint(*model_->weights);
  {
    RawStage raw(leader->address);
    absl::StatusOr<v1::StageAssignment> a = raw.Join(1, 3, fingerprint);
    EXPECT_TRUE(absl::IsInvalidArgument(a.status())) << a.status();
    EXPECT_NE(a.status().message().find("--pp 3"), std::string::npos) << a.status();
  }
  {
    RawStage raw(leader->address);
    absl::StatusOr<v1::StageAssignment> a = raw.Join(1, 2, BlockKey{1, 2});
    EXPECT_TRUE(absl::IsFailedPrecondition(a.status())) << a.status();
  }
  {
    RawStage raw(leader->address);
    absl::StatusOr<v1::StageAssignment> a = raw.Join(2, 2, fingerprint);
    EXPECT_TRUE(absl::IsInvalidArgument(a.status())) << a.status();
    EXPECT_NE(a.status().message().find("outside 1..1"), std::string::npos) << a.status();
  }
  {
    RawStage raw(leader->address);
    v1::StageMessage out;
    out.mutable_ready();
    ASSERT_TRUE(raw.stream->Write(out));
    raw.stream->WritesDone();
    EXPECT_EQ(raw.stream->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  // A held rank: the second join is refused, the first keeps it.
  RawStage first(leader->address);
  absl::StatusOr<v1::StageAssignment> a = first.Join(-1, 2, fingerprint);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->rank(), 1);
  EXPECT_EQ(a->first_layer(), 3);
  EXPECT_EQ(a->num_layers(), 2);
  EXPECT_EQ(a->num_blocks(), 256);
  EXPECT_EQ(a->block_size(), kBlockSize);
  EXPECT_EQ(a->kv_cache_dtype(), "f32");
  RawStage second(leader->address);
  absl::StatusOr<v1::StageAssignment> b = second.Join(1, 2, fingerprint);
  EXPECT_TRUE(absl::IsAlreadyExists(b.status())) << b.status();
  // Joined but not ready: the group is not formed.
  EXPECT_FALSE(leader->group->formed());
  EXPECT_NE(leader->group->NotFormedReason().find("joined, loading"), std::string::npos)
      << leader->group->NotFormedReason();

  // A runner with the wrong --pp ends with the leader's reason instead of retrying.
  std::unique_ptr<Stage> wrong = StartStage(leader->address, 3);
  wrong->thread.join();
  EXPECT_TRUE(absl::IsInvalidArgument(wrong->result)) << wrong->result;

  // A group that hands over device to device: stages must run the leader's device and --tp, and
  // a stage without links cannot take part.
  auto hub = std::make_shared<LinkHub>();
  std::unique_ptr<Server> device_leader = Leader({3, 2}, 1, 256, absl::Seconds(30), hub);
  std::unique_ptr<Stage> other_tp = StartStage(device_leader->address, 2, -1, 2, hub);
  other_tp->thread.join();
  EXPECT_TRUE(absl::IsFailedPrecondition(other_tp->result)) << other_tp->result;
  EXPECT_NE(other_tp->result.message().find("--device cpu --tp 1 like the leader"),
            std::string::npos)
      << other_tp->result;
  std::unique_ptr<Stage> no_links = StartStage(device_leader->address, 2);
  no_links->thread.join();
  EXPECT_TRUE(absl::IsFailedPrecondition(no_links->result)) << no_links->result;
  EXPECT_NE(no_links->result.message().find("no device links"), std::string::npos)
      << no_links->result;
  EXPECT_FALSE(device_leader->group->formed());
}

TEST_F(PipelineGroupTest, ASilentStageIsDroppedAfterTheStepTimeout) {
  std::unique_ptr<Server> reference = Reference();
  std::unique_ptr<Server> leader = Leader({3, 2}, 1, 256, absl::Milliseconds(500));
  const BlockKey fingerprint = ModelWeightsFingerprint(*model_->weights);
  // A stage that joins, says ready and then never answers a step.
  auto raw = std::make_unique<RawStage>(leader->address);
  ASSERT_TRUE(raw->Join(1, 2, fingerprint).ok());
  v1::StageMessage ready;
  ready.mutable_ready();
  ASSERT_TRUE(raw->stream->Write(ready));
  ASSERT_TRUE(WaitFor([&] { return leader->Health() == HealthStatus::SERVING; }));
  const auto start = std::chrono::steady_clock::now();
  const Output out = leader->Generate(Request(Prompt(3, 20), 8));
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::UNAVAILABLE) << out.status.error_message();
  EXPECT_NE(out.status.error_message().find("--pp-step-timeout"), std::string::npos)
      << out.status.error_message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_TRUE(WaitFor([&] { return leader->Health() == HealthStatus::NOT_SERVING; }));
  EXPECT_TRUE(WaitFor([&] { return leader->UsedBlocks() == 0; }));
  // The silent stage's call was ended by the leader.
  v1::LeaderMessage in;
  while (raw->stream->Read(&in)) {
  }
  EXPECT_FALSE(raw->stream->Finish().ok());
  raw.reset();

  std::unique_ptr<Stage> stage = StartStage(leader->address, 2);
  ASSERT_TRUE(WaitFor([&] { return leader->Health() == HealthStatus::SERVING; }));
  const v1::GenerateRequest request = Request(Prompt(3, 20), 8);
  ExpectSame(leader->Generate(request), reference->Generate(request), "after the timeout");
}

TEST_F(PipelineGroupTest, AStageRejoinsWhenTheLeaderGoesAndComesBack) {
  std::unique_ptr<Server> reference = Reference();
  std::unique_ptr<Server> leader = Leader({3, 2});
  const std::string address = leader->address;
  std::unique_ptr<Stage> stage = StartStage(address, 2);
  ASSERT_TRUE(WaitFor([&] { return stage->ready.load(); }));
  leader->server->Shutdown();
  ASSERT_TRUE(WaitFor([&] { return !stage->ready.load(); }));
  // The stage keeps dialling; a new leader takes the rank's place. (A new port: the old one may
  // linger; the stage is pointed at it by a second runner, as a restarted pod would be.)
  std::unique_ptr<Server> second = Leader({3, 2});
  std::unique_ptr<Stage> again = StartStage(second->address, 2);
  ASSERT_TRUE(WaitFor([&] { return second->Health() == HealthStatus::SERVING; }));
  const v1::GenerateRequest request = Request(Prompt(11, 33), 16);
  ExpectSame(second->Generate(request), reference->Generate(request), "second leader");
  stage->Stop();
  EXPECT_TRUE(stage->result.ok()) << stage->result;
  EXPECT_GE(stage->runner->stats().joins, 1);
}

}  // namespace
}  // namespace kvserve
