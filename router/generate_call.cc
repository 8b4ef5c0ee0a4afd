#include "router/generate_call.h"

#include <atomic>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging/logging.h"
#include "grpcpp/client_context.h"
#include "grpcpp/server_context.h"
#include "kvserve/v1/inference.grpc.pb.h"
#include "router/router_metrics.h"

namespace kvserve {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsBetween(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// The worker's Engine::Submit refuses with UNAVAILABLE "... draining ..." once it drains.
bool IsDrainingRefusal(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE &&
         status.error_message().find("draining") != std::string::npos;
}

// Failures before the first response that another worker may not repeat: the worker is down,
// full, or broken. INVALID_ARGUMENT and friends would fail the same way anywhere.
bool IsRetryable(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::INTERNAL:
      return true;
    default:
      return false;
  }
}

}  // namespace

/// One attempt of the request on one worker: a client streaming call driven by callbacks.
/// Keeps itself alive (self_) until OnDone; a hold keeps OnDone back until the GenerateCall
/// has decided it starts no more reads (StopReading), so ReadNext never races OnDone. Counted in
/// the pool's live calls until destroyed (token_), so that its ClientContext never holds the last
/// reference to the worker's channel (LiveCalls says why that matters).
class GenerateCall::Upstream final : public grpc::ClientReadReactor<v1::GenerateResponse>,
                                     public std::enable_shared_from_this<Upstream> {
 public:
  Upstream(GenerateCall* call, LiveCalls::Token token, v1::GenerateRequest request,
           std::chrono::system_clock::time_point deadline)
      : token_(std::move(token)), call_(call), request_(std::move(request)) {
    if (deadline != std::chrono::system_clock::time_point::max()) context_.set_deadline(deadline);
  }

  void Begin(v1::Inference::Stub& stub) {
    self_ = shared_from_this();
    stub.async()->Generate(&context_, &request_, this);
    AddHold();
    StartRead(&message_);
    StartCall();
  }
  void ReadNext() { StartRead(&message_); }
  void StopReading() {
    if (!hold_released_.exchange(true)) RemoveHold();
  }
  void Cancel() { context_.TryCancel(); }

  void OnReadDone(bool ok) override {
    if (ok) {
      call_->OnUpstreamRead(this, &message_);
    } else {
      StopReading();  // end of stream or failure: OnDone follows with the status
    }
  }
  void OnDone(const grpc::Status& status) override {
    call_->OnUpstreamDone(status);
    self_.reset();  // may delete this; nothing below
  }

 private:
  LiveCalls::Token token_;  // first: destroyed after context_
  GenerateCall* const call_;
  grpc::ClientContext context_;
  v1::GenerateRequest request_;
  v1::GenerateResponse message_;
  std::atomic<bool> hold_released_{false};
  std::shared_ptr<Upstream> self_;
};

/// The prefill phase's call on a prefill worker: reads and discards its responses (one token
/// nobody sees); what matters is that the worker computed, and now holds, the prompt's blocks.
/// Keeps itself alive (self_) until OnDone, which reports the status to the GenerateCall; counted
/// in the pool's live calls as Upstream is.
class GenerateCall::PrefillUpstream final : public grpc::ClientReadReactor<v1::GenerateResponse>,
                                            public std::enable_shared_from_this<PrefillUpstream> {
 public:
  PrefillUpstream(GenerateCall* call, LiveCalls::Token token, v1::GenerateRequest request,
                  std::chrono::system_clock::time_point deadline)
      : token_(std::move(token)), call_(call), request_(std::move(request)) {
    if (deadline != std::chrono::system_clock::time_point::max()) context_.set_deadline(deadline);
  }

  void Begin(v1::Inference::Stub& stub) {
    self_ = shared_from_this();
    stub.async()->Generate(&context_, &request_, this);
    StartRead(&message_);
    StartCall();
  }
  void Cancel() { context_.TryCancel(); }

  void OnReadDone(bool ok) override {
    if (ok) StartRead(&message_);  // discarded; a failed read means OnDone follows
  }
  void OnDone(const grpc::Status& status) override {
    call_->OnPrefillDone(status);
    self_.reset();  // may delete this; nothing below
  }

 private:
  LiveCalls::Token token_;  // first: destroyed after context_
  GenerateCall* const call_;
  grpc::ClientContext context_;
  v1::GenerateRequest request_;
  v1::GenerateResponse message_;
  std::shared_ptr<PrefillUpstream> self_;
};

