#include "worker/engine/sampling_params.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kvserve {
namespace {

constexpr int kVocab = 100;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(SamplingParamsTest, DefaultsAreValid) { EXPECT_TRUE(SamplingParams{}.Validate(kVocab).ok()); }

TEST(SamplingParamsTest, BoundaryValuesAreValid) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.top_p = 1.0f;
  p.top_k = -1;
  p.min_p = 1.0f;
  p.repetition_penalty = 0.01f;
  p.presence_penalty = -2.0f;
  p.frequency_penalty = 2.0f;
  p.max_tokens = 1;
  p.stop = {"x"};
  p.stop_token_ids = {0, kVocab - 1};
  p.logprobs = kMaxLogprobs;
  EXPECT_TRUE(p.Validate(kVocab).ok());
  p.top_k = 1000000;  // Larger than the vocabulary: keeps everything, like vLLM.
  p.logprobs = 0;
  EXPECT_TRUE(p.Validate(kVocab).ok());
}

struct BadCase {
  std::string name;
  std::function<void(SamplingParams&)> mutate;
  /// Substring the error message must contain (the field, and for floats the bad value).
  std::string expected;
};

class SamplingParamsBadTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(SamplingParamsBadTest, RejectsWithFieldName) {
  SamplingParams p;
  GetParam().mutate(p);
  const absl::Status status = p.Validate(kVocab);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find(GetParam().expected), std::string::npos) << status.message();
}

INSTANTIATE_TEST_SUITE_P(
    Table, SamplingParamsBadTest,
    ::testing::Values(
        BadCase{"TemperatureNegative", [](SamplingParams& p) { p.temperature = -0.5f; },
                "temperature must be a finite number >= 0, got -0.5"},
        BadCase{"TemperatureNaN", [](SamplingParams& p) { p.temperature = kNaN; }, "temperature"},
        BadCase{"TemperatureInf", [](SamplingParams& p) { p.temperature = kInf; }, "temperature"},
        BadCase{"TopPAboveOne", [](SamplingParams& p) { p.top_p = 1.5f; },
                "top_p must be in (0, 1], got 1.5"},
        BadCase{"TopPZero", [](SamplingParams& p) { p.top_p = 0.0f; }, "top_p"},
        BadCase{"TopPNaN", [](SamplingParams& p) { p.top_p = kNaN; }, "top_p"},
        BadCase{"TopKBelowMinusOne", [](SamplingParams& p) { p.top_k = -2; }, "top_k"},
        BadCase{"MinPNegative", [](SamplingParams& p) { p.min_p = -0.1f; }, "min_p"},
        BadCase{"MinPAboveOne", [](SamplingParams& p) { p.min_p = 1.01f; }, "min_p"},
        BadCase{"MinPNaN", [](SamplingParams& p) { p.min_p = kNaN; }, "min_p"},
        BadCase{"RepetitionZero", [](SamplingParams& p) { p.repetition_penalty = 0.0f; },
                "repetition_penalty"},
        BadCase{"RepetitionNaN", [](SamplingParams& p) { p.repetition_penalty = kNaN; },
                "repetition_penalty"},
        BadCase{"RepetitionInf", [](SamplingParams& p) { p.repetition_penalty = kInf; },
                "repetition_penalty"},
        BadCase{"PresenceTooBig", [](SamplingParams& p) { p.presence_penalty = 2.5f; },
                "presence_penalty"},
        BadCase{"PresenceNaN", [](SamplingParams& p) { p.presence_penalty = kNaN; },
                "presence_penalty"},
        BadCase{"FrequencyTooSmall", [](SamplingParams& p) { p.frequency_penalty = -2.01f; },
                "frequency_penalty"},
        BadCase{"FrequencyNaN", [](SamplingParams& p) { p.frequency_penalty = kNaN; },
                "frequency_penalty"},
        BadCase{"MaxTokensZero", [](SamplingParams& p) { p.max_tokens = 0; }, "max_tokens"},
        BadCase{"EmptyStopString",
                [](SamplingParams& p) {
                  p.stop = {"a", ""};
                },
                "stop[1]"},
        BadCase{"StopTokenTooBig",
                [](SamplingParams& p) {
                  p.stop_token_ids = {3, kVocab};
                },
                "stop_token_ids[1]"},
        BadCase{"StopTokenNegative", [](SamplingParams& p) { p.stop_token_ids = {-1}; },
                "stop_token_ids[0]"},
        BadCase{"LogprobsTooSmall", [](SamplingParams& p) { p.logprobs = -2; }, "logprobs"},
        BadCase{"LogprobsTooBig", [](SamplingParams& p) { p.logprobs = kMaxLogprobs + 1; },
                "logprobs"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; });

TEST(SamplingParamsTest, RejectsNonPositiveVocab) {
  const absl::Status status = SamplingParams{}.Validate(0);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("vocab_size"), std::string::npos);
}

TEST(SamplingParamsTest, GreedyBelowThreshold) {
  SamplingParams p;
  p.temperature = 0.0f;
  EXPECT_TRUE(p.IsGreedy());
  p.temperature = 1e-6f;
  EXPECT_TRUE(p.IsGreedy());
  p.temperature = 1e-3f;
  EXPECT_FALSE(p.IsGreedy());
}

}  // namespace
}  // namespace kvserve
