#include "router/http/openai_response.h"

#include <algorithm>
#include <random>
#include <span>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer/token_bytes.h"
#include "common/tokenizer/tokenizer.h"

namespace kvserve::http {
namespace {

using nlohmann::json;

const char* ErrorType(int http_status) {
  switch (http_status) {
    case 400:
    case 404:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 429:
      return "rate_limit_error";
    case 503:
      return "service_unavailable_error";
    case 504:
      return "timeout_error";
    default:
      return "server_error";
  }
}

/// The field a message names first: "a.b[2]: text" → "a.b[2]", also after the prefix the router
/// puts on a worker's errors ("worker 10.0.0.7:7001: max_tokens: ...").
json ParamOf(absl::string_view message) {
  if (absl::StartsWith(message, "worker ")) {
    const size_t end = message.find(": ");
    if (end != absl::string_view::npos) message.remove_prefix(end + 2);
  }
  const size_t colon = message.find(": ");
  if (colon == absl::string_view::npos || colon == 0) return nullptr;
  for (char c : message.substr(0, colon)) {
    if (!absl::ascii_isalnum(c) && c != '_' && c != '.' && c != '[' && c != ']' && c != '/') {
      return nullptr;
    }
  }
  return std::string(message.substr(0, colon));
}

const char* FinishReason(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_ABORT:
      return "abort";
    default:
      return "";
  }
}

// "call_" and 24 random letters and digits, as OpenAI's tool call ids look.
std::string ToolCallId() {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 random(std::random_device{}());
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id.push_back(kAlphabet[random() % (sizeof(kAlphabet) - 1)]);
  return id;
}

json Bytes(const std::string& text) {
  json bytes = json::array();
  for (unsigned char c : text) bytes.push_back(static_cast<int>(c));
  return bytes;
}

}  // namespace

int HttpStatusFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

ApiError ErrorFromStatus(const absl::Status& status) {
  ApiError error;
  error.http_status = HttpStatusFor(status.code());
  error.body = {{"error",
                 {{"message", std::string(status.message())},
                  {"type", ErrorType(error.http_status)},
                  {"param", ParamOf(status.message())},
                  {"code", absl::AsciiStrToLower(absl::StatusCodeToString(status.code()))}}}};
  return error;
}

ApiError ModelNotFound(const std::string& model, const std::string& served) {
  ApiError error;
  error.http_status = 404;
  error.body = {{"error",
                 {{"message", absl::StrCat("The model '", model,
                                           "' does not exist (this server serves '", served, "')")},
                  {"type", "invalid_request_error"},
                  {"param", "model"},
                  {"code", "model_not_found"}}}};
  return error;
}

ResponseBuilder::ResponseBuilder(Options options, const Tokenizer* tokenizer)
    : options_(std::move(options)),
      tokenizer_(tokenizer),
      choices_(static_cast<size_t>(std::max(options_.n, 1))) {}

json ResponseBuilder::Envelope(const char* object) const {
  return {{"id", options_.id},
          {"object", object},
          {"created", options_.created},
          {"model", options_.model}};
}

std::string ResponseBuilder::TokenText(uint32_t id) const {
  // As the token reads inside the text (SentencePiece's "▁there" is " there"), so that the
  // tokens joined are the text and text_offset points at each; a byte-fallback piece is its
  // byte.
  if (tokenizer_ != nullptr && id < static_cast<uint32_t>(tokenizer_->vocab_size())) {
    std::string text = TokenBytesMidText(*tokenizer_, static_cast<TokenId>(id));
    if (!text.empty()) return text;
  }
  return absl::StrCat("token_id:", id);
}

