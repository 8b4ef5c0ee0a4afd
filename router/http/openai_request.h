#ifndef KVSERVE_ROUTER_HTTP_OPENAI_REQUEST_H_
#define KVSERVE_ROUTER_HTTP_OPENAI_REQUEST_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/chat_template/tool_calls.h"
#include "kvserve/v1/inference.pb.h"
#include "nlohmann/json.hpp"

namespace kvserve::http {

/// Which OpenAI endpoint a request came to.
enum class Endpoint { kCompletions, kChatCompletions };

/// Limits the HTTP front checks before forwarding (the worker checks the rest again).
struct RequestLimits {
  /// Largest n (samples per request); the workers' EngineOptions::max_n.
  int max_n = 16;
  /// Largest logprobs / top_logprobs; the workers' kMaxLogprobs.
  int max_logprobs = 20;
};

/// What a chat request lets the model do with its tools (OpenAI's tool_choice).
enum class ToolChoice {
  /// No tools may be called: the reply is all content (the default without tools).
  kNone,
  /// The model decides; calls it makes are parsed out of the reply (the default with tools).
  kAuto,
  /// The reply is one or more calls (enforced by a grammar).
  kRequired,
  /// The reply is a call to the named function (enforced by a grammar).
  kNamed,
};

/// An OpenAI request translated to kvserve.v1.
struct OpenAiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  /// The model as the client named it ("" when absent).
  std::string model;
  /// Completions: prompt or prompt_token_ids set. Chat: neither (the prompt comes from the
  /// chat template) and add_special_tokens false (the template places BOS itself). Sampling,
  /// stop, n, logprobs, cache_salt and the vLLM extensions are filled in; model stays empty.
  v1::GenerateRequest generate;
  /// Chat: the messages, each content flattened to a string (text parts joined).
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  /// Chat: end the prompt with the assistant header. Default true.
  bool add_generation_prompt = true;
  bool stream = false;
  /// stream_options.include_usage: a last chunk with usage and no choices.
  bool include_usage = false;
  /// Logprobs were asked for (completions: logprobs set; chat: logprobs true).
  bool logprobs = false;
  /// Chat: the request's tools as the chat template sees them (an array of
  /// {"type": "function", "function": {"name", "description", "parameters"}}), null without.
  nlohmann::ordered_json tools = nullptr;
  ToolChoice tool_choice = ToolChoice::kNone;
  /// kNamed: the function's name.
  std::string tool_choice_name;
  /// parallel_tool_calls: more than one call per reply allowed. Default true.
  bool parallel_tool_calls = true;
};

/// Parses and validates a request body. INVALID_ARGUMENT messages start with the offending
/// field ("temperature: expected a number, got string") so the error body can name it;
/// unknown fields are ignored, as OpenAI's own optional features the server lacks (echo,
/// suffix, best_of > 1, logit_bias) are refused by name. response_format
/// (json_object, json_schema) and vLLM's guided_json, guided_regex, guided_grammar and
/// guided_choice become GenerateRequest's constraint (at most one of them). Chat requests may
/// carry tools, tool_choice and parallel_tool_calls (checked here; see SetToolCallConstraint);
/// an assistant message's tool_calls arguments given as JSON text are parsed into objects, as
/// chat templates expect them.
absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(Endpoint endpoint, const std::string& body,
                                                 const RequestLimits& limits);

/// The format tool calls are written in for `request` on a model whose template teaches
/// `model_format`: kNone when tool_choice is none (nothing is parsed), kJsonArray for a required
/// or named choice on a model with no format of its own, else the model's format.
ToolCallFormat ToolCallFormatFor(const OpenAiRequest& request, ToolCallFormat model_format);

/// For a required or named tool_choice, sets GenerateRequest's tool_calls constraint: the calls
/// in `format` (ToolCallFormatFor), to the named function or to any of the tools, one or (with
/// parallel_tool_calls) more. Does nothing for other choices.
void SetToolCallConstraint(ToolCallFormat format, OpenAiRequest* request);

}  // namespace kvserve::http

#endif  // KVSERVE_ROUTER_HTTP_OPENAI_REQUEST_H_
