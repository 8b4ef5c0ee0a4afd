// kvserve::Client against an in-process fake kvserve.v1.Inference server on loopback.

#include "client/sdk/client.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>

#include "tests/client/sdk/fake_inference_server.h"
#include "tests/test_util/held_port.h"

namespace kvserve {
namespace {

using std::chrono::seconds;
using testing::FakeInferenceServer;
using testing::StreamEnding;

// Quick retries so the tests stay fast; the backoff itself is a wait in the client, not a sleep
// the test synchronises on.
ClientOptions FastRetries(int32_t attempts) {
  ClientOptions o;
  o.max_attempts = attempts;
  o.initial_backoff = absl::Milliseconds(1);
  o.max_backoff = absl::Milliseconds(4);
  o.default_deadline = absl::Seconds(20);
  return o;
}

std::unique_ptr<Client> ConnectOrDie(const std::string& target, ClientOptions options) {
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(target, options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? std::move(*client) : nullptr;
}

// Two samples, interleaved, the second with logprobs; each ends with usage.
std::vector<v1::GenerateResponse> TwoSampleChunks() {
  std::vector<v1::GenerateResponse> chunks(4);
  chunks[0].set_request_id("req-7");
  chunks[0].set_index(0);
  chunks[0].add_token_ids(10);
  chunks[0].add_token_ids(11);
  chunks[0].set_text("Hel");
  chunks[0].set_worker("w0");
  chunks[1].set_request_id("req-7");
  chunks[1].set_index(1);
  chunks[1].add_token_ids(20);
  chunks[1].set_text("Bye");
  v1::Logprobs* lp = chunks[1].add_logprobs();
  lp->set_token_id(20);
  lp->set_logprob(-0.5f);
  v1::TokenLogprob* top = lp->add_top();
  top->set_token_id(21);
  top->set_logprob(-1.25f);
  chunks[2].set_request_id("req-7");
  chunks[2].set_index(0);
  chunks[2].add_token_ids(12);
  chunks[2].set_text("lo");
  chunks[2].set_finish_reason(v1::FINISH_REASON_LENGTH);
  chunks[2].mutable_usage()->set_prompt_tokens(5);
  chunks[2].mutable_usage()->set_completion_tokens(3);
  chunks[2].mutable_usage()->set_cached_prompt_tokens(4);
  chunks[2].mutable_usage()->set_peak_kv_blocks(2);
  chunks[3].set_request_id("req-7");
  chunks[3].set_index(1);
  chunks[3].set_finish_reason(v1::FINISH_REASON_STOP);
  chunks[3].set_stop_reason("\n");
  chunks[3].mutable_usage()->set_completion_tokens(1);
  return chunks;
}

GenerateParams TextParams() {
  GenerateParams p;
  p.prompt = "Once upon a time";
  p.max_tokens = 3;
  return p;
}

TEST(ClientTest, StreamsChunksInOrderAndSendsEveryField) {
  FakeInferenceServer server;
  server.service().SetChunks(TwoSampleChunks());
  std::unique_ptr<Client> client = ConnectOrDie(server.address(), FastRetries(1));
  GenerateParams p;
  p.model = "stories260K";
  p.prompt_token_ids = {1, 403, 407};
  p.max_tokens = 9;
  p.sampling.temperature = 0.0f;
  p.sampling.top_k = 5;
  p.sampling.min_p = 0.25f;
  p.sampling.seed = 42;
  p.stop = {"\n", "The end"};
  p.stop_token_ids = {2};
  p.ignore_eos = true;
  p.n = 2;
  p.logprobs = 1;
  p.cache_salt = "salt";
  p.request_id = "req-7";
  p.add_special_tokens = false;
  std::vector<GenerateChunk> chunks;
  absl::Status status = client->Generate(p, [&](const GenerateChunk& c) { chunks.push_back(c); });
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_EQ(chunks.size(), 4u);
  EXPECT_EQ(chunks[0].request_id, "req-7");
  EXPECT_EQ(chunks[0].worker, "w0");
  EXPECT_EQ(chunks[0].token_ids, (std::vector<TokenId>{10, 11}));
  EXPECT_FALSE(chunks[0].usage.has_value());
  EXPECT_EQ(chunks[1].index, 1u);
  ASSERT_EQ(chunks[1].logprobs.size(), 1u);
  EXPECT_EQ(chunks[1].logprobs[0].top[0].token_id, 21);
  EXPECT_FLOAT_EQ(chunks[1].logprobs[0].top[0].logprob, -1.25f);
  EXPECT_EQ(chunks[2].finish_reason, CompletionFinishReason::kLength);
  ASSERT_TRUE(chunks[2].usage.has_value());
  EXPECT_EQ(chunks[2].usage->cached_prompt_tokens, 4u);

  const v1::GenerateRequest sent = server.service().last_generate_request();
  EXPECT_EQ(sent.model(), "stories260K");
  EXPECT_TRUE(sent.prompt().empty());
  EXPECT_EQ(std::vector<uint32_t>(sent.prompt_token_ids().begin(), sent.prompt_token_ids().end()),
            (std::vector<uint32_t>{1, 403, 407}));
  EXPECT_EQ(sent.max_tokens(), 9u);
  ASSERT_TRUE(sent.sampling().has_temperature());
  EXPECT_EQ(sent.sampling().temperature(), 0.0f);
  EXPECT_FALSE(sent.sampling().has_top_p());
  EXPECT_FALSE(sent.sampling().has_repetition_penalty());
  EXPECT_EQ(sent.sampling().top_k(), 5u);
  EXPECT_EQ(sent.sampling().min_p(), 0.25f);
  EXPECT_EQ(sent.sampling().seed(), 42u);
  ASSERT_EQ(sent.stop_size(), 2);
  EXPECT_EQ(sent.stop(1), "The end");
  EXPECT_EQ(sent.stop_token_ids(0), 2u);
  EXPECT_TRUE(sent.ignore_eos());
  EXPECT_EQ(sent.n(), 2u);
  EXPECT_TRUE(sent.has_logprobs());
  EXPECT_EQ(sent.logprobs(), 1u);
  EXPECT_EQ(sent.cache_salt(), "salt");
  EXPECT_EQ(sent.request_id(), "req-7");
  ASSERT_TRUE(sent.has_add_special_tokens());
  EXPECT_FALSE(sent.add_special_tokens());
}

TEST(ClientTest, GenerateSyncGathersEverySample) {
  FakeInferenceServer server;
  server.service().SetChunks(TwoSampleChunks());
  std::unique_ptr<Client> client = ConnectOrDie(server.address(), FastRetries(1));
  absl::StatusOr<Completion> c = client->GenerateSync(TextParams());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->request_id, "req-7");
  EXPECT_EQ(c->worker, "w0");
  ASSERT_EQ(c->samples.size(), 2u);
  EXPECT_EQ(c->samples[0].text, "Hello");
  EXPECT_EQ(c->samples[0].token_ids, (std::vector<TokenId>{10, 11, 12}));
  EXPECT_EQ(CompletionFinishReasonName(c->samples[0].finish_reason), "length");
  EXPECT_EQ(c->samples[0].usage.prompt_tokens, 5u);
  EXPECT_EQ(c->samples[0].usage.completion_tokens, 3u);
  EXPECT_EQ(c->samples[0].usage.peak_kv_blocks, 2u);
  EXPECT_EQ(c->samples[1].index, 1u);
  EXPECT_EQ(c->samples[1].text, "Bye");
  EXPECT_EQ(CompletionFinishReasonName(c->samples[1].finish_reason), "stop");
  EXPECT_EQ(c->samples[1].stop_reason, "\n");
  ASSERT_EQ(c->samples[1].logprobs.size(), 1u);
  EXPECT_FLOAT_EQ(c->samples[1].logprobs[0].logprob, -0.5f);
  EXPECT_EQ(server.service().last_generate_request().prompt(), "Once upon a time");
  EXPECT_FALSE(server.service().last_generate_request().sampling().has_temperature());
}

TEST(ClientTest, RetriesUnavailableBeforeTheFirstMessage) {
  FakeInferenceServer server;
  server.service().SetChunks(TwoSampleChunks());
  server.service().FailFirstCalls(2);
  std::unique_ptr<Client> client = ConnectOrDie(server.address(), FastRetries(4));
  absl::StatusOr<Completion> c = client->GenerateSync(TextParams());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->samples[0].text, "Hello");
  EXPECT_EQ(server.service().generate_calls(), 3);
}

TEST(ClientTest, GivesUpAfterMaxAttempts) {
  FakeInferenceServer server;
  server.service().FailFirstCalls(10);
  std::unique_ptr<Client> client = ConnectOrDie(server.address(), FastRetries(3));
  absl::StatusOr<Completion> c = client->GenerateSync(TextParams());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
  EXPECT_EQ(server.service().generate_calls(), 3);
}

TEST(ClientTest, FailureAfterTheFirstMessageIsNotRetried) {
  FakeInferenceServer server;
  server.service().SetChunks(TwoSampleChunks());
  server.service().SetEnding(StreamEnding::kUnavailableAfterFirst);
  std::unique_ptr<Client> client = ConnectOrDie(server.address(), FastRetries(4));
  int chunks = 0;
  absl::Status status = client->Generate(TextParams(), [&](const GenerateChunk&) { ++chunks; });
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_EQ(chunks, 1);
  EXPECT_EQ(server.service().generate_calls(), 1);
}

TEST(ClientTest, UnaryCallsConvertAndRetry) {
  FakeInferenceServer server;
  server.service().FailFirstCalls(1);
  std::unique_ptr<Client> client = ConnectOrDie(server.address(), FastRetries(2));
  absl::StatusOr<std::vector<ModelInfo>> models = client->ListModels();
  ASSERT_TRUE(models.ok()) << models.status();
  ASSERT_EQ(models->size(), 1u);
  EXPECT_EQ((*models)[0].name, "stories260K");
  EXPECT_EQ((*models)[0].max_model_len, 512u);
  EXPECT_EQ(server.service().unary_calls(), 2);

  absl::StatusOr<std::vector<TokenId>> ids = client->Tokenize({.text = "Hi"});
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<TokenId>{1, 'H', 'i'}));
  ids = client->Tokenize({.text = "Hi", .add_special_tokens = false});
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<TokenId>{'H', 'i'}));

  absl::StatusOr<std::string> text = client->Detokenize({.token_ids = {1, 'o', 'k'}});
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "ok");
  text = client->Detokenize({.token_ids = {300}});
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(text.status().message().find("token_ids"), std::string::npos);
}

