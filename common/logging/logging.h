#ifndef KVSERVE_COMMON_LOGGING_LOGGING_H_
#define KVSERVE_COMMON_LOGGING_LOGGING_H_

// Structured logs: one line per event, either human-readable text or one JSON object per line
// (for log collectors), chosen once per process with --log-format. Every line carries a
// timestamp, a level, the component ("worker", "router") and a message, then key/value fields;
// a request's lines carry its `request_id` field in both the router and the worker.
//
//   text: 2025-01-02T03:04:05.678Z INFO router request routed request_id=rtr-1 worker=h:1
//   json: {"ts":"2025-01-02T03:04:05.678Z","level":"info","component":"router",
//          "msg":"request routed","request_id":"rtr-1","worker":"h:1"}

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvserve::logging {

/// How log lines are written.
enum class LogFormat { kText, kJson };
/// Severity of a line.
enum class LogLevel { kDebug, kInfo, kWarning, kError };

/// "text" or "json"; INVALID_ARGUMENT naming --log-format otherwise.
absl::StatusOr<LogFormat> ParseLogFormat(std::string_view name);

/// One key/value of a line. Numbers stay numbers in JSON; strings are quoted and escaped.
struct LogField {
  LogField(std::string_view k, std::string_view v) : key(k), value(v), quoted(true) {}
  LogField(std::string_view k, const char* v) : key(k), value(v), quoted(true) {}
  LogField(std::string_view k, const std::string& v) : key(k), value(v), quoted(true) {}
  LogField(std::string_view k, int64_t v);
  LogField(std::string_view k, int v) : LogField(k, static_cast<int64_t>(v)) {}
  LogField(std::string_view k, double v);

  std::string key;
  std::string value;
  /// False for numbers.
  bool quoted;
};

/// One formatted line, without its trailing newline. Pure: for tests and sinks.
std::string FormatLogLine(LogFormat format, absl::Time time, LogLevel level,
                          std::string_view component, std::string_view message,
                          std::initializer_list<LogField> fields);

/// The process-wide format (text until set). Set it once at start-up.
void SetLogFormat(LogFormat format);
LogFormat GetLogFormat();
/// Sends every line to `sink` instead of stderr (tests); an empty function restores stderr.
/// The sink is called under the logger's lock, one line at a time.
void SetLogSink(std::function<void(std::string_view line)> sink);

/// Writes one line in the process-wide format. Thread-safe; lines never interleave.
void Log(LogLevel level, std::string_view component, std::string_view message,
         std::initializer_list<LogField> fields = {});

}  // namespace kvserve::logging

#endif  // KVSERVE_COMMON_LOGGING_LOGGING_H_
