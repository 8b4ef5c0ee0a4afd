// The tool-call grammar, per model family: the texts a family's template teaches match, calls
// to functions outside the list, arguments that break the schema and extra calls do not; and
// the text the grammar allows parses back (common/chat_template/tool_calls) into the same calls.
#include "worker/constraint/tool_call_grammar.h"

#include <memory>
#include <string>
#include <vector>

#include "common/chat_template/tool_calls.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/constraint/matcher.h"

namespace kvserve::constraint {
namespace {

using json = nlohmann::ordered_json;

const json kWeather = json::parse(R"({"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20},
                   "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city"], "additionalProperties": false}})");
const json kTime = json::parse(R"({"name": "get_time"})");  // no parameters: any object

std::shared_ptr<const Grammar> Compile(const std::string& format, bool parallel) {
  const json spec = {{"format", format}, {"functions", {kWeather, kTime}}, {"parallel", parallel}};
  absl::StatusOr<Grammar> g = ToolCallGrammar(spec);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? std::make_shared<const Grammar>(std::move(*g)) : nullptr;
}

bool Matches(const std::shared_ptr<const Grammar>& grammar, std::string_view text) {
  GrammarMatcher m(grammar);
  return m.Advance(text) && m.CanEnd();
}

struct FormatCase {
  const char* format;
  ToolCallFormat parser;
  std::string one;  // a call to get_weather
  std::string two;  // get_weather then get_time
  std::string bad_name;
  std::string bad_args;  // get_weather without its required city
};

std::vector<FormatCase> Cases() {
  const std::string w = R"({"city": "Paris", "unit": "celsius"})";
  const std::string t = R"({"tz": "UTC"})";
  return {
      {"hermes", ToolCallFormat::kHermes,
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + w + "}\n</tool_call>",
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + w +
           "}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": " + t +
           "}\n</tool_call>",
       "<tool_call>\n{\"name\": \"get_news\", \"arguments\": {}}\n</tool_call>",
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"celsius\"}}\n"
       "</tool_call>"},
      {"llama3_json", ToolCallFormat::kLlama3Json,
       "{\"name\": \"get_weather\", \"parameters\": " + w + "}",
       "{\"name\": \"get_weather\", \"parameters\": " + w +
           "}; {\"name\": \"get_time\", \"parameters\": " + t + "}",
       "{\"name\": \"get_news\", \"parameters\": {}}",
       "{\"name\": \"get_weather\", \"parameters\": {}}"},
      {"mistral", ToolCallFormat::kMistral,
       "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": " + w + "}]",
       "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": " + w +
           "}, {\"name\": \"get_time\", \"arguments\": " + t + "}]",
       "[TOOL_CALLS][{\"name\": \"get_news\", \"arguments\": {}}]",
       "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": 3}}]"},
      {"deepseek", ToolCallFormat::kDeepSeek,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n" +
           w + "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n" +
           w +
           "\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n"
           "```json\n" +
           t + "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_news\n```json\n{}\n"
       "```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
       "{\"city\": \"Paris\", \"wind\": 1}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
      {"json", ToolCallFormat::kJsonArray,
       "[{\"name\": \"get_weather\", \"parameters\": " + w + "}]",
       "[{\"name\": \"get_weather\", \"parameters\": " + w +
           "}, {\"name\": \"get_time\", \"parameters\": " + t + "}]",
       "[{\"name\": \"get_news\", \"parameters\": {}}]",
       "[{\"name\": \"get_weather\", \"parameters\": {\"unit\": \"kelvin\", \"city\": \"x\"}}]"},
  };
}

