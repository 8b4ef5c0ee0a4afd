#include "common/chat_template/tool_calls.h"

#include <algorithm>
#include <initializer_list>
#include <optional>

#include "nlohmann/json.hpp"

namespace kvserve {
namespace {

using json = nlohmann::ordered_json;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralTag = "[TOOL_CALLS]";
constexpr std::string_view kDeepSeekCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kDeepSeekCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kDeepSeekCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kDeepSeekCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kDeepSeekSep = "<｜tool▁sep｜>";

std::string_view Trim(std::string_view s) {
  const size_t begin = s.find_first_not_of(" \t\r\n");
  if (begin == std::string_view::npos) return {};
  const size_t end = s.find_last_not_of(" \t\r\n");
  return s.substr(begin, end - begin + 1);
}

json ParseJson(std::string_view text) {
  return json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
}

// {"name": ..., "arguments" or "parameters": {...}} as a call.
std::optional<ParsedToolCall> CallFromJson(const json& j) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  ParsedToolCall call{j["name"].get<std::string>(), "{}"};
  const char* key = j.contains("arguments") ? "arguments" : "parameters";
  if (j.contains(key)) {
    const json& args = j[key];
    if (args.is_object()) {
      call.arguments = args.dump();
    } else if (args.is_string() && ParseJson(args.get<std::string>()).is_object()) {
      call.arguments = ParseJson(args.get<std::string>()).dump();
    } else {
      return std::nullopt;
    }
  }
  return call;
}

// Appends `piece` (trimmed) to the content, a blank line apart from what is there.
void AddContent(std::string_view piece, std::string* content) {
  piece = Trim(piece);
  if (piece.empty()) return;
  if (!content->empty()) content->append("\n\n");
  content->append(piece);
}

ParsedReply ParseHermes(std::string_view text) {
  ParsedReply reply;
  size_t pos = 0;
  while (true) {
    const size_t open = text.find(kHermesOpen, pos);
    if (open == std::string_view::npos) {
      AddContent(text.substr(pos), &reply.content);
      break;
    }
    AddContent(text.substr(pos, open - pos), &reply.content);
    const size_t body = open + kHermesOpen.size();
    size_t close = text.find(kHermesClose, body);
    // An unclosed last call (the reply stopped at the closing tag, or at EOS) still counts.
    const size_t end = close == std::string_view::npos ? text.size() : close;
    std::optional<ParsedToolCall> call =
        CallFromJson(ParseJson(Trim(text.substr(body, end - body))));
    const size_t next = close == std::string_view::npos ? text.size() : close + kHermesClose.size();
    if (call.has_value()) {
      reply.tool_calls.push_back(*std::move(call));
    } else {
      AddContent(text.substr(open, next - open), &reply.content);
    }
    pos = next;
  }
  return reply;
}

ParsedReply ParseLlama3(std::string_view text) {
  std::string_view body = Trim(text);
  if (body.starts_with(kPythonTag)) body = Trim(body.substr(kPythonTag.size()));
  ParsedReply reply;
  if (body.starts_with("{")) {
    // One call, or several separated by ";" (split only where every piece is a call).
    if (std::optional<ParsedToolCall> call = CallFromJson(ParseJson(body)); call.has_value()) {
      reply.tool_calls.push_back(*std::move(call));
      return reply;
    }
    std::vector<ParsedToolCall> calls;
    size_t start = 0;
    bool all = true;
    while (start <= body.size() && all) {
      size_t semi = body.find(';', start);
      if (semi == std::string_view::npos) semi = body.size();
      std::optional<ParsedToolCall> call =
          CallFromJson(ParseJson(Trim(body.substr(start, semi - start))));
      all = call.has_value();
      if (all) calls.push_back(*std::move(call));
      start = semi + 1;
    }
    if (all && calls.size() > 1) {
      reply.tool_calls = std::move(calls);
      return reply;
    }
  }
  reply.content = std::string(Trim(text));
  return reply;
}

ParsedReply ParseMistral(std::string_view text) {
  ParsedReply reply;
  const size_t tag = text.find(kMistralTag);
  if (tag == std::string_view::npos) {
    reply.content = std::string(Trim(text));
    return reply;
  }
  const json calls = ParseJson(Trim(text.substr(tag + kMistralTag.size())));
  std::vector<ParsedToolCall> parsed;
  if (calls.is_array() && !calls.empty()) {
    for (const json& c : calls) {
      std::optional<ParsedToolCall> call = CallFromJson(c);
      if (!call.has_value()) {
        parsed.clear();
        break;
      }
      parsed.push_back(*std::move(call));
    }
  } else if (std::optional<ParsedToolCall> call = CallFromJson(calls); call.has_value()) {
    parsed.push_back(*std::move(call));
  }
  if (parsed.empty()) {
    reply.content = std::string(Trim(text));
    return reply;
  }
  reply.content = std::string(Trim(text.substr(0, tag)));
  reply.tool_calls = std::move(parsed);
  return reply;
}

ParsedReply ParseJsonArray(std::string_view text) {
  ParsedReply reply;
  const json calls = ParseJson(Trim(text));
  if (calls.is_array()) {
    for (const json& c : calls) {
      std::optional<ParsedToolCall> call = CallFromJson(c);
      if (!call.has_value()) {
        reply.tool_calls.clear();
        break;
      }
      reply.tool_calls.push_back(*std::move(call));
    }
  }
  if (reply.tool_calls.empty()) reply.content = std::string(Trim(text));
  return reply;
}

// The first position of `marker` in `text`, or of a prefix of it that ends the text; npos.
size_t MarkerStart(std::string_view text, std::string_view marker) {
  if (const size_t at = text.find(marker); at != std::string_view::npos) return at;
  const size_t longest = std::min(text.size(), marker.size() - 1);
  for (size_t n = longest; n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) return text.size() - n;
  }
  return std::string_view::npos;
}

