#include "worker/server/worker_service.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/block_hash/block_hash.h"
#include "kernels/kv_dtype.h"
#include "worker/server/grpc_status.h"
#include "worker/server/proto_convert.h"

namespace kvserve {

/// Streams one KV event subscription to a StreamKvEvents client without blocking a thread.
///
/// The engine pushes batches into the subscription's KvEventStream and its listener wakes this
/// reactor; at most one write is in flight. A reader that falls more than
/// KvEventStream::kMaxPending batches behind has its subscription closed by the engine: the call
/// then ends RESOURCE_EXHAUSTED and the client resubscribes (getting a fresh snapshot). A client
/// cancellation closes the subscription; a server shutdown ends the call OK. Deletes itself in
/// OnDone.
class KvEventsReactor final : public grpc::ServerWriteReactor<v1::KvEventBatch> {
 public:
  KvEventsReactor(WorkerService* service, std::shared_ptr<KvEventStream> stream)
      : service_(service), stream_(std::move(stream)) {
    service_->counters_->open_kv_event_streams.fetch_add(1);
    stream_->SetListener([this] { Pump(); });
    Pump();
  }

  void OnWriteDone(bool ok) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      write_in_flight_ = false;
      if (!ok) cancelled_ = true;
    }
    Pump();
  }

  void OnCancel() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
    }
    Pump();
  }

  void OnDone() override {
    stream_->SetListener(nullptr);
    stream_->Close();
    service_->counters_->open_kv_event_streams.fetch_sub(1);
    service_->Unregister(stream_.get());
    delete this;
  }

 private:
  void Pump() {
    bool write = false;
    bool finish = false;
    grpc::Status status;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finish_started_ || write_in_flight_) return;
      KvEventBatch batch;
      if (cancelled_) {
        finish = true;
        status = grpc::Status(grpc::StatusCode::CANCELLED, "kv event stream cancelled");
      } else if (stream_->TryNext(&batch)) {
        response_.Clear();
        ToProtoKvEventBatch(batch, &response_);
        write = true;
      } else if (stream_->closed()) {
        finish = true;
        if (!service_->shutting_down()) {
          status = grpc::Status(
              grpc::StatusCode::RESOURCE_EXHAUSTED,
              absl::StrCat("kv event subscriber fell more than ", KvEventStream::kMaxPending,
                           " batches behind; resubscribe for a new snapshot"));
        }
      }
      write_in_flight_ = write;
      finish_started_ = finish;
    }
    if (write) StartWrite(&response_);
    if (finish) Finish(status);
  }

  WorkerService* service_;
  std::shared_ptr<KvEventStream> stream_;
  std::mutex mu_;
  bool write_in_flight_ = false;
  bool finish_started_ = false;
  bool cancelled_ = false;
  v1::KvEventBatch response_;
};

namespace {

class RejectedKvEvents final : public grpc::ServerWriteReactor<v1::KvEventBatch> {
 public:
  explicit RejectedKvEvents(grpc::Status status) { Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

grpc::ServerUnaryReactor* FinishOk(grpc::CallbackServerContext* context) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace

WorkerService::WorkerService(const LoadedModel* model, Engine* engine, std::string model_name,
                             ServingCounters* counters, std::function<void()> on_drain)
    : model_(model),
      engine_(engine),
      model_name_(std::move(model_name)),
      counters_(counters),
      on_drain_(std::move(on_drain)) {}

void WorkerService::Shutdown(std::chrono::milliseconds limit) {
  std::vector<std::shared_ptr<KvEventStream>> open;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutting_down_.store(true);
    open = subscriptions_;
  }
  // Closing wakes each reactor, which then finishes its call OK.
  for (const auto& stream : open) stream->Close();
  std::unique_lock<std::mutex> lock(mu_);
  unregistered_.wait_for(lock, limit, [this] { return subscriptions_.empty(); });
}

void WorkerService::Unregister(const KvEventStream* stream) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(subscriptions_, [stream](const auto& s) { return s.get() == stream; });
  }
  unregistered_.notify_all();
}

grpc::ServerUnaryReactor* WorkerService::GetLoad(grpc::CallbackServerContext* context,
                                                 const v1::GetLoadRequest* /*request*/,
                                                 v1::LoadReport* response) {
  ToLoadReport(engine_->stats(), engine_->options().block_size, engine_->draining(), response);
  response->set_role(role_);
  return FinishOk(context);
}

