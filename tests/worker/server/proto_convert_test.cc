// The proto <-> engine mapping: defaults of unset fields, saturation, field-naming errors.

#include "worker/server/proto_convert.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/worker/model/golden.h"

namespace kvserve {
namespace {

class ProtoConvertTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new LoadedModel(*LoadModel(testing_golden::kStoriesGguf));
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  static LoadedModel* model_;
};
LoadedModel* ProtoConvertTest::model_ = nullptr;

TEST_F(ProtoConvertTest, UnsetFieldsTakeTheDocumentedDefaults) {
  v1::GenerateRequest request;
  request.set_prompt("Once upon a time");
  absl::StatusOr<EngineRequest> r = ToEngineRequest(request, *model_);
  ASSERT_TRUE(r.ok()) << r.status();
  // llama2.c's tokenizer with BOS (golden.json's prompt ids for this prompt).
  EXPECT_EQ(r->prompt_ids, (std::vector<TokenId>{1, 403, 407, 261, 378}));
  EXPECT_EQ(r->n, 1);
  EXPECT_EQ(r->request_id, "");
  const SamplingParams& p = r->params;
  EXPECT_EQ(p.temperature, 1.0f);
  EXPECT_EQ(p.top_p, 1.0f);
  EXPECT_EQ(p.top_k, 0);
  EXPECT_EQ(p.min_p, 0.0f);
  EXPECT_EQ(p.repetition_penalty, 1.0f);
  EXPECT_EQ(p.presence_penalty, 0.0f);
  EXPECT_EQ(p.frequency_penalty, 0.0f);
  EXPECT_FALSE(p.seed.has_value());
  EXPECT_EQ(p.max_tokens, kDefaultMaxTokens);
  EXPECT_EQ(p.max_tokens, 16);
  EXPECT_EQ(p.logprobs, -1);
  EXPECT_FALSE(p.ignore_eos);
  EXPECT_FALSE(p.include_stop_str_in_output);
}

TEST_F(ProtoConvertTest, SetFieldsAreCopied) {
  v1::GenerateRequest request;
  request.add_prompt_token_ids(5);
  request.add_prompt_token_ids(511);
  request.set_max_tokens(7);
  request.set_n(3);
  request.set_cache_salt("tenant");
  request.set_request_id("abc");
  request.add_stop("\n\n");
  request.add_stop_token_ids(13);
  request.set_ignore_eos(true);
  request.set_include_stop_str_in_output(true);
  request.set_logprobs(0);
  v1::SamplingParams* s = request.mutable_sampling();
  s->set_temperature(0.0f);
  s->set_top_p(0.5f);
  s->set_top_k(4);
  s->set_min_p(0.1f);
  s->set_repetition_penalty(1.2f);
  s->set_presence_penalty(-0.5f);
  s->set_frequency_penalty(0.25f);
  s->set_seed(99);
  absl::StatusOr<EngineRequest> r = ToEngineRequest(request, *model_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prompt_ids, (std::vector<TokenId>{5, 511}));
  EXPECT_EQ(r->n, 3);
  EXPECT_EQ(r->cache_salt, "tenant");
  EXPECT_EQ(r->request_id, "abc");
  const SamplingParams& p = r->params;
  EXPECT_EQ(p.max_tokens, 7);
  EXPECT_EQ(p.temperature, 0.0f);
  EXPECT_EQ(p.top_p, 0.5f);
  EXPECT_EQ(p.top_k, 4);
  EXPECT_EQ(p.min_p, 0.1f);
  EXPECT_EQ(p.repetition_penalty, 1.2f);
  EXPECT_EQ(p.presence_penalty, -0.5f);
  EXPECT_EQ(p.frequency_penalty, 0.25f);
  EXPECT_EQ(p.seed, std::optional<uint64_t>(99));
  EXPECT_EQ(p.stop, (std::vector<std::string>{"\n\n"}));
  EXPECT_EQ(p.stop_token_ids, (std::vector<TokenId>{13}));
  EXPECT_TRUE(p.ignore_eos);
  EXPECT_TRUE(p.include_stop_str_in_output);
  EXPECT_EQ(p.logprobs, 0);
}

TEST_F(ProtoConvertTest, ConstraintOneofBecomesTheEngineConstraint) {
  using Kind = constraint::ConstraintSpec::Kind;
  v1::GenerateRequest request;
  request.set_prompt("Once upon a time");
  absl::StatusOr<EngineRequest> none = ToEngineRequest(request, *model_);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->constraint.kind, Kind::kNone);
  request.set_json_schema(R"({"type": "integer"})");
  absl::StatusOr<EngineRequest> schema = ToEngineRequest(request, *model_);
  ASSERT_TRUE(schema.ok());
  EXPECT_EQ(schema->constraint.kind, Kind::kJsonSchema);
  EXPECT_EQ(schema->constraint.text, R"({"type": "integer"})");
  request.set_json_object(true);
  EXPECT_EQ(ToEngineRequest(request, *model_)->constraint.kind, Kind::kJsonObject);
  request.set_regex("a+");
  EXPECT_EQ(ToEngineRequest(request, *model_)->constraint.text, "a+");
  EXPECT_EQ(ToEngineRequest(request, *model_)->constraint.kind, Kind::kRegex);
  request.set_grammar("root ::= \"a\"");
  EXPECT_EQ(ToEngineRequest(request, *model_)->constraint.kind, Kind::kGrammar);
  request.set_json_object(false);
  absl::StatusOr<EngineRequest> off = ToEngineRequest(request, *model_);
  EXPECT_EQ(off.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(off.status().message().find("json_object"), std::string::npos);

  // Tool calls: the spec the tool-call grammar reads, parameters parsed.
  v1::ToolCallConstraint* tools = request.mutable_tool_calls();
  tools->set_format("hermes");
  tools->set_parallel(true);
  v1::ToolFunction* f = tools->add_functions();
  f->set_name("get_weather");
  f->set_parameters(R"({"type": "object"})");
  tools->add_functions()->set_name("get_time");
  absl::StatusOr<EngineRequest> calls = ToEngineRequest(request, *model_);
  ASSERT_TRUE(calls.ok()) << calls.status();
  EXPECT_EQ(calls->constraint.kind, Kind::kToolCalls);
  EXPECT_EQ(nlohmann::json::parse(calls->constraint.text),
            nlohmann::json::parse(R"({"format": "hermes", "parallel": true, "functions": [
                {"name": "get_weather", "parameters": {"type": "object"}},
                {"name": "get_time"}]})"));
  f->set_parameters("{oops");
  absl::StatusOr<EngineRequest> bad = ToEngineRequest(request, *model_);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("tool_calls.functions[0].parameters"), std::string::npos)
      << bad.status();
}

