#ifndef KVSERVE_COMMON_CHAT_TEMPLATE_TOOL_CALLS_H_
#define KVSERVE_COMMON_CHAT_TEMPLATE_TOOL_CALLS_H_

#include <string>
#include <string_view>
#include <vector>

namespace kvserve {

/// How a model family writes tool calls in its output (what its chat template teaches it).
enum class ToolCallFormat {
  /// No known format: the output is all content.
  kNone,
  /// Hermes style (Qwen2.5, Qwen3, Hermes): each call is
  /// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, after optional content.
  kHermes,
  /// Llama 3.1-3.3: the whole reply is a JSON object `{"name": ..., "parameters": {...}}`
  /// (optionally after `<|python_tag|>`; several separated by ";").
  kLlama3Json,
  /// Mistral: `[TOOL_CALLS]` then a JSON array of `{"name": ..., "arguments": {...}}`.
  kMistral,
  /// DeepSeek V3 / R1: `<｜tool▁calls▁begin｜>` then, per call,
  /// `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>`,
  /// then `<｜tool▁calls▁end｜>`.
  kDeepSeek,
  /// No family's own format: the whole reply is a JSON array of
  /// `{"name": ..., "parameters": {...}}` (what a required or named tool_choice forces on a
  /// model whose template teaches no format, as vLLM does).
  kJsonArray,
};

/// "hermes", "llama3_json", "mistral", "deepseek", "json" or "none".
std::string_view ToolCallFormatName(ToolCallFormat format);

/// The format a chat template's text teaches (by the markers it writes); kNone when it has none.
ToolCallFormat DetectToolCallFormat(std::string_view chat_template);

/// One call the model made.
struct ParsedToolCall {
  std::string name;
  /// The arguments as compact JSON text (OpenAI's `function.arguments`), "{}" when absent.
  std::string arguments;
};

/// A finished assistant reply split into its text and its tool calls.
struct ParsedReply {
  /// The text outside the calls (trimmed of the whitespace around the calls).
  std::string content;
  std::vector<ParsedToolCall> tool_calls;
};

/// Where in `text` (a reply still being written) a tool call starts or may be starting: the
/// position of the first call marker, or of a partial marker at the end of the text; for the
/// formats whose calls are the whole reply (kLlama3Json, kJsonArray), the first non-blank byte
/// when the reply starts like a call, or 0 while it is all blank. npos when no call can have
/// started: the text up to that point is content whatever follows. A streaming response sends
/// the text before this position as content and holds the rest back.
size_t ToolCallStart(ToolCallFormat format, std::string_view text);

/// Splits `text` (a whole reply) by `format`. A call that is not well formed (bad JSON, no name)
/// is left in the content, as vLLM's parsers do, so nothing the model wrote is lost.
ParsedReply ParseToolCalls(ToolCallFormat format, std::string_view text);

}  // namespace kvserve

#endif  // KVSERVE_COMMON_CHAT_TEMPLATE_TOOL_CALLS_H_