v1::GenerateRequest PrefillRequestFor(const v1::GenerateRequest& request) {
  v1::GenerateRequest prefill;
  prefill.set_model(request.model());
  *prefill.mutable_prompt_token_ids() = request.prompt_token_ids();
  prefill.set_cache_salt(request.cache_salt());
  prefill.set_request_id(absl::StrCat(request.request_id(), "-prefill"));
  // One greedy token: the least the worker will run a prompt for, and the same work whatever
  // the client's sampling (its token is discarded).
  prefill.set_max_tokens(1);
  prefill.mutable_sampling()->set_temperature(0);
  prefill.set_ignore_eos(true);
  prefill.set_n(1);
  return prefill;
}

GenerateCall::GenerateCall(grpc::CallbackServerContext* context, v1::GenerateRequest request,
                           std::vector<BlockKey> block_keys, Dispatcher* dispatcher,
                           WorkerPool* pool, RouterMetrics* metrics)
    : context_(context),
      request_(std::move(request)),
      block_keys_(std::move(block_keys)),
      dispatcher_(dispatcher),
      pool_(pool),
      metrics_(metrics),
      arrival_(Clock::now()) {}

GenerateCall::~GenerateCall() = default;

void GenerateCall::Begin() {
  const absl::Status status = dispatcher_->Submit(this);
  if (!status.ok()) {
    RequestFinish(
        grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message())));
  }
}

RoutingRequest GenerateCall::routing_request() const {
  RoutingRequest routing;
  routing.block_keys = block_keys_;
  routing.prompt_tokens = request_.prompt_token_ids_size();
  return routing;
}

bool GenerateCall::Excludes(WorkerId worker) const {
  absl::MutexLock lock(&mu_);
  return excluded_.contains(worker);
}

void GenerateCall::Start(Reservation reservation) {
  const std::shared_ptr<WorkerHandle> worker = reservation.worker;
  const std::shared_ptr<WorkerHandle> prefill_worker = reservation.prefill_worker;
  const std::string kv_source =
      reservation.kv_source.has_value() ? reservation.kv_source->worker : "";
  std::shared_ptr<Upstream> upstream;
  std::shared_ptr<PrefillUpstream> prefill;
  {
    absl::MutexLock lock(&mu_);
    if (!cancelled_) {
      if (started_ == Clock::time_point{}) started_ = Clock::now();
      if (prefill_worker != nullptr) {
        prefill_started_ = Clock::now();
        prefill = std::make_shared<PrefillUpstream>(
            this, pool_->TrackCall(), PrefillRequestFor(request_), context_->deadline());
        prefill_ = prefill;
        prefill_reservation_ = std::move(reservation);
      } else {
        upstream = NewAttemptLocked(worker, reservation.kv_source);
      }
    }
  }
  if (upstream == nullptr && prefill == nullptr) {
    // Cancelled between the dispatcher's reservation and now.
    dispatcher_->Release(*worker);
    if (prefill_worker != nullptr) dispatcher_->Release(*prefill_worker);
    RequestFinish(grpc::Status(grpc::StatusCode::CANCELLED, "request cancelled by the client"));
    return;
  }
  logging::Log(logging::LogLevel::kInfo, "router", "request routed",
               {{"request_id", request_.request_id()},
                {"worker", worker->address()},
                {"prefill_worker", prefill_worker != nullptr ? prefill_worker->address() : ""},
                {"prompt_tokens", request_.prompt_token_ids_size()},
                {"kv_source", kv_source}});
  if (prefill != nullptr) {
    prefill->Begin(prefill_worker->inference());
  } else {
    upstream->Begin(worker->inference());
  }
}

std::shared_ptr<GenerateCall::Upstream> GenerateCall::NewAttemptLocked(
    std::shared_ptr<WorkerHandle> worker, const std::optional<KvTransferHint>& kv_source) {
  ++attempts_;
  worker_ = std::move(worker);
  // request_ carries no kv_source (the service drops a client's); this attempt gets its own.
  v1::GenerateRequest attempt = request_;
  if (kv_source.has_value()) {
    v1::KvSourceHint* hint = attempt.mutable_kv_source();
    hint->set_worker(kv_source->worker);
    hint->set_first_block(static_cast<uint32_t>(kv_source->first_block));
    hint->set_num_blocks(static_cast<uint32_t>(kv_source->num_blocks));
  }
  upstream_ = std::make_shared<Upstream>(this, pool_->TrackCall(), std::move(attempt),
                                         context_->deadline());
  return upstream_;
}

