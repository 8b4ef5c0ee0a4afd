// `kvserve chat-template`: render a model's chat template for a request, as Hugging Face
// transformers' apply_chat_template does, for users debugging a template and for tests.

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/cli/command.h"
#include "common/chat_template/chat_template.h"
#include "nlohmann/json.hpp"

namespace kvserve::cli {
namespace {

struct ChatTemplateOptions {
  std::string config;
  std::string request;
  std::string date;
};

int RunChatTemplate(const ChatTemplateOptions& o) {
  absl::StatusOr<ChatTemplateConfig> config = LoadChatTemplateConfig(o.config);
  if (!config.ok()) return ReportError("chat-template", config.status());
  absl::StatusOr<ChatTemplate> tmpl = ChatTemplate::Parse(config->source);
  if (!tmpl.ok()) return ReportError("chat-template", tmpl.status());

  std::ifstream in(o.request, std::ios::binary);
  if (!in) {
    return ReportError("chat-template",
                       absl::NotFoundError(absl::StrCat("cannot read ", o.request)));
  }
  std::stringstream text;
  text << in.rdbuf();
  // ordered_json: the template sees each object's keys in the file's order, as Python does.
  const nlohmann::ordered_json request = nlohmann::ordered_json::parse(text.str(), nullptr, false);
  if (request.is_discarded() || !request.is_object() || !request.contains("messages")) {
    return ReportError("chat-template",
                       absl::InvalidArgumentError(
                           absl::StrCat(o.request, ": expected a JSON object with \"messages\"")));
  }
  ChatRenderOptions options = config->options;
  // apply_chat_template's defaults: no generation prompt, no tools.
  options.add_generation_prompt = false;
  if (const auto it = request.find("add_generation_prompt"); it != request.end()) {
    if (!it->is_boolean()) {
      return ReportError("chat-template", absl::InvalidArgumentError(
                                              "add_generation_prompt: expected true or false"));
    }
    options.add_generation_prompt = it->get<bool>();
  }
  if (const auto it = request.find("tools"); it != request.end()) options.tools = *it;
  if (const auto it = request.find("extra"); it != request.end() && !it->is_null()) {
    if (!it->is_object()) {
      return ReportError("chat-template",
                         absl::InvalidArgumentError("extra: expected an object of variables"));
    }
    for (const auto& [name, value] : it->items()) options.variables[name] = value;
  }
  if (!o.date.empty()) {
    absl::CivilDay day;
    if (!absl::ParseCivilTime(o.date, &day)) {
      return ReportError("chat-template", absl::InvalidArgumentError(absl::StrCat(
                                              "--date: expected YYYY-MM-DD, got '", o.date, "'")));
    }
    options.date = day;
  }
  absl::StatusOr<std::string> rendered = tmpl->Render(request["messages"], options);
  if (!rendered.ok()) return ReportError("chat-template", rendered.status());
  std::fwrite(rendered->data(), 1, rendered->size(), stdout);
  return 0;
}

}  // namespace

Command AddChatTemplateCommand(CLI::App& app) {
  auto o = std::make_shared<ChatTemplateOptions>();
  CLI::App* sub = app.add_subcommand(
      "chat-template",
      "Render a model's chat template for a request (as transformers' apply_chat_template) and "
      "print it byte for byte.");
  sub->add_option("--config", o->config, "tokenizer_config.json, or a model directory holding one")
      ->required();
  sub->add_option("--request", o->request,
                  "JSON file: {\"messages\": [...], \"tools\": [...], \"add_generation_prompt\": "
                  "bool, \"extra\": {variables}}")
      ->required();
  sub->add_option("--date", o->date, "The date strftime_now() formats, YYYY-MM-DD (default today)");
  return {sub, [o] { return RunChatTemplate(*o); }};
}

}  // namespace kvserve::cli
