// Structured log lines: exact text and JSON renderings, escaping, the format flag and the sink.

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/logging/logging.h"
#include "gtest/gtest.h"

namespace kvserve::logging {
namespace {

const absl::Time kTime = absl::FromUnixMillis(1735787045678);  // 2025-01-02T03:04:05.678Z

TEST(LoggingTest, TextLine) {
  EXPECT_EQ(FormatLogLine(LogFormat::kText, kTime, LogLevel::kInfo, "router", "request routed",
                          {{"request_id", "rtr-1"}, {"worker", "h:1"}, {"prompt_tokens", 12}}),
            "2025-01-02T03:04:05.678Z INFO router request routed request_id=rtr-1 worker=h:1 "
            "prompt_tokens=12");
  // Values with spaces, quotes or '=' are quoted; empty ones too.
  EXPECT_EQ(FormatLogLine(LogFormat::kText, kTime, LogLevel::kWarning, "worker", "x",
                          {{"error", "bad \"a=b\""}, {"empty", ""}}),
            "2025-01-02T03:04:05.678Z WARN worker x error=\"bad \\\"a=b\\\"\" empty=\"\"");
}

TEST(LoggingTest, JsonLine) {
  EXPECT_EQ(FormatLogLine(LogFormat::kJson, kTime, LogLevel::kError, "worker", "generate \"x\"",
                          {{"request_id", "r\n1"}, {"tokens", 3}, {"seconds", 0.25}}),
            "{\"ts\":\"2025-01-02T03:04:05.678Z\",\"level\":\"error\",\"component\":\"worker\","
            "\"msg\":\"generate \\\"x\\\"\",\"request_id\":\"r\\n1\",\"tokens\":3,"
            "\"seconds\":0.25}");
  EXPECT_EQ(FormatLogLine(LogFormat::kJson, kTime, LogLevel::kDebug, "c", "m", {{"k", "\x01"}}),
            "{\"ts\":\"2025-01-02T03:04:05.678Z\",\"level\":\"debug\",\"component\":\"c\","
            "\"msg\":\"m\",\"k\":\"\\u0001\"}");
}

TEST(LoggingTest, ParseFormat) {
  EXPECT_EQ(*ParseLogFormat("text"), LogFormat::kText);
  EXPECT_EQ(*ParseLogFormat("json"), LogFormat::kJson);
  absl::StatusOr<LogFormat> bad = ParseLogFormat("yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("log-format"), std::string::npos);
}

TEST(LoggingTest, SinkReceivesLinesInTheChosenFormat) {
  std::vector<std::string> lines;
  SetLogSink([&](std::string_view line) { lines.emplace_back(line); });
  SetLogFormat(LogFormat::kJson);
  Log(LogLevel::kInfo, "worker", "hello", {{"request_id", "abc"}});
  SetLogFormat(LogFormat::kText);
  Log(LogLevel::kInfo, "worker", "hello", {{"request_id", "abc"}});
  SetLogSink(nullptr);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].front(), '{');
  EXPECT_NE(lines[0].find("\"request_id\":\"abc\""), std::string::npos);
  EXPECT_NE(lines[1].find(" INFO worker hello request_id=abc"), std::string::npos);
}

}  // namespace
}  // namespace kvserve::logging
