// The worker's gRPC server end to end: an in-process server on 127.0.0.1:0 over stories260K,
// called through real stubs. Greedy outputs are checked against golden.json (llama2.c's
// reference continuations); block accounting through GetLoad and the engine's statistics.
// Waits are bounded loops on a condition, never sleeps used as synchronisation.

#include "worker/server/worker_server.h"

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/block_hash/block_hash.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "kvserve/v1/inference.grpc.pb.h"
#include "kvserve/v1/worker.grpc.pb.h"
#include "tests/worker/model/golden.h"
#include "tests/worker/server/health.grpc.pb.h"

namespace kvserve {
namespace {

using HealthStatus = grpc::health::v1::HealthCheckResponse;
using std::chrono::milliseconds;

constexpr milliseconds kCallTimeout(10000);

// Polls `condition` until it holds or `limit` passes; true when it held. The limit only bounds a
// test whose condition never comes (it is no statement about speed), so it is generous enough for
// a loaded machine under a sanitizer.
bool WaitFor(const std::function<bool()>& condition, milliseconds limit = milliseconds(30000)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(1));
  }
  return true;
}

void SetDeadline(grpc::ClientContext* context, milliseconds timeout = kCallTimeout) {
  context->set_deadline(std::chrono::system_clock::now() + timeout);
}

// One sample's messages, concatenated.
struct Sample {
  std::vector<TokenId> ids;
  std::string text;
  std::vector<v1::Logprobs> logprobs;
  v1::GenerateResponse last;
  int messages = 0;
};

struct Generated {
  grpc::Status status;
  std::map<uint32_t, Sample> samples;
};

class WorkerServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new LoadedModel(*LoadModel(testing_golden::kStoriesGguf));
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }

  static EngineOptions Options() {
    EngineOptions o;
    o.num_threads = 1;
    o.block_size = 16;
    o.num_kv_blocks = 64;
    o.check_invariants = true;
    return o;
  }

  // Manual-step engine: nothing runs until the test calls StepOnce.
  static EngineOptions ManualOptions() {
    EngineOptions o = Options();
    o.run_loop_thread = false;
    return o;
  }

  void StartServer(EngineOptions options = Options()) {
    engine_ = *Engine::Create(model_, options);
    WorkerServerOptions server_options;
    server_options.model_name = "stories260K";
    server_ = std::make_unique<WorkerServer>(model_, engine_.get(), server_options);
    absl::StatusOr<int> port = server_->Start("127.0.0.1:0");
    ASSERT_TRUE(port.ok()) << port.status();
    ASSERT_GT(*port, 0);
    auto channel =
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", *port), grpc::InsecureChannelCredentials());
    inference_ = v1::Inference::NewStub(channel);
    worker_ = v1::Worker::NewStub(channel);
    health_ = grpc::health::v1::Health::NewStub(channel);
    channel_ = channel;
  }

  void TearDown() override {
    if (engine_ != nullptr) {
      EngineStats st = engine_->stats();
      EXPECT_EQ(st.invariant_violations, 0) << st.first_violation;
    }
    server_.reset();
    engine_.reset();
  }

  Generated Generate(const v1::GenerateRequest& request) {
    grpc::ClientContext context;
    SetDeadline(&context);
    Generated out;
    auto reader = inference_->Generate(&context, request);
    v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
      Sample& s = out.samples[msg.index()];
      s.ids.insert(s.ids.end(), msg.token_ids().begin(), msg.token_ids().end());
      s.text += msg.text();
      s.logprobs.insert(s.logprobs.end(), msg.logprobs().begin(), msg.logprobs().end());
      s.last = msg;
      ++s.messages;
    }
    out.status = reader->Finish();
    return out;
  }

  v1::LoadReport GetLoad() {
    grpc::ClientContext context;
    SetDeadline(&context);
    v1::LoadReport report;
    grpc::Status s = worker_->GetLoad(&context, v1::GetLoadRequest(), &report);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return report;
  }

  HealthStatus::ServingStatus Health(const std::string& service) {
    grpc::ClientContext context;
    SetDeadline(&context);
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(service);
    HealthStatus response;
    grpc::Status s = health_->Check(&context, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response.status();
  }

  static v1::GenerateRequest Greedy(std::vector<TokenId> prompt, uint32_t max_tokens) {
    v1::GenerateRequest r;
    for (TokenId id : prompt) r.add_prompt_token_ids(static_cast<uint32_t>(id));
    r.set_max_tokens(max_tokens);
    r.mutable_sampling()->set_temperature(0.0f);
    r.set_ignore_eos(true);
    return r;
  }

  static LoadedModel* model_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<WorkerServer> server_;
  std::unique_ptr<v1::Inference::Stub> inference_;
  std::unique_ptr<v1::Worker::Stub> worker_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
  std::shared_ptr<grpc::Channel> channel_;
};
LoadedModel* WorkerServerTest::model_ = nullptr;

