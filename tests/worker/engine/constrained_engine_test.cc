// Constrained decoding through the engine on stories260K (whose text is nonsense, so only the
// constraint makes its output valid): JSON schemas, regular expressions and GBNF grammars, batched
// and alone, with n > 1, and refusals at Submit.
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/chat_template/tool_calls.h"
#include "common/tokenizer/regex.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/worker/engine/engine_test_util.h"
#include "worker/engine/engine.h"

namespace kvserve {
namespace {

using constraint::ConstraintSpec;
using testing_engine::Collected;
using testing_engine::Drain;

constexpr const char* kSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "mood": {"enum": ["happy", "sad", "sleepy"]},
    "pets": {"type": "array", "maxItems": 3,
             "items": {"type": "object",
                       "properties": {"kind": {"enum": ["cat", "dog"]},
                                      "weight": {"type": "number"}},
                       "required": ["kind"]}},
    "friend": {"type": ["string", "null"], "maxLength": 8}
  },
  "required": ["name", "age", "mood", "pets"]
})";

// Whether all of `text` matches `pattern`, by PCRE2 (through the tokenizer's wrapper): an
// independent regex engine. (std::regex trips g++ 12's -Wmaybe-uninitialized under ASan.)
bool FullMatch(const std::string& pattern, const std::string& text) {
  absl::StatusOr<std::unique_ptr<Regex>> re =
      Regex::Compile(absl::StrCat("^(?:", pattern, ")$"), /*literal=*/false);
  if (!re.ok()) return false;
  const std::vector<std::pair<size_t, size_t>> spans = (*re)->FindAll(text);
  return spans.size() == 1 && spans[0].first == 0 && spans[0].second == text.size();
}

class ConstrainedEngineTest : public testing_engine::StoriesModelTest {
 protected:
  static EngineOptions Options() {
    EngineOptions o;
    o.num_threads = 1;
    o.check_invariants = true;
    return o;
  }

  static std::vector<TokenId> Prompt(const std::string& text) {
    return *model_->tokenizer->Encode(text);
  }

  static EngineRequest Request(std::string id, ConstraintSpec spec, float temperature,
                               uint64_t seed) {
    EngineRequest r;
    r.request_id = std::move(id);
    r.prompt_ids = Prompt("Once upon a time, Lily wrote down");
    r.params.temperature = temperature;
    r.params.seed = seed;
    r.params.max_tokens = 300;
    r.constraint = std::move(spec);
    return r;
  }

  // The checks a validator would make for kSchema, written out.
  static void ExpectValid(const std::string& text) {
    const nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(doc.is_discarded()) << text;
    ASSERT_TRUE(doc.is_object()) << text;
    ASSERT_TRUE(doc.contains("name") && doc["name"].is_string()) << text;
    EXPECT_LE(doc["name"].get<std::string>().size(), 12u * 4) << text;
    ASSERT_TRUE(doc.contains("age") && doc["age"].is_number_integer()) << text;
    EXPECT_GE(doc["age"].get<int>(), 0) << text;
    EXPECT_LE(doc["age"].get<int>(), 120) << text;
    ASSERT_TRUE(doc.contains("mood")) << text;
    EXPECT_TRUE(std::set<std::string>({"happy", "sad", "sleepy"}).contains(doc["mood"])) << text;
    ASSERT_TRUE(doc.contains("pets") && doc["pets"].is_array()) << text;
    EXPECT_LE(doc["pets"].size(), 3u) << text;
    for (const nlohmann::json& pet : doc["pets"]) {
      ASSERT_TRUE(pet.is_object() && pet.contains("kind")) << text;
      EXPECT_TRUE(pet["kind"] == "cat" || pet["kind"] == "dog") << text;
      if (pet.contains("weight")) {
        EXPECT_TRUE(pet["weight"].is_number()) << text;
      }
    }
    if (doc.contains("friend")) {
      EXPECT_TRUE(doc["friend"].is_string() || doc["friend"].is_null()) << text;
    }
    for (const auto& [key, value] : doc.items()) {
      EXPECT_TRUE(std::set<std::string>({"name", "age", "mood", "pets", "friend"}).contains(key))
          << text;
    }
  }
};

