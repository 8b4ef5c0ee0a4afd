#include "worker/engine/stop_checker.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace kvserve {
namespace {

constexpr TokenId kEos = 2;
constexpr TokenId kText = 10;  // Any ordinary token; the checker only looks at the text.

StopChecker Make(const SamplingParams& params, int32_t prompt_tokens = 5,
                 int32_t max_total_tokens = 0) {
  absl::StatusOr<StopChecker> checker =
      StopChecker::Create(params, {.eos_token_ids = {kEos, 3},
                                   .prompt_tokens = prompt_tokens,
                                   .max_total_tokens = max_total_tokens});
  EXPECT_TRUE(checker.ok()) << checker.status();
  return std::move(checker).value();
}

SamplingParams WithStops(std::vector<std::string> stop, int32_t max_tokens = 100) {
  SamplingParams params;
  params.stop = std::move(stop);
  params.max_tokens = max_tokens;
  return params;
}

/// Feeds text pieces as ordinary tokens; returns what was released per piece.
std::vector<std::string> Feed(StopChecker& checker, const std::vector<std::string>& pieces) {
  std::vector<std::string> released;
  for (const std::string& piece : pieces) released.push_back(checker.Append(kText, piece).text);
  return released;
}

TEST(StopCheckerTest, StopStringInsideOneToken) {
  StopChecker checker = Make(WithStops({"\n\n"}));
  EXPECT_EQ(checker.Append(kText, "Hello").text, "Hello");
  const StopDecision d = checker.Append(kText, " world\n\nmore");
  EXPECT_EQ(d.finish_reason, FinishReason::kStop);
  EXPECT_EQ(FinishReasonName(d.finish_reason), "stop");
  EXPECT_EQ(d.text, " world");
  EXPECT_EQ(d.stop_string, "\n\n");
  EXPECT_EQ(d.stop_token_id, kNoToken);
}

TEST(StopCheckerTest, StopStringAcrossTokens) {
  StopChecker checker = Make(WithStops({"END"}));
  EXPECT_EQ(checker.Append(kText, "abc E").text, "abc ");
  EXPECT_EQ(checker.held_back(), "E");
  StopDecision d = checker.Append(kText, "N");
  EXPECT_EQ(d.text, "");
  EXPECT_FALSE(d.finished());
  EXPECT_EQ(checker.held_back(), "EN");
  d = checker.Append(kText, "D tail");
  EXPECT_EQ(d.finish_reason, FinishReason::kStop);
  EXPECT_EQ(d.text, "");
  EXPECT_EQ(d.stop_string, "END");
}

TEST(StopCheckerTest, HeldPrefixIsReleasedWhenItIsNotAStop) {
  StopChecker checker = Make(WithStops({"END"}));
  EXPECT_EQ(Feed(checker, {"x E", "N", "d!"}), (std::vector<std::string>{"x ", "", "ENd!"}));
  EXPECT_EQ(checker.held_back(), "");
  EXPECT_EQ(checker.finish_reason(), FinishReason::kNone);
}

TEST(StopCheckerTest, OverlappingPrefixesHoldOnlyWhatCanStillMatch) {
  StopChecker checker = Make(WithStops({"aab"}));
  EXPECT_EQ(Feed(checker, {"a", "a", "a"}), (std::vector<std::string>{"", "", "a"}));
  const StopDecision d = checker.Append(kText, "b");
  EXPECT_EQ(d.finish_reason, FinishReason::kStop);
  EXPECT_EQ(d.text, "");  // Output is "a": the stop string "aab" is cut off.
}

TEST(StopCheckerTest, IncludeStopStringInOutput) {
  SamplingParams params = WithStops({"END"});
  params.include_stop_str_in_output = true;
  StopChecker checker = Make(params);
  EXPECT_EQ(checker.Append(kText, "abc EN").text, "abc ");
  const StopDecision d = checker.Append(kText, "D!!");
  EXPECT_EQ(d.finish_reason, FinishReason::kStop);
  EXPECT_EQ(d.text, "END");
}

TEST(StopCheckerTest, EarliestMatchWins) {
  // Listed second but occurs first.
  StopChecker checker = Make(WithStops({"xyz", "b"}));
  StopDecision d = checker.Append(kText, "ab xyz");
  EXPECT_EQ(d.text, "a");
  EXPECT_EQ(d.stop_string, "b");

  // "bc" completes before "abcd" does, whether the text comes in one piece or several.
  StopChecker whole = Make(WithStops({"abcd", "bc"}));
  d = whole.Append(kText, "zabcd");
  EXPECT_EQ(d.text, "za");
  EXPECT_EQ(d.stop_string, "bc");
  StopChecker pieces = Make(WithStops({"abcd", "bc"}));
  EXPECT_EQ(Feed(pieces, {"z", "ab", "c"}), (std::vector<std::string>{"z", "", "a"}));
  EXPECT_EQ(pieces.finish_reason(), FinishReason::kStop);

  // Same end: the longer (earlier-starting) one wins.
  StopChecker same_end = Make(WithStops({"cd", "bcd"}));
  d = same_end.Append(kText, "abcde");
  EXPECT_EQ(d.text, "a");
  EXPECT_EQ(d.stop_string, "bcd");
}

TEST(StopCheckerTest, EosStopsAndItsTextIsNotEmitted) {
  StopChecker checker = Make(WithStops({"END"}));
  EXPECT_EQ(checker.Append(kText, "hi E").text, "hi ");
  const StopDecision d = checker.Append(kEos, "</s>");
  EXPECT_EQ(d.finish_reason, FinishReason::kStop);
  EXPECT_EQ(d.text, "E");  // The held prefix is released, the EOS text is not.
  EXPECT_EQ(d.stop_string, "");
  EXPECT_EQ(d.stop_token_id, kNoToken);
  EXPECT_EQ(checker.num_output_tokens(), 2);

  // Every model EOS id stops.
  StopChecker other = Make(SamplingParams{});
  EXPECT_EQ(other.Append(3, "<|eot|>").finish_reason, FinishReason::kStop);
}

TEST(StopCheckerTest, IgnoreEosRunsToMaxTokens) {
  SamplingParams params;
  params.ignore_eos = true;
  params.max_tokens = 3;
  StopChecker checker = Make(params);
  StopDecision d = checker.Append(kEos, "</s>");
  EXPECT_FALSE(d.finished());
  EXPECT_EQ(d.text, "");  // EOS text is never emitted.
  EXPECT_EQ(checker.Append(kText, "a").text, "a");
  d = checker.Append(kEos, "</s>");
  EXPECT_EQ(d.finish_reason, FinishReason::kLength);
  EXPECT_EQ(d.text, "");
}

TEST(StopCheckerTest, StopTokenIds) {
  SamplingParams params;
  params.stop_token_ids = {7};
  StopChecker checker = Make(params);
  EXPECT_EQ(checker.Append(kText, "x").text, "x");
  StopDecision d = checker.Append(7, "<stop>");
  EXPECT_EQ(d.finish_reason, FinishReason::kStop);
  EXPECT_EQ(d.stop_token_id, 7);
  EXPECT_EQ(d.text, "");

  params.include_stop_str_in_output = true;
  StopChecker included = Make(params);
  d = included.Append(7, "<stop>");
  EXPECT_EQ(d.text, "<stop>");

  // stop_token_ids apply even with ignore_eos.
  params.ignore_eos = true;
  params.stop_token_ids = {kEos};
  StopChecker eos_as_stop = Make(params);
  EXPECT_EQ(eos_as_stop.Append(kEos, "</s>").stop_token_id, kEos);
}

TEST(StopCheckerTest, MaxTokensReleasesHeldText) {
  StopChecker checker = Make(WithStops({"END"}, /*max_tokens=*/3));
  EXPECT_EQ(Feed(checker, {"a", "b"}), (std::vector<std::string>{"a", "b"}));
  const StopDecision d = checker.Append(kText, "cEN");
  EXPECT_EQ(d.finish_reason, FinishReason::kLength);
  EXPECT_EQ(FinishReasonName(d.finish_reason), "length");
  EXPECT_EQ(d.text, "cEN");
}

TEST(StopCheckerTest, StopStringBeatsLengthOnTheSameToken) {
  StopChecker checker = Make(WithStops({"."}, /*max_tokens=*/1));
  const StopDecision d = checker.Append(kText, "Hi. there");
  EXPECT_EQ(d.finish_reason, FinishReason::kStop);
  EXPECT_EQ(d.text, "Hi");
}

TEST(StopCheckerTest, ContextFullIsLength) {
  StopChecker checker = Make(SamplingParams{}, /*prompt_tokens=*/10, /*max_total_tokens=*/12);
  EXPECT_FALSE(checker.Append(kText, "a").finished());
  EXPECT_EQ(checker.Append(kText, "b").finish_reason, FinishReason::kLength);
}

TEST(StopCheckerTest, AfterFinishNothingMoreIsEmitted) {
  StopChecker checker = Make(WithStops({"!"}));
  EXPECT_TRUE(checker.Append(kText, "a!b").finished());
  const StopDecision d = checker.Append(kText, "more");
  EXPECT_EQ(d.finish_reason, FinishReason::kStop);
  EXPECT_EQ(d.text, "");
  EXPECT_EQ(checker.num_output_tokens(), 1);
}

TEST(StopCheckerTest, MultiByteStopString) {
  StopChecker checker = Make(WithStops({"。\n"}));
  EXPECT_EQ(Feed(checker, {"你好", "。"}), (std::vector<std::string>{"你好", ""}));
  const StopDecision d = checker.Append(kText, "\n再见");
  EXPECT_EQ(d.finish_reason, FinishReason::kStop);
  EXPECT_EQ(d.text, "");
}

/// Reference: the output is the text up to the first point where any stop string is complete
/// (on a tie, the longer one), found by brute force over end positions.
std::string ReferenceOutput(const std::string& text, const std::vector<std::string>& stops) {
  for (size_t end = 1; end <= text.size(); ++end) {
    size_t best_start = std::string::npos;
    for (const std::string& stop : stops) {
      if (stop.size() <= end && text.compare(end - stop.size(), stop.size(), stop) == 0) {
        best_start = std::min(best_start, end - stop.size());
      }
    }
    if (best_start != std::string::npos) return text.substr(0, best_start);
  }
  return text;
}

TEST(StopCheckerTest, AnyChunkingGivesTheReferenceOutput) {
  const std::vector<std::string> stops = {"abc", "bca", "cc", "aaab"};
  uint64_t state = 12345;
  auto next = [&state](uint64_t bound) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<size_t>((state >> 33) % bound);
  };
  for (int trial = 0; trial < 500; ++trial) {
    std::string text;
    const size_t length = 1 + next(30);
    for (size_t i = 0; i < length; ++i) text += static_cast<char>('a' + next(3));
    StopChecker checker = Make(WithStops(stops, /*max_tokens=*/1000));
    std::string released;
    size_t pos = 0;
    while (pos < text.size() && checker.finish_reason() == FinishReason::kNone) {
      const size_t n = std::min(text.size() - pos, 1 + next(4));
      released += checker.Append(kText, text.substr(pos, n)).text;
      pos += n;
    }
    // Text that never met a stop string is released when the sequence ends (here by EOS).
    released += checker.Append(kEos, "").text;
    ASSERT_EQ(released, ReferenceOutput(text, stops)) << "text " << text;
  }
}

TEST(StopCheckerTest, CreateRejectsBadOptions) {
  absl::StatusOr<StopChecker> c = StopChecker::Create(WithStops({"a", ""}), {});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("stop[1]"), std::string::npos);

  c = StopChecker::Create(SamplingParams{}, {.prompt_tokens = 8, .max_total_tokens = 8});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("max_total_tokens"), std::string::npos);

  SamplingParams zero;
  zero.max_tokens = 0;
  EXPECT_FALSE(StopChecker::Create(zero, {}).ok());
}

}  // namespace
}  // namespace kvserve
