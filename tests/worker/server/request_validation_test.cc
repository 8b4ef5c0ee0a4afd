// Bad requests, table-driven: every malformed GenerateRequest is refused with INVALID_ARGUMENT
// and a message naming the field, by an in-process worker (stories260K, real engine) and by a
// router in front of it, before any token is generated. The OpenAI HTTP front's own checks
// (top_k can only be negative there: the proto field is uint32) are covered through its parser.
// Transport-level refusals (an oversized message, invalid UTF-8 on the wire) are pinned too,
// since they never reach kvserve's validation.

#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "kvserve/v1/inference.grpc.pb.h"
#include "router/http/openai_request.h"
#include "router/http/openai_response.h"
#include "router/router_server.h"
#include "tests/worker/model/golden.h"
#include "worker/engine/sampling_params.h"
#include "worker/server/proto_convert.h"
#include "worker/server/worker_server.h"

namespace kvserve {
namespace {

constexpr char kModelName[] = "stories260K";
// stories260K's context and vocabulary.
constexpr uint32_t kContext = 512;
constexpr uint32_t kVocab = 512;

struct Outcome {
  grpc::Status status;
  int messages = 0;
};

// One bad request: a valid base request, one edit, and the field the error must name.
struct BadRequest {
  std::string name;
  std::function<void(v1::GenerateRequest*)> edit;
  std::string field;
};

v1::GenerateRequest ValidRequest() {
  v1::GenerateRequest r;
  r.set_prompt("Once upon a time");
  r.set_max_tokens(4);
  r.mutable_sampling()->set_temperature(0.0f);
  return r;
}

std::vector<BadRequest> BadRequests() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<BadRequest> t = {
      {"empty prompt", [](v1::GenerateRequest* r) { r->clear_prompt(); }, "prompt"},
      {"prompt and prompt_token_ids both set",
       [](v1::GenerateRequest* r) { r->add_prompt_token_ids(1); }, "prompt"},
      {"prompt ids longer than the context",
       [](v1::GenerateRequest* r) {
         r->clear_prompt();
         for (uint32_t i = 0; i < kContext + 10; ++i) r->add_prompt_token_ids(1 + i % 300);
       },
       "prompt"},
      {"text prompt longer than the context",
       [](v1::GenerateRequest* r) {
         std::string text;
         for (int i = 0; i < 400; ++i) text += "Once upon a time ";
         r->set_prompt(text);
       },
       "prompt"},
      {"json_object false", [](v1::GenerateRequest* r) { r->set_json_object(false); },
       "json_object"},
      {"json_schema with an unsupported keyword",
       [](v1::GenerateRequest* r) { r->set_json_schema(R"({"type": "array", "contains": {}})"); },
       "contains"},
      {"json_schema not JSON", [](v1::GenerateRequest* r) { r->set_json_schema("{"); },
       "json schema"},
      {"regex with a backreference", [](v1::GenerateRequest* r) { r->set_regex("(a)\\1"); },
       "backreferences"},
      {"grammar without root", [](v1::GenerateRequest* r) { r->set_grammar("x ::= \"a\""); },
       "root"},
      {"max_tokens one past the context",
       [](v1::GenerateRequest* r) { r->set_max_tokens(kContext + 1); }, "max_tokens"},
      {"max_tokens UINT32_MAX",
       [](v1::GenerateRequest* r) { r->set_max_tokens(std::numeric_limits<uint32_t>::max()); },
       "max_tokens"},
      {"temperature negative",
       [](v1::GenerateRequest* r) { r->mutable_sampling()->set_temperature(-0.5f); },
       "temperature"},
      {"temperature NaN",
       [nan](v1::GenerateRequest* r) { r->mutable_sampling()->set_temperature(nan); },
       "temperature"},
      {"temperature infinite",
       [inf](v1::GenerateRequest* r) { r->mutable_sampling()->set_temperature(inf); },
       "temperature"},
      {"top_p 0", [](v1::GenerateRequest* r) { r->mutable_sampling()->set_top_p(0.0f); }, "top_p"},
      {"top_p above 1", [](v1::GenerateRequest* r) { r->mutable_sampling()->set_top_p(1.01f); },
       "top_p"},
      {"top_p negative", [](v1::GenerateRequest* r) { r->mutable_sampling()->set_top_p(-1.0f); },
       "top_p"},
      {"top_p NaN", [nan](v1::GenerateRequest* r) { r->mutable_sampling()->set_top_p(nan); },
       "top_p"},
      {"min_p above 1", [](v1::GenerateRequest* r) { r->mutable_sampling()->set_min_p(1.5f); },
       "min_p"},
      {"repetition_penalty 0",
       [](v1::GenerateRequest* r) { r->mutable_sampling()->set_repetition_penalty(0.0f); },
       "repetition_penalty"},
      {"presence_penalty above 2",
       [](v1::GenerateRequest* r) { r->mutable_sampling()->set_presence_penalty(2.5f); },
       "presence_penalty"},
      {"frequency_penalty NaN",
       [nan](v1::GenerateRequest* r) { r->mutable_sampling()->set_frequency_penalty(nan); },
       "frequency_penalty"},
      {"unknown model", [](v1::GenerateRequest* r) { r->set_model("llama-70b"); }, "model"},
      {"prompt id outside the vocabulary",
       [](v1::GenerateRequest* r) {
         r->clear_prompt();
         r->add_prompt_token_ids(1);
         r->add_prompt_token_ids(kVocab);
       },
       "prompt_token_ids"},
      {"prompt id UINT32_MAX",
       [](v1::GenerateRequest* r) {
         r->clear_prompt();
         r->add_prompt_token_ids(std::numeric_limits<uint32_t>::max());
       },
       "prompt_token_ids"},
      {"stop token id outside the vocabulary",
       [](v1::GenerateRequest* r) { r->add_stop_token_ids(kVocab + 7); }, "stop_token_ids"},
      {"too many stop token ids",
       [](v1::GenerateRequest* r) {
         for (size_t i = 0; i <= kMaxStopTokenIds; ++i) r->add_stop_token_ids(2);
       },
       "stop_token_ids"},
      {"too many stop strings",
       [](v1::GenerateRequest* r) {
         for (size_t i = 0; i <= kMaxStopStrings; ++i) r->add_stop(absl::StrCat("s", i));
       },
       "stop"},
      {"stop string too long",
       [](v1::GenerateRequest* r) { r->add_stop(std::string(kMaxStopStringBytes + 1, 'x')); },
       "stop[0]"},
      {"empty stop string", [](v1::GenerateRequest* r) { r->add_stop(""); }, "stop[0]"},
      {"n above the limit", [](v1::GenerateRequest* r) { r->set_n(17); }, "n must be"},
      {"n UINT32_MAX",
       [](v1::GenerateRequest* r) { r->set_n(std::numeric_limits<uint32_t>::max()); }, "n must be"},
      {"logprobs above the limit",
       [](v1::GenerateRequest* r) { r->set_logprobs(kMaxLogprobs + 1); }, "logprobs"},
      // Accepted by gRPC's 4 MiB transport limit, refused by the context check.
      {"256 KiB prompt",
       [](v1::GenerateRequest* r) { r->set_prompt(std::string(256 * 1024, 'a')); }, "prompt"},
  };
  return t;
}

class RequestValidationTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new LoadedModel(*LoadModel(testing_golden::kStoriesGguf));
    EngineOptions options;
    options.num_threads = 1;
    options.num_kv_blocks = 64;
    options.check_invariants = true;
    engine_ = Engine::Create(model_, options)->release();
    WorkerServerOptions server_options;
    server_options.model_name = kModelName;
    worker_ = new WorkerServer(model_, engine_, server_options);
    absl::StatusOr<int> port = worker_->Start("127.0.0.1:0");
    ASSERT_TRUE(port.ok()) << port.status();
    worker_address_ = absl::StrCat("127.0.0.1:", *port);

