// The load generator: percentiles against hand-computed values, report aggregation, workloads'
// shapes and determinism, and closed/open loops against the in-process fake worker
// (tests/router/fake_worker.h), including failures counted by code and GetLoad polling.

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "bench/loadgen/load_generator.h"
#include "bench/loadgen/plot.h"
#include "bench/loadgen/report.h"
#include "bench/loadgen/workload.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/router/fake_worker.h"

namespace kvserve::bench {
namespace {

TEST(PercentileTest, InterpolatesBetweenClosestRanks) {
  // numpy.percentile([1, 2, 3, 4], q): 50 -> 2.5, 90 -> 3.7, 0 -> 1, 100 -> 4.
  std::vector<double> v = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(Percentile(v, 50), 2.5);
  EXPECT_DOUBLE_EQ(Percentile(v, 90), 3.7);
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 1.0);
  EXPECT_DOUBLE_EQ(Percentile(v, 100), 4.0);
  std::vector<double> one = {7};
  EXPECT_DOUBLE_EQ(Percentile(one, 99), 7.0);
  std::vector<double> none;
  EXPECT_DOUBLE_EQ(Percentile(none, 50), 0.0);
  // 1..100: p99 = 99.01.
  std::vector<double> hundred;
  for (int i = 1; i <= 100; ++i) hundred.push_back(i);
  EXPECT_NEAR(Percentile(hundred, 99), 99.01, 1e-9);
}

TEST(ReportTest, AggregatesSuccessesAndCountsFailuresByCode) {
  std::vector<RequestRecord> records(4);
  records[0].ttft_s = 0.010;
  records[0].e2e_s = 0.100;
  records[0].itl_s = {0.02, 0.04};
  records[0].prompt_tokens = 100;
  records[0].cached_prompt_tokens = 64;
  records[0].output_tokens = 3;
  records[0].peak_kv_blocks = 9;
  records[1].ttft_s = 0.030;
  records[1].e2e_s = 0.300;
  records[1].itl_s = {0.06};
  records[1].prompt_tokens = 100;
  records[1].output_tokens = 2;
  records[1].peak_kv_blocks = 7;
  records[2].code = "RESOURCE_EXHAUSTED";
  records[2].prompt_tokens = 1000;  // failures do not count towards tokens
  records[3].code = "RESOURCE_EXHAUSTED";
  const RunReport r = BuildReport(records, 2.0);
  EXPECT_EQ(r.requests, 4);
  EXPECT_EQ(r.succeeded, 2);
  EXPECT_EQ(r.failed, 2);
  EXPECT_EQ(r.errors.at("RESOURCE_EXHAUSTED"), 2);
  EXPECT_DOUBLE_EQ(r.requests_per_s, 1.0);
  EXPECT_DOUBLE_EQ(r.output_tokens_per_s, 2.5);
  EXPECT_DOUBLE_EQ(r.prefix_hit_rate, 0.32);
  EXPECT_EQ(r.max_request_kv_blocks, 9);
  EXPECT_EQ(r.ttft.count, 2);
  EXPECT_DOUBLE_EQ(r.ttft.p50_ms, 20.0);
  EXPECT_DOUBLE_EQ(r.itl.p50_ms, 40.0);
  EXPECT_DOUBLE_EQ(r.e2e.max_ms, 300.0);

  const nlohmann::json j = nlohmann::json::parse(ReportJson({r}));
  EXPECT_EQ(j["runs"][0]["failed"], 2);
  EXPECT_EQ(j["runs"][0]["errors"]["RESOURCE_EXHAUSTED"], 2);
  EXPECT_DOUBLE_EQ(j["runs"][0]["ttft_ms"]["p50"].get<double>(), 20.0);
  const std::string table = ReportTable({r});
  EXPECT_NE(table.find("RESOURCE_EXHAUSTED x 2"), std::string::npos) << table;
  const std::string script = GnuplotScript({r}, "/tmp/x.png");
  EXPECT_NE(script.find("set output '/tmp/x.png'"), std::string::npos);
  EXPECT_NE(script.find("\n0 20 "), std::string::npos) << script;
}

WorkloadOptions Shape(WorkloadKind kind) {
  WorkloadOptions o;
  o.kind = kind;
  o.vocab_size = 512;
  o.max_model_len = 512;
  o.seed = 3;
  return o;
}

TEST(WorkloadTest, ChatLengthsVaryWithinTheContextAndAreDeterministic) {
  absl::StatusOr<Workload> w = Workload::Create(Shape(WorkloadKind::kChat));
  ASSERT_TRUE(w.ok()) << w.status();
  int min_len = 1 << 30, max_len = 0;
  for (int i = 0; i < 200; ++i) {
    const BenchRequest r = w->Make(i);
    ASSERT_GE(r.max_tokens, 1);
    ASSERT_LT(static_cast<int>(r.prompt.size()) + r.max_tokens, 512);
    for (TokenId t : r.prompt) ASSERT_TRUE(t >= 3 && t < 512) << t;
    min_len = std::min<int>(min_len, r.prompt.size());
    max_len = std::max<int>(max_len, r.prompt.size());
  }
  EXPECT_LT(min_len, 48);
  EXPECT_GT(max_len, 48);
  EXPECT_EQ(w->Make(17).prompt, w->Make(17).prompt);
  EXPECT_NE(w->Make(17).prompt, w->Make(18).prompt);
}

TEST(WorkloadTest, SharedPrefixAndLongContext) {
  absl::StatusOr<Workload> w = Workload::Create(Shape(WorkloadKind::kSharedPrefix));
  ASSERT_TRUE(w.ok()) << w.status();
  const BenchRequest a = w->Make(0), b = w->Make(1);
  ASSERT_GT(a.prompt.size(), 256u);
  ASSERT_GT(b.prompt.size(), 256u);
  EXPECT_TRUE(std::equal(a.prompt.begin(), a.prompt.begin() + 256, b.prompt.begin()));
  EXPECT_NE(a.prompt, b.prompt);

  absl::StatusOr<Workload> l = Workload::Create(Shape(WorkloadKind::kLongContext));
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->Make(5).prompt.size(), 384u);
  EXPECT_EQ(l->Make(5).max_tokens, 16);
}

