// The router end to end on loopback, against fake in-process workers (tests/router/fake_worker):
// routing by policy, KV-aware placement from KV events, retries, mid-stream failures, health
// ejection and re-admission, admission bounds, cancellation and deadline propagation, and KV
// transfer hints (GenerateRequest.kv_source).

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/block_hash/block_hash.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kvserve/v1/inference.grpc.pb.h"
#include "prometheus/metric_family.h"
#include "router/router_metrics.h"
#include "router/router_server.h"
#include "tests/router/fake_worker.h"

namespace kvserve {
namespace {

using testing::FakeWorker;
using testing::GenerateVia;
using testing::Outcome;
using testing::Prompt;

constexpr char kModel[] = KVSERVE_SHARED_DIR "/models/stories260K/stories260K.gguf";

std::vector<uint32_t> Range(uint32_t first, int count) {
  std::vector<uint32_t> ids;
  for (int i = 0; i < count; ++i) ids.push_back(first + i);
  return ids;
}

std::vector<BlockKey> KeysOf(const std::vector<uint32_t>& ids, const std::string& salt = "") {
  std::vector<TokenId> tokens(ids.begin(), ids.end());
  return HashFullBlocks(tokens, 16, salt);
}

class RouterLoopbackTest : public ::testing::Test {
 protected:
  void StartWorkers(int count) {
    for (int i = 0; i < count; ++i) workers_.push_back(std::make_unique<FakeWorker>());
  }

  void StartRouter(const std::string& policy, int max_inflight = 8, int max_queue = 8) {
    RouterOptions options;
    options.listen = "127.0.0.1:0";
    options.model_path = kModel;
    options.policy = policy;
    options.policy_config = policy_config_;
    options.dispatch.max_inflight_per_worker = max_inflight;
    options.dispatch.max_queue = max_queue;
    for (const auto& w : workers_) options.pool.static_workers.push_back(w->address());
    options.pool.background_probes = false;  // tests probe explicitly: no timing dependence
    options.pool.failure_threshold = 1;
    options.pool.probe_timeout = absl::Seconds(5);
    options.pool.kv_backoff_min = absl::Milliseconds(10);
    absl::StatusOr<std::unique_ptr<RouterServer>> router = RouterServer::Start(options);
    ASSERT_TRUE(router.ok()) << router.status();
    router_ = *std::move(router);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(router_->port()),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::Inference::NewStub(channel_);
  }

  Outcome Generate(const v1::GenerateRequest& request, absl::Duration timeout = absl::Seconds(20)) {
    return GenerateVia(*stub_, request, timeout);
  }

  const std::string& Addr(int i) const { return workers_[i]->address(); }

  /// Waits until the router's prefix index shows worker `i` holding `count` keys.
  void WaitForKeys(int i, size_t count) {
    const WorkerId id = router_->pool().Find(Addr(i))->id();
    ASSERT_TRUE(router_->index().WaitForBlockCount(id, count, absl::Seconds(10)));
  }

  /// The value of the router's unlabelled counter `name` (-1 when there is none).
  double Counter(std::string_view name) const {
    for (const prometheus::MetricFamily& family : router_->metrics().collectable()->Collect()) {
      if (family.name == name && !family.metric.empty()) return family.metric[0].counter.value;
    }
    return -1;
  }

  /// Read by StartRouter.
  RoutingPolicyConfig policy_config_;
  std::vector<std::unique_ptr<FakeWorker>> workers_;
  std::unique_ptr<RouterServer> router_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Inference::Stub> stub_;
};

TEST_F(RouterLoopbackTest, StreamsTheWorkersTokensAndNamesTheWorker) {
  StartWorkers(1);
  StartRouter("round_robin");
  Outcome out = Generate(Prompt({1, 2, 3}));
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  ASSERT_EQ(out.responses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_EQ(out.responses[i].token_ids_size(), 1);
    EXPECT_EQ(out.responses[i].token_ids(0), FakeWorker::kTokens[i]);
    EXPECT_EQ(out.responses[i].worker(), Addr(0));
  }
  EXPECT_EQ(out.responses[2].finish_reason(), v1::FINISH_REASON_LENGTH);
  // The forwarded request: token ids, a generated request id, no model name.
  const std::vector<v1::GenerateRequest> seen = workers_[0]->requests();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].prompt_token_ids_size(), 3);
  EXPECT_FALSE(seen[0].request_id().empty());
  EXPECT_TRUE(seen[0].model().empty());
  EXPECT_EQ(out.responses[0].request_id(), seen[0].request_id());
}

