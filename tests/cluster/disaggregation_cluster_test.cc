// Disaggregated prefill and decode end to end: real `kvserve worker --role prefill|decode`
// processes behind an in-process router. The tokens must be those of one colocated worker,
// whether the decode worker pulled the prompt's blocks from the prefill worker or, with the
// prefill worker gone, computed the prompt itself.

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "prometheus/metric_family.h"
#include "router/router_metrics.h"
#include "router/router_server.h"
#include "tests/cluster/process_cluster.h"

namespace kvserve {
namespace {

using testing::ConnectClient;
using testing::Greedy;
using testing::Prompt;
using testing::Spawned;
using testing::SpawnWorker;

double Prefills(RouterServer& router, const std::string& outcome) {
  for (const prometheus::MetricFamily& family : router.metrics().collectable()->Collect()) {
    if (family.name != "kvserve_router_disaggregated_prefills_total") continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      for (const prometheus::ClientMetric::Label& label : metric.label) {
        if (label.name == "outcome" && label.value == outcome) return metric.counter.value;
      }
    }
  }
  return -1;
}

std::vector<TokenId> TokensOf(const absl::StatusOr<Completion>& completion) {
  if (!completion.ok() || completion->samples.empty()) return {};
  return completion->samples[0].token_ids;
}

TEST(DisaggregationClusterTest, PrefillAndDecodeWorkersGiveTheTokensOfOneWorker) {
  absl::StatusOr<Spawned> reference = SpawnWorker();
  absl::StatusOr<Spawned> prefill = SpawnWorker({"--role", "prefill"});
  absl::StatusOr<Spawned> decode = SpawnWorker({"--role", "decode"});
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_TRUE(prefill.ok()) << prefill.status();
  ASSERT_TRUE(decode.ok()) << decode.status();

  RouterOptions options;
  options.listen = "127.0.0.1:0";
  options.model_path = testing::kTestModel;
  options.pool.static_workers = {prefill->address, decode->address};
  options.dispatch.disaggregation_min_tokens = 0;  // every prompt's blocks go through a prefill
  options.pool.probe_interval = absl::Milliseconds(100);
  options.pool.probe_timeout = absl::Milliseconds(500);
  absl::StatusOr<std::unique_ptr<RouterServer>> router = RouterServer::Start(options);
  ASSERT_TRUE(router.ok()) << router.status();
  ASSERT_EQ((*router)->pool().Find(prefill->address)->role(), WorkerRole::kPrefill);
  ASSERT_EQ((*router)->pool().Find(decode->address)->role(), WorkerRole::kDecode);

  std::unique_ptr<Client> direct = *ConnectClient(reference->address);
  std::unique_ptr<Client> routed = *ConnectClient(absl::StrCat("127.0.0.1:", (*router)->port()));
  // Odd lengths: one usable block, several, and a prompt of whole blocks (its last block holds
  // the last token and is computed by the decode worker).
  const std::vector<int> lengths = {17, 45, 64, 101};
  for (size_t i = 0; i < lengths.size(); ++i) {
    const GenerateParams params = Greedy(Prompt(static_cast<TokenId>(3 + i), lengths[i]), 12);
    absl::StatusOr<Completion> want = direct->GenerateSync(params);
    absl::StatusOr<Completion> got = routed->GenerateSync(params);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->worker, decode->address) << "prompt of " << lengths[i];
    EXPECT_EQ(TokensOf(got), TokensOf(want)) << "prompt of " << lengths[i];
    // The decode worker (--kv-transfer always by default) pulled every usable block.
    EXPECT_EQ(got->samples[0].usage.cached_prompt_tokens, (lengths[i] - 1) / 16 * 16)
        << "prompt of " << lengths[i];
  }
  EXPECT_EQ(Prefills(**router, "ok"), static_cast<double>(lengths.size()));
  EXPECT_EQ(Prefills(**router, "failed"), 0);

  // The prefill worker dies: the next requests are prefilled on the decode worker (a failed
  // prefill phase, or none once the router has ejected the worker), with the same tokens.
  ASSERT_EQ(::kill(prefill->process.pid(), SIGKILL), 0);
  for (size_t i = 0; i < lengths.size(); ++i) {
    const GenerateParams params = Greedy(Prompt(static_cast<TokenId>(50 + i), lengths[i]), 12);
    absl::StatusOr<Completion> want = direct->GenerateSync(params);
    absl::StatusOr<Completion> got = routed->GenerateSync(params);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->worker, decode->address);
    EXPECT_EQ(TokensOf(got), TokensOf(want)) << "prompt of " << lengths[i];
  }
  std::printf("after the prefill worker died: %.0f failed prefill phases\n",
              Prefills(**router, "failed"));
  (*router)->Shutdown();
}

}  // namespace
}  // namespace kvserve
