// Exact choices of each routing policy on hand-built worker views.

#include "router/routing_policy.h"

#include <vector>

#include "gtest/gtest.h"

namespace kvserve {
namespace {

// A worker holding `matched_blocks` of the request's blocks, all in its device pool unless
// `device_blocks` says fewer (the rest in its host or disk tier).
WorkerView View(int in_flight, int waiting, int matched_blocks, int capacity = 10,
                int device_blocks = -1) {
  WorkerView view;
  view.in_flight = in_flight;
  view.load.waiting_requests = waiting;
  view.matched_blocks = matched_blocks;
  view.matched_device_blocks = device_blocks < 0 ? matched_blocks : device_blocks;
  view.capacity = capacity;
  return view;
}

std::unique_ptr<RoutingPolicy> Make(std::string_view name, RoutingPolicyConfig config = {}) {
  absl::StatusOr<std::unique_ptr<RoutingPolicy>> policy =
      RoutingPolicyRegistry::Default().Create(name, config);
  EXPECT_TRUE(policy.ok()) << policy.status();
  return *std::move(policy);
}

RoutingRequest Request(int prompt_tokens, int block_size = 16) {
  RoutingRequest request;
  request.prompt_tokens = prompt_tokens;
  request.block_size = block_size;
  return request;
}

TEST(RoutingPolicyRegistryTest, KnowsTheBuiltInsAndRejectsUnknownNames) {
  EXPECT_EQ(RoutingPolicyRegistry::Default().Names(),
            (std::vector<std::string>{"kv_aware", "least_loaded", "round_robin"}));
  absl::StatusOr<std::unique_ptr<RoutingPolicy>> bad =
      RoutingPolicyRegistry::Default().Create("random", {});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'random'"), std::string_view::npos);
  EXPECT_NE(bad.status().message().find("kv_aware"), std::string_view::npos);
  EXPECT_EQ(Make("kv_aware")->name(), "kv_aware");
  EXPECT_EQ(kDefaultRoutingPolicy, "kv_aware");
}

TEST(RoutingPolicyRegistryTest, RegistersCustomPolicies) {
  RoutingPolicyRegistry registry;
  registry.Register("last", [](const RoutingPolicyConfig& c) { return NewRoundRobinPolicy(c); });
  EXPECT_TRUE(registry.Create("last", {}).ok());
  EXPECT_FALSE(registry.Create("kv_aware", {}).ok());
}

TEST(RoundRobinTest, CyclesThroughCandidatesIgnoringLoadAndCache) {
  auto policy = Make("round_robin");
  const std::vector<WorkerView> views = {View(9, 9, 0), View(0, 0, 5), View(0, 0, 0)};
  std::vector<size_t> picks;
  for (int i = 0; i < 7; ++i) picks.push_back(policy->Choose(Request(32), views).index);
  EXPECT_EQ(picks, (std::vector<size_t>{0, 1, 2, 0, 1, 2, 0}));
}

TEST(LeastLoadedTest, PicksSmallestInFlightPlusWaitingFirstOnTies) {
  auto policy = Make("least_loaded");
  // Loads 5, 3, 3, 4: the first of the two 3s.
  const std::vector<WorkerView> views = {View(5, 0, 9), View(1, 2, 0), View(3, 0, 0),
                                         View(0, 4, 0)};
  EXPECT_EQ(policy->Choose(Request(32), views).index, 1u);
  // Waiting requests in the worker's own queue count as load.
  const std::vector<WorkerView> queued = {View(0, 6, 0), View(2, 0, 0)};
  EXPECT_EQ(policy->Choose(Request(32), queued).index, 1u);
}

TEST(KvAwareTest, PrefersTheLongestCachedPrefix) {
  auto policy = Make("kv_aware");
  // Prompt of 64 tokens = 4 blocks; worker 2 holds 3 of them.
  const std::vector<WorkerView> views = {View(0, 0, 1), View(0, 0, 0), View(0, 0, 3)};
  EXPECT_EQ(policy->Choose(Request(64), views).index, 2u);
}

TEST(KvAwareTest, TradesCacheHitsAgainstLoadByTheCostFunction) {
  RoutingPolicyConfig config;
  config.kv_aware.load_weight = 0.5;
  config.kv_aware.balance_threshold = -1;  // guard off: only the score decides
  auto policy = Make("kv_aware", config);
  // Worker 0: hit 4/4 = 1.0, load 8 of 10 -> 1 - 0.5 * 0.8 = 0.6.
  // Worker 1: hit 0, load 0 -> 0. Worker 0 wins.
  EXPECT_EQ(policy->Choose(Request(64), std::vector{View(8, 0, 4), View(0, 0, 0)}).index, 0u);
  // Worker 0: hit 1/4 = 0.25, load 7 -> 0.25 - 0.35 = -0.1; worker 1: 0 - 0.05 = -0.05.
  EXPECT_EQ(policy->Choose(Request(64), std::vector{View(7, 0, 1), View(1, 0, 0)}).index, 1u);
  // Worker 0: hit 0.5, load 10 -> 0; worker 1: hit 0.25, load 2 -> 0.15. Worker 1 wins.
  EXPECT_EQ(policy->Choose(Request(64), std::vector{View(4, 6, 2), View(2, 0, 1)}).index, 1u);
}

TEST(KvAwareTest, BlocksInALowerTierCountLessThanOnTheDevice) {
  std::unique_ptr<RoutingPolicy> policy = Make("kv_aware");
  // 4 blocks on the host tier (worth 3.2) against 4 on the device: the device wins.
  std::vector<WorkerView> views = {View(0, 0, 4, 10, 0), View(0, 0, 4)};
  EXPECT_EQ(policy->Choose(Request(64), views).index, 1u);
  // 4 on the host tier against 3 on the device: restoring 4 beats recomputing 1 of them.
  views = {View(0, 0, 3), View(0, 0, 4, 10, 0)};
  EXPECT_EQ(policy->Choose(Request(64), views).index, 1u);
  // With the tiers weighted 0.5, 4 host blocks (2) lose to 3 device blocks.
  RoutingPolicyConfig config;
  config.kv_aware.lower_tier_weight = 0.5;
  EXPECT_EQ(Make("kv_aware", config)->Choose(Request(64), views).index, 0u);
}

// `view` with `pullable` leading blocks held by some other worker.
WorkerView Pullable(WorkerView view, int pullable) {
  view.pullable_blocks = pullable;
  return view;
}

TEST(KvAwareTest, BlocksAnotherWorkerHoldsCountAtTheTransferWeight) {
  RoutingPolicyConfig config;
  config.kv_aware.balance_threshold = -1;  // guard off: only the score decides
  auto policy = Make("kv_aware", config);
  // Prompt of 64 tokens = 4 blocks. Worker 0 holds them all but is busy: load 12 of 10 ->
  // 1 - 0.5 * 1.2 = 0.4. Worker 1 holds nothing and is idle, but can pull the 4 blocks from
  // worker 0: 0.5 * 4 / 4 = 0.5. The idle worker wins.
  std::vector<WorkerView> views = {Pullable(View(8, 4, 4), 0), Pullable(View(0, 0, 0), 4)};
  EXPECT_EQ(policy->Choose(Request(64), views).index, 1u);
  // Without the transfer weight the idle worker's score is 0 and the busy holder keeps it.
  config.kv_aware.transfer_weight = 0;
  auto no_transfer = Make("kv_aware", config);
  EXPECT_EQ(no_transfer->Choose(Request(64), views).index, 0u);
}

TEST(KvAwareTest, OnlyBlocksBeyondTheWorkersOwnRunArePulled) {
  auto policy = Make("kv_aware");
  // 4 blocks. Worker 0: 2 of its own + 2 pulled at 0.5 = 3 (0.75). Worker 1: 3 of its own,
  // nothing longer elsewhere to pull (0.75 less its load 0.05 = 0.7). Worker 0 wins.
  std::vector<WorkerView> views = {Pullable(View(0, 0, 2), 4), Pullable(View(1, 0, 3), 2)};
  EXPECT_EQ(policy->Choose(Request(64), views).index, 0u);
  // A shorter run elsewhere counts neither way: worker 0 holds 3, another worker 2 (0.75 - 0.05
  // = 0.7); worker 1 holds 2 and can pull a third (2.5 blocks: 0.625). Worker 0 wins.
  views = {Pullable(View(1, 0, 3), 2), Pullable(View(0, 0, 2), 3)};
  EXPECT_EQ(policy->Choose(Request(64), views).index, 0u);
  // A pulled block is worth less than one restored from the worker's own host tier (0.8).
  views = {Pullable(View(0, 0, 0), 4), Pullable(View(0, 0, 4, 10, 0), 4)};
  EXPECT_EQ(policy->Choose(Request(64), views).index, 1u);
}

TEST(TransferHintTest, OnlyKvAwareWithATransferWeightWantsThem) {
  EXPECT_TRUE(Make("kv_aware")->wants_kv_transfer_hints());
  RoutingPolicyConfig config;
  config.kv_aware.transfer_weight = 0;
  EXPECT_FALSE(Make("kv_aware", config)->wants_kv_transfer_hints());
  EXPECT_FALSE(Make("round_robin")->wants_kv_transfer_hints());
  EXPECT_FALSE(Make("least_loaded")->wants_kv_transfer_hints());
}

TEST(KvAwareTest, EqualScoresGoToTheLowerLoad) {
  RoutingPolicyConfig config;
  config.kv_aware.load_weight = 0;  // scores are the hit ratios alone: exact ties
  auto policy = Make("kv_aware", config);
  EXPECT_EQ(
      policy->Choose(Request(64), std::vector{View(3, 0, 2), View(1, 0, 2), View(2, 0, 2)}).index,
      1u);
}

TEST(KvAwareTest, HitRatioIsCappedAndZeroForShortPrompts) {
  auto policy = Make("kv_aware");
  // A 10-token prompt has no full block: no hits, least loaded wins.
  EXPECT_EQ(policy->Choose(Request(10), std::vector{View(2, 0, 0), View(1, 0, 0)}).index, 1u);
  // The hit ratio cannot exceed 1, so 5 "matched" blocks of a 64-token prompt weigh as 4.
  RoutingPolicyConfig config;
  config.kv_aware.balance_threshold = -1;
  auto capped = Make("kv_aware", config);
  EXPECT_EQ(capped->Choose(Request(64), std::vector{View(2, 0, 5), View(0, 0, 4)}).index, 1u);
}

TEST(KvAwareTest, BalanceGuardFallsBackToLeastLoaded) {
  RoutingPolicyConfig config;
  config.kv_aware.load_weight = 0.1;
  config.kv_aware.balance_threshold = 3;
  auto policy = Make("kv_aware", config);
  // Worker 0 holds the whole prompt. Load difference 3 = threshold: the cache still wins.
  EXPECT_EQ(policy->Choose(Request(64), std::vector{View(3, 0, 4), View(0, 0, 0)}).index, 0u);
  // Load difference 4 > 3: the guard sends the request to the least loaded worker.
  EXPECT_EQ(policy->Choose(Request(64), std::vector{View(3, 1, 4), View(0, 0, 0)}).index, 1u);
  // The guard picks the least loaded, not merely another worker.
  EXPECT_EQ(
      policy->Choose(Request(64), std::vector{View(5, 0, 4), View(2, 0, 0), View(1, 0, 0)}).index,
      2u);
}

TEST(KvAwareTest, DeterministicAcrossCalls) {
  auto policy = Make("kv_aware");
  const std::vector<WorkerView> views = {View(1, 0, 2), View(1, 0, 2), View(0, 0, 0)};
  const size_t first = policy->Choose(Request(64), views).index;
  for (int i = 0; i < 5; ++i) EXPECT_EQ(policy->Choose(Request(64), views).index, first);
  EXPECT_EQ(first, 0u);
}

}  // namespace
}  // namespace kvserve
