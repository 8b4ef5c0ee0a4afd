#include "router/http/openai_request.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace kvserve::http {
namespace {

// Ordered: a JSON schema keeps its property order, and messages their key order for templates.
using json = nlohmann::ordered_json;

absl::Status Invalid(absl::string_view field, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", message));
}

const char* JsonTypeName(const json& value) {
  switch (value.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "boolean";
    case json::value_t::string:
      return "string";
    case json::value_t::array:
      return "array";
    case json::value_t::object:
      return "object";
    case json::value_t::number_float:
      return "number";
    default:
      return "integer";
  }
}

absl::Status WrongType(absl::string_view field, absl::string_view expected, const json& got) {
  return Invalid(field, absl::StrCat("expected ", expected, ", got ", JsonTypeName(got)));
}

/// Typed access to optional fields of the request object; null counts as absent.
class Fields {
 public:
  explicit Fields(const json& object) : object_(object) {}

  const json* Get(const char* name) const {
    auto it = object_.find(name);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }

  absl::StatusOr<std::optional<double>> Number(const char* name) const {
    const json* v = Get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number()) return WrongType(name, "a number", *v);
    const double d = v->get<double>();
    if (!std::isfinite(d)) return Invalid(name, "must be finite");
    return d;
  }

  absl::StatusOr<std::optional<int64_t>> Integer(const char* name) const {
    const json* v = Get(name);
    if (v == nullptr) return std::nullopt;
    if (v->is_number_integer()) {
      if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t{INT64_MAX}) {
        return Invalid(name, "too large");
      }
      return v->get<int64_t>();
    }
    // 3.0 is an integer too (some clients serialise every number as a float).
    if (v->is_number_float()) {
      const double d = v->get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) {
        return static_cast<int64_t>(d);
      }
    }
    return WrongType(name, "an integer", *v);
  }

  absl::StatusOr<std::optional<bool>> Bool(const char* name) const {
    const json* v = Get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_boolean()) return WrongType(name, "true or false", *v);
    return v->get<bool>();
  }

  absl::StatusOr<std::optional<std::string>> String(const char* name) const {
    const json* v = Get(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) return WrongType(name, "a string", *v);
    return v->get<std::string>();
  }

 private:
  const json& object_;
};