void GenerateCall::OnPrefillDone(const grpc::Status& status) {
  Reservation reservation;
  std::shared_ptr<Upstream> upstream;
  grpc::Status end_status;  // set when the call ends here
  bool cancelled = false;
  double seconds = 0;
  {
    absl::MutexLock lock(&mu_);
    prefill_.reset();
    reservation = std::move(prefill_reservation_);
    prefill_reservation_ = Reservation{};
    seconds = SecondsBetween(prefill_started_, Clock::now());
    // The prefill call runs under the client's deadline: when it expired there, it has for
    // the client too (and a cancellation past the deadline is the deadline's).
    const auto deadline = context_->deadline();
    const bool deadline_passed = deadline != std::chrono::system_clock::time_point::max() &&
                                 (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
                                  (cancelled_ && std::chrono::system_clock::now() >= deadline));
    cancelled = cancelled_ || deadline_passed;
    if (deadline_passed) {
      end_status = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                "deadline exceeded while the prompt was being computed");
    } else if (cancelled_) {
      end_status = grpc::Status(grpc::StatusCode::CANCELLED, "request cancelled by the client");
    } else {
      // A failed prefill falls back to the ordinary hint (or none): the decode worker computes
      // what it does not pull. A hint naming the worker that just failed is not worth a try.
      std::optional<KvTransferHint> hint =
          status.ok() ? reservation.prefill_kv_source : reservation.kv_source;
      if (!status.ok() && hint.has_value() &&
          hint->worker == reservation.prefill_worker->address()) {
        hint.reset();
      }
      upstream = NewAttemptLocked(reservation.worker, hint);
    }
  }
  WorkerHandle& prefill_worker = *reservation.prefill_worker;
  if (!cancelled) {
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE && !IsDrainingRefusal(status)) {
      pool_->ReportFailure(prefill_worker);
    }
    if (IsDrainingRefusal(status)) pool_->MarkDraining(prefill_worker);
    if (metrics_ != nullptr) metrics_->RecordPrefillPhase(status.ok() ? "ok" : "failed", seconds);
    if (!status.ok()) {
      logging::Log(logging::LogLevel::kWarning, "router",
                   "prefill failed: the decode worker computes the prompt",
                   {{"request_id", request_.request_id()},
                    {"prefill_worker", prefill_worker.address()},
                    {"worker", reservation.worker->address()},
                    {"error", status.error_message()}});
    }
  }
  dispatcher_->Release(prefill_worker);
  if (upstream == nullptr) {
    dispatcher_->Release(*reservation.worker);
    RequestFinish(end_status);
    return;
  }
  upstream->Begin(reservation.worker->inference());
}

void GenerateCall::Reject(absl::Status status) {
  RequestFinish(
      grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message())));
}

void GenerateCall::OnUpstreamRead(Upstream* upstream, v1::GenerateResponse* message) {
  bool forward = false;
  {
    absl::MutexLock lock(&mu_);
    if (!cancelled_ && !finish_requested_) {
      forward = true;
      if (!first_received_) first_message_ = Clock::now();
      first_received_ = true;
      write_pending_ = true;
      outgoing_ = std::move(*message);
      if (outgoing_.worker().empty()) outgoing_.set_worker(worker_->address());
    }
  }
  if (forward) {
    StartWrite(&outgoing_);
  } else {
    upstream->Cancel();
    upstream->StopReading();
  }
}

void GenerateCall::OnWriteDone(bool ok) {
  std::shared_ptr<Upstream> upstream;
  bool read_next = false;
  bool ready = false;
  grpc::Status status;
  {
    absl::MutexLock lock(&mu_);
    write_pending_ = false;
    upstream = upstream_;
    read_next = ok && !cancelled_ && upstream != nullptr;
    ready = ReadyToFinishLocked();
    status = final_status_;
  }
  if (upstream != nullptr) {
    if (read_next) {
      upstream->ReadNext();
    } else {
      upstream->Cancel();  // the client is gone: stop the worker
      upstream->StopReading();
    }
  }
  if (ready) Complete(status);
}

