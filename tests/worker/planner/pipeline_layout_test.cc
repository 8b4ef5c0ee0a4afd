#include "worker/planner/pipeline_layout.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kvserve {
namespace {

// The stages as "first:count" pairs, for readable comparisons.
std::vector<std::string> Slices(const std::vector<StageLayers>& stages) {
  std::vector<std::string> out;
  for (const StageLayers& s : stages)
    out.push_back(std::to_string(s.first) + ":" + std::to_string(s.count));
  return out;
}

std::vector<std::string> Split(int num_layers, int pp, std::vector<int> counts = {}) {
  absl::StatusOr<std::vector<StageLayers>> stages = SplitLayers(num_layers, pp, counts);
  EXPECT_TRUE(stages.ok()) << stages.status();
  return stages.ok() ? Slices(*stages) : std::vector<std::string>{};
}

// The error message of a refused split ("" when it was not refused).
std::string SplitError(int num_layers, int pp, std::vector<int> counts = {}) {
  absl::StatusOr<std::vector<StageLayers>> stages = SplitLayers(num_layers, pp, counts);
  if (stages.ok()) return "";
  EXPECT_EQ(stages.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(stages.status().message());
}

using Strings = std::vector<std::string>;

TEST(SplitLayersTest, EvenSplitGivesTheExtraLayersToTheEarlierStages) {
  // DeepSeek-V3's 61 layers over 2 stages: 31 + 30.
  EXPECT_EQ(Split(61, 2), (Strings{"0:31", "31:30"}));
  // Llama-3.1-405B's 126 over 4: 126 = 4 × 31 + 2.
  EXPECT_EQ(Split(126, 4), (Strings{"0:32", "32:32", "64:31", "95:31"}));
  EXPECT_EQ(Split(126, 2), (Strings{"0:63", "63:63"}));
  EXPECT_EQ(Split(7, 3), (Strings{"0:3", "3:2", "5:2"}));
  EXPECT_EQ(Split(5, 5), (Strings{"0:1", "1:1", "2:1", "3:1", "4:1"}));
  EXPECT_EQ(Split(32, 1), (Strings{"0:32"}));
}

TEST(SplitLayersTest, ExplicitPartition) {
  EXPECT_EQ(Split(61, 2, {20, 41}), (Strings{"0:20", "20:41"}));
  EXPECT_EQ(Split(61, 3, {1, 30, 30}), (Strings{"0:1", "1:30", "31:30"}));
  EXPECT_EQ(Split(61, 1, {61}), (Strings{"0:61"}));
  absl::StatusOr<std::vector<StageLayers>> stages = SplitLayers(61, 2, std::vector<int>{30, 31});
  ASSERT_TRUE(stages.ok()) << stages.status();
  EXPECT_EQ((*stages)[1].end(), 61);
  EXPECT_EQ(DescribeStageLayers(*stages), "30+31");
}

TEST(SplitLayersTest, RefusalsNameTheNumbers) {
  EXPECT_EQ(SplitError(61, 0), "--pp must be >= 1, got 0");
  EXPECT_EQ(SplitError(61, -2), "--pp must be >= 1, got -2");
  EXPECT_EQ(SplitError(3, 4), "--pp 4 needs at least one layer per stage; the model has 3 layers");
  EXPECT_EQ(SplitError(61, 2, {61}), "--pp-layers lists 1 stages; --pp is 2");
  EXPECT_EQ(SplitError(61, 2, {30, 30, 1}), "--pp-layers lists 3 stages; --pp is 2");
  EXPECT_EQ(SplitError(61, 2, {30, 30}),
            "--pp-layers 30,30 adds up to 60 layers; the model has 61");
  EXPECT_EQ(SplitError(61, 2, {31, 31}),
            "--pp-layers 31,31 adds up to 62 layers; the model has 61");
  EXPECT_EQ(SplitError(61, 2, {61, 0}),
            "--pp-layers: stage 1 gets 0 layers; every stage needs at least 1");
  EXPECT_EQ(SplitError(61, 2, {62, -1}),
            "--pp-layers: stage 1 gets -1 layers; every stage needs at least 1");
}

TEST(ParseStageLayerCountsTest, ParsesCommaSeparatedCounts) {
  EXPECT_EQ(*ParseStageLayerCounts("31,30"), (std::vector<int>{31, 30}));
  EXPECT_EQ(*ParseStageLayerCounts(" 31 , 30 "), (std::vector<int>{31, 30}));
  EXPECT_EQ(*ParseStageLayerCounts("126"), (std::vector<int>{126}));
  EXPECT_TRUE(ParseStageLayerCounts("")->empty());
  EXPECT_TRUE(ParseStageLayerCounts("  ")->empty());
}

TEST(ParseStageLayerCountsTest, RefusesBadEntries) {
  for (const char* text : {"31,x", "31,,30", "31,30,", "0,61", "-1,62", "31.5,29.5"}) {
    absl::StatusOr<std::vector<int>> counts = ParseStageLayerCounts(text);
    ASSERT_FALSE(counts.ok()) << text;
    EXPECT_EQ(counts.status().code(), absl::StatusCode::kInvalidArgument) << text;
  }
  EXPECT_EQ(ParseStageLayerCounts("31,x").status().message(),
            "--pp-layers: 'x' is not a positive layer count (expected e.g. 31,30)");
  EXPECT_EQ(ParseStageLayerCounts("0,61").status().message(),
            "--pp-layers: '0' is not a positive layer count (expected e.g. 31,30)");
}

}  // namespace
}  // namespace kvserve