std::vector<TokenId> Ids(const google::protobuf::RepeatedField<uint32_t>& ids) {
  return std::vector<TokenId>(ids.begin(), ids.end());
}

TEST_F(WorkerServerTest, GreedyGenerateMatchesGoldenViaTextAndIds) {
  StartServer();
  const auto golden = testing_golden::LoadStoriesGolden();
  for (const auto& c : golden.cases) {
    for (bool via_text : {true, false}) {
      SCOPED_TRACE(absl::StrCat(c.prompt, via_text ? " (text)" : " (ids)"));
      v1::GenerateRequest request;
      if (via_text) {
        request.set_prompt(c.prompt);
      } else {
        for (TokenId id : c.prompt_ids) request.add_prompt_token_ids(static_cast<uint32_t>(id));
      }
      request.set_max_tokens(static_cast<uint32_t>(c.generated_ids.size()));
      request.mutable_sampling()->set_temperature(0.0f);
      request.set_request_id(absl::StrCat("golden-", via_text));
      Generated g = Generate(request);
      ASSERT_TRUE(g.status.ok()) << g.status.error_message();
      ASSERT_EQ(g.samples.size(), 1u);
      const Sample& s = g.samples[0];
      EXPECT_EQ(s.ids, c.generated_ids);
      EXPECT_EQ(c.prompt + s.text, c.text);
      // One message per engine step, each with one token; the last one carries the ending.
      EXPECT_EQ(s.messages, static_cast<int>(c.generated_ids.size()));
      EXPECT_EQ(s.last.request_id(), request.request_id());
      EXPECT_EQ(s.last.worker(), server_->advertised_address());
      EXPECT_EQ(s.last.finish_reason(), v1::FINISH_REASON_LENGTH);
      EXPECT_EQ(s.last.usage().prompt_tokens(), c.prompt_ids.size());
      EXPECT_EQ(s.last.usage().completion_tokens(), c.generated_ids.size());
      EXPECT_TRUE(s.logprobs.empty());
    }
  }
  EXPECT_EQ(server_->stats().generate_requests, 4);
}

TEST_F(WorkerServerTest, GeneratedRequestIdsAreUniqueAndEchoed) {
  StartServer();
  v1::GenerateRequest request = Greedy({1, 403}, 2);
  Generated a = Generate(request);
  Generated b = Generate(request);
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  EXPECT_FALSE(a.samples[0].last.request_id().empty());
  EXPECT_NE(a.samples[0].last.request_id(), b.samples[0].last.request_id());
}