    RouterOptions router_options;
    router_options.listen = "127.0.0.1:0";
    router_options.model_path = testing_golden::kStoriesGguf;
    router_options.model_name = kModelName;
    router_options.pool.static_workers = {worker_address_};
    router_options.pool.background_probes = false;
    router_options.pool.probe_timeout = absl::Seconds(5);
    absl::StatusOr<std::unique_ptr<RouterServer>> router = RouterServer::Start(router_options);
    ASSERT_TRUE(router.ok()) << router.status();
    router_ = router->release();
    router_address_ = absl::StrCat("127.0.0.1:", router_->port());
  }

  static void TearDownTestSuite() {
    delete router_;
    delete worker_;
    delete engine_;
    delete model_;
  }

  static Outcome Generate(const std::string& address, const v1::GenerateRequest& request) {
    auto stub = v1::Inference::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto reader = stub->Generate(&context, request);
    Outcome out;
    v1::GenerateResponse response;
    while (reader->Read(&response)) ++out.messages;
    out.status = reader->Finish();
    return out;
  }

  // Both endpoints: the worker directly and the router in front of it.
  static std::vector<std::pair<std::string, std::string>> Endpoints() {
    return {{"worker", worker_address_}, {"router", router_address_}};
  }

  static LoadedModel* model_;
  static Engine* engine_;
  static WorkerServer* worker_;
  static RouterServer* router_;
  static std::string worker_address_;
  static std::string router_address_;
};