void GenerateCall::OnUpstreamDone(const grpc::Status& status) {
  std::shared_ptr<WorkerHandle> worker;
  grpc::Status final_status;
  bool retry = false;
  bool worker_unreachable = false;
  {
    absl::MutexLock lock(&mu_);
    upstream_.reset();
    worker_unreachable = !cancelled_ && status.error_code() == grpc::StatusCode::UNAVAILABLE &&
                         !IsDrainingRefusal(status);
    worker = std::move(worker_);
    if (status.ok()) {
      final_status = grpc::Status::OK;
    } else if (cancelled_) {
      final_status =
          status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
              ? status
              : grpc::Status(grpc::StatusCode::CANCELLED, "request cancelled by the client");
    } else if (first_received_) {
      final_status =
          status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
              ? status
              : grpc::Status(grpc::StatusCode::UNAVAILABLE,
                             absl::StrCat("worker ", worker->address(),
                                          " failed after streaming started (code ",
                                          static_cast<int>(status.error_code()), ": ",
                                          status.error_message(), "); the output is incomplete"));
    } else {
      final_status = grpc::Status(status.error_code(), absl::StrCat("worker ", worker->address(),
                                                                    ": ", status.error_message()));
      if (attempts_ < 2 && IsRetryable(status.error_code())) {
        excluded_.insert(worker->id());
        retry = true;
      }
    }
  }
  // A worker that cannot be reached counts towards its ejection like a failed probe; one that
  // drains leaves the routable set at once.
  if (worker_unreachable) pool_->ReportFailure(*worker);
  if (IsDrainingRefusal(status)) pool_->MarkDraining(*worker);
  dispatcher_->Release(*worker);
  if (retry) {
    Reservation next = dispatcher_->ReserveNow(this);
    if (next.worker != nullptr) {
      if (metrics_ != nullptr) metrics_->RecordRetry();
      logging::Log(logging::LogLevel::kWarning, "router", "retrying on another worker",
                   {{"request_id", request_.request_id()},
                    {"failed_worker", worker->address()},
                    {"error", status.error_message()}});
      Start(std::move(next));
      return;
    }
  }
  RequestFinish(final_status);
}

void GenerateCall::OnCancel() {
  if (dispatcher_->Withdraw(this)) {
    RequestFinish(grpc::Status(grpc::StatusCode::CANCELLED, "request cancelled while queued"));
    return;
  }
  std::shared_ptr<Upstream> upstream;
  std::shared_ptr<PrefillUpstream> prefill;
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    upstream = upstream_;
    prefill = prefill_;
  }
  if (upstream != nullptr) upstream->Cancel();
  if (prefill != nullptr) prefill->Cancel();
}

void GenerateCall::OnDone() { delete this; }

void GenerateCall::Complete(const grpc::Status& status) {
  const Clock::time_point now = Clock::now();
  const std::string code =
      absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code()));
  const std::string message = status.error_message();
  double queue_seconds = -1;
  double ttft_seconds = -1;
  {
    absl::MutexLock lock(&mu_);
    if (started_ != Clock::time_point{}) queue_seconds = SecondsBetween(arrival_, started_);
    if (first_message_ != Clock::time_point{}) {
      ttft_seconds = SecondsBetween(arrival_, first_message_);
    }
  }
  const double e2e_seconds = SecondsBetween(arrival_, now);
  if (metrics_ != nullptr) metrics_->RecordRequest(code, e2e_seconds, queue_seconds, ttft_seconds);
  logging::Log(message.empty() ? logging::LogLevel::kInfo : logging::LogLevel::kWarning, "router",
               "request finished",
               {{"request_id", request_.request_id()},
                {"status", code},
                {"error", message},
                {"duration_s", e2e_seconds}});
  // Give the key's slot back before the client can see the end: a client that sends its next
  // call as soon as this one ends must not find its key still at its limit.
  { ApiKeyGuard::Lease released = std::move(lease_); }
  if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
    context_->AddTrailingMetadata(std::string(kRetryAfterMetadata),
                                  absl::StrCat(absl::ToInt64Milliseconds(retry_after_)));
  }
  Finish(status);
}

void GenerateCall::RequestFinish(const grpc::Status& status) {
  bool ready = false;
  grpc::Status final_status;
  {
    absl::MutexLock lock(&mu_);
    if (!finish_requested_) {
      finish_requested_ = true;
      final_status_ = status;
    }
    ready = ReadyToFinishLocked();
    final_status = final_status_;
  }
  if (ready) Complete(final_status);  // may lead to OnDone on another thread: touch nothing after
}

bool GenerateCall::ReadyToFinishLocked() {
  if (!finish_requested_ || finished_ || write_pending_ || upstream_ != nullptr ||
      prefill_ != nullptr) {
    return false;
  }
  finished_ = true;
  return true;
}

}  // namespace kvserve
