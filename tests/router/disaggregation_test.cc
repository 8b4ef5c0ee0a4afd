// Disaggregated prefill and decode through the router, against fake in-process workers that
// report a role (tests/router/fake_worker): the prefill phase on a prefill-role worker, the
// decode worker's hint to pull the prompt's blocks from it, the fall back to local prefill when
// that phase fails, and the cases that run no prefill phase at all (only prefill workers,
// --disaggregation off, short prompts, prompts the decode worker holds, full prefill workers).

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
constexpr int kBlockSize = 16;
constexpr char kPrefills[] = "kvserve_router_disaggregated_prefills_total";
constexpr char kPrefillDuration[] = "kvserve_router_prefill_phase_duration_seconds";

std::vector<uint32_t> Range(uint32_t first, int count) {
  std::vector<uint32_t> ids;
  for (int i = 0; i < count; ++i) ids.push_back(first + i);
  return ids;
}

bool IsPrefill(const v1::GenerateRequest& request) {
  const std::string& id = request.request_id();
  return id.size() > 8 && id.compare(id.size() - 8, 8, "-prefill") == 0;
}

std::vector<BlockKey> KeysOf(const std::vector<uint32_t>& ids) {
  std::vector<TokenId> tokens(ids.begin(), ids.end());
  return HashFullBlocks(tokens, kBlockSize, "");
}

class DisaggregationTest : public ::testing::Test {
 protected:
  /// One fake worker per role, in order ("" reports no role, as an older worker).
  void StartWorkers(const std::vector<std::string>& roles) {
    for (const std::string& role : roles) {
      workers_.push_back(std::make_unique<FakeWorker>());
      workers_.back()->set_role(role);
    }
  }

  void StartRouter(const std::string& policy = "kv_aware", int max_inflight = 8) {
    RouterOptions options;
    options.listen = "127.0.0.1:0";
    options.model_path = kModel;
    options.policy = policy;
    options.dispatch.block_size = kBlockSize;
    options.dispatch.max_inflight_per_worker = max_inflight;
    options.dispatch.max_queue = 8;
    options.dispatch.disaggregation = disaggregation_;
    options.dispatch.disaggregation_min_tokens = min_tokens_;
    for (const auto& w : workers_) options.pool.static_workers.push_back(w->address());
    options.pool.background_probes = false;  // the first probe round (in Start) reads the roles
    options.pool.failure_threshold = 1;
    options.pool.probe_timeout = absl::Seconds(5);
    options.pool.kv_backoff_min = absl::Milliseconds(10);
    absl::StatusOr<std::unique_ptr<RouterServer>> router = RouterServer::Start(options);
    ASSERT_TRUE(router.ok()) << router.status();
    router_ = *std::move(router);
    stub_ = v1::Inference::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(router_->port()), grpc::InsecureChannelCredentials()));
  }

  Outcome Generate(const v1::GenerateRequest& request, absl::Duration timeout = absl::Seconds(20)) {
    return GenerateVia(*stub_, request, timeout);
  }

  const std::string& Addr(int i) const { return workers_[i]->address(); }
  int InFlight(int i) const { return router_->pool().Find(Addr(i))->in_flight(); }

  void WaitForKeys(int i, size_t count) {
    const WorkerId id = router_->pool().Find(Addr(i))->id();
    ASSERT_TRUE(router_->index().WaitForBlockCount(id, count, absl::Seconds(10)));
  }

  /// The disaggregated prefill counter with outcome `outcome` (-1 when there is none).
  double Prefills(const std::string& outcome) const {
    for (const prometheus::MetricFamily& family : router_->metrics().collectable()->Collect()) {
      if (family.name != kPrefills) continue;
      for (const prometheus::ClientMetric& metric : family.metric) {
        for (const prometheus::ClientMetric::Label& label : metric.label) {
          if (label.name == "outcome" && label.value == outcome) return metric.counter.value;
        }
      }
    }
    return -1;
  }

  /// Observations of the prefill phase duration histogram (-1 when there is none).
  double PrefillPhases() const {
    for (const prometheus::MetricFamily& family : router_->metrics().collectable()->Collect()) {
      if (family.name == kPrefillDuration && !family.metric.empty()) {
        return static_cast<double>(family.metric[0].histogram.sample_count);
      }
    }
    return -1;
  }

  DisaggregationMode disaggregation_ = DisaggregationMode::kAuto;
  // DispatcherOptions::disaggregation_min_tokens; 0 here, so that any usable block counts.
  int min_tokens_ = 0;
  std::vector<std::unique_ptr<FakeWorker>> workers_;
  std::unique_ptr<RouterServer> router_;
  std::unique_ptr<v1::Inference::Stub> stub_;
};

