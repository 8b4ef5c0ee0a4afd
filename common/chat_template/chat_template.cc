#include "common/chat_template/chat_template.h"

#include <utility>

#include "absl/strings/str_cat.h"
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

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::json& messages,
                                                 const ChatRenderOptions& options) const {
  if (!messages.is_array()) return absl::InvalidArgumentError("messages: expected an array");
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!messages[i].is_object()) {
      return absl::InvalidArgumentError(absl::StrCat("messages[", i, "]: expected an object"));
    }
  }
  jinja::Value::Map globals = {
      {"messages", jinja::Value::FromJson(messages)},
      {"add_generation_prompt", jinja::Value::Bool(options.add_generation_prompt)},
      {"bos_token", jinja::Value::String(options.bos_token)},
      {"eos_token", jinja::Value::String(options.eos_token)},
  };
  absl::StatusOr<std::string> text = jinja::Render(*nodes_, globals);
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("chat_template: ", text.status().message()));
  }
  return text;
}

}  // namespace kvserve
