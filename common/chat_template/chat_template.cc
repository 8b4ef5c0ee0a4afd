#include "common/chat_template/chat_template.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/chat_template/jinja_ast.h"
#include "common/chat_template/jinja_parser.h"
#include "common/chat_template/jinja_render.h"
#include "common/chat_template/jinja_value.h"
#include "nlohmann/json.hpp"

namespace kvserve {

ChatTemplate::ChatTemplate(std::shared_ptr<const std::vector<jinja::Node>> nodes)
    : nodes_(std::move(nodes)) {}

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  absl::StatusOr<std::vector<jinja::Node>> nodes = jinja::Parse(source, jinja::ParseOptions{});
  if (!nodes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("chat_template: ", nodes.status().message()));
  }
  return ChatTemplate(std::make_shared<const std::vector<jinja::Node>>(*std::move(nodes)));
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& messages,
                                                 const ChatRenderOptions& options) const {
  if (!messages.is_array()) return absl::InvalidArgumentError("messages: expected an array");
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!messages[i].is_object()) {
      return absl::InvalidArgumentError(absl::StrCat("messages[", i, "]: expected an object"));
    }
  }
  if (!options.tools.is_null() && !options.tools.is_array()) {
    return absl::InvalidArgumentError("tools: expected an array");
  }
  if (!options.variables.is_object()) {
    return absl::InvalidArgumentError("chat template variables: expected an object");
  }
  jinja::Value::Map globals = {
      {"messages", jinja::Value::FromJson(messages)},
      {"tools", jinja::Value::FromJson(options.tools)},
      {"documents", jinja::Value::None()},
      {"add_generation_prompt", jinja::Value::Bool(options.add_generation_prompt)},
      {"bos_token", jinja::Value::String(options.bos_token)},
      {"eos_token", jinja::Value::String(options.eos_token)},
  };
  for (const auto& item : options.variables.items()) {
    // Not a structured binding: clang 14 (the fuzz build) cannot capture one in a lambda.
    const std::string& name = item.key();
    jinja::Value v = jinja::Value::FromJson(item.value());
    auto it = std::find_if(globals.begin(), globals.end(),
                           [&](const auto& entry) { return entry.first == name; });
    if (it != globals.end()) {
      it->second = std::move(v);
    } else {
      globals.emplace_back(name, std::move(v));
    }
  }
  jinja::RenderEnv env;
  env.today = options.date ? *options.date : absl::ToCivilDay(absl::Now(), absl::UTCTimeZone());
  absl::StatusOr<std::string> text = jinja::Render(*nodes_, globals, env);
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("chat_template: ", text.status().message()));
  }
  return text;
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::json& messages,
                                                 const ChatRenderOptions& options) const {
  return Render(nlohmann::ordered_json::parse(
                    messages.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)),
                options);
}

absl::StatusOr<ChatTemplateConfig> LoadChatTemplateConfig(const std::string& path) {
  std::filesystem::path file(path);
  if (std::filesystem::is_directory(file)) file /= "tokenizer_config.json";
  std::ifstream in(file, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", file.string()));
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::ordered_json config = nlohmann::ordered_json::parse(text.str(), nullptr, false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(file.string(), ": not a JSON object"));
  }
  ChatTemplateConfig out;
  const auto source = config.find("chat_template");
  if (source != config.end() && source->is_string()) {
    out.source = source->get<std::string>();
  } else if (source != config.end() && source->is_array()) {
    for (const auto& named : *source) {
      if (named.is_object() && named.value("name", "") == "default" && named.contains("template") &&
          named["template"].is_string()) {
        out.source = named["template"].get<std::string>();
      }
    }
  }
  if (out.source.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.string(), ": no chat_template (a string, or a template named default)"));
  }
  for (const char* name : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                           "cls_token", "mask_token"}) {
    const auto token = config.find(name);
    if (token == config.end()) continue;
    std::string value;
    if (token->is_string()) {
      value = token->get<std::string>();
    } else if (token->is_object() && token->contains("content") &&
               (*token)["content"].is_string()) {
      value = (*token)["content"].get<std::string>();
    } else {
      continue;  // null: the tokenizer has none
    }
    if (std::string_view(name) == "bos_token") {
      out.options.bos_token = std::move(value);
    } else if (std::string_view(name) == "eos_token") {
      out.options.eos_token = std::move(value);
    } else {
      out.options.variables[name] = std::move(value);
    }
  }
  return out;
}

}  // namespace kvserve