TEST_F(ProtoConvertTest, AddSpecialTokensFalseDropsBos) {
  v1::GenerateRequest request;
  request.set_prompt("Once upon a time");
  request.set_add_special_tokens(false);
  absl::StatusOr<EngineRequest> r = ToEngineRequest(request, *model_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prompt_ids, (std::vector<TokenId>{403, 407, 261, 378}));
}

TEST_F(ProtoConvertTest, HugeCountsSaturateInsteadOfWrapping) {
  v1::GenerateRequest request;
  request.add_prompt_token_ids(1);
  request.set_max_tokens(std::numeric_limits<uint32_t>::max());
  request.set_n(std::numeric_limits<uint32_t>::max());
  request.set_logprobs(std::numeric_limits<uint32_t>::max());
  absl::StatusOr<EngineRequest> r = ToEngineRequest(request, *model_);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->params.max_tokens, std::numeric_limits<int32_t>::max());
  EXPECT_EQ(r->n, std::numeric_limits<int32_t>::max());
  // Still out of range for the engine, which names the field.
  EXPECT_EQ(r->params.logprobs, std::numeric_limits<int32_t>::max());
  EXPECT_NE(r->params.Validate(512).message().find("logprobs"), std::string::npos);
}

TEST_F(ProtoConvertTest, PromptErrorsNameTheField) {
  v1::GenerateRequest none;
  absl::Status s = ToEngineRequest(none, *model_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("prompt"), std::string::npos) << s;

  v1::GenerateRequest both;
  both.set_prompt("x");
  both.add_prompt_token_ids(1);
  s = ToEngineRequest(both, *model_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("prompt_token_ids"), std::string::npos) << s;

  v1::GenerateRequest out_of_vocab;
  out_of_vocab.add_prompt_token_ids(1);
  out_of_vocab.add_prompt_token_ids(4000000000u);
  s = ToEngineRequest(out_of_vocab, *model_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("prompt_token_ids[1]"), std::string::npos) << s;
}

TEST_F(ProtoConvertTest, FinalOutputCarriesReasonAndUsage) {
  RequestOutput out;
  out.sample_index = 1;
  out.token_ids = {7, 8};
  out.text = "ab";
  out.logprobs.resize(2);
  out.logprobs[0].token = 7;
  out.logprobs[0].logprob = -0.5f;
  out.logprobs[0].top_logprobs = {{7, -0.5f}, {9, -1.5f}};
  out.logprobs[1].token = 8;
  out.logprobs[1].logprob = -0.25f;
  out.finished = true;
  out.finish_reason = FinishReason::kStop;
  out.stop_string = "\n";
  out.usage = {
      .prompt_tokens = 5, .cached_prompt_tokens = 2, .completion_tokens = 2, .peak_kv_blocks = 1};
  v1::GenerateResponse r;
  ToGenerateResponse(out, &r);
  EXPECT_EQ(r.index(), 1u);
  EXPECT_EQ(r.token_ids_size(), 2);
  EXPECT_EQ(r.text(), "ab");
  ASSERT_EQ(r.logprobs_size(), 2);
  EXPECT_EQ(r.logprobs(0).token_id(), 7u);
  EXPECT_EQ(r.logprobs(0).logprob(), -0.5f);
  ASSERT_EQ(r.logprobs(0).top_size(), 2);
  EXPECT_EQ(r.logprobs(0).top(1).token_id(), 9u);
  EXPECT_EQ(r.finish_reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(r.stop_reason(), "\n");
  EXPECT_EQ(r.usage().prompt_tokens(), 5u);
  EXPECT_EQ(r.usage().cached_prompt_tokens(), 2u);
  EXPECT_EQ(r.usage().completion_tokens(), 2u);
  EXPECT_EQ(r.usage().peak_kv_blocks(), 1u);

  RequestOutput aborted;
  aborted.finished = true;
  aborted.status = absl::CancelledError("aborted");
  v1::GenerateResponse a;
  ToGenerateResponse(aborted, &a);
  EXPECT_EQ(a.finish_reason(), v1::FINISH_REASON_ABORT);

  RequestOutput middle;
  middle.token_ids = {3};
  v1::GenerateResponse m;
  ToGenerateResponse(middle, &m);
  EXPECT_EQ(m.finish_reason(), v1::FINISH_REASON_UNSPECIFIED);
  EXPECT_FALSE(m.has_usage());
}

}  // namespace
}  // namespace kvserve