#define KV_ASSIGN_OR_RETURN(lhs, expr)          \
  auto lhs##_or = (expr);                       \
  if (!lhs##_or.ok()) return lhs##_or.status(); \
  const auto lhs = *lhs##_or

absl::Status CheckRange(const char* name, double v, double lo, double hi, bool lo_open,
                        absl::string_view range) {
  if ((lo_open ? v <= lo : v < lo) || v > hi) {
    return Invalid(name, absl::StrCat("must be ", range, ", got ", v));
  }
  return absl::OkStatus();
}

absl::Status ParseSampling(const Fields& f, v1::GenerateRequest* out) {
  v1::SamplingParams* s = out->mutable_sampling();
  KV_ASSIGN_OR_RETURN(temperature, f.Number("temperature"));
  if (temperature) {
    if (absl::Status st = CheckRange("temperature", *temperature, 0, 1e6, false, ">= 0");
        !st.ok()) {
      return st;
    }
    s->set_temperature(static_cast<float>(*temperature));
  }
  KV_ASSIGN_OR_RETURN(top_p, f.Number("top_p"));
  if (top_p) {
    if (absl::Status st = CheckRange("top_p", *top_p, 0, 1, true, "in (0, 1]"); !st.ok()) {
      return st;
    }
    s->set_top_p(static_cast<float>(*top_p));
  }
  KV_ASSIGN_OR_RETURN(top_k, f.Integer("top_k"));
  if (top_k) {
    if (*top_k < -1 || *top_k > INT32_MAX) {
      return Invalid("top_k", absl::StrCat("must be -1 or 0 (disabled) or positive, got ", *top_k));
    }
    s->set_top_k(*top_k < 0 ? 0 : static_cast<uint32_t>(*top_k));
  }
  KV_ASSIGN_OR_RETURN(min_p, f.Number("min_p"));
  if (min_p) {
    if (absl::Status st = CheckRange("min_p", *min_p, 0, 1, false, "in [0, 1]"); !st.ok()) {
      return st;
    }
    s->set_min_p(static_cast<float>(*min_p));
  }
  KV_ASSIGN_OR_RETURN(presence, f.Number("presence_penalty"));
  if (presence) {
    if (absl::Status st = CheckRange("presence_penalty", *presence, -2, 2, false, "in [-2, 2]");
        !st.ok()) {
      return st;
    }
    s->set_presence_penalty(static_cast<float>(*presence));
  }
  KV_ASSIGN_OR_RETURN(frequency, f.Number("frequency_penalty"));
  if (frequency) {
    if (absl::Status st = CheckRange("frequency_penalty", *frequency, -2, 2, false, "in [-2, 2]");
        !st.ok()) {
      return st;
    }
    s->set_frequency_penalty(static_cast<float>(*frequency));
  }
  KV_ASSIGN_OR_RETURN(repetition, f.Number("repetition_penalty"));
  if (repetition) {
    if (absl::Status st = CheckRange("repetition_penalty", *repetition, 0, 1e6, true, "> 0");
        !st.ok()) {
      return st;
    }
    s->set_repetition_penalty(static_cast<float>(*repetition));
  }
  KV_ASSIGN_OR_RETURN(seed, f.Integer("seed"));
  if (seed) s->set_seed(static_cast<uint64_t>(*seed));
  return absl::OkStatus();
}

absl::Status ParseStop(const Fields& f, v1::GenerateRequest* out) {
  if (const json* stop = f.Get("stop")) {
    if (stop->is_string()) {
      if (!stop->get<std::string>().empty()) out->add_stop(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (size_t i = 0; i < stop->size(); ++i) {
        const json& item = (*stop)[i];
        const std::string field = absl::StrCat("stop[", i, "]");
        if (!item.is_string()) return WrongType(field, "a string", item);
        if (item.get<std::string>().empty()) return Invalid(field, "must not be empty");
        out->add_stop(item.get<std::string>());
      }
    } else {
      return WrongType("stop", "a string or an array of strings", *stop);
    }
  }
  if (const json* ids = f.Get("stop_token_ids")) {
    if (!ids->is_array()) return WrongType("stop_token_ids", "an array of integers", *ids);
    for (size_t i = 0; i < ids->size(); ++i) {
      const json& id = (*ids)[i];
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > UINT32_MAX) {
        return Invalid(absl::StrCat("stop_token_ids[", i, "]"), "expected a token id");
      }
      out->add_stop_token_ids(static_cast<uint32_t>(id.get<int64_t>()));
    }
  }
  return absl::OkStatus();
}

/// A token id array ([1, 2, 3]) into prompt_token_ids.
absl::Status ParseTokenIds(const json& ids, v1::GenerateRequest* out) {
  for (size_t i = 0; i < ids.size(); ++i) {
    const json& id = ids[i];
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > UINT32_MAX) {
      return Invalid(absl::StrCat("prompt[", i, "]"), "expected a token id (integer >= 0)");
    }
    out->add_prompt_token_ids(static_cast<uint32_t>(id.get<int64_t>()));
  }
  return absl::OkStatus();
}

absl::Status ParsePrompt(const Fields& f, v1::GenerateRequest* out) {
  const json* prompt = f.Get("prompt");
  if (prompt == nullptr) return Invalid("prompt", "is required");
  const json* one = prompt;
  // A list holding one prompt (["text"] or [[1, 2]]) is that prompt; batches are refused.
  if (prompt->is_array() && prompt->size() == 1 &&
      ((*prompt)[0].is_string() || (*prompt)[0].is_array())) {
    one = &(*prompt)[0];
  } else if (prompt->is_array() && !prompt->empty() &&
             ((*prompt)[0].is_string() || (*prompt)[0].is_array())) {
    return Invalid("prompt",
                   "several prompts in one request are not supported; send one "
                   "request per prompt");
  }
  if (one->is_string()) {
    if (one->get<std::string>().empty()) return Invalid("prompt", "must not be empty");
    out->set_prompt(one->get<std::string>());
    return absl::OkStatus();
  }
  if (one->is_array()) {
    if (one->empty()) return Invalid("prompt", "must not be empty");
    return ParseTokenIds(*one, out);
  }
  return WrongType("prompt", "a string or an array of token ids", *one);
}