TEST_F(DisaggregationTest, ThePoolRecordsEachWorkersRole) {
  StartWorkers({"prefill", "decode", "both", "", "speculative"});
  StartRouter();
  EXPECT_EQ(router_->pool().Find(Addr(0))->role(), WorkerRole::kPrefill);
  EXPECT_EQ(router_->pool().Find(Addr(1))->role(), WorkerRole::kDecode);
  EXPECT_EQ(router_->pool().Find(Addr(2))->role(), WorkerRole::kBoth);
  EXPECT_EQ(router_->pool().Find(Addr(3))->role(), WorkerRole::kBoth);  // an older worker
  EXPECT_EQ(router_->pool().Find(Addr(4))->role(), WorkerRole::kBoth);  // unknown: served as both
  // A worker that changes its role is seen at the next probe.
  workers_[2]->set_role("prefill");
  router_->pool().ProbeNow();
  EXPECT_EQ(router_->pool().Find(Addr(2))->load().role, WorkerRole::kPrefill);
}

// The prompt is computed on the prefill worker (one greedy token, discarded), then the decode
// worker streams the tokens, told to pull the prompt's usable blocks from the prefill worker.
TEST_F(DisaggregationTest, PrefillsOnThePrefillWorkerThenDecodesWithItsBlocks) {
  StartWorkers({"prefill", "decode"});
  StartRouter();
  EXPECT_EQ(Prefills("ok"), 0);
  const std::vector<uint32_t> prompt = Range(10, 50);  // 3 full blocks, all usable
  v1::GenerateRequest request = Prompt(prompt, "tenant-a");
  request.set_request_id("req-1");
  request.set_max_tokens(12);
  request.mutable_sampling()->set_temperature(0.8f);
  request.add_stop("the end");
  request.set_logprobs(2);
  request.set_regex("[a-z]+");
  Outcome out = Generate(request);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  ASSERT_EQ(out.responses.size(), 3u);
  EXPECT_EQ(out.worker(), Addr(1));

  ASSERT_EQ(workers_[0]->generate_count(), 1);
  const v1::GenerateRequest prefill = workers_[0]->requests()[0];
  EXPECT_EQ(prefill.request_id(), "req-1-prefill");
  EXPECT_EQ(
      std::vector<uint32_t>(prefill.prompt_token_ids().begin(), prefill.prompt_token_ids().end()),
      prompt);
  EXPECT_EQ(prefill.cache_salt(), "tenant-a");
  EXPECT_EQ(prefill.max_tokens(), 1u);
  ASSERT_TRUE(prefill.sampling().has_temperature());
  EXPECT_EQ(prefill.sampling().temperature(), 0.0f);
  EXPECT_TRUE(prefill.ignore_eos());
  EXPECT_EQ(prefill.n(), 1u);
  EXPECT_FALSE(prefill.has_logprobs());
  EXPECT_EQ(prefill.stop_size(), 0);
  EXPECT_EQ(prefill.constraint_case(), v1::GenerateRequest::CONSTRAINT_NOT_SET);
  EXPECT_FALSE(prefill.has_kv_source());

  ASSERT_EQ(workers_[1]->generate_count(), 1);
  const v1::GenerateRequest decode = workers_[1]->requests()[0];
  EXPECT_EQ(decode.request_id(), "req-1");
  EXPECT_EQ(decode.max_tokens(), 12u);
  EXPECT_EQ(decode.regex(), "[a-z]+");
  ASSERT_TRUE(decode.has_kv_source());
  EXPECT_EQ(decode.kv_source().worker(), Addr(0));
  EXPECT_EQ(decode.kv_source().first_block(), 0u);
  EXPECT_EQ(decode.kv_source().num_blocks(), (50u - 1) / kBlockSize);

  EXPECT_EQ(Prefills("ok"), 1);
  EXPECT_EQ(Prefills("failed"), 0);
  EXPECT_EQ(PrefillPhases(), 1);
  EXPECT_EQ(InFlight(0), 0);
  EXPECT_EQ(InFlight(1), 0);
}