TEST_F(WorkerServerTest, TwoSamplesStreamSeparately) {
  StartServer();
  v1::GenerateRequest request = Greedy({1, 403, 407, 261, 378}, 8);
  request.set_n(2);
  request.mutable_sampling()->set_temperature(1.0f);
  request.mutable_sampling()->set_seed(7);
  Generated g = Generate(request);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  ASSERT_EQ(g.samples.size(), 2u);
  for (uint32_t i = 0; i < 2; ++i) {
    const Sample& s = g.samples[i];
    EXPECT_EQ(s.ids.size(), 8u) << i;
    EXPECT_EQ(s.last.finish_reason(), v1::FINISH_REASON_LENGTH) << i;
    EXPECT_EQ(s.last.usage().completion_tokens(), 8u) << i;
    EXPECT_EQ(s.last.usage().prompt_tokens(), 5u) << i;
  }
}

TEST_F(WorkerServerTest, LogprobsArePresentWhenAsked) {
  StartServer();
  v1::GenerateRequest request = Greedy({1, 403, 407, 261, 378}, 6);
  request.set_logprobs(3);
  Generated g = Generate(request);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  const Sample& s = g.samples[0];
  ASSERT_EQ(s.logprobs.size(), s.ids.size());
  for (size_t i = 0; i < s.ids.size(); ++i) {
    const v1::Logprobs& lp = s.logprobs[i];
    EXPECT_EQ(static_cast<TokenId>(lp.token_id()), s.ids[i]);
    EXPECT_LE(lp.logprob(), 0.0f);
    ASSERT_EQ(lp.top_size(), 3);
    // Greedy: the chosen token is the most likely one.
    EXPECT_EQ(lp.top(0).token_id(), lp.token_id());
    EXPECT_EQ(lp.top(0).logprob(), lp.logprob());
    EXPECT_GE(lp.top(0).logprob(), lp.top(1).logprob());
    EXPECT_GE(lp.top(1).logprob(), lp.top(2).logprob());
  }
}