TEST_F(RouterLoopbackTest, TextPromptsAreTokenizedAndSaltAndIdPassedThrough) {
  StartWorkers(1);
  StartRouter("kv_aware");
  v1::GenerateRequest request;
  request.set_prompt("Once upon a time");
  request.set_cache_salt("tenant-a");
  request.set_request_id("req-42");
  request.set_model("stories260K");
  Outcome out = Generate(request);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  const v1::GenerateRequest seen = workers_[0]->requests().at(0);
  EXPECT_TRUE(seen.prompt().empty());
  EXPECT_GT(seen.prompt_token_ids_size(), 2);
  EXPECT_EQ(seen.prompt_token_ids(0), 1u);  // BOS added by default
  EXPECT_EQ(seen.cache_salt(), "tenant-a");
  EXPECT_EQ(seen.request_id(), "req-42");
}

TEST_F(RouterLoopbackTest, RejectsBadRequestsWithTheFieldName) {
  StartWorkers(1);
  StartRouter("kv_aware");
  v1::GenerateRequest both = Prompt({1, 2});
  both.set_prompt("hi");
  Outcome out = Generate(both);
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(out.status.error_message().find("prompt"), std::string::npos);
  out = Generate(Prompt({1, 100000}));
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(out.status.error_message().find("prompt_token_ids[1]"), std::string::npos);
  v1::GenerateRequest wrong_model = Prompt({1});
  wrong_model.set_model("llama-70b");
  out = Generate(wrong_model);
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(out.status.error_message().find("model"), std::string::npos);
  EXPECT_EQ(workers_[0]->generate_count(), 0);
}

TEST_F(RouterLoopbackTest, AnswersModelAndTokenizerCallsLocally) {
  StartWorkers(1);
  StartRouter("kv_aware");
  grpc::ClientContext c1;
  v1::ListModelsResponse models;
  ASSERT_TRUE(stub_->ListModels(&c1, {}, &models).ok());
  ASSERT_EQ(models.models_size(), 1);
  EXPECT_EQ(models.models(0).name(), "stories260K");
  EXPECT_EQ(models.models(0).vocab_size(), 512u);
  EXPECT_EQ(models.models(0).max_model_len(), 256u);  // from the worker's GetModelInfo
  grpc::ClientContext c2;
  v1::TokenizeRequest tokenize;
  tokenize.set_text("Once upon a time");
  v1::TokenizeResponse ids;
  ASSERT_TRUE(stub_->Tokenize(&c2, tokenize, &ids).ok());
  ASSERT_GT(ids.token_ids_size(), 1);
  grpc::ClientContext c3;
  v1::DetokenizeRequest detokenize;
  detokenize.mutable_token_ids()->CopyFrom(ids.token_ids());
  detokenize.set_skip_special_tokens(true);
  v1::DetokenizeResponse text;
  ASSERT_TRUE(stub_->Detokenize(&c3, detokenize, &text).ok());
  EXPECT_EQ(text.text(), "Once upon a time");
  EXPECT_EQ(workers_[0]->generate_count(), 0);
}

