#include "tests/router/fake_worker.h"

#include <algorithm>
#include <deque>
#include <mutex>

namespace kvserve::testing {
namespace {

void AddEvent(v1::KvEventBatch* batch, const BlockKey& key, bool stored, KvTier tier) {
  v1::KvEvent* event = batch->add_events();
  event->set_type(stored ? v1::KvEvent::TYPE_STORED : v1::KvEvent::TYPE_EVICTED);
  event->mutable_key()->set_hi(key.hi);
  event->mutable_key()->set_lo(key.lo);
  event->set_tier(static_cast<v1::KvEvent::Tier>(tier));
}

v1::KvEventBatch MakeBatch(bool reset, const std::vector<BlockKey>& keys, bool stored,
                           KvTier tier) {
  v1::KvEventBatch batch;
  batch.set_reset(reset);
  for (const BlockKey& key : keys) AddEvent(&batch, key, stored, tier);
  return batch;
}

}  // namespace

// A Generate stream. Finishers: the first-message logic, OnWriteDone(false), and OnCancel for
// a stream parked in held_ (removal from held_ under the owner's lock decides who finishes).
class FakeWorker::GenerateReactor final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  GenerateReactor(FakeWorker* owner, Mode mode, grpc::StatusCode fail_code, std::string id,
                  std::vector<std::string> texts, v1::FinishReason finish)
      : owner_(owner),
        mode_(mode),
        fail_code_(fail_code),
        id_(std::move(id)),
        texts_(std::move(texts)),
        finish_(finish) {}

  void Begin() {
    if (mode_ == Mode::kFailBeforeFirst) {
      Finish(grpc::Status(fail_code_, "fake worker fails before the first token"));
      return;
    }
    WriteNext();
  }

  void Resume() { WriteNext(); }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
      return;
    }
    if (next_ == 1 && mode_ == Mode::kFailAfterFirst) {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "fake worker crashed mid-stream"));
      return;
    }
    if (next_ == 1 && mode_ == Mode::kHoldAfterFirst) {
      bool finish = false;
      bool proceed = false;
      {
        absl::MutexLock lock(&owner_->mu_);
        if (cancelled_) {
          finish = true;
        } else if (owner_->hold_released_) {
          proceed = true;
        } else {
          owner_->held_.push_back(this);
        }
      }
      if (finish) Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
      if (proceed) WriteNext();
      return;
    }
    WriteNext();
  }

  void OnCancel() override {
    bool finish = false;
    {
      absl::MutexLock lock(&owner_->mu_);
      ++owner_->cancelled_;
      cancelled_ = true;
      auto it = std::find(owner_->held_.begin(), owner_->held_.end(), this);
      if (it != owner_->held_.end()) {
        owner_->held_.erase(it);
        finish = true;
      }
    }
    if (finish) Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }

  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    const size_t count = texts_.size();
    if (next_ == count) {
      Finish(grpc::Status::OK);
      return;
    }
    message_.Clear();
    message_.set_request_id(id_);
    message_.add_token_ids(kTokens[next_ % std::size(kTokens)]);
    message_.set_text(texts_[next_]);
    if (next_ + 1 == count) {
      message_.set_finish_reason(finish_);
      message_.mutable_usage()->set_completion_tokens(static_cast<uint32_t>(count));
    }
    ++next_;
    StartWrite(&message_);
  }

  FakeWorker* const owner_;
  const Mode mode_;
  const grpc::StatusCode fail_code_;
  const std::string id_;
  const std::vector<std::string> texts_;
  const v1::FinishReason finish_;
  size_t next_ = 0;
  bool cancelled_ = false;  // guarded by owner_->mu_
  v1::GenerateResponse message_;
};

// One StreamKvEvents subscriber: a queue of batches written one at a time.
class FakeWorker::KvStreamReactor final : public grpc::ServerWriteReactor<v1::KvEventBatch> {
 public:
  explicit KvStreamReactor(FakeWorker* owner) : owner_(owner) {}