// An assistant message's tool_calls: checked, and arguments given as JSON text (as OpenAI
// clients send them) parsed into objects, which is what chat templates render.
absl::Status NormalizeToolCalls(const std::string& field, json* message) {
  auto calls = message->find("tool_calls");
  if (calls == message->end() || calls->is_null()) return absl::OkStatus();
  if (!calls->is_array()) return WrongType(field + ".tool_calls", "an array", *calls);
  for (size_t j = 0; j < calls->size(); ++j) {
    json& call = (*calls)[j];
    const std::string call_field = absl::StrCat(field, ".tool_calls[", j, "]");
    if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
        !call["function"].value("name", json()).is_string()) {
      return Invalid(call_field, "expected {\"function\": {\"name\": ..., \"arguments\": ...}}");
    }
    json& function = call["function"];
    if (function.contains("arguments") && function["arguments"].is_string()) {
      const std::string& text = function["arguments"].get_ref<const std::string&>();
      json parsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (parsed.is_discarded()) {
        return Invalid(call_field + ".function.arguments", "is not valid JSON");
      }
      function["arguments"] = std::move(parsed);
    }
  }
  return absl::OkStatus();
}

/// Flattens a message's content (string, null, or [{"type": "text", "text": ...}]).
absl::StatusOr<json> ParseMessages(const Fields& f) {
  const json* messages = f.Get("messages");
  if (messages == nullptr) return Invalid("messages", "is required");
  if (!messages->is_array()) return WrongType("messages", "an array", *messages);
  if (messages->empty()) return Invalid("messages", "must not be empty");
  json out = json::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string field = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return WrongType(field, "an object", m);
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return Invalid(field + ".role", "expected a string");
    }
    json message = m;
    auto content = m.find("content");
    if (content == m.end() || content->is_null()) {
      message["content"] = "";
    } else if (content->is_array()) {
      std::string text;
      for (size_t j = 0; j < content->size(); ++j) {
        const json& part = (*content)[j];
        const std::string part_field = absl::StrCat(field, ".content[", j, "]");
        // value() with a json default: a non-string "type" compares unequal instead of throwing.
        if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
          return Invalid(part_field,
                         "only {\"type\": \"text\", \"text\": ...} parts are supported");
        }
        text += part["text"].get<std::string>();
      }
      message["content"] = text;
    } else if (!content->is_string()) {
      return WrongType(field + ".content", "a string or an array of parts", *content);
    }
    if (absl::Status s = NormalizeToolCalls(field, &message); !s.ok()) return s;
    out.push_back(std::move(message));
  }
  return out;
}

absl::Status RefuseUnsupported(const Fields& f) {
  if (const json* echo = f.Get("echo");
      echo != nullptr && echo->is_boolean() && echo->get<bool>()) {
    return Invalid("echo", "is not supported");
  }
  if (f.Get("suffix") != nullptr) return Invalid("suffix", "is not supported");
  if (const json* best_of = f.Get("best_of");
      best_of != nullptr && !(best_of->is_number_integer() && best_of->get<int64_t>() <= 1)) {
    return Invalid("best_of", "values above 1 are not supported");
  }
  if (const json* bias = f.Get("logit_bias"); bias != nullptr && !bias->empty()) {
    return Invalid("logit_bias", "is not supported");
  }
  return absl::OkStatus();
}

// OpenAI's rule for function names: 1 to 64 of a-z, A-Z, 0-9, '_' and '-'.
bool ValidFunctionName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '_' && c != '-') return false;
  }
  return true;
}