// A prompt of whole blocks: the last block holds the last prompt token, which the decode worker
// computes itself (for its logits), so it is not one of the blocks to pull.
TEST_F(DisaggregationTest, TheLastTokensBlockIsNotPulled) {
  StartWorkers({"decode", "prefill"});
  StartRouter();
  Outcome out = Generate(Prompt(Range(10, 48)));  // 3 full blocks, 2 usable
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_EQ(out.worker(), Addr(0));
  ASSERT_EQ(workers_[0]->generate_count(), 1);
  EXPECT_EQ(workers_[0]->requests()[0].kv_source().worker(), Addr(1));
  EXPECT_EQ(workers_[0]->requests()[0].kv_source().num_blocks(), 2u);
}

// The decode worker already holds the first block: it pulls only the blocks after it; when it
// holds every usable block there is no prefill phase.
TEST_F(DisaggregationTest, TheDecodeWorkersOwnBlocksAreNeitherPulledNorPrefilled) {
  StartWorkers({"prefill", "decode"});
  StartRouter();
  const std::vector<uint32_t> prompt = Range(10, 50);
  const std::vector<BlockKey> keys = KeysOf(prompt);
  ASSERT_EQ(keys.size(), 3u);
  workers_[1]->StoreKeys({keys[0]});
  WaitForKeys(1, 1);
  ASSERT_TRUE(Generate(Prompt(prompt)).status.ok());
  ASSERT_EQ(workers_[0]->generate_count(), 1);
  v1::GenerateRequest decode = workers_[1]->requests().at(0);
  EXPECT_EQ(decode.kv_source().worker(), Addr(0));
  EXPECT_EQ(decode.kv_source().first_block(), 1u);
  EXPECT_EQ(decode.kv_source().num_blocks(), 3u);

  workers_[1]->StoreKeys({keys[1], keys[2]});
  WaitForKeys(1, 3);
  ASSERT_TRUE(Generate(Prompt(prompt)).status.ok());
  EXPECT_EQ(workers_[0]->generate_count(), 1);
  EXPECT_FALSE(workers_[1]->requests().at(1).has_kv_source());
}

// kv_aware picks the prefill worker by its prefix cache too; and when a prefill worker already
// holds every usable block, the decode worker is simply told to pull them: no prefill phase.
TEST_F(DisaggregationTest, PrefillWorkersAreChosenByTheirPrefixCaches) {
  StartWorkers({"prefill", "prefill", "decode"});
  StartRouter();
  const std::vector<uint32_t> prompt = Range(10, 50);
  const std::vector<BlockKey> keys = KeysOf(prompt);
  workers_[1]->StoreKeys({keys[0]});
  WaitForKeys(1, 1);
  ASSERT_TRUE(Generate(Prompt(prompt)).status.ok());
  EXPECT_EQ(workers_[0]->generate_count(), 0);
  ASSERT_EQ(workers_[1]->generate_count(), 1);
  v1::GenerateRequest decode = workers_[2]->requests().at(0);
  EXPECT_EQ(decode.kv_source().worker(), Addr(1));
  EXPECT_EQ(decode.kv_source().num_blocks(), 3u);

  workers_[1]->StoreKeys({keys[1], keys[2]});
  WaitForKeys(1, 3);
  ASSERT_TRUE(Generate(Prompt(prompt)).status.ok());
  EXPECT_EQ(workers_[1]->generate_count(), 1);  // no second prefill
  decode = workers_[2]->requests().at(1);
  EXPECT_EQ(decode.kv_source().worker(), Addr(1));
  EXPECT_EQ(decode.kv_source().first_block(), 0u);
  EXPECT_EQ(decode.kv_source().num_blocks(), 3u);
  EXPECT_EQ(Prefills("ok"), 1);
}