LoadedModel* RequestValidationTest::model_ = nullptr;
Engine* RequestValidationTest::engine_ = nullptr;
WorkerServer* RequestValidationTest::worker_ = nullptr;
RouterServer* RequestValidationTest::router_ = nullptr;
std::string RequestValidationTest::worker_address_;
std::string RequestValidationTest::router_address_;

TEST_F(RequestValidationTest, TheValidBaseRequestIsServed) {
  for (const auto& [name, address] : Endpoints()) {
    SCOPED_TRACE(name);
    Outcome out = Generate(address, ValidRequest());
    EXPECT_TRUE(out.status.ok()) << out.status.error_message();
    EXPECT_GT(out.messages, 0);
  }
}

TEST_F(RequestValidationTest, EachBadRequestIsInvalidArgumentNamingTheField) {
  const int64_t rejected_before = worker_->stats().generate_rejected;
  int worker_calls = 0;
  for (const BadRequest& bad : BadRequests()) {
    v1::GenerateRequest request = ValidRequest();
    bad.edit(&request);
    for (const auto& [name, address] : Endpoints()) {
      SCOPED_TRACE(absl::StrCat(bad.name, " via the ", name));
      Outcome out = Generate(address, request);
      EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << out.status.error_message();
      EXPECT_NE(out.status.error_message().find(bad.field), std::string::npos)
          << "message '" << out.status.error_message() << "' does not name " << bad.field;
      EXPECT_EQ(out.messages, 0);
    }
    ++worker_calls;
  }
  // Nothing was admitted: the engine saw no request, and its pool is untouched.
  EXPECT_GE(worker_->stats().generate_rejected - rejected_before, worker_calls);
  EXPECT_TRUE(engine_->idle());
  const EngineStats stats = engine_->stats();
  EXPECT_EQ(stats.used_blocks, 0);
  EXPECT_EQ(stats.invariant_violations, 0) << stats.first_violation;
}

TEST_F(RequestValidationTest, InvalidUtf8InAStopStringBuiltInMemoryIsRefused) {
  // Off the wire, protobuf refuses invalid UTF-8 in a string field before kvserve sees it (see
  // the next test); a request built in memory reaches the conversion, which names the field.
  v1::GenerateRequest request = ValidRequest();
  request.add_stop("ok");
  request.add_stop("bad \xC3\x28 byte");
  absl::StatusOr<EngineRequest> converted = ToEngineRequest(request, *model_);
  EXPECT_EQ(converted.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(converted.status().message().find("stop[1]"), std::string::npos)
      << converted.status();
  request = ValidRequest();
  request.set_prompt("bad \xFF byte");
  converted = ToEngineRequest(request, *model_);
  EXPECT_EQ(converted.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(converted.status().message().find("prompt"), std::string::npos)
      << converted.status();
}

TEST_F(RequestValidationTest, InvalidUtf8OnTheWireNeverReachesTheEngine) {
  v1::GenerateRequest request = ValidRequest();
  request.set_prompt("Once upon a \xFF\xFE time");
  for (const auto& [name, address] : Endpoints()) {
    SCOPED_TRACE(name);
    Outcome out = Generate(address, request);
    // protobuf refuses to parse the message and gRPC 1.51's callback server then answers
    // UNIMPLEMENTED itself, before kvserve's handler runs (pinned so a change is noticed).
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::UNIMPLEMENTED)
        << out.status.error_message();
    EXPECT_EQ(out.messages, 0);
  }
  EXPECT_TRUE(engine_->idle());
}

TEST_F(RequestValidationTest, MessagesOverTheTransportLimitAreRefusedByGrpc) {
  // gRPC's default 4 MiB receive limit refuses the message before any handler runs; it answers
  // RESOURCE_EXHAUSTED (the transport's code for this, not kvserve's).
  v1::GenerateRequest request = ValidRequest();
  request.set_prompt(std::string(5 * 1024 * 1024, 'a'));
  for (const auto& [name, address] : Endpoints()) {
    SCOPED_TRACE(name);
    Outcome out = Generate(address, request);
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << out.status.error_message();
    EXPECT_EQ(out.messages, 0);
  }
  EXPECT_TRUE(engine_->idle());
}

// The HTTP front validates the OpenAI JSON before it becomes a GenerateRequest; its
// INVALID_ARGUMENT messages start with the field and map to HTTP 400.
TEST(HttpRequestValidationTest, EachBadBodyIsInvalidArgumentNamingTheField) {
  struct Case {
    std::string body;
    std::string field;
  };
  const std::vector<Case> cases = {
      {R"({"prompt": "hi", "top_k": -2})", "top_k"},
      {R"({"prompt": "hi", "temperature": -1})", "temperature"},
      {R"({"prompt": "hi", "top_p": 0})", "top_p"},
      {R"({"prompt": "hi", "top_p": 1.5})", "top_p"},
      {R"({"prompt": "hi", "max_tokens": 0})", "max_tokens"},
      {R"({"prompt": "hi", "max_tokens": -3})", "max_tokens"},
      {R"({"prompt": "hi", "n": 17})", "n"},
      {R"({"prompt": "hi", "stop": [""]})", "stop[0]"},
      {R"({"prompt": "hi", "stop_token_ids": [-1]})", "stop_token_ids[0]"},
      {R"({"prompt": "hi", "temperature": "hot"})", "temperature"},
      {"{\"prompt\": \"bad \xFF byte\"}", "body"},
      {R"({"prompt": "hi")", "body"},
      // A non-string type used to throw out of the parser (found by openai_request_fuzzer).
      {R"({"prompt": "hi", "response_format": {"type": 1}})", "response_format"},
      {R"({"prompt": "hi", "response_format": {"type": "yaml"}})", "response_format.type"},
      {R"({"prompt": "hi", "response_format": {"type": "json_schema"}})",
       "response_format.json_schema"},
      {R"({"prompt": "hi", "response_format": {"type": "json_schema", "json_schema": {"schema": 3}}})",
       "response_format.json_schema.schema"},
      {R"({"prompt": "hi", "guided_json": 5})", "guided_json"},
      {R"({"prompt": "hi", "guided_choice": []})", "guided_choice"},
      {R"({"prompt": "hi", "guided_choice": ["a", 1]})", "guided_choice"},
      {R"({"prompt": "hi", "guided_regex": "a", "guided_grammar": "root ::= \"a\""})",
       "guided_grammar"},
      {R"({"prompt": "hi", "response_format": {"type": "json_object"}, "guided_regex": "a"})",
       "guided_regex"},
  };
  http::RequestLimits limits;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body);
    absl::StatusOr<http::OpenAiRequest> parsed =
        http::ParseOpenAiRequest(http::Endpoint::kCompletions, c.body, limits);
    ASSERT_FALSE(parsed.ok());
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(parsed.status().message().substr(0, c.field.size()), c.field) << parsed.status();
    EXPECT_EQ(http::HttpStatusFor(parsed.status().code()), 400);
  }
}