  // Called with owner_->mu_ held.
  void Enqueue(const v1::KvEventBatch& batch) {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (cancelled_ || dropped_) return;
    pending_.push_back(batch);
    if (!writing_) {
      writing_ = true;
      StartWrite(&pending_.front());
    }
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    pending_.pop_front();
    writing_ = false;
    if (!ok || cancelled_ || dropped_) {
      FinishOnce();
      return;
    }
    if (!pending_.empty()) {
      writing_ = true;
      StartWrite(&pending_.front());
    }
  }

  // Ends the stream from the worker's side with `code` (events already queued are dropped); called
  // with owner_->mu_ held.
  void Drop(grpc::StatusCode code) {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    dropped_ = true;
    drop_code_ = code;
    if (!writing_) FinishOnce();
  }

  void OnCancel() override {
    {
      absl::MutexLock owner_lock(&owner_->mu_);
      auto& streams = owner_->kv_streams_;
      streams.erase(std::remove(streams.begin(), streams.end(), this), streams.end());
    }
    std::lock_guard<std::recursive_mutex> lock(mu_);
    cancelled_ = true;
    if (!writing_) FinishOnce();
  }

  void OnDone() override {
    {
      absl::MutexLock owner_lock(&owner_->mu_);
      auto& streams = owner_->kv_streams_;
      streams.erase(std::remove(streams.begin(), streams.end(), this), streams.end());
    }
    delete this;
  }

 private:
  void FinishOnce() {
    if (finished_) return;
    finished_ = true;
    Finish(dropped_ ? grpc::Status(drop_code_, "kv event stream dropped") : grpc::Status::OK);
  }

  FakeWorker* const owner_;
  std::recursive_mutex mu_;
  std::deque<v1::KvEventBatch> pending_;
  bool writing_ = false;
  bool cancelled_ = false;
  bool dropped_ = false;
  grpc::StatusCode drop_code_ = grpc::StatusCode::OK;
  bool finished_ = false;
};

class FakeWorker::InferenceImpl final : public v1::Inference::CallbackService {
 public:
  explicit InferenceImpl(FakeWorker* owner) : owner_(owner) {}

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override {
    Mode mode;
    grpc::StatusCode code;
    std::vector<std::string> texts;
    v1::FinishReason finish;
    {
      absl::MutexLock lock(&owner_->mu_);
      owner_->requests_.push_back(*request);
      owner_->last_deadline_ = context->deadline();
      mode = owner_->mode_;
      code = owner_->fail_code_;
      texts = owner_->texts_;
      finish = owner_->finish_;
    }
    auto* reactor =
        new GenerateReactor(owner_, mode, code, request->request_id(), std::move(texts), finish);
    reactor->Begin();
    return reactor;
  }

 private:
  FakeWorker* const owner_;
};

class FakeWorker::WorkerImpl final : public v1::Worker::CallbackService {
 public:
  explicit WorkerImpl(FakeWorker* owner) : owner_(owner) {}

  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* context,
                                    const v1::GetLoadRequest* /*request*/,
                                    v1::LoadReport* response) override {
    {
      absl::MutexLock lock(&owner_->mu_);
      *response = owner_->load_;
      response->set_role(owner_->role_);
    }
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerWriteReactor<v1::KvEventBatch>* StreamKvEvents(
      grpc::CallbackServerContext* /*context*/,
      const v1::StreamKvEventsRequest* /*request*/) override {
    auto* reactor = new KvStreamReactor(owner_);
    absl::MutexLock lock(&owner_->mu_);
    ++owner_->kv_subscriptions_;
    owner_->kv_streams_.push_back(reactor);
    v1::KvEventBatch snapshot;
    snapshot.set_reset(true);
    for (const auto& [key, tiers] : owner_->keys_) {
      for (KvTier tier : {KvTier::kDevice, KvTier::kHost, KvTier::kDisk}) {
        if ((tiers >> static_cast<int>(tier) & 1) != 0) AddEvent(&snapshot, key, true, tier);
      }
    }
    reactor->Enqueue(std::move(snapshot));
    return reactor;
  }

  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* /*request*/,
                                         v1::ModelInfo* response) override {
    response->set_name("fake");
    response->set_max_model_len(256);
    response->set_vocab_size(512);
    response->set_block_size(16);
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  FakeWorker* const owner_;
};

