// The OpenAI-compatible HTTP front with real HTTP requests on loopback (httplib client), over
// an in-process router whose workers are fakes (tests/router/fake_worker: tokens 7, 8, 9 with
// text "t" each, then finish_reason LENGTH and completion_tokens 3).

#include "router/http/http_server.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "router/http/openai_response.h"
#include "router/router_server.h"
#include "tests/router/fake_worker.h"
#include "tests/test_util/scratch_dir.h"

namespace kvserve {
namespace {

using nlohmann::json;
using testing::FakeWorker;

constexpr char kStories[] = KVSERVE_SHARED_DIR "/models/stories260K/stories260K.gguf";
constexpr char kTinyLlama[] = KVSERVE_SHARED_DIR "/models/tokenizers/tinyllama-1.1b-chat-v1.0";

struct Reply {
  int status = 0;
  std::string content_type;
  std::string retry_after;
  std::string body;
  json Json() const { return json::parse(body, nullptr, false); }
  /// The `data:` payloads of a server-sent event stream.
  std::vector<std::string> Events() const {
    std::vector<std::string> events;
    size_t pos = 0;
    while (true) {
      const size_t end = body.find("\n\n", pos);
      if (end == std::string::npos) break;
      const std::string event = body.substr(pos, end - pos);
      EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
      events.push_back(event.substr(6));
      pos = end + 2;
    }
    EXPECT_EQ(pos, body.size()) << "trailing bytes after the last event";
    return events;
  }
};

class HttpServerTest : public ::testing::Test {
 protected:
  void Start(const std::string& model_path, int max_queue = 8) {
    worker_ = std::make_unique<FakeWorker>();
    RouterOptions options;
    options.listen = "127.0.0.1:0";
    options.model_path = model_path;
    options.policy = "round_robin";
    options.dispatch.max_inflight_per_worker = 4;
    options.dispatch.max_queue = max_queue;
    options.pool.static_workers = {worker_->address()};
    options.pool.background_probes = false;
    options.pool.failure_threshold = 1;
    options.pool.probe_timeout = absl::Seconds(5);
    absl::StatusOr<std::unique_ptr<RouterServer>> router = RouterServer::Start(options);
    ASSERT_TRUE(router.ok()) << router.status();
    router_ = *std::move(router);
    HttpServerOptions http_options;
    http_options.listen = "127.0.0.1:0";
    http_options.threads = http_threads_;
    http_options.max_queued_connections = max_queued_connections_;
    http_options.request_timeout = absl::Seconds(20);
    http_options.stream_heartbeat = stream_heartbeat_;
    HttpServerDeps deps;
    deps.channel = router_->InProcessChannel();
    deps.tokenizer = &router_->tokenizer();
    deps.model_name = router_->model_name();
    absl::StatusOr<std::unique_ptr<HttpServer>> http = HttpServer::Start(http_options, deps);
    ASSERT_TRUE(http.ok()) << http.status();
    http_ = *std::move(http);
  }

  void TearDown() override {
    if (http_ != nullptr) http_->Shutdown();
    if (router_ != nullptr) router_->Shutdown();
  }

  Reply Post(const std::string& path, const std::string& body) {
    httplib::Client client("127.0.0.1", http_->port());
    client.set_read_timeout(20, 0);
    httplib::Result result = client.Post(path.c_str(), body, "application/json");
    Reply reply;
    EXPECT_TRUE(result) << "no HTTP response for " << path << ": "
                        << httplib::to_string(result.error());
    if (!result) return reply;
    reply.status = result->status;
    reply.content_type = result->get_header_value("Content-Type");
    reply.retry_after = result->get_header_value("Retry-After");
    reply.body = result->body;
    return reply;
  }

  Reply Get(const std::string& path) {
    httplib::Client client("127.0.0.1", http_->port());
    httplib::Result result = client.Get(path.c_str());
    Reply reply;
    EXPECT_TRUE(result);
    if (!result) return reply;
    reply.status = result->status;
    reply.retry_after = result->get_header_value("Retry-After");
    reply.body = result->body;
    return reply;
  }