TEST_F(RouterLoopbackTest, RoundRobinAlternates) {
  StartWorkers(2);
  StartRouter("round_robin");
  std::vector<std::string> served;
  for (int i = 0; i < 4; ++i) {
    Outcome out = Generate(Prompt(Range(1, 20)));
    ASSERT_TRUE(out.status.ok()) << out.status.error_message();
    served.push_back(out.worker());
  }
  EXPECT_EQ(served, (std::vector<std::string>{Addr(0), Addr(1), Addr(0), Addr(1)}));
}

TEST_F(RouterLoopbackTest, LeastLoadedAvoidsTheWorkerWithAQueue) {
  StartWorkers(2);
  v1::LoadReport busy;
  busy.set_waiting_requests(5);
  workers_[0]->set_load(busy);
  StartRouter("least_loaded");
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Generate(Prompt({1, 2})).worker(), Addr(1));
  EXPECT_EQ(workers_[0]->generate_count(), 0);
}

TEST_F(RouterLoopbackTest, KvAwareFollowsTheWorkersKvEvents) {
  StartWorkers(3);
  StartRouter("kv_aware");
  const std::vector<uint32_t> prompt = Range(10, 50);  // 3 full blocks
  const std::vector<BlockKey> keys = KeysOf(prompt);
  ASSERT_EQ(keys.size(), 3u);
  workers_[2]->StoreKeys(keys);
  const WorkerId w2 = router_->pool().Find(Addr(2))->id();
  ASSERT_TRUE(router_->index().WaitForBlockCount(w2, 3, absl::Seconds(10)));
  // Every request sharing the prefix goes to worker 2 (each finishes before the next).
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Generate(Prompt(prompt)).worker(), Addr(2));
  // The same tokens under another cache salt share nothing: least loaded, first on ties.
  EXPECT_EQ(Generate(Prompt(prompt, "other-tenant")).worker(), Addr(0));
  // After worker 2 evicts the first block, nothing is reusable there any more.
  workers_[2]->EvictKeys({keys[0]});
  ASSERT_TRUE(router_->index().WaitForBlockCount(w2, 2, absl::Seconds(10)));
  EXPECT_EQ(Generate(Prompt(prompt)).worker(), Addr(0));
}

// Blocks a worker holds only in its host tier (it restores them) count, a little less than blocks
// in a device pool, and a worker that drops them from every tier stops drawing the prefix.
TEST_F(RouterLoopbackTest, KvAwareCountsBlocksAWorkerCanRestoreFromItsHostTier) {
  StartWorkers(3);
  // With transfers, worker 1 would pull the fourth block from worker 2 (3 + 0.5 beats 3.2):
  // this test is about the tiers alone.
  policy_config_.kv_aware.transfer_weight = 0;
  StartRouter("kv_aware");
  const std::vector<uint32_t> prompt = Range(10, 66);  // 4 full blocks
  const std::vector<BlockKey> keys = KeysOf(prompt);
  ASSERT_EQ(keys.size(), 4u);
  workers_[1]->StoreKeys({keys[0], keys[1], keys[2]});  // 3 on the device
  workers_[2]->StoreKeys(keys, KvTier::kHost);          // 4 on the host: worth 3.2
  const WorkerId w1 = router_->pool().Find(Addr(1))->id();
  const WorkerId w2 = router_->pool().Find(Addr(2))->id();
  ASSERT_TRUE(router_->index().WaitForBlockCount(w1, 3, absl::Seconds(10)));
  ASSERT_TRUE(router_->index().WaitForBlockCount(w2, 4, absl::Seconds(10)));
  EXPECT_EQ(Generate(Prompt(prompt)).worker(), Addr(2));
  // Worker 2's host tier drops the first block: its run is empty, worker 1 wins.
  workers_[2]->EvictKeys({keys[0]}, KvTier::kHost);
  ASSERT_TRUE(router_->index().WaitForBlockCount(w2, 3, absl::Seconds(10)));
  EXPECT_EQ(Generate(Prompt(prompt)).worker(), Addr(1));
}

