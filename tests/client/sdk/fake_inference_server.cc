#include "tests/client/sdk/fake_inference_server.h"

#include <utility>

namespace kvserve::testing {
namespace {

// Writes canned chunks one at a time, then ends the stream as told. Every decision is made under
// mu_ and acted on after it is released, so no gRPC call runs under the lock.
class CannedStream final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  CannedStream(FakeInferenceService* service, std::vector<v1::GenerateResponse> chunks,
               StreamEnding ending)
      : service_(service), chunks_(std::move(chunks)), ending_(ending) {
    limit_ = ending_ == StreamEnding::kOk ? chunks_.size() : std::min<size_t>(1, chunks_.size());
    Act(Decide());
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mu_);
    write_pending_ = false;
    if (!ok) cancelled_ = true;
    Action action = Decide();
    lock.unlock();
    Act(action);
  }

  void OnCancel() override {
    service_->NoteCancelled();
    std::unique_lock<std::mutex> lock(mu_);
    cancelled_ = true;
    Action action = write_pending_ ? Action{} : Decide();
    lock.unlock();
    Act(action);
  }

  void OnDone() override { delete this; }

 private:
  struct Action {
    const v1::GenerateResponse* write = nullptr;
    bool finish = false;
    grpc::Status status;
  };

  // Requires mu_ held and no write pending.
  Action Decide() {
    Action action;
    if (finished_) return action;
    if (cancelled_) {
      action.finish = true;
      action.status = grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    } else if (next_ < limit_) {
      action.write = &chunks_[next_++];
      write_pending_ = true;
      return action;
    } else if (ending_ == StreamEnding::kOk) {
      action.finish = true;
    } else if (ending_ == StreamEnding::kUnavailableAfterFirst) {
      action.finish = true;
      action.status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "fake worker lost mid-stream");
    } else {
      return action;  // kHangAfterFirst: wait for OnCancel.
    }
    finished_ = true;
    return action;
  }

  void Act(const Action& action) {
    if (action.write != nullptr) StartWrite(action.write);
    if (action.finish) Finish(action.status);
  }

  FakeInferenceService* service_;
  const std::vector<v1::GenerateResponse> chunks_;
  const StreamEnding ending_;
  size_t limit_ = 0;
  std::mutex mu_;
  size_t next_ = 0;
  bool write_pending_ = false;
  bool cancelled_ = false;
  bool finished_ = false;
};

}  // namespace

void FakeInferenceService::FailFirstCalls(int k) {
  std::lock_guard<std::mutex> lock(mu_);
  failures_left_ = k;
}

void FakeInferenceService::SetChunks(std::vector<v1::GenerateResponse> chunks) {
  std::lock_guard<std::mutex> lock(mu_);
  chunks_ = std::move(chunks);
}

void FakeInferenceService::SetEnding(StreamEnding ending) {
  std::lock_guard<std::mutex> lock(mu_);
  ending_ = ending;
}

int FakeInferenceService::generate_calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return generate_calls_;
}

int FakeInferenceService::unary_calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return unary_calls_;
}

v1::GenerateRequest FakeInferenceService::last_generate_request() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_request_;
}

std::chrono::system_clock::time_point FakeInferenceService::last_deadline() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_deadline_;
}

bool FakeInferenceService::WaitForCancellations(int n, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return cancellations_ >= n; });
}

bool FakeInferenceService::WaitForGenerateCalls(int n, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return generate_calls_ >= n; });
}

void FakeInferenceService::NoteCancelled() {
  std::lock_guard<std::mutex> lock(mu_);
  ++cancellations_;
  cv_.notify_all();
}

bool FakeInferenceService::CountCallAndMaybeFail(grpc::CallbackServerContext* ctx) {
  // Requires mu_ held.
  last_deadline_ = ctx->deadline();
  if (failures_left_ > 0) {
    --failures_left_;
    return true;
  }
  return false;
}

grpc::ServerWriteReactor<v1::GenerateResponse>* FakeInferenceService::Generate(
    grpc::CallbackServerContext* ctx, const v1::GenerateRequest* request) {
  std::vector<v1::GenerateResponse> chunks;
  StreamEnding ending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++generate_calls_;
    cv_.notify_all();
    last_request_ = *request;
    if (CountCallAndMaybeFail(ctx)) {
      // An UNAVAILABLE before any message: what a draining or unreachable worker answers.
      chunks.clear();
      ending = StreamEnding::kUnavailableAfterFirst;
    } else {
      chunks = chunks_;
      ending = ending_;
    }
  }
  return new CannedStream(this, std::move(chunks), ending);
}

grpc::ServerUnaryReactor* FakeInferenceService::ListModels(grpc::CallbackServerContext* ctx,
                                                           const v1::ListModelsRequest*,
                                                           v1::ListModelsResponse* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  bool fail;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++unary_calls_;
    fail = CountCallAndMaybeFail(ctx);
  }
  if (fail) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "fake server unavailable"));
    return reactor;
  }
  v1::ModelCard* card = response->add_models();
  card->set_name("stories260K");
  card->set_max_model_len(512);
  card->set_vocab_size(512);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* FakeInferenceService::Tokenize(grpc::CallbackServerContext* ctx,
                                                         const v1::TokenizeRequest* request,
                                                         v1::TokenizeResponse* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  bool fail;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++unary_calls_;
    fail = CountCallAndMaybeFail(ctx);
  }
  if (fail) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "fake server unavailable"));
    return reactor;
  }
  if (!request->has_add_special_tokens() || request->add_special_tokens()) {
    response->add_token_ids(1);
  }
  for (unsigned char c : request->text()) response->add_token_ids(c);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* FakeInferenceService::Detokenize(grpc::CallbackServerContext* ctx,
                                                           const v1::DetokenizeRequest* request,
                                                           v1::DetokenizeResponse* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  bool fail;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++unary_calls_;
    fail = CountCallAndMaybeFail(ctx);
  }
  if (fail) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "fake server unavailable"));
    return reactor;
  }
  std::string text;
  for (uint32_t id : request->token_ids()) {
    if (id > 255) {
      reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                   "token_ids: id out of the fake's byte vocabulary"));
      return reactor;
    }
    if (id != 1) text.push_back(static_cast<char>(id));
  }
  response->set_text(text);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

FakeInferenceServer::FakeInferenceServer() {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service_);
  server_ = builder.BuildAndStart();
  address_ = "127.0.0.1:" + std::to_string(port);
}

FakeInferenceServer::~FakeInferenceServer() { Shutdown(); }

void FakeInferenceServer::Shutdown() {
  if (server_ == nullptr) return;
  // Streams still hanging are cancelled at once rather than waited for.
  server_->Shutdown(std::chrono::system_clock::now());
  server_->Wait();
  server_.reset();
}

}  // namespace kvserve::testing