json ResponseBuilder::Logprobs(const v1::GenerateResponse& message, Choice* choice) const {
  if (options_.endpoint == Endpoint::kCompletions) {
    json out = {{"tokens", json::array()},
                {"token_logprobs", json::array()},
                {"top_logprobs", json::array()},
                {"text_offset", json::array()}};
    for (const v1::Logprobs& lp : message.logprobs()) {
      const std::string token = TokenText(lp.token_id());
      out["tokens"].push_back(token);
      out["token_logprobs"].push_back(lp.logprob());
      json top = json::object();
      for (const v1::TokenLogprob& t : lp.top()) top[TokenText(t.token_id())] = t.logprob();
      out["top_logprobs"].push_back(std::move(top));
      out["text_offset"].push_back(choice->text_offset);
      choice->text_offset += token.size();
    }
    return out;
  }
  json content = json::array();
  for (const v1::Logprobs& lp : message.logprobs()) {
    const std::string token = TokenText(lp.token_id());
    json top = json::array();
    for (const v1::TokenLogprob& t : lp.top()) {
      const std::string alt = TokenText(t.token_id());
      top.push_back({{"token", alt}, {"logprob", t.logprob()}, {"bytes", Bytes(alt)}});
    }
    content.push_back({{"token", token},
                       {"logprob", lp.logprob()},
                       {"bytes", Bytes(token)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}};
}

void ResponseBuilder::ParseReply(Choice* choice) const {
  ParsedReply reply = ParseToolCalls(options_.tool_format, choice->text);
  if (reply.tool_calls.empty()) {
    choice->content = choice->text;
    return;
  }
  if (options_.single_tool_call) reply.tool_calls.resize(1);
  choice->content = std::move(reply.content);
  for (size_t k = 0; k < reply.tool_calls.size(); ++k) {
    choice->tool_calls.push_back({{"id", ToolCallId()},
                                  {"type", "function"},
                                  {"function",
                                   {{"name", std::move(reply.tool_calls[k].name)},
                                    {"arguments", std::move(reply.tool_calls[k].arguments)}}}});
  }
  if (choice->finish_reason == "stop") choice->finish_reason = "tool_calls";
}

std::vector<json> ResponseBuilder::Add(const v1::GenerateResponse& message) {
  const bool chat = options_.endpoint == Endpoint::kChatCompletions;
  const bool parse_tools = chat && options_.tool_format != ToolCallFormat::kNone;
  const size_t index = message.index();
  if (index >= choices_.size()) choices_.resize(index + 1);
  Choice& choice = choices_[index];
  choice.text += message.text();
  json logprobs = nullptr;
  if (options_.logprobs) {
    logprobs = Logprobs(message, &choice);
    // Accumulate for the final response.
    if (choice.logprobs.is_null()) {
      choice.logprobs = logprobs;
    } else {
      for (auto& [key, values] : logprobs.items()) {
        for (const json& v : values) choice.logprobs[key].push_back(v);
      }
    }
  }
  json finish = nullptr;
  if (message.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
    choice.finish_reason = FinishReason(message.finish_reason());
    choice.stop_reason = message.stop_reason();
    prompt_tokens_ = std::max(prompt_tokens_, message.usage().prompt_tokens());
    cached_tokens_ = std::max(cached_tokens_, message.usage().cached_prompt_tokens());
    completion_tokens_ += message.usage().completion_tokens();
    if (parse_tools) ParseReply(&choice);
    finish = choice.finish_reason;
  }
  const char* object = chat ? "chat.completion.chunk" : "text_completion";
  auto make_chunk = [&](json delta, json logprobs_value, json finish_value) {
    json entry = {{"index", index},
                  {"logprobs", std::move(logprobs_value)},
                  {"finish_reason", std::move(finish_value)}};
    if (chat) {
      entry["delta"] = std::move(delta);
    } else {
      entry["text"] = message.text();
    }
    json chunk = Envelope(object);
    chunk["choices"] = json::array({std::move(entry)});
    return chunk;
  };
  if (!parse_tools) {
    json delta = message.text().empty() && !finish.is_null() ? json::object()
                                                             : json{{"content", message.text()}};
    return {make_chunk(std::move(delta), std::move(logprobs), std::move(finish))};
  }

  // Content goes out up to where a call may start; the rest waits for the end of the reply.
  json delta = json::object();
  if (finish.is_null()) {
    const size_t start = ToolCallStart(options_.tool_format, choice.text);
    const size_t visible = start == std::string::npos ? choice.text.size() : start;
    if (visible > choice.streamed) {
      delta["content"] = choice.text.substr(choice.streamed, visible - choice.streamed);
      choice.streamed = visible;
    }
    if (delta.empty() && logprobs.is_null()) return {};
    return {make_chunk(std::move(delta), std::move(logprobs), nullptr)};
  }
  if (choice.tool_calls.empty()) {
    if (choice.streamed < choice.text.size())
      delta["content"] = choice.text.substr(choice.streamed);
  } else {
    // What of the parsed content was not sent yet (the content is trimmed around the calls).
    std::string_view sent = std::string_view(choice.text).substr(0, choice.streamed);
    const size_t first = sent.find_first_not_of(" \t\r\n");
    sent = first == std::string_view::npos
               ? std::string_view()
               : sent.substr(first, sent.find_last_not_of(" \t\r\n") - first + 1);
    if (choice.content.size() > sent.size() && std::string_view(choice.content).starts_with(sent)) {
      delta["content"] = choice.content.substr(sent.size());
    }
    json calls = json::array();
    for (size_t k = 0; k < choice.tool_calls.size(); ++k) {
      json call = choice.tool_calls[k];
      call["index"] = k;
      calls.push_back(std::move(call));
    }
    delta["tool_calls"] = std::move(calls);
  }
  choice.streamed = choice.text.size();
  std::vector<json> chunks;
  if (!delta.empty() || !logprobs.is_null()) {
    chunks.push_back(make_chunk(std::move(delta), std::move(logprobs), nullptr));
  }
  chunks.push_back(make_chunk(json::object(), nullptr, std::move(finish)));
  return chunks;
}

json ResponseBuilder::RoleChunk(int index) const {
  json chunk = Envelope("chat.completion.chunk");
  chunk["choices"] = json::array({{{"index", index},
                                   {"delta", {{"role", "assistant"}, {"content", ""}}},
                                   {"logprobs", nullptr},
                                   {"finish_reason", nullptr}}});
  return chunk;
}

json ResponseBuilder::Usage() const {
  return {{"prompt_tokens", prompt_tokens_},
          {"completion_tokens", completion_tokens_},
          {"total_tokens", prompt_tokens_ + completion_tokens_},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens_}}}};
}