// A holder of the prompt's prefix that is full hands the request to another worker, with a hint
// naming the holder and the blocks to pull; the hint is the router's alone (a client's is
// dropped) and names only blocks of the request's own cache salt.
TEST_F(RouterLoopbackTest, KvAwareOffloadsAFullHolderWithATransferHint) {
  StartWorkers(2);
  workers_[0]->set_mode(FakeWorker::Mode::kHoldAfterFirst);
  StartRouter("kv_aware", /*max_inflight=*/1, /*max_queue=*/4);
  const std::string kHints = "kvserve_router_kv_transfer_hints_total";
  EXPECT_EQ(Counter(kHints), 0);
  const std::vector<uint32_t> prompt = Range(10, 50);  // 3 full blocks
  const std::vector<BlockKey> keys = KeysOf(prompt);
  workers_[0]->StoreKeys(keys);
  WaitForKeys(0, 3);
  // A goes to the holder (no hint: it has the whole prefix) and is held there: worker 0 is full.
  grpc::ClientContext ca;
  ca.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  auto a = stub_->Generate(&ca, Prompt(prompt));
  v1::GenerateResponse msg;
  ASSERT_TRUE(a->Read(&msg));
  EXPECT_EQ(msg.worker(), Addr(0));
  EXPECT_FALSE(workers_[0]->requests().at(0).has_kv_source());

  // B goes to worker 1, told to pull blocks [0, 3) from worker 0; the client's own hint is gone.
  v1::GenerateRequest b = Prompt(prompt);
  b.mutable_kv_source()->set_worker("203.0.113.7:9000");
  b.mutable_kv_source()->set_num_blocks(3);
  Outcome out = Generate(b);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_EQ(out.worker(), Addr(1));
  v1::GenerateRequest seen = workers_[1]->requests().at(0);
  ASSERT_TRUE(seen.has_kv_source());
  EXPECT_EQ(seen.kv_source().worker(), Addr(0));
  EXPECT_EQ(seen.kv_source().first_block(), 0u);
  EXPECT_EQ(seen.kv_source().num_blocks(), 3u);
  EXPECT_EQ(Counter(kHints), 1);

  // Once worker 1 holds the first block itself, it pulls only [1, 3).
  workers_[1]->StoreKeys({keys[0]});
  WaitForKeys(1, 1);
  out = Generate(Prompt(prompt));
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  seen = workers_[1]->requests().at(1);
  ASSERT_TRUE(seen.has_kv_source());
  EXPECT_EQ(seen.kv_source().worker(), Addr(0));
  EXPECT_EQ(seen.kv_source().first_block(), 1u);
  EXPECT_EQ(seen.kv_source().num_blocks(), 3u);

  // The same tokens under another cache salt (another tenant) match none of worker 0's blocks.
  out = Generate(Prompt(prompt, "other-tenant"));
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_FALSE(workers_[1]->requests().at(2).has_kv_source());
  EXPECT_EQ(Counter(kHints), 2);

  // With A done, the idle holder serves the prefix itself: no hint, and a client's is dropped.
  workers_[0]->ReleaseHeld();
  while (a->Read(&msg)) {
  }
  ASSERT_TRUE(a->Finish().ok());
  out = Generate(b);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_EQ(out.worker(), Addr(0));
  EXPECT_FALSE(workers_[0]->requests().at(1).has_kv_source());
  EXPECT_EQ(Counter(kHints), 2);
}

// The first attempt's hint names the holder; when that attempt fails and the retry goes to the
// holder itself, the retry carries no hint.
TEST_F(RouterLoopbackTest, ARetryDoesNotCarryTheFirstAttemptsHint) {
  StartWorkers(2);
  v1::LoadReport busy;
  busy.set_waiting_requests(9);  // past the balance guard (8): the request goes to worker 1
  workers_[0]->set_load(busy);
  workers_[1]->set_mode(FakeWorker::Mode::kFailBeforeFirst);
  StartRouter("kv_aware");
  const std::vector<uint32_t> prompt = Range(10, 50);
  workers_[0]->StoreKeys(KeysOf(prompt));
  WaitForKeys(0, 3);
  Outcome out = Generate(Prompt(prompt));
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_EQ(out.worker(), Addr(0));
  ASSERT_EQ(workers_[1]->generate_count(), 1);
  EXPECT_EQ(workers_[1]->requests()[0].kv_source().worker(), Addr(0));
  ASSERT_EQ(workers_[0]->generate_count(), 1);
  EXPECT_FALSE(workers_[0]->requests()[0].has_kv_source());
}

