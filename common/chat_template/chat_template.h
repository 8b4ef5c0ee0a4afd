#ifndef KVSERVE_COMMON_CHAT_TEMPLATE_CHAT_TEMPLATE_H_
#define KVSERVE_COMMON_CHAT_TEMPLATE_CHAT_TEMPLATE_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace kvserve {

namespace jinja {
struct Node;
}  // namespace jinja

/// The variables a chat template sees besides `messages`.
struct ChatRenderOptions {
  /// End the prompt with the assistant's turn header (the template's add_generation_prompt).
  bool add_generation_prompt = true;
  /// The tokenizer's BOS and EOS token text ("<s>", "</s>"); empty when it has none.
  std::string bos_token;
  std::string eos_token;
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
  absl::StatusOr<std::string> Render(const nlohmann::json& messages,
                                     const ChatRenderOptions& options) const;

 private:
  explicit ChatTemplate(std::shared_ptr<const std::vector<jinja::Node>> nodes);
  std::shared_ptr<const std::vector<jinja::Node>> nodes_;
};

}  // namespace kvserve

#endif  // KVSERVE_COMMON_CHAT_TEMPLATE_CHAT_TEMPLATE_H_