// response_format and vLLM's guided_* fields become GenerateRequest's constraint; a JSON schema
// keeps its property order (the body is parsed into an ordered JSON object).
TEST(HttpRequestValidationTest, OutputConstraintsBecomeTheConstraintOneof) {
  http::RequestLimits limits;
  auto parse = [&](const std::string& body) {
    absl::StatusOr<http::OpenAiRequest> parsed =
        http::ParseOpenAiRequest(http::Endpoint::kCompletions, body, limits);
    EXPECT_TRUE(parsed.ok()) << body << ": " << parsed.status();
    return parsed.ok() ? parsed->generate : v1::GenerateRequest();
  };
  v1::GenerateRequest g = parse(
      R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "n",
          "schema": {"type": "object", "properties": {"z": {"type": "string"}, "a": {}}}}}})");
  EXPECT_EQ(g.json_schema(), R"({"type":"object","properties":{"z":{"type":"string"},"a":{}}})");
  EXPECT_TRUE(
      parse(R"({"prompt": "x", "response_format": {"type": "json_object"}})").json_object());
  EXPECT_EQ(parse(R"({"prompt": "x", "response_format": {"type": "text"}})").constraint_case(),
            v1::GenerateRequest::CONSTRAINT_NOT_SET);
  EXPECT_EQ(parse(R"({"prompt": "x", "guided_json": "{\"type\": \"integer\"}"})").json_schema(),
            R"({"type": "integer"})");
  EXPECT_EQ(parse(R"({"prompt": "x", "guided_json": {"enum": [1, 2]}})").json_schema(),
            R"({"enum":[1,2]})");
  EXPECT_EQ(parse(R"({"prompt": "x", "guided_regex": "[0-9]+"})").regex(), "[0-9]+");
  EXPECT_EQ(parse(R"({"prompt": "x", "guided_grammar": "root ::= \"a\""})").grammar(),
            "root ::= \"a\"");
  EXPECT_EQ(parse(R"j({"prompt": "x", "guided_choice": ["a.b", "(c)"]})j").regex(),
            "(a\\.b)|(\\(c\\))");
}

}  // namespace
}  // namespace kvserve