// Policies that do not weigh other workers' blocks send no hints, and neither does kv_aware with
// a transfer weight of 0.
TEST_F(RouterLoopbackTest, OnlyKvAwareWithATransferWeightSendsHints) {
  StartWorkers(2);
  v1::LoadReport busy;
  busy.set_waiting_requests(9);
  workers_[1]->set_load(busy);
  StartRouter("round_robin");
  const std::vector<uint32_t> prompt = Range(10, 50);
  workers_[1]->StoreKeys(KeysOf(prompt));
  WaitForKeys(1, 3);
  EXPECT_EQ(Generate(Prompt(prompt)).worker(), Addr(0));  // round robin's first pick
  EXPECT_FALSE(workers_[0]->requests().at(0).has_kv_source());
  router_.reset();
  policy_config_.kv_aware.transfer_weight = 0;
  StartRouter("kv_aware");
  WaitForKeys(1, 3);
  EXPECT_EQ(Generate(Prompt(prompt)).worker(), Addr(0));  // the balance guard's pick
  EXPECT_FALSE(workers_[0]->requests().at(1).has_kv_source());
}

// The KV event stream breaks (UNAVAILABLE), or the worker closes it because the router fell too
// far behind (RESOURCE_EXHAUSTED, KvEventStream::kMaxPending), while the worker stays healthy: the
// router subscribes again and the new stream's snapshot gives it the worker's cache as it is now,
// including what changed while no stream was open.
class KvStreamDropTest : public RouterLoopbackTest,
                         public ::testing::WithParamInterface<grpc::StatusCode> {};

TEST_P(KvStreamDropTest, IsFollowedByANewSubscriptionAndSnapshot) {
  StartWorkers(2);
  StartRouter("kv_aware");
  const std::vector<uint32_t> prompt = Range(10, 50);  // 3 full blocks
  const std::vector<uint32_t> other = Range(200, 40);  // 2 full blocks
  const std::vector<BlockKey> keys = KeysOf(prompt);
  const std::vector<BlockKey> other_keys = KeysOf(other);
  workers_[1]->StoreKeys(keys);
  const WorkerId w1 = router_->pool().Find(Addr(1))->id();
  ASSERT_TRUE(router_->index().WaitForBlockCount(w1, 3, absl::Seconds(10)));
  EXPECT_EQ(Generate(Prompt(prompt)).worker(), Addr(1));

  const int subscriptions = workers_[1]->kv_subscriptions();
  workers_[1]->DropKvStreams(GetParam());
  // Changes while the router may or may not be subscribed: the snapshot or the events carry them.
  workers_[1]->EvictKeys({keys[0]});
  workers_[1]->StoreKeys(other_keys);
  ASSERT_TRUE(workers_[1]->WaitForKvSubscriptions(subscriptions + 1))
      << "the router did not subscribe again";
  ASSERT_TRUE(router_->index().WaitForBlockCount(w1, 4, absl::Seconds(10)));
  EXPECT_TRUE(router_->pool().Find(Addr(1))->routable());
  EXPECT_EQ(Generate(Prompt(other)).worker(), Addr(1));
  // The first block of `prompt` is gone there: nothing of it is reusable, least loaded wins.
  EXPECT_EQ(Generate(Prompt(prompt)).worker(), Addr(0));
}

INSTANTIATE_TEST_SUITE_P(Codes, KvStreamDropTest,
                         ::testing::Values(grpc::StatusCode::UNAVAILABLE,
                                           grpc::StatusCode::RESOURCE_EXHAUSTED));