TEST_F(ConstrainedEngineTest, JsonSchemaOutputsValidateBatchedAndAlone) {
  constexpr int kRequests = 24;
  std::vector<EngineRequest> requests;
  for (int i = 0; i < kRequests; ++i) {
    requests.push_back(Request(absl::StrCat("json-", i),
                               {ConstraintSpec::Kind::kJsonSchema, kSchema}, i == 0 ? 0.0f : 1.0f,
                               100 + i));
  }
  std::unique_ptr<Engine> batched = *Engine::Create(model_, Options());
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const EngineRequest& r : requests) streams.push_back(*batched->Submit(r));
  std::vector<Collected> together;
  for (auto& s : streams) together.push_back(Drain(*s)[0]);
  testing_engine::ExpectPoolFree(*batched);

  std::unique_ptr<Engine> single = *Engine::Create(model_, Options());
  for (int i = 0; i < kRequests; ++i) {
    SCOPED_TRACE(requests[i].request_id);
    const Collected& got = together[i];
    ASSERT_TRUE(got.final_output.status.ok()) << got.final_output.status;
    EXPECT_EQ(got.final_output.finish_reason, FinishReason::kStop) << got.text;
    ExpectValid(got.text);
    // The same tokens when the request runs alone: masks do not depend on the batch.
    Collected alone = Drain(**single->Submit(requests[i]))[0];
    EXPECT_EQ(alone.tokens, got.tokens);
  }
  testing_engine::ExpectPoolFree(*single);
}

TEST_F(ConstrainedEngineTest, EverySampleOfNIsValid) {
  std::unique_ptr<Engine> engine = *Engine::Create(model_, Options());
  EngineRequest r = Request("n4", {ConstraintSpec::Kind::kJsonSchema, kSchema}, 1.0f, 7);
  r.n = 4;
  std::map<int, Collected> samples = Drain(**engine->Submit(r));
  ASSERT_EQ(samples.size(), 4u);
  std::set<std::string> distinct;
  for (const auto& [index, got] : samples) {
    SCOPED_TRACE(index);
    EXPECT_EQ(got.final_output.finish_reason, FinishReason::kStop);
    ExpectValid(got.text);
    distinct.insert(got.text);
  }
  EXPECT_GT(distinct.size(), 1u);
  testing_engine::ExpectPoolFree(*engine);
}

TEST_F(ConstrainedEngineTest, RegexAndGrammarShapeTheText) {
  std::unique_ptr<Engine> engine = *Engine::Create(model_, Options());
  const std::string pattern = "(yes|no)(, (yes|no)){2,4}\\.";
  for (int seed = 0; seed < 6; ++seed) {
    Collected got = Drain(**engine->Submit(Request(
        absl::StrCat("re-", seed), {ConstraintSpec::Kind::kRegex, pattern}, 1.0f, seed)))[0];
    EXPECT_TRUE(FullMatch(pattern, got.text)) << got.text;
    EXPECT_EQ(got.final_output.finish_reason, FinishReason::kStop);
  }
  const std::string gbnf =
      "root ::= \"The \" animal \" is \" [0-9]{1,2} \" years old\"\n"
      "animal ::= \"cat\" | \"dog\" | \"bird\"\n";
  Collected got =
      Drain(**engine->Submit(Request("gbnf", {ConstraintSpec::Kind::kGrammar, gbnf}, 0.8f, 3)))[0];
  EXPECT_TRUE(FullMatch("The (cat|dog|bird) is [0-9]{1,2} years old", got.text)) << got.text;
  testing_engine::ExpectPoolFree(*engine);
}

