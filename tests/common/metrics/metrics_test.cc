// The metrics glue: naming rules, bucket layouts, the exposition parser against hand-written
// Prometheus text, and the /metrics endpoint over loopback HTTP.

#include <memory>
#include <string>

#include "common/metrics/buckets.h"
#include "common/metrics/exposition.h"
#include "common/metrics/metric_names.h"
#include "common/metrics/metrics_server.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "tests/common/metrics/scrape.h"

namespace kvserve::metrics {
namespace {

TEST(MetricNamesTest, BuildsConventionalNames) {
  EXPECT_EQ(MetricName("worker", "time_to_first_token", "seconds"),
            "kvserve_worker_time_to_first_token_seconds");
  EXPECT_EQ(MetricName("router", "workers"), "kvserve_router_workers");
  EXPECT_EQ(CounterName("worker", "prompt", "tokens"), "kvserve_worker_prompt_tokens_total");
  EXPECT_TRUE(CheckMetricName("kvserve_worker_prompt_tokens_total").ok());
}

TEST(MetricNamesTest, RejectsBadNames) {
  EXPECT_FALSE(CheckMetricName("vllm_prompt_tokens").ok());
  EXPECT_FALSE(CheckMetricName("kvserve_worker:rate").ok());
  EXPECT_FALSE(CheckMetricName("kvserve_Worker").ok());
  EXPECT_FALSE(CheckMetricName("kvserve_worker__x").ok());
  EXPECT_FALSE(CheckMetricName("kvserve_worker_").ok());
  EXPECT_NE(CheckMetricName("kvserve_a:b").message().find("':'"), std::string::npos);
}

TEST(BucketsTest, Layouts) {
  EXPECT_EQ(ExponentialBuckets(1, 2, 4), (std::vector<double>{1, 2, 4, 8}));
  EXPECT_EQ(LinearBuckets(0.5, 0.25, 3), (std::vector<double>{0.5, 0.75, 1.0}));
  EXPECT_TRUE(ExponentialBuckets(0, 2, 4).empty());
  EXPECT_TRUE(LinearBuckets(0, 0, 4).empty());
  for (const auto* b : {&TimeToFirstTokenBuckets(), &InterTokenLatencyBuckets(),
                        &RequestPhaseBuckets(), &TokenCountBuckets()}) {
    ASSERT_FALSE(b->empty());
    for (size_t i = 1; i < b->size(); ++i) EXPECT_LT((*b)[i - 1], (*b)[i]);
  }
  EXPECT_EQ(TokenCountBuckets().back(), 32768);
}

TEST(ExpositionTest, ParsesHandWrittenText) {
  const std::string text =
      "# HELP kvserve_x_total X.\n"
      "# TYPE kvserve_x_total counter\n"
      "kvserve_x_total{reason=\"stop\"} 3\n"
      "kvserve_x_total{reason=\"a \\\"quoted\\\" \\\\ one\"} 1.5 1700000000000\n"
      "kvserve_h_bucket{le=\"+Inf\"} 7\n"
      "kvserve_g -2e-3\n";
  absl::StatusOr<std::vector<Sample>> samples = ParseExposition(text);
  ASSERT_TRUE(samples.ok()) << samples.status();
  ASSERT_EQ(samples->size(), 4u);
  EXPECT_EQ(FindSample(*samples, "kvserve_x_total", {{"reason", "stop"}}), 3);
  EXPECT_EQ(FindSample(*samples, "kvserve_x_total", {{"reason", "a \"quoted\" \\ one"}}), 1.5);
  EXPECT_EQ(SumSamples(*samples, "kvserve_x_total"), 4.5);
  EXPECT_EQ(FindSample(*samples, "kvserve_h_bucket", {{"le", "+Inf"}}), 7);
  EXPECT_DOUBLE_EQ(*FindSample(*samples, "kvserve_g"), -0.002);
  EXPECT_FALSE(FindSample(*samples, "kvserve_missing").has_value());
}

TEST(ExpositionTest, MalformedLinesNameTheLine) {
  absl::StatusOr<std::vector<Sample>> bad = ParseExposition("ok 1\nbad{le=\"1} 2\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("line 2"), std::string::npos) << bad.status();
  EXPECT_FALSE(ParseExposition("x notanumber\n").ok());
  EXPECT_FALSE(ParseExposition("{a=\"b\"} 1\n").ok());
}

// One Exposer per test process: destroying one that served a request takes ~2 s.
TEST(MetricsServerTest, ServesRefreshedRegistryOverHttp) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto& counter = prometheus::BuildCounter()
                      .Name("kvserve_test_events_total")
                      .Help("Events.")
                      .Register(*registry)
                      .Add({{"kind", "a"}});
  auto& gauge =
      prometheus::BuildGauge().Name("kvserve_test_level").Help("Level.").Register(*registry).Add({});
  auto& histogram = prometheus::BuildHistogram()
                        .Name("kvserve_test_latency_seconds")
                        .Help("Latency.")
                        .Register(*registry)
                        .Add({}, std::vector<double>{0.1, 1.0});
  counter.Increment(2);
  histogram.Observe(0.05);
  histogram.Observe(0.5);
  int refreshes = 0;
  auto collectable = std::make_shared<RefreshingCollectable>(registry, [&] {
    ++refreshes;
    gauge.Set(refreshes * 10);
  });
  absl::StatusOr<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start("127.0.0.1:0", collectable);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);

  absl::StatusOr<std::vector<Sample>> samples = testing::Scrape((*server)->port());
  ASSERT_TRUE(samples.ok()) << samples.status();
  EXPECT_EQ(FindSample(*samples, "kvserve_test_events_total", {{"kind", "a"}}), 2);
  EXPECT_EQ(FindSample(*samples, "kvserve_test_level"), 10);
  EXPECT_EQ(FindSample(*samples, "kvserve_test_latency_seconds_count"), 2);
  EXPECT_EQ(FindSample(*samples, "kvserve_test_latency_seconds_bucket", {{"le", "0.1"}}), 1);
  EXPECT_EQ(FindSample(*samples, "kvserve_test_latency_seconds_bucket", {{"le", "+Inf"}}), 2);

  // In-process rendering matches (and refreshes again).
  absl::StatusOr<std::vector<Sample>> rendered = ParseExposition(RenderText(*collectable));
  ASSERT_TRUE(rendered.ok());
  EXPECT_EQ(FindSample(*rendered, "kvserve_test_level"), 20);

  EXPECT_FALSE(testing::HttpGet((*server)->port(), "/nothing-here").ok());
}

TEST(MetricsServerTest, BadAddressesAreClearErrors) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto collectable = std::make_shared<RefreshingCollectable>(registry, nullptr);
  absl::StatusOr<std::unique_ptr<MetricsServer>> no_port =
      MetricsServer::Start("localhost", collectable);
  ASSERT_FALSE(no_port.ok());
  EXPECT_NE(no_port.status().message().find("metrics-listen"), std::string::npos);
  absl::StatusOr<std::unique_ptr<MetricsServer>> bad_host =
      MetricsServer::Start("256.1.1.1:0", collectable);
  ASSERT_FALSE(bad_host.ok());
  EXPECT_NE(bad_host.status().message().find("metrics-listen"), std::string::npos);
}

}  // namespace
}  // namespace kvserve::metrics