TEST(WorkloadTest, BadShapesNameTheFlag) {
  WorkloadOptions o = Shape(WorkloadKind::kLongContext);
  o.prompt_len = 600;
  absl::StatusOr<Workload> w = Workload::Create(o);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("--prompt-len 600"), absl::string_view::npos);
  o = Shape(WorkloadKind::kSharedPrefix);
  o.prefix_len = 500;
  w = Workload::Create(o);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("--prefix-len 500"), absl::string_view::npos);
  EXPECT_FALSE(ParseWorkloadKind("chatty").ok());
  EXPECT_FALSE(ParseLoadMode("half-open").ok());

  LoadOptions load;
  load.endpoint = "127.0.0.1:1";
  EXPECT_NE(ValidateLoadOptions(load).message().find("exactly one of --duration"),
            absl::string_view::npos);
  load.num_requests = 4;
  load.concurrency = 0;
  EXPECT_NE(ValidateLoadOptions(load).message().find("--concurrency"), absl::string_view::npos);
  load.concurrency = 1;
  load.mode = LoadMode::kOpen;
  load.rate = 0;
  EXPECT_NE(ValidateLoadOptions(load).message().find("--rate"), absl::string_view::npos);
}

TEST(LoadGeneratorTest, ClosedLoopAgainstFakeWorker) {
  testing::FakeWorker worker;
  v1::LoadReport load;
  load.set_used_blocks(5);
  load.set_total_blocks(100);
  worker.set_load(load);
  absl::StatusOr<Workload> w = Workload::Create(Shape(WorkloadKind::kChat));
  ASSERT_TRUE(w.ok());
  LoadOptions o;
  o.endpoint = worker.address();
  o.concurrency = 4;
  o.num_requests = 24;
  o.workers = {worker.address()};
  absl::StatusOr<RunReport> r = RunLoad(o, *w);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->requests, 24);
  EXPECT_EQ(r->succeeded, 24);
  EXPECT_EQ(r->failed, 0);
  EXPECT_EQ(worker.generate_count(), 24);
  // The fake streams 3 tokens, one per message.
  EXPECT_EQ(r->output_tokens, 24 * 3);
  EXPECT_EQ(r->ttft.count, 24);
  EXPECT_EQ(r->itl.count, 24 * 2);
  EXPECT_EQ(r->mode, "closed");
  ASSERT_EQ(r->worker_kv.size(), 1u);
  EXPECT_EQ(r->worker_kv[0].total_blocks, 100);
  EXPECT_EQ(r->worker_kv[0].peak_used_blocks, 5);
  // The requests carry the workload's prompts as token ids, greedy, with ignore_eos.
  const std::vector<v1::GenerateRequest> sent = worker.requests();
  ASSERT_EQ(sent.size(), 24u);
  EXPECT_TRUE(sent[0].ignore_eos());
}

TEST(LoadGeneratorTest, OpenLoopCountsFailuresByCode) {
  testing::FakeWorker worker;
  worker.set_mode(testing::FakeWorker::Mode::kFailBeforeFirst,
                  grpc::StatusCode::RESOURCE_EXHAUSTED);
  absl::StatusOr<Workload> w = Workload::Create(Shape(WorkloadKind::kSharedPrefix));
  ASSERT_TRUE(w.ok());
  LoadOptions o;
  o.endpoint = worker.address();
  o.mode = LoadMode::kOpen;
  o.rate = 2000;  // arrivals within a few ms: the test does not wait on the clock
  o.num_requests = 10;
  absl::StatusOr<RunReport> r = RunLoad(o, *w);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->requests, 10);
  EXPECT_EQ(r->failed, 10);
  EXPECT_EQ(r->errors.at("RESOURCE_EXHAUSTED"), 10);
  EXPECT_EQ(r->mode, "open");
  EXPECT_EQ(r->workload, "shared-prefix");
}

}  // namespace
}  // namespace kvserve::bench