// A prefill worker that held part of the prompt and then failed its prefill is not named in the
// decode worker's fallback hint either.
TEST_F(DisaggregationTest, AFailedPrefillWorkerIsNotPulledFrom) {
  StartWorkers({"prefill", "decode"});
  workers_[0]->set_mode(FakeWorker::Mode::kFailBeforeFirst, grpc::StatusCode::INTERNAL);
  StartRouter();
  const std::vector<uint32_t> prompt = Range(10, 50);
  workers_[0]->StoreKeys({KeysOf(prompt)[0]});
  WaitForKeys(0, 1);
  Outcome out = Generate(Prompt(prompt));
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_EQ(workers_[0]->generate_count(), 1);
  EXPECT_FALSE(workers_[1]->requests().at(0).has_kv_source());
  EXPECT_EQ(Prefills("failed"), 1);
}

// A failed prefill never fails the request: the decode worker gets no hint to pull from the
// failed worker and computes the prompt itself.
TEST_F(DisaggregationTest, AFailedPrefillFallsBackToLocalPrefill) {
  StartWorkers({"prefill", "decode"});
  workers_[0]->set_mode(FakeWorker::Mode::kFailBeforeFirst, grpc::StatusCode::UNAVAILABLE);
  StartRouter();
  Outcome out = Generate(Prompt(Range(10, 50)));
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_EQ(out.responses.size(), 3u);
  EXPECT_EQ(out.worker(), Addr(1));
  ASSERT_EQ(workers_[0]->generate_count(), 1);
  EXPECT_TRUE(IsPrefill(workers_[0]->requests()[0]));
  ASSERT_EQ(workers_[1]->generate_count(), 1);
  EXPECT_FALSE(workers_[1]->requests()[0].has_kv_source());
  EXPECT_EQ(Prefills("failed"), 1);
  EXPECT_EQ(Prefills("ok"), 0);
  EXPECT_EQ(InFlight(0), 0);
  EXPECT_EQ(InFlight(1), 0);
}

// A prefill worker that fails with a request error (which the decode worker would not repeat)
// is a failed prefill all the same.
TEST_F(DisaggregationTest, AnyPrefillErrorFallsBackToLocalPrefill) {
  StartWorkers({"prefill", "decode"});
  workers_[0]->set_mode(FakeWorker::Mode::kFailBeforeFirst, grpc::StatusCode::INVALID_ARGUMENT);
  StartRouter();
  Outcome out = Generate(Prompt(Range(10, 50)));
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_EQ(out.worker(), Addr(1));
  EXPECT_FALSE(workers_[1]->requests().at(0).has_kv_source());
  EXPECT_EQ(Prefills("failed"), 1);
}

// With only prefill workers routable, they serve requests like any worker: no prefill phase.
TEST_F(DisaggregationTest, OnlyPrefillWorkersStillServe) {
  StartWorkers({"prefill", "prefill"});
  StartRouter("round_robin");
  for (int i = 0; i < 2; ++i) {
    Outcome out = Generate(Prompt(Range(10, 50)));
    ASSERT_TRUE(out.status.ok()) << out.status.error_message();
    EXPECT_EQ(out.worker(), Addr(i));
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(workers_[i]->generate_count(), 1);
    EXPECT_FALSE(IsPrefill(workers_[i]->requests()[0]));
    EXPECT_FALSE(workers_[i]->requests()[0].has_kv_source());
  }
  EXPECT_EQ(Prefills("ok") + Prefills("failed"), 0);
}

// Once the last decode-capable worker leaves the routable set, the prefill workers serve; when
// it comes back, the split resumes.
TEST_F(DisaggregationTest, PrefillWorkersServeWhileNoDecodeWorkerIsRoutable) {
  StartWorkers({"prefill", "decode"});
  StartRouter();
  workers_[1]->SetServing(false);
  router_->pool().ProbeNow();
  Outcome out = Generate(Prompt(Range(10, 50)));
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_EQ(out.worker(), Addr(0));
  EXPECT_FALSE(IsPrefill(workers_[0]->requests().at(0)));
  workers_[1]->SetServing(true);
  router_->pool().ProbeNow();
  out = Generate(Prompt(Range(10, 50)));
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_EQ(out.worker(), Addr(1));
  EXPECT_TRUE(IsPrefill(workers_[0]->requests().at(1)));
}

