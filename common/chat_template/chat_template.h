#ifndef KVSERVE_COMMON_CHAT_TEMPLATE_CHAT_TEMPLATE_H_
#define KVSERVE_COMMON_CHAT_TEMPLATE_CHAT_TEMPLATE_H_

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/civil_time.h"
#include "nlohmann/json.hpp"

namespace kvserve {

namespace jinja {
struct Node;
}  // namespace jinja

/// The variables a chat template sees besides `messages`, as Hugging Face transformers'
/// apply_chat_template passes them.
struct ChatRenderOptions {
  /// End the prompt with the assistant's turn header (the template's add_generation_prompt).
  bool add_generation_prompt = true;
  /// The tokenizer's BOS and EOS token text ("<s>", "</s>"); empty when it has none.
  std::string bos_token;
  std::string eos_token;
  /// The request's tools (a JSON array of {"type": "function", "function": {...}}), or null:
  /// the template then sees `tools` as None.
  nlohmann::ordered_json tools = nullptr;
  /// Further variables, a JSON object: the tokenizer's other special tokens (pad_token,
  /// unk_token, ...) and a request's chat_template_kwargs (enable_thinking, ...). They override
  /// the variables above of the same name.
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();
  /// The date strftime_now() formats; unset: today (UTC).
  std::optional<absl::CivilDay> date;
};

/// A model's chat template (tokenizer_config.json `chat_template`, Jinja2 source) compiled
/// once and rendered per request into a prompt string.
///
/// Supports the Jinja subset listed in common/chat_template/jinja_parser.h, with Hugging Face's
/// environment settings (trim_blocks and lstrip_blocks on). Templates are data from a model
/// file: rendering has no access to anything but its inputs, and loops and output are bounded.
/// Immutable after Parse; Render may run on several threads at once.
class ChatTemplate {
 public:
  /// Compiles `source`; INVALID_ARGUMENT "chat_template: line N: ..." for syntax errors and
  /// constructs outside the supported subset.
  static absl::StatusOr<ChatTemplate> Parse(std::string_view source);

  /// Renders the prompt for `messages` (a JSON array of objects with at least "role" and
  /// "content"; other fields are visible to the template too). INVALID_ARGUMENT when messages
  /// is not such an array, when the template calls raise_exception (its message is kept), or
  /// when evaluation fails ("chat_template: line N: ...").
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& messages,
                                     const ChatRenderOptions& options) const;
  /// The same for messages parsed into nlohmann::json, whose objects hold their keys sorted: the
  /// template sees them in that order (tojson of a message writes them so).
  absl::StatusOr<std::string> Render(const nlohmann::json& messages,
                                     const ChatRenderOptions& options) const;

 private:
  explicit ChatTemplate(std::shared_ptr<const std::vector<jinja::Node>> nodes);
  std::shared_ptr<const std::vector<jinja::Node>> nodes_;
};

/// A model's chat template and the special tokens Hugging Face transformers passes it, as read
/// from tokenizer_config.json.
struct ChatTemplateConfig {
  /// `chat_template`: the string, or of named templates the one named "default".
  std::string source;
  /// bos_token and eos_token set, and unk/sep/pad/cls/mask tokens in `variables` (those the file
  /// sets: a string, or an object whose "content" is the text).
  ChatRenderOptions options;
};

/// Reads `path`: a tokenizer_config.json or a model directory holding one. NOT_FOUND when there
/// is none, INVALID_ARGUMENT naming the file when it is not JSON or has no chat_template.
absl::StatusOr<ChatTemplateConfig> LoadChatTemplateConfig(const std::string& path);

}  // namespace kvserve

#endif  // KVSERVE_COMMON_CHAT_TEMPLATE_CHAT_TEMPLATE_H_