// For replies that are calls as a whole: where the call starts when the reply begins with one of
// `openers` (or a prefix of one), 0 while blank, else npos.
size_t WholeReplyStart(std::string_view text, std::initializer_list<std::string_view> openers) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return 0;
  const std::string_view rest = text.substr(first);
  for (std::string_view opener : openers) {
    const size_t n = std::min(rest.size(), opener.size());
    if (rest.substr(0, n) == opener.substr(0, n)) return first;
  }
  return std::string_view::npos;
}

// <｜tool▁call▁begin｜>TYPE<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>
std::optional<ParsedToolCall> DeepSeekCall(std::string_view call) {
  const size_t sep = call.find(kDeepSeekSep);
  if (sep == std::string_view::npos) return std::nullopt;
  std::string_view rest = call.substr(sep + kDeepSeekSep.size());
  const size_t newline = rest.find('\n');
  if (newline == std::string_view::npos) return std::nullopt;
  const std::string_view name = Trim(rest.substr(0, newline));
  std::string_view args = Trim(rest.substr(newline + 1));
  if (args.starts_with("```json")) args = args.substr(7);
  if (args.ends_with("```")) args = args.substr(0, args.size() - 3);
  const json parsed = ParseJson(Trim(args));
  if (name.empty() || !parsed.is_object()) return std::nullopt;
  return ParsedToolCall{std::string(name), parsed.dump()};
}

ParsedReply ParseDeepSeek(std::string_view text) {
  ParsedReply reply;
  const size_t begin = text.find(kDeepSeekCallsBegin);
  if (begin == std::string_view::npos) {
    reply.content = std::string(Trim(text));
    return reply;
  }
  size_t end = text.find(kDeepSeekCallsEnd, begin);
  if (end == std::string_view::npos) end = text.size();
  const std::string_view calls =
      text.substr(begin + kDeepSeekCallsBegin.size(), end - begin - kDeepSeekCallsBegin.size());
  std::vector<ParsedToolCall> parsed;
  for (size_t pos = calls.find(kDeepSeekCallBegin); pos != std::string_view::npos;
       pos = calls.find(kDeepSeekCallBegin, pos)) {
    pos += kDeepSeekCallBegin.size();
    size_t call_end = calls.find(kDeepSeekCallEnd, pos);
    if (call_end == std::string_view::npos) call_end = calls.size();
    std::optional<ParsedToolCall> call = DeepSeekCall(calls.substr(pos, call_end - pos));
    if (!call.has_value()) {
      parsed.clear();
      break;
    }
    parsed.push_back(*std::move(call));
    pos = call_end;
  }
  if (parsed.empty()) {
    reply.content = std::string(Trim(text));
    return reply;
  }
  reply.content = std::string(Trim(text.substr(0, begin)));
  const size_t after = end == text.size() ? end : end + kDeepSeekCallsEnd.size();
  AddContent(text.substr(after), &reply.content);
  reply.tool_calls = std::move(parsed);
  return reply;
}

}  // namespace

std::string_view ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama3Json:
      return "llama3_json";
    case ToolCallFormat::kMistral:
      return "mistral";
    case ToolCallFormat::kDeepSeek:
      return "deepseek";
    case ToolCallFormat::kJsonArray:
      return "json";
    case ToolCallFormat::kNone:
      break;
  }
  return "none";
}

ToolCallFormat DetectToolCallFormat(std::string_view chat_template) {
  auto has = [&](std::string_view marker) {
    return chat_template.find(marker) != std::string_view::npos;
  };
  if (has("tool▁calls▁begin")) return ToolCallFormat::kDeepSeek;
  if (has("<tool_call>")) return ToolCallFormat::kHermes;
  if (has(kMistralTag)) return ToolCallFormat::kMistral;
  if (has(kPythonTag) || has("\"parameters\": dictionary")) return ToolCallFormat::kLlama3Json;
  return ToolCallFormat::kNone;
}

ParsedReply ParseToolCalls(ToolCallFormat format, std::string_view text) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return ParseHermes(text);
    case ToolCallFormat::kLlama3Json:
      return ParseLlama3(text);
    case ToolCallFormat::kMistral:
      return ParseMistral(text);
    case ToolCallFormat::kDeepSeek:
      return ParseDeepSeek(text);
    case ToolCallFormat::kJsonArray:
      return ParseJsonArray(text);
    case ToolCallFormat::kNone:
      break;
  }
  return ParsedReply{std::string(text), {}};
}

size_t ToolCallStart(ToolCallFormat format, std::string_view text) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return MarkerStart(text, kHermesOpen);
    case ToolCallFormat::kMistral:
      return MarkerStart(text, kMistralTag);
    case ToolCallFormat::kDeepSeek:
      return MarkerStart(text, kDeepSeekCallsBegin);
    case ToolCallFormat::kLlama3Json:
      return WholeReplyStart(text, {"{", kPythonTag});
    case ToolCallFormat::kJsonArray:
      return WholeReplyStart(text, {"["});
    case ToolCallFormat::kNone:
      break;
  }
  return std::string_view::npos;
}

}  // namespace kvserve