TEST_F(WorkerServerTest, ValidationErrorsAreInvalidArgumentNamingTheField) {
  StartServer();
  struct Case {
    const char* name;
    std::function<void(v1::GenerateRequest*)> edit;
    const char* field;
  };
  const std::vector<Case> cases = {
      {"empty prompt", [](v1::GenerateRequest* r) { r->clear_prompt_token_ids(); }, "prompt"},
      {"prompt and ids", [](v1::GenerateRequest* r) { r->set_prompt("Once"); }, "prompt_token_ids"},
      {"id outside vocab", [](v1::GenerateRequest* r) { r->add_prompt_token_ids(512); },
       "prompt_token_ids"},
      {"top_p 2", [](v1::GenerateRequest* r) { r->mutable_sampling()->set_top_p(2.0f); }, "top_p"},
      {"temperature NaN",
       [](v1::GenerateRequest* r) {
         r->mutable_sampling()->set_temperature(std::numeric_limits<float>::quiet_NaN());
       },
       "temperature"},
      {"n too large", [](v1::GenerateRequest* r) { r->set_n(17); }, "n must"},
      {"prompt longer than context",
       [](v1::GenerateRequest* r) {
         for (int i = 0; i < 600; ++i) r->add_prompt_token_ids(300);
       },
       "prompt"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    v1::GenerateRequest request = Greedy({1, 403}, 4);
    c.edit(&request);
    Generated g = Generate(request);
    EXPECT_EQ(g.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(g.status.error_message().find(c.field), std::string::npos)
        << g.status.error_message();
    EXPECT_TRUE(g.samples.empty());
  }
  v1::GenerateRequest other_model = Greedy({1, 403}, 4);
  other_model.set_model("llama-70b");
  EXPECT_EQ(Generate(other_model).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(server_->stats().generate_rejected, static_cast<int64_t>(cases.size()) + 1);
  EXPECT_EQ(GetLoad().used_blocks(), 0u);
}

TEST_F(WorkerServerTest, PromptTooBigForThePoolIsResourceExhausted) {
  EngineOptions options = Options();
  options.num_kv_blocks = 4;  // 3 usable blocks: 48 tokens
  StartServer(options);
  std::vector<TokenId> prompt(100, 300);
  Generated g = Generate(Greedy(prompt, 4));
  EXPECT_EQ(g.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << g.status.error_message();
}

// Starts a long greedy request on a manual-step engine and runs its prefill, so it holds blocks.
class StreamingCall {
 public:
  StreamingCall(v1::Inference::Stub* stub, Engine* engine, milliseconds timeout) {
    EXPECT_TRUE(Start(stub, engine, timeout));
  }
  // Leaves the call unstarted, for Start.
  StreamingCall() = default;

  // Starts the call with a deadline `timeout` from now, waits for its submission, runs the
  // prefill and reads the first token. False when the deadline ended the call before that.
  bool Start(v1::Inference::Stub* stub, Engine* engine, milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    SetDeadline(&context_, timeout);
    v1::GenerateRequest request;
    for (int i = 0; i < 40; ++i) request.add_prompt_token_ids(static_cast<uint32_t>(300 + i));
    request.set_max_tokens(400);
    request.set_ignore_eos(true);
    request.mutable_sampling()->set_temperature(0.0f);
    reader_ = stub->Generate(&context_, request);
    // The call reaches the engine through the server: wait for the submission (or the deadline,
    // which may end the call before it gets there).
    EXPECT_TRUE(
        WaitFor([&] { return !engine->idle() || std::chrono::steady_clock::now() > deadline; }));
    if (engine->idle()) return false;
    engine->StepOnce();  // prefill and first token
    return reader_->Read(&first_);
  }

  grpc::ClientContext& context() { return context_; }
  grpc::ClientReader<v1::GenerateResponse>& reader() { return *reader_; }
  const v1::GenerateResponse& first() const { return first_; }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader_;
  v1::GenerateResponse first_;
};

TEST_F(WorkerServerTest, CancellingAStreamAbortsTheRequestAndFreesItsBlocks) {
  StartServer(ManualOptions());
  StreamingCall call(inference_.get(), engine_.get(), kCallTimeout);
  EXPECT_EQ(call.first().token_ids_size(), 1);
  // 40 prompt tokens: three blocks.
  EXPECT_EQ(GetLoad().used_blocks(), 3u);
  EXPECT_EQ(GetLoad().running_requests(), 1u);

  call.context().TryCancel();
  EXPECT_EQ(call.reader().Finish().error_code(), grpc::StatusCode::CANCELLED);
  // The server saw the cancellation and queued the abort: the next engine iteration frees the
  // request's blocks without generating the 399 tokens still due.
  ASSERT_TRUE(WaitFor([this] { return server_->stats().generate_cancelled == 1; }));
  engine_->StepOnce();
  EXPECT_TRUE(engine_->idle());
  const v1::LoadReport load = GetLoad();
  EXPECT_EQ(load.used_blocks(), 0u);
  EXPECT_EQ(load.running_requests(), 0u);
  EXPECT_EQ(engine_->stats().num_steps, 2);  // warm-up + the prefill above
  EXPECT_TRUE(WaitFor([this] { return server_->stats().open_generate_streams == 0; }));
}

TEST_F(WorkerServerTest, ExpiredDeadlineIsDeadlineExceededAndFreesBlocks) {
  StartServer(ManualOptions());
  // The deadline must end the call after its prefill has run (so that it holds blocks) but covers
  // submission, prefill and the first read too. Rather than bet that one fixed deadline fits this
  // machine, a call whose deadline ran out during that setup is cleaned up and tried again with a
  // deadline twice as long; the assertions below only run on a call that was set up in time.
  std::unique_ptr<StreamingCall> call;
  for (milliseconds timeout(300);; timeout *= 2) {
    ASSERT_LE(timeout, kCallTimeout * 6) << "no call was set up within its deadline";
    call = std::make_unique<StreamingCall>();
    if (call->Start(inference_.get(), engine_.get(), timeout)) break;
    EXPECT_EQ(call->reader().Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
    // Free whatever the late call holds before the next try.
    ASSERT_TRUE(WaitFor([this] {
      if (!engine_->idle()) engine_->StepOnce();
      return engine_->idle() && GetLoad().used_blocks() == 0;
    }));
  }
  const int64_t cancelled_before = server_->stats().generate_cancelled;
  EXPECT_EQ(GetLoad().used_blocks(), 3u);
  // Nothing steps the engine, so no more messages come before the deadline.
  v1::GenerateResponse msg;
  EXPECT_FALSE(call->reader().Read(&msg));
  EXPECT_EQ(call->reader().Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  ASSERT_TRUE(WaitFor([&] { return server_->stats().generate_cancelled == cancelled_before + 1; }));
  engine_->StepOnce();
  EXPECT_TRUE(engine_->idle());
  EXPECT_EQ(GetLoad().used_blocks(), 0u);
}

/// Holds the engine's loop thread in OnStep, after its first step that ran the model, until
/// Open(): while it is closed no request gets past that step.
class StepGate final : public EngineObserver {
 public:
  void OnStep(const StepMetrics& /*step*/) override {
    std::unique_lock<std::mutex> lock(mu_);
    ++steps_;
    cv_.wait(lock, [this] { return open_; });
  }
  void OnRequestFinished(const RequestMetrics& /*request*/) override {}
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  int steps() {
    std::lock_guard<std::mutex> lock(mu_);
    return steps_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  int steps_ = 0;
};

TEST_F(WorkerServerTest, CancellationWithTheRealLoopFreesBlocks) {
  StartServer();
  // The loop thread stops after the request's first step (prefill, which samples the first
  // tokens) until the cancel has been seen, so the request cannot finish before it, whatever the
  // machine's speed. The gate replaces the server's metrics observer, which this test does not
  // read.
  auto gate = std::make_shared<StepGate>();
  engine_->SetObserver(gate);
  const absl::Cleanup open_gate = [&gate] { gate->Open(); };  // however the test ends
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::GenerateRequest request = Greedy({1, 403, 407, 261, 378}, 400);
  request.set_n(16);
  auto reader = inference_->Generate(&context, request);
  v1::GenerateResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  context.TryCancel();
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  ASSERT_TRUE(WaitFor([this] { return server_->stats().generate_cancelled == 1; }));
  // The cancel (and the abort it queued) came before the loop got past the request's first
  // step: the first message goes out before the step's OnStep, so the loop may not have reached
  // the gate yet (0), but it cannot have passed it (once seen under ASan in CI).
  EXPECT_LE(gate->steps(), 1);
  EXPECT_TRUE(WaitFor([&gate] { return gate->steps() == 1; }));
  gate->Open();
  EXPECT_TRUE(WaitFor([this] {
    const EngineStats st = engine_->stats();
    return engine_->idle() && st.used_blocks == 0 && st.num_running == 0;
  }));
  EXPECT_EQ(GetLoad().used_blocks(), 0u);
}

TEST_F(WorkerServerTest, GetLoadReportsThePool) {
  StartServer(ManualOptions());
  v1::LoadReport idle = GetLoad();
  EXPECT_EQ(idle.total_blocks(), 63u);  // 64 minus the reserved null block
  EXPECT_EQ(idle.used_blocks(), 0u);
  EXPECT_EQ(idle.free_blocks(), 63u);
  EXPECT_EQ(idle.block_size(), 16u);
  EXPECT_EQ(idle.running_requests(), 0u);
  EXPECT_EQ(idle.waiting_requests(), 0u);
  EXPECT_FALSE(idle.draining());

  StreamingCall call(inference_.get(), engine_.get(), kCallTimeout);
  v1::LoadReport busy = GetLoad();
  EXPECT_EQ(busy.running_requests(), 1u);
  EXPECT_EQ(busy.used_blocks(), 3u);
  EXPECT_EQ(busy.free_blocks(), 60u);
  call.context().TryCancel();
  call.reader().Finish();
  ASSERT_TRUE(WaitFor([this] { return server_->stats().generate_cancelled == 1; }));
  engine_->StepOnce();
  // The prompt's two full blocks stay cached (free but evictable).
  v1::LoadReport after = GetLoad();
  EXPECT_EQ(after.used_blocks(), 0u);
  EXPECT_EQ(after.cached_free_blocks(), 2u);
  EXPECT_EQ(after.free_blocks(), 63u);

  grpc::ClientContext context;
  SetDeadline(&context);
  v1::ModelInfo info;
  ASSERT_TRUE(worker_->GetModelInfo(&context, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.name(), "stories260K");
  EXPECT_EQ(info.max_model_len(), 512u);
  EXPECT_EQ(info.vocab_size(), 512u);
  EXPECT_EQ(info.block_size(), 16u);
  EXPECT_EQ(info.num_kv_blocks(), 63u);
  EXPECT_EQ(info.kv_cache_dtype(), "f32");
  EXPECT_EQ(info.tensor_parallel_size(), 1u);
}

TEST_F(WorkerServerTest, KvEventsStartWithASnapshotThenDeltas) {
  StartServer();
  grpc::ClientContext context;
  SetDeadline(&context);
  auto events = worker_->StreamKvEvents(&context, v1::StreamKvEventsRequest());
  v1::KvEventBatch batch;
  ASSERT_TRUE(events->Read(&batch));
  EXPECT_TRUE(batch.reset());
  EXPECT_EQ(batch.events_size(), 0);  // the warm-up fills no block

  std::vector<TokenId> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(300 + i);
  v1::GenerateRequest request = Greedy(prompt, 1);
  request.set_cache_salt("tenant-a");
  ASSERT_TRUE(Generate(request).status.ok());

  const std::vector<BlockKey> expected = HashFullBlocks(prompt, 16, "tenant-a");
  ASSERT_EQ(expected.size(), 2u);
  std::vector<BlockKey> stored;
  while (stored.size() < expected.size() && events->Read(&batch)) {
    EXPECT_FALSE(batch.reset());
    for (const v1::KvEvent& e : batch.events()) {
      EXPECT_EQ(e.type(), v1::KvEvent::TYPE_STORED);
      stored.push_back({e.key().hi(), e.key().lo()});
    }
  }
  EXPECT_EQ(stored, expected);
  EXPECT_EQ(server_->stats().open_kv_event_streams, 1);
  context.TryCancel();
  EXPECT_EQ(events->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(WaitFor([this] { return server_->stats().open_kv_event_streams == 0; }));
}

TEST_F(WorkerServerTest, KvEventsNameTheTierHoldingEachBlock) {
  EngineOptions o = Options();
  o.kv_offload.host_bytes = int64_t{4} << 20;
  StartServer(o);
  grpc::ClientContext context;
  SetDeadline(&context);
  auto events = worker_->StreamKvEvents(&context, v1::StreamKvEventsRequest());
  v1::KvEventBatch batch;
  ASSERT_TRUE(events->Read(&batch));
  std::vector<TokenId> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(300 + i);
  ASSERT_TRUE(Generate(Greedy(prompt, 1)).status.ok());
  const std::vector<BlockKey> expected = HashFullBlocks(prompt, 16, "");
  // Each full block is stored in the device pool and copied to the host tier.
  std::vector<BlockKey> device, host;
  while ((device.size() < 2 || host.size() < 2) && events->Read(&batch)) {
    for (const v1::KvEvent& e : batch.events()) {
      EXPECT_EQ(e.type(), v1::KvEvent::TYPE_STORED);
      (e.tier() == v1::KvEvent::TIER_HOST ? host : device).push_back({e.key().hi(), e.key().lo()});
      EXPECT_NE(e.tier(), v1::KvEvent::TIER_DISK);
    }
  }
  EXPECT_EQ(device, expected);
  EXPECT_EQ(host, expected);
  context.TryCancel();
  events->Finish();
}

TEST_F(WorkerServerTest, HealthIsServingAfterWarmup) {
  StartServer();
  EXPECT_EQ(Health(""), HealthStatus::SERVING);
  EXPECT_EQ(Health("kvserve.v1.Inference"), HealthStatus::SERVING);
  EXPECT_EQ(Health("kvserve.v1.Worker"), HealthStatus::SERVING);
  EXPECT_EQ(engine_->stats().num_finished_requests, 1);  // the warm-up

  grpc::ClientContext context;
  SetDeadline(&context);
  v1::ListModelsResponse models;
  ASSERT_TRUE(inference_->ListModels(&context, v1::ListModelsRequest(), &models).ok());
  ASSERT_EQ(models.models_size(), 1);
  EXPECT_EQ(models.models(0).name(), "stories260K");
  EXPECT_EQ(models.models(0).max_model_len(), 512u);
  EXPECT_EQ(models.models(0).vocab_size(), 512u);
}

// Server reflection answers list_services with both kvserve services. The reflection protos are
// not installed, so the call is made with raw bytes: ServerReflectionRequest{list_services = ""}
// is field 7, length 0.
TEST_F(WorkerServerTest, ReflectionListsTheServices) {
  StartServer();
  grpc::GenericStub stub(channel_);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  SetDeadline(&context);
  auto call = stub.PrepareCall(
      &context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  // Each operation is started and awaited in turn, so events arrive in order.
  auto await = [&cq](intptr_t expected) {
    void* tag = nullptr;
    bool ok = false;
    return cq.Next(&tag, &ok) && reinterpret_cast<intptr_t>(tag) == expected && ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(await(1));
  grpc::Slice request_bytes(std::string("\x3a\x00", 2));
  grpc::ByteBuffer request(&request_bytes, 1);
  call->Write(request, reinterpret_cast<void*>(2));
  ASSERT_TRUE(await(2));
  call->WritesDone(reinterpret_cast<void*>(3));
  ASSERT_TRUE(await(3));
  grpc::ByteBuffer response;
  call->Read(&response, reinterpret_cast<void*>(4));
  ASSERT_TRUE(await(4));
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  ASSERT_TRUE(await(5));
  EXPECT_TRUE(status.ok()) << status.error_message();
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  EXPECT_NE(bytes.find("kvserve.v1.Inference"), std::string::npos);
  EXPECT_NE(bytes.find("kvserve.v1.Worker"), std::string::npos);
  EXPECT_NE(bytes.find("grpc.health.v1.Health"), std::string::npos);
}

TEST_F(WorkerServerTest, DrainReportsNotServingAndRefusesGenerate) {
  StartServer();
  grpc::ClientContext context;
  SetDeadline(&context);
  v1::DrainResponse response;
  ASSERT_TRUE(worker_->Drain(&context, v1::DrainRequest(), &response).ok());
  EXPECT_EQ(Health(""), HealthStatus::NOT_SERVING);
  EXPECT_EQ(Health("kvserve.v1.Inference"), HealthStatus::NOT_SERVING);
  EXPECT_EQ(Health("kvserve.v1.Worker"), HealthStatus::NOT_SERVING);
  EXPECT_TRUE(GetLoad().draining());
  Generated g = Generate(Greedy({1, 403}, 2));
  EXPECT_EQ(g.status.error_code(), grpc::StatusCode::UNAVAILABLE) << g.status.error_message();
}

TEST_F(WorkerServerTest, AbortRpcEndsTheSampleWithAbort) {
  StartServer(ManualOptions());
  v1::GenerateRequest request = Greedy({1, 403, 407}, 50);
  request.set_request_id("to-abort");
  grpc::ClientContext context;
  SetDeadline(&context);
  auto reader = inference_->Generate(&context, request);
  ASSERT_TRUE(WaitFor([this] { return !engine_->idle(); }));
  engine_->StepOnce();
  v1::GenerateResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  {
    grpc::ClientContext abort_context;
    SetDeadline(&abort_context);
    v1::AbortRequest abort;
    abort.set_request_id("to-abort");
    v1::AbortResponse abort_response;
    ASSERT_TRUE(worker_->Abort(&abort_context, abort, &abort_response).ok());
  }
  engine_->StepOnce();
  v1::GenerateResponse last;
  while (reader->Read(&msg)) last = msg;
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_ABORT);
  EXPECT_EQ(GetLoad().used_blocks(), 0u);
}

TEST_F(WorkerServerTest, TokenizeDetokenizeRoundTrip) {
  StartServer();
  grpc::ClientContext tc;
  SetDeadline(&tc);
  v1::TokenizeRequest tokenize;
  tokenize.set_text("Once upon a time");
  v1::TokenizeResponse ids;
  ASSERT_TRUE(inference_->Tokenize(&tc, tokenize, &ids).ok());
  // golden.json's prompt ids for this text.
  EXPECT_EQ(Ids(ids.token_ids()), (std::vector<TokenId>{1, 403, 407, 261, 378}));

  grpc::ClientContext dc;
  SetDeadline(&dc);
  v1::DetokenizeRequest detokenize;
  *detokenize.mutable_token_ids() = ids.token_ids();
  detokenize.set_skip_special_tokens(true);
  v1::DetokenizeResponse text;
  ASSERT_TRUE(inference_->Detokenize(&dc, detokenize, &text).ok());
  EXPECT_EQ(text.text(), "Once upon a time");

  grpc::ClientContext bc;
  SetDeadline(&bc);
  v1::DetokenizeRequest bad;
  bad.add_token_ids(5);
  bad.add_token_ids(512);
  grpc::Status s = inference_->Detokenize(&bc, bad, &text);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("token_ids[1]"), std::string::npos) << s.error_message();
}

TEST_F(WorkerServerTest, ShutdownEndsOpenStreamsPromptly) {
  StartServer(ManualOptions());
  grpc::ClientContext kv_context;
  SetDeadline(&kv_context);
  auto events = worker_->StreamKvEvents(&kv_context, v1::StreamKvEventsRequest());
  ASSERT_TRUE(WaitFor([this] { return server_->stats().open_kv_event_streams == 1; }));
  engine_->StepOnce();  // publishes the snapshot
  v1::KvEventBatch batch;
  ASSERT_TRUE(events->Read(&batch));
  StreamingCall call(inference_.get(), engine_.get(), kCallTimeout);

  // "Promptly" means Shutdown ends the open streams itself rather than waiting for their clients
  // or deadlines: a Shutdown that waited would return only when the 10 s deadlines had ended both
  // streams with DEADLINE_EXCEEDED, which the statuses below rule out (no wall-clock bound).
  server_->Shutdown();
  // The prefill's stored blocks may still be queued; then the stream ends.
  int more = 0;
  while (events->Read(&batch)) ++more;
  EXPECT_LE(more, 1);
  const grpc::Status kv_status = events->Finish();
  EXPECT_TRUE(kv_status.ok()) << kv_status.error_code() << " " << kv_status.error_message();
  v1::GenerateResponse msg;
  while (call.reader().Read(&msg)) {
  }
  const grpc::Status status = call.reader().Finish();
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
  EXPECT_EQ(server_->stats().open_generate_streams, 0);
  EXPECT_EQ(server_->stats().open_kv_event_streams, 0);
  // The cancelled request was aborted in the engine.
  engine_->StepOnce();
  EXPECT_TRUE(engine_->idle());
}

TEST(DefaultModelNameTest, StripsDirectoriesAndExtension) {
  EXPECT_EQ(DefaultModelName("/models/stories260K.gguf"), "stories260K");
  EXPECT_EQ(DefaultModelName("llama.gguf"), "llama");
  EXPECT_EQ(DefaultModelName(KVSERVE_SHARED_DIR "/models/stories260K/"), "stories260K");
}

}  // namespace
}  // namespace kvserve