grpc::ServerWriteReactor<v1::KvEventBatch>* WorkerService::StreamKvEvents(
    grpc::CallbackServerContext* /*context*/, const v1::StreamKvEventsRequest* /*request*/) {
  std::shared_ptr<KvEventStream> stream;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_.load()) {
      return new RejectedKvEvents(
          grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker is shutting down"));
    }
    stream = engine_->SubscribeKvEvents();
    subscriptions_.push_back(stream);
  }
  return new KvEventsReactor(this, std::move(stream));
}

grpc::ServerUnaryReactor* WorkerService::Abort(grpc::CallbackServerContext* context,
                                               const v1::AbortRequest* request,
                                               v1::AbortResponse* /*response*/) {
  engine_->Abort(request->request_id());
  return FinishOk(context);
}

grpc::ServerUnaryReactor* WorkerService::Drain(grpc::CallbackServerContext* context,
                                               const v1::DrainRequest* /*request*/,
                                               v1::DrainResponse* /*response*/) {
  engine_->Drain();
  if (on_drain_) on_drain_();
  return FinishOk(context);
}

namespace {

// Bytes of blocks read out of the engine per loop-thread task: large enough to keep a stream
// busy, small enough not to stretch the gap between two steps.
constexpr int64_t kExportBatchBytes = int64_t{8} << 20;

/// A FetchKvBlocks call that failed before streaming.
class RejectedFetch final : public grpc::ServerWriteReactor<v1::KvBlockData> {
 public:
  explicit RejectedFetch(const absl::Status& status) { Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

/// Streams a prompt's cached blocks to a peer: asks the engine for a batch of blocks (read on its
/// loop thread between steps), writes them one message per block, then asks for the next batch
/// until the range is done or the engine has no more. At most one batch and one write are
/// outstanding; the call finishes only when neither is, so the engine's callback never outlives
/// the reactor. Deletes itself in OnDone.
class FetchKvBlocksReactor final : public grpc::ServerWriteReactor<v1::KvBlockData> {
 public:
  /// `keys`: the chain hashes of the prompt's full blocks; the blocks [first, end) are sent.
  FetchKvBlocksReactor(Engine* engine, ServingCounters* counters, std::vector<BlockKey> keys,
                       int32_t first, int32_t end)
      : engine_(engine), counters_(counters), keys_(std::move(keys)), next_(first), end_(end) {
    Pump();
  }

  void OnWriteDone(bool ok) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      write_in_flight_ = false;
      if (!ok) cancelled_ = true;
    }
    Pump();
  }

  void OnCancel() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
    }
    Pump();
  }

  void OnDone() override { delete this; }

 private:
  void OnBatch(std::vector<KvBlockPayload> blocks) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      export_in_flight_ = false;
      const int64_t expected = std::min<int64_t>(
          end_ - next_, std::max<int64_t>(1, kExportBatchBytes / engine_->kv_block_bytes()));
      // Fewer blocks than asked for: the engine holds no more of this prefix.
      if (static_cast<int64_t>(blocks.size()) < expected) exhausted_ = true;
      next_ += static_cast<int32_t>(blocks.size());
      batch_ = std::move(blocks);
      sent_ = 0;
    }
    Pump();
  }

  void Pump() {
    enum class Action { kNone, kWrite, kExport, kFinish };
    Action action = Action::kNone;
    grpc::Status status;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finish_started_ || write_in_flight_ || export_in_flight_) return;
      if (cancelled_) {
        finish_started_ = true;
        action = Action::kFinish;
        status = grpc::Status(grpc::StatusCode::CANCELLED, "FetchKvBlocks cancelled");
      } else if (sent_ < batch_.size()) {
        KvBlockPayload& b = batch_[sent_++];
        message_.Clear();
        message_.set_index(static_cast<uint32_t>(b.index));
        message_.mutable_key()->set_hi(b.key.hi);
        message_.mutable_key()->set_lo(b.key.lo);
        counters_->kv_served_blocks.fetch_add(1);
        counters_->kv_served_bytes.fetch_add(static_cast<int64_t>(b.bytes.size()));
        message_.set_data(std::move(b.bytes));
        write_in_flight_ = true;
        action = Action::kWrite;
      } else if (exhausted_ || next_ >= end_) {
        finish_started_ = true;
        action = Action::kFinish;
      } else {
        export_in_flight_ = true;
        action = Action::kExport;
      }
    }
    switch (action) {
      case Action::kNone:
        break;
      case Action::kWrite:
        StartWrite(&message_);
        break;
      case Action::kExport:
        engine_->ExportKvBlocks(
            std::vector<BlockKey>(keys_.begin() + next_, keys_.begin() + end_), next_,
            kExportBatchBytes,
            [this](std::vector<KvBlockPayload> blocks) { OnBatch(std::move(blocks)); });
        break;
      case Action::kFinish:
        Finish(status);
        break;
    }
  }

  Engine* const engine_;
  ServingCounters* const counters_;
  const std::vector<BlockKey> keys_;
  std::mutex mu_;
  int32_t next_;
  const int32_t end_;
  std::vector<KvBlockPayload> batch_;
  size_t sent_ = 0;
  bool exhausted_ = false;
  bool export_in_flight_ = false;
  bool write_in_flight_ = false;
  bool cancelled_ = false;
  bool finish_started_ = false;
  v1::KvBlockData message_;
};

}  // namespace

grpc::ServerWriteReactor<v1::KvBlockData>* WorkerService::FetchKvBlocks(
    grpc::CallbackServerContext* /*context*/, const v1::FetchKvBlocksRequest* request) {
  const KvTierIdentity& mine = engine_->kv_identity();
  const v1::KvIdentity& theirs = request->identity();
  if (theirs.model().hi() != mine.model.hi || theirs.model().lo() != mine.model.lo) {
    return new RejectedFetch(absl::FailedPreconditionError(
        "identity: the caller's model fingerprint differs from this worker's; KV blocks move "
        "only between workers serving the same weights"));
  }
  if (theirs.layout() != mine.layout) {
    return new RejectedFetch(absl::FailedPreconditionError(
        absl::StrCat("identity: the caller's KV layout is '", theirs.layout(),
                     "', this worker's is '", mine.layout, "'")));
  }
  const int32_t bs = engine_->options().block_size;
  const int64_t max_tokens = model_->config().max_position_embeddings;
  if (request->token_ids_size() < bs || request->token_ids_size() > max_tokens) {
    return new RejectedFetch(
        absl::InvalidArgumentError(absl::StrCat("token_ids: need at least one full block (", bs,
                                                " tokens) and at most the "
                                                "model's context of ",
                                                max_tokens, ", got ", request->token_ids_size())));
  }
  const int32_t full = request->token_ids_size() / bs;
  if (request->first_block() >= static_cast<uint32_t>(full)) {
    return new RejectedFetch(absl::InvalidArgumentError(absl::StrCat(
        "first_block: ", request->first_block(), " is past the prompt's ", full, " full blocks")));
  }
  const int32_t first = static_cast<int32_t>(request->first_block());
  const int32_t end =
      request->max_blocks() == 0
          ? full
          : static_cast<int32_t>(std::min<int64_t>(full, int64_t{first} + request->max_blocks()));
  const std::vector<TokenId> tokens(request->token_ids().begin(), request->token_ids().end());
  // Hashed here, once, with the caller's salt: the caller gets blocks of that salt only.
  return new FetchKvBlocksReactor(engine_, counters_,
                                  HashFullBlocks(tokens, bs, request->cache_salt()), first, end);
}

grpc::ServerUnaryReactor* WorkerService::GetModelInfo(grpc::CallbackServerContext* context,
                                                      const v1::GetModelInfoRequest* /*request*/,
                                                      v1::ModelInfo* response) {
  const ModelConfig& config = model_->config();
  response->set_name(model_name_);
  response->set_max_model_len(static_cast<uint32_t>(config.max_position_embeddings));
  response->set_vocab_size(static_cast<uint32_t>(config.vocab_size));
  response->set_block_size(static_cast<uint32_t>(engine_->options().block_size));
  response->set_kv_cache_dtype(std::string(KvCacheDTypeName(engine_->options().kv_cache_dtype)));
  // Usable blocks, as LoadReport.total_blocks counts them (the engine reserves a null block).
  response->set_num_kv_blocks(static_cast<uint32_t>(engine_->stats().total_blocks));
  response->set_tensor_parallel_size(1);
  return FinishOk(context);
}

}  // namespace kvserve
