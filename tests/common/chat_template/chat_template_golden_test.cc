// Released models' chat templates against reference renderings made with Jinja2 the way Hugging
// Face transformers' apply_chat_template renders them (../shared/models/chat_templates: each
// folder's tokenizer_config.json as published and golden.json with the cases). Every rendering
// must match byte for byte; where the reference raised an error, rendering must fail with the
// same message.

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/chat_template/chat_template.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kvserve {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kTemplates[] = KVSERVE_SHARED_DIR "/models/chat_templates";

Json ReadJson(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return Json::parse(text.str());
}

// The folders that hold a golden.json.
std::vector<std::string> Models() {
  std::vector<std::string> models;
  for (const auto& entry : std::filesystem::directory_iterator(kTemplates)) {
    if (std::filesystem::exists(entry.path() / "golden.json")) {
      models.push_back(entry.path().filename().string());
    }
  }
  std::sort(models.begin(), models.end());
  return models;
}

class ChatTemplateGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatTemplateGoldenTest, RendersEveryCaseLikeTransformers) {
  const std::filesystem::path dir = std::filesystem::path(kTemplates) / GetParam();
  const Json golden = ReadJson(dir / "golden.json");
  absl::StatusOr<ChatTemplateConfig> config = LoadChatTemplateConfig(dir.string());
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<ChatTemplate> tmpl = ChatTemplate::Parse(config->source);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();

  // The special tokens read from tokenizer_config.json are the ones the reference passed.
  ChatRenderOptions base = config->options;
  Json passed = base.variables;
  if (!base.bos_token.empty()) passed["bos_token"] = base.bos_token;
  if (!base.eos_token.empty()) passed["eos_token"] = base.eos_token;
  const Json& expected = golden.at("render_env").at("special_tokens_passed");
  EXPECT_EQ(passed.size(), expected.size()) << passed.dump() << " vs " << expected.dump();
  for (const auto& [name, value] : expected.items()) EXPECT_EQ(passed.value(name, Json()), value);
  int year = 0, month = 0, day = 0;
  ASSERT_EQ(std::sscanf(golden.at("strftime_date").get<std::string>().c_str(), "%d-%d-%d", &year,
                        &month, &day),
            3);
  base.date = absl::CivilDay(year, month, day);

  ASSERT_FALSE(golden.at("cases").empty());
  for (const Json& c : golden.at("cases")) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    ChatRenderOptions options = base;
    options.add_generation_prompt = c.at("add_generation_prompt").get<bool>();
    options.tools = c.at("tools");
    for (const auto& [name, value] : c.at("extra").items()) options.variables[name] = value;
    absl::StatusOr<std::string> rendered = tmpl->Render(c.at("messages"), options);
    if (c.contains("rendered")) {
      ASSERT_TRUE(rendered.ok()) << rendered.status();
      EXPECT_EQ(*rendered, c.at("rendered").get<std::string>());
    } else {
      const std::string error = c.at("error").get<std::string>();
      ASSERT_FALSE(rendered.ok()) << "rendered where the reference failed with: " << error;
      EXPECT_NE(rendered.status().message().find(error), std::string::npos)
          << rendered.status() << "\nreference: " << error;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Released, ChatTemplateGoldenTest, ::testing::ValuesIn(Models()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& ch : name) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace kvserve