TEST_F(DisaggregationTest, OffTreatsEveryWorkerAsBoth) {
  StartWorkers({"prefill", "decode"});
  disaggregation_ = DisaggregationMode::kOff;
  StartRouter("round_robin");
  for (int i = 0; i < 2; ++i) {
    Outcome out = Generate(Prompt(Range(10, 50)));
    ASSERT_TRUE(out.status.ok()) << out.status.error_message();
    EXPECT_EQ(out.worker(), Addr(i));  // the prefill worker streams too
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(workers_[i]->generate_count(), 1);
    EXPECT_FALSE(IsPrefill(workers_[i]->requests()[0]));
    EXPECT_FALSE(workers_[i]->requests()[0].has_kv_source());
  }
}

// A prompt needs one full block before its last token for a prefill phase to pay.
TEST_F(DisaggregationTest, PromptsWithoutAUsableBlockSkipThePrefillPhase) {
  StartWorkers({"prefill", "decode"});
  StartRouter();
  for (int length : {1, 15, kBlockSize}) {
    ASSERT_TRUE(Generate(Prompt(Range(10, length))).status.ok()) << length;
  }
  EXPECT_EQ(workers_[0]->generate_count(), 0);
  EXPECT_EQ(workers_[1]->generate_count(), 3);
  ASSERT_TRUE(Generate(Prompt(Range(10, kBlockSize + 1))).status.ok());
  ASSERT_EQ(workers_[0]->generate_count(), 1);
  EXPECT_EQ(workers_[1]->requests().at(3).kv_source().num_blocks(), 1u);
}

// --disaggregation-min-tokens: prompts whose blocks the decode worker lacks hold fewer tokens
// are computed by the decode worker.
TEST_F(DisaggregationTest, ShortPromptsArePrefilledByTheDecodeWorker) {
  StartWorkers({"prefill", "decode"});
  min_tokens_ = 4 * kBlockSize;
  StartRouter();
  // 3 usable blocks (48 tokens): below the threshold.
  ASSERT_TRUE(Generate(Prompt(Range(10, 3 * kBlockSize + 1))).status.ok());
  EXPECT_EQ(workers_[0]->generate_count(), 0);
  EXPECT_FALSE(workers_[1]->requests().at(0).has_kv_source());
  // 4 usable blocks: a prefill phase.
  ASSERT_TRUE(Generate(Prompt(Range(100, 4 * kBlockSize + 1))).status.ok());
  ASSERT_EQ(workers_[0]->generate_count(), 1);
  EXPECT_EQ(workers_[1]->requests().at(1).kv_source().num_blocks(), 4u);
}

// Client cancellation during the prefill phase cancels the prefill call and ends the request;
// neither slot leaks (with one slot per worker, the next request could not start otherwise).
TEST_F(DisaggregationTest, CancellingDuringThePrefillPhaseReleasesBothSlots) {
  StartWorkers({"prefill", "decode"});
  workers_[0]->set_mode(FakeWorker::Mode::kHoldAfterFirst);
  StartRouter("kv_aware", /*max_inflight=*/1);
  grpc::ClientContext context;
  auto reader = stub_->Generate(&context, Prompt(Range(10, 50)));
  ASSERT_TRUE(workers_[0]->WaitForGenerates(1));
  EXPECT_EQ(InFlight(0), 1);
  EXPECT_EQ(InFlight(1), 1);
  context.TryCancel();
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(workers_[0]->WaitForCancelled(1));
  EXPECT_EQ(workers_[1]->generate_count(), 0);

  workers_[0]->set_mode(FakeWorker::Mode::kNormal);
  Outcome out = Generate(Prompt(Range(10, 50)));
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_EQ(out.worker(), Addr(1));
  EXPECT_EQ(InFlight(0), 0);
  EXPECT_EQ(InFlight(1), 0);
  EXPECT_EQ(Prefills("ok"), 1);
  EXPECT_EQ(Prefills("failed"), 0);  // a cancelled phase is no failed prefill
}