TEST_F(RouterLoopbackTest, RetriesOnAnotherWorkerWhenTheFirstFailsBeforeAnyToken) {
  StartWorkers(2);
  workers_[0]->set_mode(FakeWorker::Mode::kFailBeforeFirst, grpc::StatusCode::UNAVAILABLE);
  StartRouter("round_robin");
  Outcome out = Generate(Prompt({1, 2, 3}));
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_EQ(out.responses.size(), 3u);
  EXPECT_EQ(out.worker(), Addr(1));
  ASSERT_EQ(workers_[0]->generate_count(), 1);
  ASSERT_EQ(workers_[1]->generate_count(), 1);
  EXPECT_EQ(workers_[0]->requests()[0].request_id(), workers_[1]->requests()[0].request_id());
}

TEST_F(RouterLoopbackTest, RetriesOnlyOnce) {
  StartWorkers(3);
  for (auto& w : workers_) w->set_mode(FakeWorker::Mode::kFailBeforeFirst);
  StartRouter("round_robin");
  Outcome out = Generate(Prompt({1, 2, 3}));
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(
      workers_[0]->generate_count() + workers_[1]->generate_count() + workers_[2]->generate_count(),
      2);
}

TEST_F(RouterLoopbackTest, DoesNotRetryRequestErrors) {
  StartWorkers(2);
  workers_[0]->set_mode(FakeWorker::Mode::kFailBeforeFirst, grpc::StatusCode::INVALID_ARGUMENT);
  StartRouter("round_robin");
  Outcome out = Generate(Prompt({1, 2, 3}));
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(workers_[1]->generate_count(), 0);
}

TEST_F(RouterLoopbackTest, FailureAfterTheFirstTokenEndsWithUnavailable) {
  StartWorkers(2);
  workers_[0]->set_mode(FakeWorker::Mode::kFailAfterFirst);
  StartRouter("round_robin");
  Outcome out = Generate(Prompt({1, 2, 3}));
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(out.status.error_message().find("after streaming started"), std::string::npos)
      << out.status.error_message();
  EXPECT_NE(out.status.error_message().find(Addr(0)), std::string::npos);
  EXPECT_EQ(out.responses.size(), 1u);
  EXPECT_EQ(workers_[1]->generate_count(), 0);  // no retry once tokens were streamed
}

TEST_F(RouterLoopbackTest, EjectsUnhealthyWorkersAndReadmitsThem) {
  StartWorkers(2);
  StartRouter("round_robin");
  workers_[0]->SetServing(false);
  router_->pool().ProbeNow();
  EXPECT_FALSE(router_->pool().Find(Addr(0))->routable());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Generate(Prompt({1, 2})).worker(), Addr(1));
  EXPECT_EQ(workers_[0]->generate_count(), 0);

  workers_[0]->SetServing(true);
  router_->pool().ProbeNow();
  EXPECT_TRUE(router_->pool().Find(Addr(0))->routable());
  std::vector<std::string> served;
  for (int i = 0; i < 2; ++i) served.push_back(Generate(Prompt({1, 2})).worker());
  std::sort(served.begin(), served.end());
  std::vector<std::string> both = {Addr(0), Addr(1)};
  std::sort(both.begin(), both.end());
  EXPECT_EQ(served, both);
}

TEST_F(RouterLoopbackTest, DrainingWorkersGetNoNewRequests) {
  StartWorkers(2);
  StartRouter("round_robin");
  v1::LoadReport draining;
  draining.set_draining(true);
  workers_[1]->set_load(draining);
  router_->pool().ProbeNow();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Generate(Prompt({1})).worker(), Addr(0));
}

TEST_F(RouterLoopbackTest, NoHealthyWorkerIsUnavailable) {
  StartWorkers(1);
  StartRouter("kv_aware");
  workers_[0]->SetServing(false);
  router_->pool().ProbeNow();
  Outcome out = Generate(Prompt({1}));
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(out.status.error_message().find("no healthy worker"), std::string::npos);
}