  /// Checks an OpenAI error body and returns its "error" object.
  static json ExpectError(const Reply& reply, int status) {
    EXPECT_EQ(reply.status, status) << reply.body;
    const json body = reply.Json();
    EXPECT_TRUE(body.is_object() && body.contains("error")) << reply.body;
    if (!body.is_object() || !body.contains("error")) return json::object();
    const json& error = body["error"];
    EXPECT_TRUE(error["message"].is_string() && !error["message"].get<std::string>().empty());
    EXPECT_TRUE(error["type"].is_string());
    EXPECT_TRUE(error.contains("param"));
    EXPECT_TRUE(error.contains("code"));
    return error;
  }

  /// HttpServerOptions::threads and max_queued_connections for Start.
  int http_threads_ = 4;
  int max_queued_connections_ = HttpServerOptions{}.max_queued_connections;
  absl::Duration stream_heartbeat_ = HttpServerOptions{}.stream_heartbeat;
  std::unique_ptr<FakeWorker> worker_;
  std::unique_ptr<RouterServer> router_;
  std::unique_ptr<HttpServer> http_;
};

TEST_F(HttpServerTest, CompletionTranslatesTheRequestAndAnswersLikeOpenAi) {
  Start(kStories);
  const Reply reply = Post("/v1/completions", R"({
      "model": "stories260K", "prompt": "Once upon a time", "max_tokens": 3,
      "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "presence_penalty": 0.5,
      "frequency_penalty": -0.5, "repetition_penalty": 1.1, "seed": 7, "stop": ["x", "y"],
      "cache_salt": "tenant-a", "user": "u1"})");
  ASSERT_EQ(reply.status, 200) << reply.body;
  EXPECT_EQ(reply.content_type, "application/json");
  const json body = reply.Json();
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["model"], "stories260K");
  EXPECT_EQ(body["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_TRUE(body["created"].is_number_integer());
  ASSERT_EQ(body["choices"].size(), 1u);
  EXPECT_EQ(body["choices"][0]["index"], 0);
  EXPECT_EQ(body["choices"][0]["text"], "ttt");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(body["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(body["usage"]["completion_tokens"], 3);
  EXPECT_EQ(body["usage"]["total_tokens"].get<int>(),
            body["usage"]["prompt_tokens"].get<int>() + 3);
  EXPECT_EQ(body["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

  const std::vector<v1::GenerateRequest> seen = worker_->requests();
  ASSERT_EQ(seen.size(), 1u);
  const v1::GenerateRequest& g = seen[0];
  EXPECT_EQ(g.prompt_token_ids(0), 1u);  // tokenized by the router, BOS added
  EXPECT_GT(g.prompt_token_ids_size(), 2);
  EXPECT_EQ(g.max_tokens(), 3u);
  EXPECT_FLOAT_EQ(g.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(g.sampling().top_p(), 0.9f);
  EXPECT_EQ(g.sampling().top_k(), 40u);
  EXPECT_FLOAT_EQ(g.sampling().min_p(), 0.05f);
  EXPECT_FLOAT_EQ(g.sampling().presence_penalty(), 0.5f);
  EXPECT_FLOAT_EQ(g.sampling().frequency_penalty(), -0.5f);
  EXPECT_FLOAT_EQ(g.sampling().repetition_penalty(), 1.1f);
  EXPECT_EQ(g.sampling().seed(), 7u);
  ASSERT_EQ(g.stop_size(), 2);
  EXPECT_EQ(g.stop(1), "y");
  EXPECT_EQ(g.cache_salt(), "tenant-a");
  EXPECT_FALSE(g.has_logprobs());
  EXPECT_EQ(body["id"], "cmpl-" + g.request_id());
}

TEST_F(HttpServerTest, TokenIdPromptsAndStringStop) {
  Start(kStories);
  const Reply reply = Post("/v1/completions", R"({"prompt": [1, 403, 407], "stop": "end"})");
  ASSERT_EQ(reply.status, 200) << reply.body;
  const v1::GenerateRequest g = worker_->requests().at(0);
  ASSERT_EQ(g.prompt_token_ids_size(), 3);
  EXPECT_EQ(g.prompt_token_ids(2), 407u);
  ASSERT_EQ(g.stop_size(), 1);
  EXPECT_EQ(g.stop(0), "end");
}

TEST_F(HttpServerTest, CompletionStreamsServerSentEvents) {
  Start(kStories);
  const Reply reply = Post("/v1/completions", R"({"prompt": "Once", "stream": true,
                                                   "stream_options": {"include_usage": true}})");
  ASSERT_EQ(reply.status, 200) << reply.body;
  EXPECT_EQ(reply.content_type, "text/event-stream");
  const std::vector<std::string> events = reply.Events();
  ASSERT_EQ(events.size(), 5u) << reply.body;  // 3 tokens, usage, [DONE]
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  std::string id;
  for (int i = 0; i < 3; ++i) {
    const json chunk = json::parse(events[i]);
    EXPECT_EQ(chunk["object"], "text_completion");
    if (i == 0) id = chunk["id"];
    EXPECT_EQ(chunk["id"], id);
    ASSERT_EQ(chunk["choices"].size(), 1u);
    text += chunk["choices"][0]["text"].get<std::string>();
    if (i < 2) {
      EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
    } else {
      EXPECT_EQ(chunk["choices"][0]["finish_reason"], "length");
    }
  }
  EXPECT_EQ(text, "ttt");
  const json usage = json::parse(events[3]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 3);
}

TEST_F(HttpServerTest, ChatAppliesTheModelsTemplate) {
  Start(kTinyLlama);
  const Reply reply = Post("/v1/chat/completions", R"({"model": "tinyllama-1.1b-chat-v1.0",
      "messages": [{"role": "system", "content": "Be nice."},
                   {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
      "logprobs": false, "max_completion_tokens": 5})");
  ASSERT_EQ(reply.status, 200) << reply.body;
  const json body = reply.Json();
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "ttt");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["usage"]["completion_tokens"], 3);

  // The prompt the worker got is TinyLlama's zephyr format (written out by hand), encoded
  // without an extra BOS.
  const std::string expected = "<|system|>\nBe nice.</s>\n<|user|>\nHi</s>\n<|assistant|>\n";
  EncodeOptions no_special;
  no_special.add_special_tokens = false;
  absl::StatusOr<std::vector<TokenId>> ids = router_->tokenizer().Encode(expected, no_special);
  ASSERT_TRUE(ids.ok());
  const v1::GenerateRequest g = worker_->requests().at(0);
  EXPECT_EQ(std::vector<TokenId>(g.prompt_token_ids().begin(), g.prompt_token_ids().end()), *ids);
  EXPECT_EQ(g.max_tokens(), 5u);
}

TEST_F(HttpServerTest, ChatStreamsDeltas) {
  Start(kTinyLlama);
  const Reply reply = Post("/v1/chat/completions", R"({"stream": true,
      "messages": [{"role": "user", "content": "Hi"}]})");
  ASSERT_EQ(reply.status, 200) << reply.body;
  const std::vector<std::string> events = reply.Events();
  ASSERT_EQ(events.size(), 5u) << reply.body;  // role, 3 deltas, [DONE]
  const json role = json::parse(events[0]);
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_EQ(role["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (int i = 1; i <= 3; ++i) {
    text += json::parse(events[i])["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(text, "ttt");
  EXPECT_EQ(json::parse(events[3])["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(events[4], "[DONE]");
}

TEST_F(HttpServerTest, ModelsAndHealth) {
  Start(kStories);
  const Reply models = Get("/v1/models");
  ASSERT_EQ(models.status, 200) << models.body;
  const json body = models.Json();
  EXPECT_EQ(body["object"], "list");
  ASSERT_EQ(body["data"].size(), 1u);
  EXPECT_EQ(body["data"][0]["id"], "stories260K");
  EXPECT_EQ(body["data"][0]["object"], "model");
  EXPECT_EQ(body["data"][0]["max_model_len"], 256);
  const Reply health = Get("/health");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.Json()["status"], "ok");
  ExpectError(Get("/v1/nothing"), 404);
}

TEST_F(HttpServerTest, BadRequestsGetOpenAiErrors) {
  Start(kStories);
  json error = ExpectError(Post("/v1/completions", R"({"max_tokens": 3})"), 400);
  EXPECT_EQ(error["param"], "prompt");
  EXPECT_EQ(error["type"], "invalid_request_error");
  error = ExpectError(Post("/v1/completions", R"({"prompt": "a", "temperature": "hot"})"), 400);
  EXPECT_EQ(error["param"], "temperature");
  EXPECT_NE(error["message"].get<std::string>().find("expected a number, got string"),
            std::string::npos);
  error = ExpectError(Post("/v1/completions", R"({"prompt": "a", "n": 100})"), 400);
  EXPECT_EQ(error["param"], "n");
  error = ExpectError(Post("/v1/completions", R"({"prompt": "a", "model": "gpt-4"})"), 404);
  EXPECT_EQ(error["code"], "model_not_found");
  EXPECT_EQ(error["param"], "model");
  error = ExpectError(Post("/v1/completions", "{not json"), 400);
  EXPECT_EQ(error["param"], "body");
  error = ExpectError(Post("/v1/completions", R"({"prompt": "a", "echo": true})"), 400);
  EXPECT_EQ(error["param"], "echo");
  // Checked by the router on the gRPC path, named the same way.
  error = ExpectError(Post("/v1/completions", R"({"prompt": [1, 100000]})"), 400);
  EXPECT_EQ(error["param"], "prompt_token_ids[1]");
  EXPECT_EQ(error["code"], "invalid_argument");
  // stories260K has no chat template.
  error = ExpectError(
      Post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "Hi"}]})"), 400);
  EXPECT_NE(error["message"].get<std::string>().find("no chat template"), std::string::npos);
  error = ExpectError(Post("/v1/chat/completions", R"({"messages": []})"), 400);
  EXPECT_EQ(error["param"], "messages");
  EXPECT_EQ(worker_->generate_count(), 0);
}

TEST_F(HttpServerTest, WorkerErrorsMapToHttpStatuses) {
  Start(kStories);
  worker_->set_mode(FakeWorker::Mode::kFailBeforeFirst, grpc::StatusCode::INVALID_ARGUMENT);
  ExpectError(Post("/v1/completions", R"({"prompt": "a"})"), 400);
  worker_->set_mode(FakeWorker::Mode::kFailBeforeFirst, grpc::StatusCode::RESOURCE_EXHAUSTED);
  json error = ExpectError(Post("/v1/completions", R"({"prompt": "a"})"), 429);
  EXPECT_EQ(error["code"], "resource_exhausted");
  // A failure after the first chunk of a stream arrives as an error event, then [DONE].
  worker_->set_mode(FakeWorker::Mode::kFailAfterFirst);
  const Reply reply = Post("/v1/completions", R"({"prompt": "a", "stream": true})");
  ASSERT_EQ(reply.status, 200);
  const std::vector<std::string> events = reply.Events();
  ASSERT_EQ(events.size(), 3u) << reply.body;
  EXPECT_EQ(json::parse(events[1])["error"]["code"], "unavailable");
  EXPECT_EQ(events[2], "[DONE]");
}

TEST_F(HttpServerTest, ShutdownCancelsRunningStreams) {
  Start(kStories);
  worker_->set_mode(FakeWorker::Mode::kHoldAfterFirst);
  Reply reply;
  std::thread client(
      [&] { reply = Post("/v1/completions", R"({"prompt": "a", "stream": true})"); });
  ASSERT_TRUE(worker_->WaitForGenerates(1));
  http_->Shutdown();  // no grace: the held stream is cancelled, not waited for
  client.join();
  EXPECT_TRUE(worker_->WaitForCancelled(1));
  // Cancelled before the HTTP handler saw the first token: 503; after: an error event.
  if (reply.status == 503) {
    EXPECT_EQ(ExpectError(reply, 503)["message"], "server shutting down");
    return;
  }
  ASSERT_EQ(reply.status, 200) << reply.body;
  const std::vector<std::string> events = reply.Events();
  ASSERT_GE(events.size(), 2u) << reply.body;
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(json::parse(events[events.size() - 2])["error"]["code"], "unavailable") << reply.body;
}

// Server-sent events leave as they are generated, not when the stream ends; a client that goes
// away while no token comes (the fake worker holds after its first) is noticed by the heartbeat
// comment's failed write, and its request is cancelled on the worker.
TEST_F(HttpServerTest, EventsArriveWhileTheStreamIsOpenAndADisconnectCancelsTheWorker) {
  stream_heartbeat_ = absl::Milliseconds(50);
  Start(kStories);
  worker_->set_mode(FakeWorker::Mode::kHoldAfterFirst);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(http_->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string body = R"({"prompt": "a", "stream": true})";
  const std::string request =
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
      "Content-Type: application/json\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  timeval timeout{20, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  // Up to the end of the first event: the worker holds after its first token, so this event left
  // while the stream was open.
  std::string received;
  size_t event = std::string::npos;
  size_t event_end = std::string::npos;
  while ((event = received.find("data: ")) == std::string::npos ||
         (event_end = received.find("\n\n", event)) == std::string::npos) {
    char buf[4096];
    const ssize_t got = ::recv(fd, buf, sizeof(buf), 0);
    if (got <= 0) ::close(fd);
    ASSERT_GT(got, 0) << "the stream ended or stalled before its first event: " << received;
    received.append(buf, static_cast<size_t>(got));
  }
  EXPECT_EQ(received.rfind("HTTP/1.1 200", 0), 0u) << received;
  EXPECT_EQ(received.find("[DONE]"), std::string::npos) << received;
  const json first = json::parse(received.substr(event + 6, event_end - event - 6), nullptr, false);
  EXPECT_EQ(first["choices"][0]["text"], "t") << received;
  ::close(fd);  // the client goes away mid-stream
  EXPECT_TRUE(worker_->WaitForCancelled(1)) << "the worker's Generate call was never cancelled";
  EXPECT_EQ(worker_->generate_count(), 1);
}

TEST_F(HttpServerTest, ConnectionsPastTheQueueAreAnswered503WithRetryAfter) {
  http_threads_ = 1;
  max_queued_connections_ = 0;
  Start(kStories);
  worker_->set_mode(FakeWorker::Mode::kHoldAfterFirst);
  Reply held;
  std::thread client([&] { held = Post("/v1/completions", R"({"prompt": "a"})"); });
  if (!worker_->WaitForGenerates(1)) {  // else the only connection thread is now busy
    worker_->ReleaseHeld();
    client.join();
    FAIL() << "the first request was not served: HTTP " << held.status << " " << held.body;
  }

  // Refused, but read in full first: a 4 MiB body (more than a loopback socket buffers) still
  // gets its answer instead of a reset.
  const std::string padding(size_t{4} << 20, 'x');
  Reply refused = Post("/v1/completions", R"({"prompt": "a", "user": ")" + padding + R"("})");
  json error = ExpectError(refused, 503);
  EXPECT_EQ(refused.retry_after, "1");
  EXPECT_EQ(error["code"], "unavailable");
  EXPECT_NE(error["message"].get<std::string>().find("server overloaded"), std::string::npos)
      << refused.body;
  refused = Get("/v1/models");
  ExpectError(refused, 503);
  EXPECT_EQ(refused.retry_after, "1");
  EXPECT_EQ(Get("/health").status, 200);  // cheap, so answered even on a refused connection
  EXPECT_EQ(http_->connections_refused(), 3u);
  EXPECT_EQ(worker_->generate_count(), 1);

  worker_->ReleaseHeld();
  client.join();
  ASSERT_EQ(held.status, 200) << held.body;
  EXPECT_EQ(held.Json()["choices"][0]["text"], "ttt");
  EXPECT_EQ(http_->connections_admitted(), 1u);
}

TEST_F(HttpServerTest, NegativeLimitsAreRefusedAtStart) {
  Start(kStories);
  HttpServerOptions options;
  options.listen = "127.0.0.1:0";
  HttpServerDeps deps;
  deps.channel = router_->InProcessChannel();
  deps.tokenizer = &router_->tokenizer();
  options.max_queued_connections = -1;
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start(options, deps);
  ASSERT_FALSE(server.ok());
  EXPECT_NE(server.status().message().find("http-max-queued-connections"), std::string::npos);
  options.max_queued_connections = 0;
  options.listen_backlog = 0;
  server = HttpServer::Start(options, deps);
  ASSERT_FALSE(server.ok());
  EXPECT_NE(server.status().message().find("http-listen-backlog"), std::string::npos);
}

// A tokenizer directory with TinyLlama's tokenizer and Qwen2.5-Coder's released chat template,
// which teaches Hermes-style tool calls (<tool_call> tags).
std::string HermesModelDir() {
  const std::string dir = test_util::ScratchPath("hermes");
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(std::string(kTinyLlama) + "/tokenizer.json", dir + "/tokenizer.json");
  json config = json::parse(std::ifstream(std::string(kTinyLlama) + "/tokenizer_config.json"));
  const json qwen = json::parse(std::ifstream(
      KVSERVE_SHARED_DIR "/models/chat_templates/qwen2.5-coder-3b-instruct/tokenizer_config.json"));
  config["chat_template"] = qwen["chat_template"];
  std::ofstream(dir + "/tokenizer_config.json") << config.dump();
  return dir;
}

constexpr char kTools[] = R"("tools": [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                    "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time"}}])";

std::string ChatWithTools(const std::string& extra) {
  return absl::StrCat(R"({"messages": [{"role": "user", "content": "Weather in Paris?"}], )",
                      kTools, extra, "}");
}

TEST_F(HttpServerTest, ToolsAreRenderedAndCallsParsedFromTheReply) {
  Start(HermesModelDir());
  worker_->set_texts({"I will check.", "<tool",
                      "_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"
                      "\n</tool_call>"});
  const Reply reply = Post("/v1/chat/completions", ChatWithTools(""));
  ASSERT_EQ(reply.status, 200) << reply.body;
  const json choice = reply.Json()["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_EQ(choice["message"]["content"], "I will check.");
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u) << reply.body;
  const json call = choice["message"]["tool_calls"][0];
  EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(call["function"]["arguments"], R"({"city":"Paris"})");

  // The tools reached the prompt through the model's own template; "auto" adds no constraint.
  const v1::GenerateRequest g = worker_->requests().at(0);
  EXPECT_EQ(g.constraint_case(), v1::GenerateRequest::CONSTRAINT_NOT_SET);
  absl::StatusOr<std::string> prompt = router_->tokenizer().Decode(
      std::vector<TokenId>(g.prompt_token_ids().begin(), g.prompt_token_ids().end()));
  ASSERT_TRUE(prompt.ok());
  EXPECT_NE(prompt->find("<tools>\n{\"type\": \"function\", \"function\": {\"name\": "
                         "\"get_weather\", \"description\": \"Weather now\""),
            std::string::npos)
      << *prompt;

  // tool_choice "none": nothing is parsed, the reply is content.
  const Reply none = Post("/v1/chat/completions", ChatWithTools(R"(, "tool_choice": "none")"));
  ASSERT_EQ(none.status, 200) << none.body;
  EXPECT_EQ(none.Json()["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(none.Json()["choices"][0]["message"].contains("tool_calls"));
  EXPECT_NE(none.Json()["choices"][0]["message"]["content"].get<std::string>().find("<tool_call>"),
            std::string::npos);
}

TEST_F(HttpServerTest, ToolCallsStreamAsDeltas) {
  Start(HermesModelDir());
  worker_->set_texts({"I will check.", "<tool",
                      "_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"
                      "\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}"
                      "\n</tool_call>"});
  const Reply reply = Post("/v1/chat/completions", ChatWithTools(R"(, "stream": true)"));
  ASSERT_EQ(reply.status, 200) << reply.body;
  const std::vector<std::string> events = reply.Events();
  // role, the content before the call, nothing while "<tool" may open a call, the calls, the
  // finish reason, [DONE].
  ASSERT_EQ(events.size(), 5u) << reply.body;
  EXPECT_EQ(json::parse(events[1])["choices"][0]["delta"]["content"], "I will check.");
  const json calls = json::parse(events[2])["choices"][0]["delta"]["tool_calls"];
  ASSERT_EQ(calls.size(), 2u) << events[2];
  EXPECT_EQ(calls[0]["index"], 0);
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(calls[0]["function"]["arguments"], R"({"city":"Paris"})");
  EXPECT_EQ(calls[1]["index"], 1);
  EXPECT_EQ(calls[1]["function"]["name"], "get_time");
  EXPECT_EQ(calls[1]["type"], "function");
  EXPECT_EQ(json::parse(events[2])["choices"][0]["finish_reason"], nullptr);
  EXPECT_EQ(json::parse(events[3])["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(events[4], "[DONE]");

  // parallel_tool_calls false reports the first call only.
  const Reply single =
      Post("/v1/chat/completions", ChatWithTools(R"(, "parallel_tool_calls": false)"));
  ASSERT_EQ(single.status, 200) << single.body;
  EXPECT_EQ(single.Json()["choices"][0]["message"]["tool_calls"].size(), 1u);
}

TEST_F(HttpServerTest, RequiredAndNamedToolChoicesConstrainTheReply) {
  Start(HermesModelDir());
  ASSERT_EQ(Post("/v1/chat/completions", ChatWithTools(R"(, "tool_choice": "required")")).status,
            200);
  ASSERT_EQ(Post("/v1/chat/completions", ChatWithTools(R"(, "tool_choice": {"type": "function",
                                   "function": {"name": "get_time"}})"))
                .status,
            200);
  ASSERT_EQ(Post("/v1/chat/completions",
                 ChatWithTools(R"(, "tool_choice": "required", "parallel_tool_calls": false)"))
                .status,
            200);
  const std::vector<v1::GenerateRequest> requests = worker_->requests();
  ASSERT_EQ(requests.size(), 3u);
  const v1::ToolCallConstraint& required = requests[0].tool_calls();
  EXPECT_EQ(required.format(), "hermes");
  EXPECT_TRUE(required.parallel());
  ASSERT_EQ(required.functions_size(), 2);
  EXPECT_EQ(required.functions(0).name(), "get_weather");
  EXPECT_EQ(json::parse(required.functions(0).parameters()),
            json::parse(R"({"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]})"));
  EXPECT_EQ(required.functions(1).name(), "get_time");
  EXPECT_EQ(required.functions(1).parameters(), "");
  const v1::ToolCallConstraint& named = requests[1].tool_calls();
  ASSERT_EQ(named.functions_size(), 1);
  EXPECT_EQ(named.functions(0).name(), "get_time");
  EXPECT_FALSE(named.parallel());
  EXPECT_FALSE(requests[2].tool_calls().parallel());
}

TEST_F(HttpServerTest, ModelsWithoutAToolFormatGetAJsonArrayOfCalls) {
  Start(kTinyLlama);  // its template teaches no tool-call format
  worker_->set_texts({"[{\"name\": \"get_time\", ", "\"parameters\": {\"tz\": \"UTC\"}}]"});
  const Reply reply = Post("/v1/chat/completions", ChatWithTools(R"(, "tool_choice": "required")"));
  ASSERT_EQ(reply.status, 200) << reply.body;
  EXPECT_EQ(worker_->requests().at(0).tool_calls().format(), "json");
  const json message = reply.Json()["choices"][0]["message"];
  EXPECT_EQ(message["content"], nullptr);
  ASSERT_EQ(message["tool_calls"].size(), 1u) << reply.body;
  EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "get_time");
  EXPECT_EQ(message["tool_calls"][0]["function"]["arguments"], R"({"tz":"UTC"})");
}

TEST_F(HttpServerTest, ToolCallsAndToolResultsRoundTripIntoThePrompt) {
  Start(HermesModelDir());
  const Reply reply = Post("/v1/chat/completions", absl::StrCat(R"({"messages": [
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
       "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "22 C"}], )",
                                                                kTools, "}"));
  ASSERT_EQ(reply.status, 200) << reply.body;
  const v1::GenerateRequest g = worker_->requests().at(0);
  absl::StatusOr<std::string> prompt = router_->tokenizer().Decode(
      std::vector<TokenId>(g.prompt_token_ids().begin(), g.prompt_token_ids().end()));
  ASSERT_TRUE(prompt.ok());
  EXPECT_NE(prompt->find("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", "
                         "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n"
                         "<|im_start|>user\n<tool_response>\n22 C\n</tool_response><|im_end|>\n"
                         "<|im_start|>assistant\n"),
            std::string::npos)
      << *prompt;
}

TEST_F(HttpServerTest, BadToolRequestsNameTheField) {
  Start(HermesModelDir());
  struct Case {
    std::string path;
    std::string body;
    const char* param;
  };
  const Case cases[] = {
      {"/v1/chat/completions",
       ChatWithTools(R"(, "tool_choice": {"type": "function", "function": {"name": "x"}})"),
       "tool_choice.function.name"},
      {"/v1/chat/completions", ChatWithTools(R"(, "tool_choice": "sometimes")"), "tool_choice"},
      {"/v1/chat/completions",
       ChatWithTools(R"(, "tool_choice": "required", "response_format": {"type": "json_object"})"),
       "tool_choice"},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})",
       "tool_choice"},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "x"}],
           "tools": [{"type": "function", "function": {"name": "bad name"}}]})",
       "tools[0].function.name"},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "retrieval"}]})",
       "tools[0].type"},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls":
           [{"function": {"name": "f", "arguments": "{oops"}}]}]})",
       "messages[1].tool_calls[0].function.arguments"},
      {"/v1/completions", absl::StrCat(R"({"prompt": "x", )", kTools, "}"), "tools"},
  };
  for (const Case& c : cases) {
    const json error = ExpectError(Post(c.path, c.body), 400);
    EXPECT_EQ(error["param"], c.param) << c.body;
  }
  EXPECT_EQ(worker_->generate_count(), 0);
}

TEST(HttpStatusTest, MapsGrpcCodes) {
  EXPECT_EQ(http::HttpStatusFor(absl::StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(http::HttpStatusFor(absl::StatusCode::kUnauthenticated), 401);
  EXPECT_EQ(http::HttpStatusFor(absl::StatusCode::kNotFound), 404);
  EXPECT_EQ(http::HttpStatusFor(absl::StatusCode::kResourceExhausted), 429);
  EXPECT_EQ(http::HttpStatusFor(absl::StatusCode::kUnavailable), 503);
  EXPECT_EQ(http::HttpStatusFor(absl::StatusCode::kDeadlineExceeded), 504);
  EXPECT_EQ(http::HttpStatusFor(absl::StatusCode::kInternal), 500);
  EXPECT_EQ(http::HttpStatusFor(absl::StatusCode::kCancelled), 500);
  const http::ApiError error =
      http::ErrorFromStatus(absl::UnavailableError("no healthy worker to serve the request"));
  EXPECT_EQ(error.http_status, 503);
  EXPECT_TRUE(error.body["error"]["param"].is_null());
  EXPECT_EQ(error.body["error"]["type"], "service_unavailable_error");
}

}  // namespace
}  // namespace kvserve