TEST_F(ConstrainedEngineTest, ToolCallsInEveryFamilysFormatParseAndValidate) {
  std::unique_ptr<Engine> engine = *Engine::Create(model_, Options());
  const nlohmann::ordered_json functions = nlohmann::ordered_json::parse(R"([
      {"name": "get_weather", "parameters": {"type": "object",
       "properties": {"city": {"type": "string", "maxLength": 12},
                      "unit": {"enum": ["celsius", "fahrenheit"]}},
       "required": ["city"], "additionalProperties": false}},
      {"name": "get_time", "parameters": {"type": "object",
       "properties": {"tz": {"enum": ["UTC", "CET"]}}, "additionalProperties": false}}])");
  const std::pair<const char*, ToolCallFormat> formats[] = {
      {"hermes", ToolCallFormat::kHermes},
      {"llama3_json", ToolCallFormat::kLlama3Json},
      {"mistral", ToolCallFormat::kMistral},
      {"deepseek", ToolCallFormat::kDeepSeek},
      {"json", ToolCallFormat::kJsonArray}};
  // Each call valid: a listed function, arguments that validate.
  auto expect_valid = [](const ParsedToolCall& call, const std::string& text) {
    const nlohmann::json args = nlohmann::json::parse(call.arguments);
    ASSERT_TRUE(args.is_object()) << text;
    if (call.name == "get_weather") {
      ASSERT_TRUE(args.contains("city") && args["city"].is_string()) << text;
      for (const auto& [key, value] : args.items()) {
        EXPECT_TRUE(key == "city" ||
                    (key == "unit" && (value == "celsius" || value == "fahrenheit")))
            << text;
      }
    } else {
      ASSERT_EQ(call.name, "get_time") << text;
      for (const auto& [key, value] : args.items()) {
        EXPECT_TRUE(key == "tz" && (value == "UTC" || value == "CET")) << text;
      }
    }
  };
  for (const auto& [format, parser] : formats) {
    for (int seed = 0; seed < 4; ++seed) {
      SCOPED_TRACE(absl::StrCat(format, " seed ", seed));
      // One call: the grammar ends after it, so the reply ends there (finish reason stop).
      const nlohmann::ordered_json spec = {
          {"format", format}, {"functions", functions}, {"parallel", false}};
      Collected got = Drain(**engine->Submit(
          Request(absl::StrCat("tools-", format, "-", seed),
                  {ConstraintSpec::Kind::kToolCalls, spec.dump()}, 1.0f, seed)))[0];
      ASSERT_TRUE(got.final_output.status.ok()) << got.final_output.status;
      EXPECT_EQ(got.final_output.finish_reason, FinishReason::kStop) << got.text;
      // Parsed by the HTTP front's parser for the family: one call and nothing else.
      const ParsedReply reply = ParseToolCalls(parser, got.text);
      EXPECT_EQ(reply.content, "") << got.text;
      ASSERT_EQ(reply.tool_calls.size(), 1u) << got.text;
      expect_valid(reply.tool_calls[0], got.text);
    }
    // Parallel: stories260K rarely stops choosing another call, so the reply may run to the end
    // of its context; every whole call in it is valid all the same.
    const nlohmann::ordered_json spec = {
        {"format", format}, {"functions", functions}, {"parallel", true}};
    Collected got = Drain(
        **engine->Submit(Request(absl::StrCat("parallel-", format),
                                 {ConstraintSpec::Kind::kToolCalls, spec.dump()}, 1.0f, 11)))[0];
    ASSERT_TRUE(got.final_output.status.ok()) << got.final_output.status;
    const ParsedReply reply = ParseToolCalls(parser, got.text);
    if (got.final_output.finish_reason == FinishReason::kStop) {
      EXPECT_EQ(reply.content, "") << got.text;
      EXPECT_GE(reply.tool_calls.size(), 1u) << got.text;
    }
    for (const ParsedToolCall& call : reply.tool_calls) expect_valid(call, got.text);
  }
  testing_engine::ExpectPoolFree(*engine);
}

TEST_F(ConstrainedEngineTest, MaxTokensCutsTheOutputShort) {
  std::unique_ptr<Engine> engine = *Engine::Create(model_, Options());
  EngineRequest r = Request("short", {ConstraintSpec::Kind::kJsonSchema, kSchema}, 1.0f, 5);
  r.params.max_tokens = 3;
  Collected got = Drain(**engine->Submit(r))[0];
  EXPECT_EQ(got.final_output.finish_reason, FinishReason::kLength);
  EXPECT_EQ(got.tokens.size(), 3u);
  testing_engine::ExpectPoolFree(*engine);
}

TEST_F(ConstrainedEngineTest, BadConstraintsAreRefusedAtSubmit) {
  std::unique_ptr<Engine> engine = *Engine::Create(model_, Options());
  struct Case {
    ConstraintSpec spec;
    const char* message;
  };
  const Case cases[] = {
      {{ConstraintSpec::Kind::kJsonSchema, R"({"type": "string", "format": "hostname"})"},
       "format 'hostname'"},
      {{ConstraintSpec::Kind::kJsonSchema, "[1, 2"}, "not valid JSON"},
      {{ConstraintSpec::Kind::kRegex, "(a"}, "missing ')'"},
      {{ConstraintSpec::Kind::kGrammar, "root ::= x"}, "never defined"},
      {{ConstraintSpec::Kind::kToolCalls, R"({"format": "hermes", "functions": []})"},
       "tool_calls.functions"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::shared_ptr<RequestStream>> s =
        engine->Submit(Request("bad", c.spec, 1.0f, 1));
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find(c.message), std::string::npos) << s.status();
  }
  // A constraint no token can continue (an empty class) fails the request, not the engine.
  Collected got = Drain(**engine->Submit(
      Request("impossible", {ConstraintSpec::Kind::kRegex, "[^\\x00-\\u{10FFFF}]"}, 1.0f, 1)))[0];
  EXPECT_EQ(got.final_output.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(got.final_output.status.message().find("no token"), std::string::npos);
  testing_engine::ExpectPoolFree(*engine);
}

}  // namespace
}  // namespace kvserve