TEST(ToolCallGrammarTest, EachFamilysCallsMatchAndNothingElseDoes) {
  for (const FormatCase& c : Cases()) {
    SCOPED_TRACE(c.format);
    const std::shared_ptr<const Grammar> single = Compile(c.format, /*parallel=*/false);
    const std::shared_ptr<const Grammar> parallel = Compile(c.format, /*parallel=*/true);
    ASSERT_NE(single, nullptr);
    ASSERT_NE(parallel, nullptr);
    EXPECT_TRUE(Matches(single, c.one)) << c.one;
    EXPECT_TRUE(Matches(parallel, c.one)) << c.one;
    EXPECT_FALSE(Matches(single, c.two)) << "two calls without parallel: " << c.two;
    EXPECT_TRUE(Matches(parallel, c.two)) << c.two;
    EXPECT_FALSE(Matches(parallel, c.bad_name)) << c.bad_name;
    EXPECT_FALSE(Matches(parallel, c.bad_args)) << c.bad_args;
    EXPECT_FALSE(Matches(parallel, "")) << "the reply must call something";
    EXPECT_FALSE(Matches(parallel, "Sure! " + c.one)) << "no text before the calls";

    // What the grammar allows parses back into the calls.
    const ParsedReply one = ParseToolCalls(c.parser, c.one);
    ASSERT_EQ(one.tool_calls.size(), 1u);
    EXPECT_EQ(one.tool_calls[0].name, "get_weather");
    EXPECT_EQ(json::parse(one.tool_calls[0].arguments),
              json::parse(R"({"city": "Paris", "unit": "celsius"})"));
    EXPECT_EQ(one.content, "");
    const ParsedReply two = ParseToolCalls(c.parser, c.two);
    ASSERT_EQ(two.tool_calls.size(), 2u);
    EXPECT_EQ(two.tool_calls[1].name, "get_time");
    EXPECT_EQ(json::parse(two.tool_calls[1].arguments), json::parse(R"({"tz": "UTC"})"));
  }
}

TEST(ToolCallGrammarTest, MalformedSpecsAreRefusedNamingTheField) {
  struct Case {
    json spec;
    const char* message;
  };
  const Case cases[] = {
      {{{"format", "xml"}, {"functions", {kTime}}}, "tool_calls.format"},
      {{{"format", "hermes"}, {"functions", json::array()}}, "tool_calls.functions"},
      {{{"format", "hermes"}, {"functions", {{{"name", ""}}}}}, "tool_calls.functions[0].name"},
      {{{"format", "deepseek"}, {"functions", {{{"name", "a\nb"}}}}},
       "tool_calls.functions[0].name"},
      {{{"format", "hermes"},
        {"functions",
         {kTime, {{"name", "f"}, {"parameters", {{"type", "object"}, {"multipleOf", 2}}}}}}},
       "tool_calls.functions[1].parameters: json schema: multipleOf"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Grammar> g = ToolCallGrammar(c.spec);
    ASSERT_FALSE(g.ok()) << c.spec.dump();
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(g.status().message().find(c.message), std::string::npos) << g.status();
  }
}

TEST(ToolCallStartTest, HoldsBackWhatMayBeACall) {
  EXPECT_EQ(ToolCallStart(ToolCallFormat::kHermes, "Let me check."), std::string::npos);
  EXPECT_EQ(ToolCallStart(ToolCallFormat::kHermes, "Let me check.<tool"), 13u);
  EXPECT_EQ(ToolCallStart(ToolCallFormat::kHermes, "ok <tool_call>\n{"), 3u);
  EXPECT_EQ(ToolCallStart(ToolCallFormat::kHermes, "a < b"), std::string::npos);
  EXPECT_EQ(ToolCallStart(ToolCallFormat::kMistral, "x [TOOL"), 2u);
  EXPECT_EQ(ToolCallStart(ToolCallFormat::kDeepSeek, "x <｜tool"), 2u);
  EXPECT_EQ(ToolCallStart(ToolCallFormat::kLlama3Json, "  "), 0u);
  EXPECT_EQ(ToolCallStart(ToolCallFormat::kLlama3Json, " {\"name\""), 1u);
  EXPECT_EQ(ToolCallStart(ToolCallFormat::kLlama3Json, "<|python"), 0u);
  EXPECT_EQ(ToolCallStart(ToolCallFormat::kLlama3Json, "Hello"), std::string::npos);
  EXPECT_EQ(ToolCallStart(ToolCallFormat::kJsonArray, "[{"), 0u);
  EXPECT_EQ(ToolCallStart(ToolCallFormat::kNone, "<tool_call>"), std::string::npos);
}

}  // namespace
}  // namespace kvserve::constraint
