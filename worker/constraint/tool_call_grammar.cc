#include "worker/constraint/tool_call_grammar.h"

#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/constraint/json_schema.h"

namespace kvserve::constraint {
namespace {

using json = nlohmann::ordered_json;

// How one family frames its calls: before the first, between two, after the last, and each
// call's text around the function name and the arguments.
struct Framing {
  std::string_view open;
  std::string_view separator;
  std::string_view close;
  std::string_view call_prefix;  // then the name
  std::string_view name_suffix;  // then the arguments
  std::string_view call_suffix;
  bool json_name = true;  // the name as a JSON string ("F") rather than bare (F)
};

bool FramingFor(std::string_view format, Framing* out) {
  if (format == "hermes") {
    *out = {"", "\n", "", "<tool_call>\n{\"name\": ", ", \"arguments\": ", "}\n</tool_call>"};
  } else if (format == "llama3_json") {
    *out = {"", "; ", "", "{\"name\": ", ", \"parameters\": ", "}"};
  } else if (format == "mistral") {
    *out = {"[TOOL_CALLS][", ", ", "]", "{\"name\": ", ", \"arguments\": ", "}"};
  } else if (format == "deepseek") {
    *out = {"<｜tool▁calls▁begin｜>",
            "\n",
            "<｜tool▁calls▁end｜>",
            "<｜tool▁call▁begin｜>function<｜tool▁sep｜>",
            "\n```json\n",
            "\n```<｜tool▁call▁end｜>",
            /*json_name=*/false};
  } else if (format == "json") {
    *out = {"[", ", ", "]", "{\"name\": ", ", \"parameters\": ", "}"};
  } else {
    return false;
  }
  return true;
}

absl::Status Invalid(const std::string& field, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("tool_calls.", field, ": ", message));
}

Sequence Concat(Sequence a, const Sequence& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

absl::StatusOr<Grammar> ToolCallGrammar(const json& spec) {
  if (!spec.is_object()) return Invalid("spec", "expected an object");
  Framing framing;
  if (!spec.contains("format") || !spec["format"].is_string() ||
      !FramingFor(spec["format"].get<std::string>(), &framing)) {
    return Invalid("format",
                   "expected \"hermes\", \"llama3_json\", \"mistral\", \"deepseek\" or \"json\"");
  }
  if (!spec.contains("functions") || !spec["functions"].is_array() || spec["functions"].empty()) {
    return Invalid("functions", "expected a non-empty array");
  }
  const bool parallel = spec.value("parallel", false);

  GrammarBuilder builder;
  std::vector<Sequence> calls;
  const json& functions = spec["functions"];
  for (size_t i = 0; i < functions.size(); ++i) {
    const json& f = functions[i];
    const std::string field = absl::StrCat("functions[", i, "]");
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string() ||
        f["name"].get<std::string>().empty()) {
      return Invalid(field + ".name", "expected a non-empty string");
    }
    const std::string name = f["name"].get<std::string>();
    if (!framing.json_name && name.find_first_of("\n`<>") != std::string::npos) {
      return Invalid(field + ".name", "cannot hold a newline, '`', '<' or '>' in this format");
    }
    // No parameters schema: any JSON object, as OpenAI treats a function without one.
    const json any_object = {{"type", "object"}};
    const json& parameters =
        f.contains("parameters") && !f["parameters"].is_null() ? f["parameters"] : any_object;
    absl::StatusOr<Symbol> arguments = AddJsonSchemaRule(&builder, parameters);
    if (!arguments.ok()) {
      return Invalid(field + ".parameters", arguments.status().message());
    }
    Sequence call = GrammarBuilder::Literal(framing.call_prefix);
    call = Concat(std::move(call),
                  GrammarBuilder::Literal(framing.json_name ? json(name).dump() : name));
    call = Concat(std::move(call), GrammarBuilder::Literal(framing.name_suffix));
    call.push_back(*arguments);
    call = Concat(std::move(call), GrammarBuilder::Literal(framing.call_suffix));
    calls.push_back(std::move(call));
  }
  const int32_t call = builder.NewRule("call", std::move(calls));
  Sequence body = {Symbol::Rule(call)};
  if (parallel) {
    Sequence more = GrammarBuilder::Literal(framing.separator);
    more.push_back(Symbol::Rule(call));
    absl::StatusOr<int32_t> rest = builder.Repeat("more-calls", more, 0, -1);
    if (!rest.ok()) return rest.status();
    body.push_back(Symbol::Rule(*rest));
  }
  Sequence root = GrammarBuilder::Literal(framing.open);
  root = Concat(std::move(root), body);
  root = Concat(std::move(root), GrammarBuilder::Literal(framing.close));
  return builder.Build(builder.NewRule("root", {std::move(root)}));
}

}  // namespace kvserve::constraint