// The client's deadline bounds the prefill phase: when it passes there, the request ends with
// DEADLINE_EXCEEDED and no decode attempt is made.
TEST_F(DisaggregationTest, TheDeadlineAppliesToThePrefillPhase) {
  StartWorkers({"prefill", "decode"});
  workers_[0]->set_mode(FakeWorker::Mode::kHoldAfterFirst);
  StartRouter("kv_aware", /*max_inflight=*/1);
  Outcome out = Generate(Prompt(Range(10, 50)), absl::Milliseconds(500));
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(out.responses.empty());
  EXPECT_TRUE(workers_[0]->WaitForCancelled(1));
  EXPECT_EQ(workers_[1]->generate_count(), 0);
  workers_[0]->set_mode(FakeWorker::Mode::kNormal);
  ASSERT_TRUE(Generate(Prompt(Range(10, 50))).status.ok());  // both slots were released
}

// Every prefill worker full: the decode worker computes the prompt rather than waiting.
TEST_F(DisaggregationTest, AFullPrefillWorkerMeansColocatedPrefill) {
  StartWorkers({"prefill", "decode", "decode"});
  workers_[0]->set_mode(FakeWorker::Mode::kHoldAfterFirst);
  StartRouter("round_robin", /*max_inflight=*/1);
  grpc::ClientContext held;
  held.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  auto a = stub_->Generate(&held, Prompt(Range(10, 50)));
  ASSERT_TRUE(workers_[0]->WaitForGenerates(1));
  Outcome b = Generate(Prompt(Range(100, 50)));
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  EXPECT_EQ(b.worker(), Addr(2));
  EXPECT_FALSE(workers_[2]->requests().at(0).has_kv_source());
  EXPECT_EQ(workers_[0]->generate_count(), 1);

  workers_[0]->ReleaseHeld();
  v1::GenerateResponse message;
  int messages = 0;
  while (a->Read(&message)) ++messages;
  ASSERT_TRUE(a->Finish().ok());
  EXPECT_EQ(messages, 3);
  EXPECT_EQ(workers_[1]->requests().at(0).kv_source().worker(), Addr(0));
}

// A decode attempt that fails before streaming is retried on another decode worker, without a
// second prefill phase; the prefill policy keeps its own round-robin turn.
TEST_F(DisaggregationTest, ADecodeRetryRunsNoSecondPrefill) {
  StartWorkers({"decode", "decode", "prefill"});
  workers_[0]->set_mode(FakeWorker::Mode::kFailBeforeFirst, grpc::StatusCode::UNAVAILABLE);
  StartRouter("round_robin");
  Outcome out = Generate(Prompt(Range(10, 50)));
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_EQ(out.worker(), Addr(1));
  EXPECT_EQ(workers_[2]->generate_count(), 1);
  ASSERT_EQ(workers_[0]->generate_count(), 1);
  EXPECT_EQ(workers_[0]->requests()[0].kv_source().worker(), Addr(2));
  ASSERT_EQ(workers_[1]->generate_count(), 1);
  EXPECT_FALSE(IsPrefill(workers_[1]->requests()[0]));
}

TEST_F(DisaggregationTest, RoundRobinAlternatesDecodeWorkersAroundOnePrefillWorker) {
  StartWorkers({"decode", "prefill", "decode"});
  StartRouter("round_robin");
  std::vector<std::string> served;
  for (int i = 0; i < 4; ++i) {
    Outcome out = Generate(Prompt(Range(10 + i, 40)));
    ASSERT_TRUE(out.status.ok()) << out.status.error_message();
    served.push_back(out.worker());
  }
  EXPECT_EQ(served, (std::vector<std::string>{Addr(0), Addr(2), Addr(0), Addr(2)}));
  EXPECT_EQ(workers_[1]->generate_count(), 4);
}

TEST(DisaggregationModeTest, ParsesTheFlag) {
  EXPECT_EQ(*ParseDisaggregationMode("auto"), DisaggregationMode::kAuto);
  EXPECT_EQ(*ParseDisaggregationMode("off"), DisaggregationMode::kOff);
  const absl::Status bad = ParseDisaggregationMode("on").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("disaggregation"), std::string::npos);
}

}  // namespace
}  // namespace kvserve
