// Tool-call parsing per model family. The independent reference: the released chat templates'
// own renderings of assistant turns that made tool calls (shared/models/chat_templates, rendered
// by transformers' Jinja2) must parse back into the calls the messages held.
#include "common/chat_template/tool_calls.h"

#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kvserve {
namespace {

using json = nlohmann::json;

std::string TemplateDir(const std::string& model) {
  return std::string(KVSERVE_SHARED_DIR) + "/models/chat_templates/" + model;
}

json ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
}

std::string ChatTemplateOf(const std::string& model) {
  const json config = ReadJson(TemplateDir(model) + "/tokenizer_config.json");
  const json& t = config["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  return t.at(0).at("template").get<std::string>();
}

TEST(ToolCallsTest, FormatsOfTheReleasedTemplates) {
  EXPECT_EQ(DetectToolCallFormat(ChatTemplateOf("qwen3-4b")), ToolCallFormat::kHermes);
  EXPECT_EQ(DetectToolCallFormat(ChatTemplateOf("qwen2.5-coder-3b-instruct")),
            ToolCallFormat::kHermes);
  EXPECT_EQ(DetectToolCallFormat(ChatTemplateOf("qwen2.5-instruct-doublebrace-variant")),
            ToolCallFormat::kHermes);
  EXPECT_EQ(DetectToolCallFormat(ChatTemplateOf("llama-3.2-3b-instruct")),
            ToolCallFormat::kLlama3Json);
  EXPECT_EQ(DetectToolCallFormat(ChatTemplateOf("deepseek-r1")), ToolCallFormat::kDeepSeek);
  // This release of Mistral's template has no tool support.
  EXPECT_EQ(DetectToolCallFormat(ChatTemplateOf("mistral-7b-instruct-v0.3")),
            ToolCallFormat::kNone);
}

// Each template's rendering of an assistant turn with tool calls is what that family's model
// writes; it parses back into the message's calls.
TEST(ToolCallsTest, RenderedAssistantTurnsParseBackIntoTheirCalls) {
  struct Family {
    const char* model;
    const char* turn_start;
    const char* turn_end;
    const char* call_marker;
  };
  const Family families[] = {
      {"qwen3-4b", "<|im_start|>assistant\n", "<|im_end|>", "<tool_call>"},
      {"qwen2.5-coder-3b-instruct", "<|im_start|>assistant\n", "<|im_end|>", "<tool_call>"},
      {"qwen2.5-instruct-doublebrace-variant", "<|im_start|>assistant\n", "<|im_end|>",
       "<tool_call>"},
      {"llama-3.2-3b-instruct", "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>",
       "{\"name\""},
  };
  int checked = 0;
  for (const Family& f : families) {
    SCOPED_TRACE(f.model);
    const ToolCallFormat format = DetectToolCallFormat(ChatTemplateOf(f.model));
    const json golden = ReadJson(TemplateDir(f.model) + "/golden.json");
    ASSERT_TRUE(golden.contains("cases"));
    for (const json& c : golden["cases"]) {
      if (!c.contains("rendered")) continue;
      const json* calls = nullptr;
      for (const json& m : c["messages"]) {
        if (m.contains("tool_calls")) {
          calls = &m["tool_calls"];
          break;
        }
      }
      if (calls == nullptr) continue;
      SCOPED_TRACE(c["name"].get<std::string>());
      const std::string rendered = c["rendered"].get<std::string>();
      const size_t marker = rendered.find(f.call_marker);
      ASSERT_NE(marker, std::string::npos);
      const size_t start = rendered.rfind(f.turn_start, marker) + std::string(f.turn_start).size();
      const size_t end = rendered.find(f.turn_end, marker);
      const ParsedReply reply = ParseToolCalls(format, rendered.substr(start, end - start));
      ASSERT_EQ(reply.tool_calls.size(), calls->size()) << rendered.substr(start, end - start);
      EXPECT_EQ(reply.content, "");
      for (size_t i = 0; i < calls->size(); ++i) {
        const json& want = (*calls)[i]["function"];
        EXPECT_EQ(reply.tool_calls[i].name, want["name"].get<std::string>());
        const json want_args = want["arguments"].is_string()
                                   ? json::parse(want["arguments"].get<std::string>())
                                   : want["arguments"];
        EXPECT_EQ(json::parse(reply.tool_calls[i].arguments), want_args);
      }
      ++checked;
    }
  }
  EXPECT_GE(checked, 4);
}

TEST(ToolCallsTest, HermesContentAndSeveralCalls) {
  const ParsedReply r = ParseToolCalls(
      ToolCallFormat::kHermes,
      "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"b\", \"arguments\": \"{\\\"y\\\": [2]}\"}\n</tool_call>");
  EXPECT_EQ(r.content, "Let me check.");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].name, "a");
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"x":1})");
  EXPECT_EQ(r.tool_calls[1].name, "b");
  EXPECT_EQ(r.tool_calls[1].arguments, R"({"y":[2]})");
  // Unclosed (the reply ended at EOS): still a call. Malformed: kept as content.
  const ParsedReply unclosed =
      ParseToolCalls(ToolCallFormat::kHermes, "<tool_call>\n{\"name\": \"c\"}\n");
  ASSERT_EQ(unclosed.tool_calls.size(), 1u);
  EXPECT_EQ(unclosed.tool_calls[0].arguments, "{}");
  const ParsedReply bad =
      ParseToolCalls(ToolCallFormat::kHermes, "Hi <tool_call>{\"nam\": 1}</tool_call> there");
  EXPECT_TRUE(bad.tool_calls.empty());
  EXPECT_EQ(bad.content, "Hi\n\n<tool_call>{\"nam\": 1}</tool_call>\n\nthere");
}

TEST(ToolCallsTest, Llama3JsonMistralAndDeepSeek) {
  ParsedReply r = ParseToolCalls(
      ToolCallFormat::kLlama3Json,
      "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"q\": \"x\"}}; {\"name\": \"b\", "
      "\"parameters\": {}}");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"q":"x"})");
  EXPECT_EQ(r.tool_calls[1].name, "b");
  r = ParseToolCalls(ToolCallFormat::kLlama3Json, "{\"answer\": 42}");
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, "{\"answer\": 42}");

  r = ParseToolCalls(ToolCallFormat::kMistral,
                     "Sure. [TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"n\": 3}}, "
                     "{\"name\": \"g\", \"arguments\": {}}]");
  EXPECT_EQ(r.content, "Sure.");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"n":3})");

  r = ParseToolCalls(
      ToolCallFormat::kDeepSeek,
      "Thinking done.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
      "```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁call▁begin｜>function"
      "<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
  EXPECT_EQ(r.content, "Thinking done.");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(r.tool_calls[1].name, "get_time");

  r = ParseToolCalls(ToolCallFormat::kNone, "<tool_call>{\"name\": \"a\"}</tool_call>");
  EXPECT_TRUE(r.tool_calls.empty());
}

}  // namespace
}  // namespace kvserve
