#ifndef KVSERVE_WORKER_CONSTRAINT_TOOL_CALL_GRAMMAR_H_
#define KVSERVE_WORKER_CONSTRAINT_TOOL_CALL_GRAMMAR_H_

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "worker/constraint/grammar.h"

namespace kvserve::constraint {

/// A grammar for output that is nothing but tool calls, written the way a model family writes
/// them (what OpenAI's tool_choice "required" and a named tool_choice ask for). `spec`:
///
///     {"format": "hermes" | "llama3_json" | "mistral" | "deepseek" | "json",
///      "functions": [{"name": "get_weather", "parameters": {JSON schema}}, ...],
///      "parallel": true}
///
/// Each call names one of the functions and its arguments validate against that function's
/// parameters (a missing schema: any JSON object). With "parallel" false exactly one call, else
/// one or more. The formats, per call, with calls joined as the family joins them:
///
///   hermes       <tool_call>\n{"name": "F", "arguments": ARGS}\n</tool_call>   (joined by \n)
///   llama3_json  {"name": "F", "parameters": ARGS}                             (joined by "; ")
///   mistral      [TOOL_CALLS][{"name": "F", "arguments": ARGS}, ...]
///   deepseek     <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>F\n```json\nARGS
///                \n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>                  (joined by \n)
///   json         [{"name": "F", "parameters": ARGS}, ...]   (for models with no known format)
///
/// INVALID_ARGUMENT naming the field for a malformed spec ("tool_calls.functions[1].name: ...")
/// and for a parameters schema the schema compiler refuses.
absl::StatusOr<Grammar> ToolCallGrammar(const nlohmann::ordered_json& spec);

}  // namespace kvserve::constraint

#endif  // KVSERVE_WORKER_CONSTRAINT_TOOL_CALL_GRAMMAR_H_