// tools, tool_choice and parallel_tool_calls of a chat request.
absl::Status ParseTools(const Fields& f, OpenAiRequest* request) {
  const json* tools = f.Get("tools");
  std::vector<std::string> names;
  if (tools != nullptr) {
    if (!tools->is_array()) return WrongType("tools", "an array", *tools);
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& tool = (*tools)[i];
      const std::string field = absl::StrCat("tools[", i, "]");
      if (!tool.is_object()) return WrongType(field, "an object", tool);
      if (tool.value("type", json()) != "function") {
        return Invalid(field + ".type", "expected \"function\"");
      }
      const json* function = tool.contains("function") ? &tool["function"] : nullptr;
      if (function == nullptr || !function->is_object()) {
        return Invalid(field + ".function", "expected an object with a name");
      }
      const json name = function->value("name", json());
      if (!name.is_string() || !ValidFunctionName(name.get<std::string>())) {
        return Invalid(field + ".function.name", "expected 1 to 64 letters, digits, '_' or '-'");
      }
      if (std::find(names.begin(), names.end(), name.get<std::string>()) != names.end()) {
        return Invalid(field + ".function.name",
                       absl::StrCat("'", name.get<std::string>(), "' is defined twice"));
      }
      names.push_back(name.get<std::string>());
      if (function->contains("description") && !(*function)["description"].is_string() &&
          !(*function)["description"].is_null()) {
        return WrongType(field + ".function.description", "a string", (*function)["description"]);
      }
      if (function->contains("parameters") && !(*function)["parameters"].is_object() &&
          !(*function)["parameters"].is_null()) {
        return WrongType(field + ".function.parameters", "a JSON schema object",
                         (*function)["parameters"]);
      }
    }
    if (!tools->empty()) {
      request->tools = *tools;
      request->tool_choice = ToolChoice::kAuto;
    }
  }
  if (const json* choice = f.Get("tool_choice")) {
    if (choice->is_string()) {
      const std::string c = choice->get<std::string>();
      if (c == "none") {
        request->tool_choice = ToolChoice::kNone;
      } else if (c == "auto" || c == "required") {
        if (names.empty() && c == "required") {
          return Invalid("tool_choice", "\"required\" needs tools");
        }
        if (!names.empty()) {
          request->tool_choice = c == "auto" ? ToolChoice::kAuto : ToolChoice::kRequired;
        }
      } else {
        return Invalid("tool_choice", absl::StrCat("expected \"none\", \"auto\", \"required\" "
                                                   "or a function, got \"",
                                                   c, "\""));
      }
    } else if (choice->is_object()) {
      const json* function = choice->contains("function") ? &(*choice)["function"] : nullptr;
      if (choice->value("type", json()) != "function" || function == nullptr ||
          !function->is_object() || !function->value("name", json()).is_string()) {
        return Invalid("tool_choice",
                       "expected {\"type\": \"function\", \"function\": {\"name\": ...}}");
      }
      const std::string name = (*function)["name"].get<std::string>();
      if (std::find(names.begin(), names.end(), name) == names.end()) {
        return Invalid("tool_choice.function.name",
                       absl::StrCat("no function named '", name, "' in tools"));
      }
      request->tool_choice = ToolChoice::kNamed;
      request->tool_choice_name = name;
    } else {
      return WrongType("tool_choice", "a string or an object", *choice);
    }
  }
  KV_ASSIGN_OR_RETURN(parallel, f.Bool("parallel_tool_calls"));
  if (parallel) request->parallel_tool_calls = *parallel;
  return absl::OkStatus();
}