FakeWorker::FakeWorker()
    : inference_(std::make_unique<InferenceImpl>(this)),
      worker_(std::make_unique<WorkerImpl>(this)) {
  load_.set_total_blocks(64);
  load_.set_free_blocks(64);
  load_.set_block_size(16);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(inference_.get());
  builder.RegisterService(worker_.get());
  server_ = builder.BuildAndStart();
  address_ = "127.0.0.1:" + std::to_string(port);
}

FakeWorker::~FakeWorker() {
  server_->Shutdown(std::chrono::system_clock::now());
  server_->Wait();
}

void FakeWorker::set_mode(Mode mode, grpc::StatusCode fail_code) {
  absl::MutexLock lock(&mu_);
  mode_ = mode;
  fail_code_ = fail_code;
  hold_released_ = false;
}

void FakeWorker::set_texts(std::vector<std::string> texts, v1::FinishReason finish) {
  absl::MutexLock lock(&mu_);
  if (texts.empty()) {
    texts_ = {"t", "t", "t"};
    finish_ = v1::FINISH_REASON_LENGTH;
  } else {
    texts_ = std::move(texts);
    finish_ = finish;
  }
}

void FakeWorker::set_load(const v1::LoadReport& load) {
  absl::MutexLock lock(&mu_);
  load_ = load;
}

void FakeWorker::set_role(std::string role) {
  absl::MutexLock lock(&mu_);
  role_ = std::move(role);
}

void FakeWorker::SetServing(bool serving) {
  server_->GetHealthCheckService()->SetServingStatus(serving);
}

void FakeWorker::Broadcast(const v1::KvEventBatch& batch) {
  for (KvStreamReactor* stream : kv_streams_) stream->Enqueue(batch);
}

void FakeWorker::StoreKeys(const std::vector<BlockKey>& keys, KvTier tier) {
  absl::MutexLock lock(&mu_);
  for (const BlockKey& key : keys) keys_[key] |= static_cast<uint8_t>(1 << static_cast<int>(tier));
  Broadcast(MakeBatch(/*reset=*/false, keys, /*stored=*/true, tier));
}

void FakeWorker::EvictKeys(const std::vector<BlockKey>& keys, KvTier tier) {
  absl::MutexLock lock(&mu_);
  for (const BlockKey& key : keys) {
    auto it = keys_.find(key);
    if (it == keys_.end()) continue;
    it->second &= static_cast<uint8_t>(~(1 << static_cast<int>(tier)));
    if (it->second == 0) keys_.erase(it);
  }
  Broadcast(MakeBatch(/*reset=*/false, keys, /*stored=*/false, tier));
}

void FakeWorker::ReleaseHeld() {
  std::vector<GenerateReactor*> held;
  {
    absl::MutexLock lock(&mu_);
    held.swap(held_);
    hold_released_ = true;
  }
  for (GenerateReactor* reactor : held) reactor->Resume();
}

std::vector<v1::GenerateRequest> FakeWorker::requests() const {
  absl::MutexLock lock(&mu_);
  return requests_;
}

int FakeWorker::generate_count() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(requests_.size());
}

std::chrono::system_clock::time_point FakeWorker::last_deadline() const {
  absl::MutexLock lock(&mu_);
  return last_deadline_;
}

bool FakeWorker::WaitForGenerates(int n, absl::Duration timeout) const {
  auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int>(requests_.size()) >= n;
  };
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
}

void FakeWorker::DropKvStreams(grpc::StatusCode code) {
  absl::MutexLock lock(&mu_);
  for (KvStreamReactor* stream : kv_streams_) stream->Drop(code);
  kv_streams_.clear();
}

bool FakeWorker::WaitForKvSubscriptions(int n, absl::Duration timeout) const {
  auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return kv_subscriptions_ >= n; };
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
}

int FakeWorker::kv_subscriptions() const {
  absl::MutexLock lock(&mu_);
  return kv_subscriptions_;
}

bool FakeWorker::WaitForCancelled(int n, absl::Duration timeout) const {
  auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return cancelled_ >= n; };
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
}

}  // namespace kvserve::testing