json ResponseBuilder::UsageChunk() const {
  const bool chat = options_.endpoint == Endpoint::kChatCompletions;
  json chunk = Envelope(chat ? "chat.completion.chunk" : "text_completion");
  chunk["choices"] = json::array();
  chunk["usage"] = Usage();
  return chunk;
}

json ResponseBuilder::Final() const {
  const bool chat = options_.endpoint == Endpoint::kChatCompletions;
  json out = Envelope(chat ? "chat.completion" : "text_completion");
  json choices = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    json entry = {{"index", i},
                  {"logprobs", options_.logprobs && !c.logprobs.is_null() ? c.logprobs : json()},
                  {"finish_reason", c.finish_reason.empty() ? json() : json(c.finish_reason)}};
    if (!c.stop_reason.empty()) entry["stop_reason"] = c.stop_reason;
    if (chat && !c.tool_calls.empty()) {
      entry["message"] = {{"role", "assistant"},
                          {"content", c.content.empty() ? json() : json(c.content)},
                          {"tool_calls", c.tool_calls}};
    } else if (chat) {
      entry["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      entry["text"] = c.text;
    }
    choices.push_back(std::move(entry));
  }
  out["choices"] = std::move(choices);
  out["usage"] = Usage();
  return out;
}

}  // namespace kvserve::http