// A regular expression matching exactly `text`.
std::string RegexLiteral(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

// response_format (OpenAI) and vLLM's guided_json / guided_regex / guided_grammar /
// guided_choice into GenerateRequest's constraint; at most one may be given.
absl::Status ParseConstraint(const Fields& f, v1::GenerateRequest* g) {
  std::vector<std::string> given;
  if (const json* format = f.Get("response_format")) {
    if (!format->is_object()) return WrongType("response_format", "an object", *format);
    const json* type = format->contains("type") ? &(*format)["type"] : nullptr;
    if (type == nullptr || !type->is_string()) {
      return Invalid("response_format.type",
                     "expected \"text\", \"json_object\" or \"json_schema\"");
    }
    const std::string t = type->get<std::string>();
    if (t == "json_object") {
      g->set_json_object(true);
      given.push_back("response_format");
    } else if (t == "json_schema") {
      const json* spec = format->contains("json_schema") ? &(*format)["json_schema"] : nullptr;
      if (spec == nullptr || !spec->is_object()) {
        return Invalid("response_format.json_schema", "expected an object with a schema");
      }
      if (!spec->contains("schema")) {
        // OpenAI accepts a json_schema without a schema: any JSON object then.
        g->set_json_object(true);
      } else if (const json& schema = (*spec)["schema"];
                 schema.is_object() || schema.is_boolean()) {
        g->set_json_schema(schema.dump());
      } else {
        return WrongType("response_format.json_schema.schema", "an object", schema);
      }
      given.push_back("response_format");
    } else if (t != "text") {
      return Invalid(
          "response_format.type",
          absl::StrCat("expected \"text\", \"json_object\" or \"json_schema\", got \"", t, "\""));
    }
  }
  if (const json* schema = f.Get("guided_json")) {
    if (schema->is_string()) {
      g->set_json_schema(schema->get<std::string>());
    } else if (schema->is_object()) {
      g->set_json_schema(schema->dump());
    } else {
      return WrongType("guided_json", "an object or a string", *schema);
    }
    given.push_back("guided_json");
  }
  KV_ASSIGN_OR_RETURN(regex, f.String("guided_regex"));
  if (regex) {
    g->set_regex(*regex);
    given.push_back("guided_regex");
  }
  KV_ASSIGN_OR_RETURN(grammar, f.String("guided_grammar"));
  if (grammar) {
    g->set_grammar(*grammar);
    given.push_back("guided_grammar");
  }
  if (const json* choice = f.Get("guided_choice")) {
    if (!choice->is_array() || choice->empty()) {
      return WrongType("guided_choice", "a non-empty array of strings", *choice);
    }
    std::string pattern;
    for (const json& c : *choice) {
      if (!c.is_string()) return WrongType("guided_choice", "a non-empty array of strings", c);
      absl::StrAppend(&pattern, pattern.empty() ? "" : "|", "(", RegexLiteral(c.get<std::string>()),
                      ")");
    }
    g->set_regex(pattern);
    given.push_back("guided_choice");
  }
  if (given.size() > 1) {
    return Invalid(given[1], absl::StrCat("cannot be combined with ", given[0],
                                          ": give one output constraint"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(Endpoint endpoint, const std::string& body,
                                                 const RequestLimits& limits) {
  const json root = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return Invalid("body", "is not valid JSON");
  if (!root.is_object()) return Invalid("body", "expected a JSON object");
  const Fields f(root);
  if (absl::Status s = RefuseUnsupported(f); !s.ok()) return s;
  OpenAiRequest request;
  request.endpoint = endpoint;
  v1::GenerateRequest& g = request.generate;
  KV_ASSIGN_OR_RETURN(model, f.String("model"));
  if (model) request.model = *model;

  if (endpoint == Endpoint::kCompletions) {
    if (const json* tools = f.Get("tools"); tools != nullptr && !tools->empty()) {
      return Invalid("tools", "only /v1/chat/completions takes tools");
    }
    if (absl::Status s = ParsePrompt(f, &g); !s.ok()) return s;
  } else {
    if (absl::Status s = ParseTools(f, &request); !s.ok()) return s;
    KV_ASSIGN_OR_RETURN(messages, ParseMessages(f));
    request.messages = messages;
    g.set_add_special_tokens(false);
    KV_ASSIGN_OR_RETURN(generation_prompt, f.Bool("add_generation_prompt"));
    if (generation_prompt) request.add_generation_prompt = *generation_prompt;
  }
  KV_ASSIGN_OR_RETURN(add_special, f.Bool("add_special_tokens"));
  if (add_special) g.set_add_special_tokens(*add_special);

  const char* max_tokens_field = "max_tokens";
  if (endpoint == Endpoint::kChatCompletions && f.Get("max_completion_tokens") != nullptr) {
    max_tokens_field = "max_completion_tokens";
  }
  KV_ASSIGN_OR_RETURN(max_tokens, f.Integer(max_tokens_field));
  if (max_tokens) {
    if (*max_tokens < 1 || *max_tokens > INT32_MAX) {
      return Invalid(max_tokens_field, absl::StrCat("must be >= 1, got ", *max_tokens));
    }
    g.set_max_tokens(static_cast<uint32_t>(*max_tokens));
  }
  if (absl::Status s = ParseSampling(f, &g); !s.ok()) return s;
  if (absl::Status s = ParseStop(f, &g); !s.ok()) return s;

  KV_ASSIGN_OR_RETURN(n, f.Integer("n"));
  if (n) {
    if (*n < 1 || *n > limits.max_n) {
      return Invalid("n", absl::StrCat("must be in [1, ", limits.max_n, "], got ", *n));
    }
    g.set_n(static_cast<uint32_t>(*n));
  }

  if (endpoint == Endpoint::kCompletions) {
    KV_ASSIGN_OR_RETURN(logprobs, f.Integer("logprobs"));
    if (logprobs) {
      if (*logprobs < 0 || *logprobs > limits.max_logprobs) {
        return Invalid("logprobs",
                       absl::StrCat("must be in [0, ", limits.max_logprobs, "], got ", *logprobs));
      }
      request.logprobs = true;
      g.set_logprobs(static_cast<uint32_t>(*logprobs));
    }
  } else {
    KV_ASSIGN_OR_RETURN(logprobs, f.Bool("logprobs"));
    KV_ASSIGN_OR_RETURN(top, f.Integer("top_logprobs"));
    if (top && (*top < 0 || *top > limits.max_logprobs)) {
      return Invalid("top_logprobs",
                     absl::StrCat("must be in [0, ", limits.max_logprobs, "], got ", *top));
    }
    if (top && *top > 0 && !(logprobs && *logprobs)) {
      return Invalid("top_logprobs", "requires logprobs to be true");
    }
    if (logprobs && *logprobs) {
      request.logprobs = true;
      g.set_logprobs(top ? static_cast<uint32_t>(*top) : 0);
    }
  }

  KV_ASSIGN_OR_RETURN(stream, f.Bool("stream"));
  request.stream = stream && *stream;
  if (const json* options = f.Get("stream_options")) {
    if (!options->is_object()) return WrongType("stream_options", "an object", *options);
    const Fields stream_options(*options);
    KV_ASSIGN_OR_RETURN(include_usage, stream_options.Bool("include_usage"));
    request.include_usage = include_usage && *include_usage;
  }
  KV_ASSIGN_OR_RETURN(user, f.String("user"));  // accepted for compatibility, not used
  (void)user;
  KV_ASSIGN_OR_RETURN(salt, f.String("cache_salt"));
  if (salt) g.set_cache_salt(*salt);
  KV_ASSIGN_OR_RETURN(ignore_eos, f.Bool("ignore_eos"));
  if (ignore_eos) g.set_ignore_eos(*ignore_eos);
  KV_ASSIGN_OR_RETURN(include_stop, f.Bool("include_stop_str_in_output"));
  if (include_stop) g.set_include_stop_str_in_output(*include_stop);
  if (absl::Status s = ParseConstraint(f, &g); !s.ok()) return s;
  if ((request.tool_choice == ToolChoice::kRequired || request.tool_choice == ToolChoice::kNamed) &&
      g.constraint_case() != v1::GenerateRequest::CONSTRAINT_NOT_SET) {
    return Invalid("tool_choice",
                   "a required or named tool_choice cannot be combined with response_format or "
                   "guided_* (the reply is the tool calls)");
  }
  return request;
}

ToolCallFormat ToolCallFormatFor(const OpenAiRequest& request, ToolCallFormat model_format) {
  switch (request.tool_choice) {
    case ToolChoice::kNone:
      return ToolCallFormat::kNone;
    case ToolChoice::kAuto:
      return model_format;
    case ToolChoice::kRequired:
    case ToolChoice::kNamed:
      break;
  }
  return model_format == ToolCallFormat::kNone ? ToolCallFormat::kJsonArray : model_format;
}

void SetToolCallConstraint(ToolCallFormat format, OpenAiRequest* request) {
  if (request->tool_choice != ToolChoice::kRequired && request->tool_choice != ToolChoice::kNamed) {
    return;
  }
  v1::ToolCallConstraint* constraint = request->generate.mutable_tool_calls();
  constraint->set_format(std::string(ToolCallFormatName(format)));
  const bool named = request->tool_choice == ToolChoice::kNamed;
  constraint->set_parallel(!named && request->parallel_tool_calls);
  for (const json& tool : request->tools) {
    const json& function = tool["function"];
    const std::string name = function["name"].get<std::string>();
    if (named && name != request->tool_choice_name) continue;
    v1::ToolFunction* f = constraint->add_functions();
    f->set_name(name);
    if (function.contains("parameters") && function["parameters"].is_object()) {
      f->set_parameters(
          function["parameters"].dump(-1, ' ', false, json::error_handler_t::replace));
    }
  }
}

}  // namespace kvserve::http