TEST(ClientTest, PropagatesTheDeadline) {
  FakeInferenceServer server;
  server.service().SetChunks(TwoSampleChunks());
  ClientOptions options = FastRetries(1);
  options.default_deadline = absl::Hours(1);
  std::unique_ptr<Client> client = ConnectOrDie(server.address(), options);

  auto before = std::chrono::system_clock::now();
  ASSERT_TRUE(client->GenerateSync(TextParams()).ok());
  auto seen = server.service().last_deadline();
  EXPECT_GT(seen, before + std::chrono::minutes(59));
  EXPECT_LT(seen, std::chrono::system_clock::now() + std::chrono::minutes(61));

  before = std::chrono::system_clock::now();
  ASSERT_TRUE(client->ListModels({.deadline = absl::Seconds(30)}).ok());
  seen = server.service().last_deadline();
  EXPECT_GT(seen, before + seconds(25));
  EXPECT_LT(seen, std::chrono::system_clock::now() + seconds(31));
}

TEST(ClientTest, DeadlineExceededWhileTheServerHangs) {
  FakeInferenceServer server;
  server.service().SetChunks(TwoSampleChunks());
  server.service().SetEnding(StreamEnding::kHangAfterFirst);
  std::unique_ptr<Client> client = ConnectOrDie(server.address(), FastRetries(3));
  int chunks = 0;
  absl::Status status = client->Generate(TextParams(), [&](const GenerateChunk&) { ++chunks; },
                                         {.deadline = absl::Milliseconds(300)});
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_EQ(chunks, 1);
  EXPECT_EQ(server.service().generate_calls(), 1);
  EXPECT_TRUE(server.service().WaitForCancellations(1, std::chrono::seconds(10)));
}

