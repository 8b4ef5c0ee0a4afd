#include "worker/server/generate_reactor.h"

#include <utility>

#include "common/logging/logging.h"
#include "worker/server/grpc_status.h"
#include "worker/server/proto_convert.h"

namespace kvserve {

GenerateReactor::GenerateReactor(GenerateReactorParams params) : params_(std::move(params)) {
  params_.counters->open_generate_streams.fetch_add(1);
  if (params_.stream == nullptr) return;  // Attach follows
  // Outputs pushed before the listener existed are picked up by the Pump below.
  params_.stream->SetListener([this] { Pump(); });
  Pump();
}

void GenerateReactor::Attach(absl::StatusOr<std::shared_ptr<RequestStream>> stream) {
  bool abort = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stream.ok()) {
      params_.stream = std::move(*stream);
      // A cancel that came before the request existed found nothing to abort.
      abort = cancelled_;
    } else {
      attach_error_ = stream.status();
    }
  }
  if (abort) params_.engine->Abort(params_.request_id);
  if (params_.stream != nullptr) params_.stream->SetListener([this] { Pump(); });
  Pump();
}

bool GenerateReactor::cancelled() {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

void GenerateReactor::Pump() {
  enum class Action { kNone, kWrite, kWriteAndFinish, kFinish };
  Action action = Action::kNone;
  grpc::Status finish_status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finish_started_ || write_in_flight_) return;
    RequestOutput out;
    if (params_.stream == nullptr && attach_error_.ok()) return;  // not attached yet
    if (!attach_error_.ok()) {
      finish_started_ = true;
      action = Action::kFinish;
      finish_status = ToGrpcStatus(attach_error_);
    } else if (cancelled_) {
      finish_started_ = true;
      action = Action::kFinish;
      finish_status = grpc::Status(grpc::StatusCode::CANCELLED, "generate call cancelled");
    } else if (params_.stream->TryNext(&out)) {
      if (out.finished && !out.status.ok() && out.status.code() != absl::StatusCode::kCancelled) {
        // The engine failed the whole request; its samples all end with this status.
        finish_started_ = true;
        action = Action::kFinish;
        finish_status = ToGrpcStatus(out.status);
      } else {
        if (out.finished) completion_tokens_ += out.usage.completion_tokens;
        response_.Clear();
        response_.set_request_id(params_.request_id);
        response_.set_worker(params_.worker);
        ToGenerateResponse(out, &response_);
        if (out.finished) ++samples_finished_;
        if (samples_finished_ >= params_.num_samples) {
          finish_started_ = true;
          action = Action::kWriteAndFinish;
        } else {
          write_in_flight_ = true;
          action = Action::kWrite;
        }
      }
    }
  }
  // Logged before the call ends, so a client that saw the end also finds the line.
  if (action == Action::kWriteAndFinish || action == Action::kFinish) {
    logging::Log(logging::LogLevel::kInfo, "worker", "generate finished",
                 {{"request_id", params_.request_id},
                  {"status", action == Action::kWriteAndFinish
                                 ? std::string("OK")
                                 : absl::StatusCodeToString(
                                       static_cast<absl::StatusCode>(finish_status.error_code()))},
                  {"completion_tokens", completion_tokens_}});
  }
  // gRPC calls happen outside the lock: a reaction may run on another thread at once.
  switch (action) {
    case Action::kNone:
      break;
    case Action::kWrite:
      StartWrite(&response_);
      break;
    case Action::kWriteAndFinish:
      StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
      break;
    case Action::kFinish:
      Finish(finish_status);
      break;
  }
}

void GenerateReactor::OnWriteDone(bool ok) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    write_in_flight_ = false;
    if (!ok) cancelled_ = true;
  }
  // A failed write means the stream is gone: stop generating for nobody.
  if (!ok) params_.engine->Abort(params_.request_id);
  Pump();
}

void GenerateReactor::OnCancel() {
  bool pending = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    pending = params_.stream == nullptr && attach_error_.ok();
  }
  if (pending && on_cancel_pending_) on_cancel_pending_();
  params_.engine->Abort(params_.request_id);
  // Counted after the abort is queued, so whoever sees the count sees the abort too.
  params_.counters->generate_cancelled.fetch_add(1);
  Pump();
}

void GenerateReactor::OnDone() {
  // After this returns the engine thread no longer runs Pump.
  if (params_.stream != nullptr) params_.stream->SetListener(nullptr);
  params_.counters->open_generate_streams.fetch_sub(1);
  delete this;
}

}  // namespace kvserve
