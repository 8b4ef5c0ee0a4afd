#ifndef KVSERVE_ROUTER_HTTP_OPENAI_RESPONSE_H_
#define KVSERVE_ROUTER_HTTP_OPENAI_RESPONSE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/chat_template/tool_calls.h"
#include "kvserve/v1/inference.pb.h"
#include "nlohmann/json.hpp"
#include "router/http/openai_request.h"

namespace kvserve {
class Tokenizer;
}  // namespace kvserve

namespace kvserve::http {

/// An error as the HTTP front answers it.
struct ApiError {
  int http_status = 500;
  /// {"error": {"message", "type", "param", "code"}}
  nlohmann::json body;
};

/// The HTTP status for a gRPC/absl code: INVALID_ARGUMENT 400, UNAUTHENTICATED 401,
/// NOT_FOUND 404, RESOURCE_EXHAUSTED 429, UNAVAILABLE 503, DEADLINE_EXCEEDED 504, else 500.
int HttpStatusFor(absl::StatusCode code);

/// The OpenAI-style error for a status. `param` is the field the message starts with
/// ("temperature: ..." → "temperature", "prompt_token_ids[1]: ..." → "prompt_token_ids[1]"),
/// null otherwise; `code` is the status code's name in lower case.
ApiError ErrorFromStatus(const absl::Status& status);

/// 404 for a model this server does not serve (code "model_not_found", param "model").
ApiError ModelNotFound(const std::string& model, const std::string& served);

/// Turns the kvserve.v1 response stream of one request into OpenAI JSON: stream chunks as
/// messages arrive, and the whole response (accumulated) at the end. Not thread-safe.
class ResponseBuilder {
 public:
  struct Options {
    Endpoint endpoint = Endpoint::kCompletions;
    /// "cmpl-..." / "chatcmpl-..." (the same in every chunk).
    std::string id;
    std::string model;
    /// Unix seconds.
    int64_t created = 0;
    /// Samples requested (choices are pre-created so indexes are dense).
    int n = 1;
    bool logprobs = false;
    /// Chat: the format tool calls are parsed from (ToolCallFormatFor); kNone: none are.
    ToolCallFormat tool_format = ToolCallFormat::kNone;
    /// Report at most the first call of a reply (parallel_tool_calls false).
    bool single_tool_call = false;
  };

  /// `tokenizer` (may be null) spells out logprob tokens; it must outlive the builder.
  ResponseBuilder(Options options, const Tokenizer* tokenizer);

  /// Adds one message to the totals and returns its stream chunks: usually one. With tool calls
  /// parsed, text that may be a call is held back (no chunk, or one with logprobs only) until the
  /// reply ends; then the calls come as one chunk of `delta.tool_calls` (each call whole: index,
  /// id, type, function name and arguments) and the finish reason ("tool_calls") in another.
  std::vector<nlohmann::json> Add(const v1::GenerateResponse& message);
  /// Chat streams open with one chunk per choice carrying the role ({"role": "assistant"}).
  nlohmann::json RoleChunk(int index) const;
  /// The last stream chunk when stream_options.include_usage: no choices, the usage.
  nlohmann::json UsageChunk() const;
  /// The complete (non-streamed) response.
  nlohmann::json Final() const;

 private:
  struct Choice {
    std::string text;
    std::string finish_reason;
    std::string stop_reason;
    nlohmann::json logprobs;
    size_t text_offset = 0;
    /// Bytes of `text` sent as content deltas (with tool calls parsed).
    size_t streamed = 0;
    /// At the end, with tool calls parsed: the content outside the calls, and the calls as
    /// OpenAI tool_calls entries (empty when the reply made none).
    std::string content;
    nlohmann::json tool_calls = nlohmann::json::array();
  };

  /// At the end of a choice's reply: splits it into content and tool calls.
  void ParseReply(Choice* choice) const;

  nlohmann::json Envelope(const char* object) const;
  nlohmann::json Logprobs(const v1::GenerateResponse& message, Choice* choice) const;
  nlohmann::json Usage() const;
  std::string TokenText(uint32_t id) const;

  const Options options_;
  const Tokenizer* const tokenizer_;
  std::vector<Choice> choices_;
  uint32_t prompt_tokens_ = 0;
  uint32_t cached_tokens_ = 0;
  uint32_t completion_tokens_ = 0;
};

}  // namespace kvserve::http

#endif  // KVSERVE_ROUTER_HTTP_OPENAI_RESPONSE_H_