TEST(ClientTest, CancelFromAnotherThreadEndsTheStream) {
  FakeInferenceServer server;
  server.service().SetChunks(TwoSampleChunks());
  server.service().SetEnding(StreamEnding::kHangAfterFirst);
  std::unique_ptr<Client> client = ConnectOrDie(server.address(), FastRetries(3));
  auto handle = std::make_shared<CallHandle>();
  std::promise<void> first_chunk;
  std::future<absl::Status> result = std::async(std::launch::async, [&] {
    bool signalled = false;
    return client->Generate(TextParams(),
                            [&](const GenerateChunk&) {
                              if (!signalled) first_chunk.set_value();
                              signalled = true;
                            },
                            {.handle = handle});
  });
  ASSERT_EQ(first_chunk.get_future().wait_for(seconds(10)), std::future_status::ready);
  handle->Cancel();
  ASSERT_EQ(result.wait_for(seconds(10)), std::future_status::ready);
  EXPECT_EQ(result.get().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(handle->cancelled());
  EXPECT_TRUE(server.service().WaitForCancellations(1, std::chrono::seconds(10)));
  EXPECT_EQ(server.service().generate_calls(), 1);
}

TEST(ClientTest, CancelStopsTheRetryBackoff) {
  FakeInferenceServer server;
  server.service().FailFirstCalls(100);
  ClientOptions options = FastRetries(5);
  options.initial_backoff = absl::Hours(1);
  options.max_backoff = absl::Hours(1);
  options.default_deadline = absl::InfiniteDuration();
  std::unique_ptr<Client> client = ConnectOrDie(server.address(), options);
  auto handle = std::make_shared<CallHandle>();
  std::future<absl::Status> result = std::async(std::launch::async, [&] {
    return client->Generate(TextParams(), nullptr, {.handle = handle});
  });
  ASSERT_TRUE(server.service().WaitForGenerateCalls(1, std::chrono::seconds(10)));
  handle->Cancel();
  ASSERT_EQ(result.wait_for(seconds(10)), std::future_status::ready);
  EXPECT_EQ(result.get().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(server.service().generate_calls(), 1);
}

TEST(ClientTest, CancelledHandleFailsTheCallUpFront) {
  FakeInferenceServer server;
  std::unique_ptr<Client> client = ConnectOrDie(server.address(), FastRetries(1));
  auto handle = std::make_shared<CallHandle>();
  handle->Cancel();
  EXPECT_EQ(client->GenerateSync(TextParams(), {.handle = handle}).status().code(),
            absl::StatusCode::kCancelled);
  EXPECT_EQ(server.service().generate_calls(), 0);
}

TEST(ClientTest, MessagesOverTheSizeLimitAreRefused) {
  FakeInferenceServer server;
  std::vector<v1::GenerateResponse> chunks(1);
  chunks[0].set_text(std::string(8192, 'x'));
  server.service().SetChunks(chunks);
  ClientOptions options = FastRetries(1);
  options.max_message_bytes = 1024;
  std::unique_ptr<Client> client = ConnectOrDie(server.address(), options);
  EXPECT_EQ(client->GenerateSync(TextParams()).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(ClientTest, UnreachableServerIsUnavailable) {
  // A port the test holds without listening: always refused, never taken by another process.
  test_util::HeldPort held;
  const std::string address = held.address();
  std::unique_ptr<Client> client = ConnectOrDie(address, FastRetries(2));
  EXPECT_EQ(client->ListModels().status().code(), absl::StatusCode::kUnavailable);

  ClientOptions options = FastRetries(1);
  options.connect_timeout = absl::Milliseconds(200);
  absl::StatusOr<std::unique_ptr<Client>> refused = Client::Connect(address, options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
}

TEST(ClientTest, RejectsBadArgumentsWithTheFieldName) {
  EXPECT_EQ(Client::Connect("", {}).status().code(), absl::StatusCode::kInvalidArgument);
  ClientOptions bad;
  bad.max_attempts = 0;
  absl::Status s = Client::Connect("127.0.0.1:1", bad).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("max_attempts"), std::string::npos) << s;

  FakeInferenceServer server;
  std::unique_ptr<Client> client = ConnectOrDie(server.address(), FastRetries(1));
  GenerateParams both = TextParams();
  both.prompt_token_ids = {1};
  s = client->GenerateSync(both).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("prompt_token_ids"), std::string::npos) << s;
  GenerateParams neither;
  EXPECT_EQ(client->GenerateSync(neither).status().code(), absl::StatusCode::kInvalidArgument);
  GenerateParams negative = TextParams();
  negative.stop_token_ids = {2, -3};
  s = client->GenerateSync(negative).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("stop_token_ids[1]"), std::string::npos) << s;
  EXPECT_EQ(server.service().generate_calls(), 0);
}

}  // namespace
}  // namespace kvserve
