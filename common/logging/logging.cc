#include "common/logging/logging.h"

#include <atomic>
#include <cstdio>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvserve::logging {
namespace {

std::atomic<LogFormat> g_format{LogFormat::kText};

std::mutex& SinkMutex() {
  static std::mutex mu;
  return mu;
}

std::function<void(std::string_view)>& Sink() {
  static std::function<void(std::string_view)> sink;
  return sink;
}

std::string_view LevelName(LogLevel level, bool upper) {
  switch (level) {
    case LogLevel::kDebug:
      return upper ? "DEBUG" : "debug";
    case LogLevel::kInfo:
      return upper ? "INFO" : "info";
    case LogLevel::kWarning:
      return upper ? "WARN" : "warning";
    case LogLevel::kError:
      return upper ? "ERROR" : "error";
  }
  return "info";
}

void AppendJsonString(std::string* out, std::string_view s) {
  out->push_back('"');
  for (const char c : s) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(out, "\\u%04x", static_cast<unsigned char>(c));
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

// Text values are bare unless they contain a space, a quote, '=' or a control character.
void AppendTextValue(std::string* out, std::string_view s) {
  bool plain = !s.empty();
  for (const char c : s) {
    if (c == ' ' || c == '"' || c == '=' || static_cast<unsigned char>(c) < 0x20) plain = false;
  }
  if (plain) {
    out->append(s);
  } else {
    AppendJsonString(out, s);
  }
}

}  // namespace

absl::StatusOr<LogFormat> ParseLogFormat(std::string_view name) {
  if (name == "text") return LogFormat::kText;
  if (name == "json") return LogFormat::kJson;
  return absl::InvalidArgumentError(
      absl::StrCat("log-format: expected 'text' or 'json', got '", std::string(name), "'"));
}

LogField::LogField(std::string_view k, int64_t v) : key(k), value(absl::StrCat(v)), quoted(false) {}

LogField::LogField(std::string_view k, double v)
    : key(k), value(absl::StrFormat("%.6g", v)), quoted(false) {}

std::string FormatLogLine(LogFormat format, absl::Time time, LogLevel level,
                          std::string_view component, std::string_view message,
                          std::initializer_list<LogField> fields) {
  const std::string ts = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", time, absl::UTCTimeZone());
  std::string out;
  if (format == LogFormat::kJson) {
    absl::StrAppend(&out, "{\"ts\":\"", ts, "\",\"level\":\"");
    out.append(LevelName(level, false));
    out.append("\",\"component\":");
    AppendJsonString(&out, component);
    out.append(",\"msg\":");
    AppendJsonString(&out, message);
    for (const LogField& f : fields) {
      out.push_back(',');
      AppendJsonString(&out, f.key);
      out.push_back(':');
      if (f.quoted) {
        AppendJsonString(&out, f.value);
      } else {
        out.append(f.value);
      }
    }
    out.push_back('}');
    return out;
  }
  out.append(ts).append(" ").append(LevelName(level, true)).append(" ");
  out.append(component).append(" ").append(message);
  for (const LogField& f : fields) {
    absl::StrAppend(&out, " ", f.key, "=");
    AppendTextValue(&out, f.value);
  }
  return out;
}

void SetLogFormat(LogFormat format) { g_format.store(format); }

LogFormat GetLogFormat() { return g_format.load(); }

void SetLogSink(std::function<void(std::string_view line)> sink) {
  std::lock_guard<std::mutex> lock(SinkMutex());
  Sink() = std::move(sink);
}

void Log(LogLevel level, std::string_view component, std::string_view message,
         std::initializer_list<LogField> fields) {
  const std::string line =
      FormatLogLine(g_format.load(), absl::Now(), level, component, message, fields);
  std::lock_guard<std::mutex> lock(SinkMutex());
  if (Sink()) {
    Sink()(line);
    return;
  }
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

}  // namespace kvserve::logging