TEST_F(RouterLoopbackTest, QueuesThenRefusesBeyondTheAdmissionBounds) {
  StartWorkers(1);
  workers_[0]->set_mode(FakeWorker::Mode::kHoldAfterFirst);
  StartRouter("kv_aware", /*max_inflight=*/1, /*max_queue=*/1);
  auto deadline = absl::ToChronoTime(absl::Now() + absl::Seconds(20));
  // A takes the only slot and is held after its first token.
  grpc::ClientContext ca;
  ca.set_deadline(deadline);
  auto a = stub_->Generate(&ca, Prompt({1, 2}));
  v1::GenerateResponse msg;
  ASSERT_TRUE(a->Read(&msg));
  // B waits in the queue.
  grpc::ClientContext cb;
  cb.set_deadline(deadline);
  auto b = stub_->Generate(&cb, Prompt({3, 4}));
  ASSERT_TRUE(router_->dispatcher().WaitForQueued(1, absl::Seconds(10)));
  // C finds the slot and the queue full.
  Outcome c = Generate(Prompt({5, 6}));
  EXPECT_EQ(c.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(c.status.error_message().find("max-queue"), std::string::npos);
  // Releasing A lets B run (B is released too).
  workers_[0]->ReleaseHeld();
  while (a->Read(&msg)) {
  }
  const grpc::Status a_status = a->Finish();
  EXPECT_TRUE(a_status.ok()) << a_status.error_message();
  int b_messages = 0;
  while (b->Read(&msg)) ++b_messages;
  const grpc::Status b_status = b->Finish();
  EXPECT_TRUE(b_status.ok()) << b_status.error_message();
  EXPECT_EQ(b_messages, 3);
  EXPECT_EQ(workers_[0]->generate_count(), 2);
}

TEST_F(RouterLoopbackTest, QueuedRequestsCanBeCancelled) {
  StartWorkers(1);
  workers_[0]->set_mode(FakeWorker::Mode::kHoldAfterFirst);
  StartRouter("kv_aware", /*max_inflight=*/1, /*max_queue=*/4);
  grpc::ClientContext ca;
  auto a = stub_->Generate(&ca, Prompt({1, 2}));
  v1::GenerateResponse msg;
  ASSERT_TRUE(a->Read(&msg));
  grpc::ClientContext cb;
  auto b = stub_->Generate(&cb, Prompt({3, 4}));
  ASSERT_TRUE(router_->dispatcher().WaitForQueued(1, absl::Seconds(10)));
  cb.TryCancel();
  EXPECT_EQ(b->Finish().error_code(), grpc::StatusCode::CANCELLED);
  ASSERT_TRUE(router_->dispatcher().WaitForQueued(0, absl::Seconds(10)));
  workers_[0]->ReleaseHeld();
  while (a->Read(&msg)) {
  }
  EXPECT_TRUE(a->Finish().ok());
  EXPECT_EQ(workers_[0]->generate_count(), 1);
}

TEST_F(RouterLoopbackTest, ClientCancellationReachesTheWorker) {
  StartWorkers(1);
  workers_[0]->set_mode(FakeWorker::Mode::kHoldAfterFirst);
  StartRouter("kv_aware");
  grpc::ClientContext context;
  auto reader = stub_->Generate(&context, Prompt({1, 2}));
  v1::GenerateResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  context.TryCancel();
  EXPECT_TRUE(workers_[0]->WaitForCancelled(1));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(RouterLoopbackTest, DeadlineIsPropagatedToTheWorker) {
  StartWorkers(1);
  StartRouter("kv_aware");
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(30);
  grpc::ClientContext context;
  context.set_deadline(deadline);
  auto reader = stub_->Generate(&context, Prompt({1, 2}));
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
  }
  ASSERT_TRUE(reader->Finish().ok());
  const auto seen = workers_[0]->last_deadline();
  // Deadlines travel as timeouts that gRPC rounds up to coarse units (for header
  // compression) on each hop, so the worker's deadline may be slightly later; what matters is
  // that it is the client's deadline, not none (infinite) or the router's own.
  EXPECT_LE(seen, deadline + std::chrono::seconds(2));
  EXPECT_GE(seen, deadline - std::chrono::seconds(5));
}

TEST_F(RouterLoopbackTest, AnExpiredDeadlineCancelsTheWorkerCall) {
  StartWorkers(1);
  workers_[0]->set_mode(FakeWorker::Mode::kHoldAfterFirst);
  StartRouter("kv_aware");
  Outcome out = Generate(Prompt({1, 2}), absl::Milliseconds(500));
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(out.responses.size(), 1u);
  EXPECT_TRUE(workers_[0]->WaitForCancelled(1));
}

TEST(WorkerDiscoveryTest, ParsesStaticListsAndResolvesDns) {
  absl::StatusOr<std::vector<std::string>> list = ParseWorkerList("a:1, b:2", "workers");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(*list, (std::vector<std::string>{"a:1", "b:2"}));
  EXPECT_EQ(ParseWorkerList("a:1,,b:2", "workers").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ParseWorkerList("a:1,a:1", "workers").status().message().find("twice"),
            std::string::npos);
  absl::StatusOr<std::vector<std::string>> resolved = ResolveWorkers("localhost:7001");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_NE(std::find(resolved->begin(), resolved->end(), "127.0.0.1:7001"), resolved->end());
  EXPECT_EQ(ResolveWorkers("localhost").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveWorkers("localhost:0").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(WorkerDiscoveryTest, DnsDiscoveredWorkersServe) {
  FakeWorker worker;
  const std::string port = worker.address().substr(worker.address().rfind(':') + 1);
  RouterOptions options;
  options.listen = "127.0.0.1:0";
  options.model_path = kModel;
  options.pool.dns_target = "localhost:" + port;
  options.pool.background_probes = false;
  options.pool.probe_timeout = absl::Seconds(5);
  absl::StatusOr<std::unique_ptr<RouterServer>> router = RouterServer::Start(options);
  ASSERT_TRUE(router.ok()) << router.status();
  ASSERT_NE((*router)->pool().Find("127.0.0.1:" + port), nullptr);
  auto stub = v1::Inference::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string((*router)->port()), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  auto reader = stub->Generate(&context, Prompt({1, 2}));
  v1::GenerateResponse msg;
  int n = 0;
  while (reader->Read(&msg)) ++n;
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(n, 3);
}

TEST(RouterOptionsTest, BadOptionsNameTheOption) {
  RouterOptions options;
  options.listen = "127.0.0.1:0";
  options.model_path = kModel;
  options.pool.static_workers = {"127.0.0.1:1"};
  options.pool.background_probes = false;
  options.policy = "fastest";
  EXPECT_NE(RouterServer::Start(options).status().message().find("policy"), std::string::npos);
  options.policy = "kv_aware";
  options.dispatch.max_inflight_per_worker = 0;
  EXPECT_NE(RouterServer::Start(options).status().message().find("max-inflight-per-worker"),
            std::string::npos);
  options.dispatch.max_inflight_per_worker = 4;
  options.policy_config.kv_aware.transfer_weight = 1.5;
  EXPECT_NE(RouterServer::Start(options).status().message().find("kv-transfer-weight"),
            std::string::npos);
  options.policy_config.kv_aware.transfer_weight = 0;
  options.model_path = "/nonexistent/model.gguf";
  EXPECT_NE(RouterServer::Start(options).status().message().find("/nonexistent/model.gguf"),
            std::string::npos);
  options.model_path = kModel;
  options.pool.dns_target = "x:1";
  EXPECT_EQ(RouterServer::Start(options).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvserve
