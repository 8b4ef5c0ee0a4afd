#include "worker/server/worker_service.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
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
