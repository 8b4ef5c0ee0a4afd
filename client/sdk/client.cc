#include "client/sdk/client.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/strings/cord.h"
#include "absl/types/optional.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/sdk/proto_convert.h"
#include "grpcpp/grpcpp.h"
#include "kvserve/v1/inference.grpc.pb.h"

namespace kvserve {

// The state behind a CallHandle: whether it was cancelled, and the context of the attempt in
// flight so that Cancel can abort it.
struct CallHandle::State {
  std::mutex mu;
  std::condition_variable cv;
  bool cancelled = false;
  grpc::ClientContext* active = nullptr;  // Guarded by mu; owned by the calling thread.
};

CallHandle::CallHandle() : state_(std::make_unique<State>()) {}
CallHandle::~CallHandle() = default;

void CallHandle::Cancel() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->cancelled = true;
  if (state_->active != nullptr) state_->active->TryCancel();
  state_->cv.notify_all();
}

bool CallHandle::cancelled() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->cancelled;
}

// The Client's side of a CallHandle: attaching each attempt's context and waiting out backoffs.
struct CallHandleAccess {
  // Makes `ctx` the attempt Cancel aborts; false when the handle is already cancelled.
  static bool Attach(CallHandle& handle, grpc::ClientContext* ctx) {
    std::lock_guard<std::mutex> lock(handle.state_->mu);
    if (handle.state_->cancelled) return false;
    handle.state_->active = ctx;
    return true;
  }
  static void Detach(CallHandle& handle) {
    std::lock_guard<std::mutex> lock(handle.state_->mu);
    handle.state_->active = nullptr;
  }
  // Waits `duration` unless cancelled first; false when cancelled.
  static bool WaitUnlessCancelled(CallHandle& handle, absl::Duration duration) {
    std::unique_lock<std::mutex> lock(handle.state_->mu);
    return !handle.state_->cv.wait_for(lock, absl::ToChronoNanoseconds(duration),
                                       [&] { return handle.state_->cancelled; });
  }
};

std::optional<absl::Duration> RetryAfter(const absl::Status& status) {
  if (!absl::IsResourceExhausted(status)) return std::nullopt;
  absl::optional<absl::Cord> payload =
      status.GetPayload(absl::string_view(kRetryAfterPayload.data(), kRetryAfterPayload.size()));
  int64_t ms = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &ms) || ms < 0) {
    return std::nullopt;
  }
  return absl::Milliseconds(ms);
}

std::string_view CompletionFinishReasonName(CompletionFinishReason reason) {
  switch (reason) {
    case CompletionFinishReason::kStop:
      return "stop";
    case CompletionFinishReason::kLength:
      return "length";
    case CompletionFinishReason::kAbort:
      return "abort";
    case CompletionFinishReason::kUnspecified:
      break;
  }
  return "";
}

namespace {

absl::Status ValidateOptions(const std::string& target, const ClientOptions& o) {
  if (target.empty()) return absl::InvalidArgumentError("target: empty endpoint address");
  if (o.max_attempts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ClientOptions.max_attempts: must be >= 1, got ", o.max_attempts));
  }
  if (o.initial_backoff < absl::ZeroDuration() || o.max_backoff < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ClientOptions.initial_backoff/max_backoff: negative");
  }
  if (!(o.backoff_multiplier >= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ClientOptions.backoff_multiplier: must be >= 1, got ", o.backoff_multiplier));
  }
  if (o.tls_client_cert.empty() != o.tls_client_key.empty()) {
    return absl::InvalidArgumentError(
        "ClientOptions.tls_client_cert/tls_client_key: give both or neither");
  }
  for (char c : o.api_key) {
    if (c <= 0x20 || c >= 0x7f) {
      return absl::InvalidArgumentError(
          "ClientOptions.api_key: only printable ASCII characters other than space");
    }
  }
  if (o.max_message_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ClientOptions.max_message_bytes: must be positive, got ", o.max_message_bytes));
  }
  return absl::OkStatus();
}

// gRPC and abseil share the canonical status code numbering. A RESOURCE_EXHAUSTED answer's
// retry hint (trailing metadata) travels on as a payload.
absl::Status FromGrpc(const grpc::Status& status, const grpc::ClientContext& ctx) {
  if (status.ok()) return absl::OkStatus();
  absl::Status out(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
    const auto& trailers = ctx.GetServerTrailingMetadata();
    auto it = trailers.find("retry-after-ms");
    if (it != trailers.end()) {
      out.SetPayload(absl::string_view(kRetryAfterPayload.data(), kRetryAfterPayload.size()),
                     absl::Cord(absl::string_view(it->second.data(), it->second.size())));
    }
  }
  return out;
}

std::shared_ptr<grpc::ChannelCredentials> Credentials(const ClientOptions& o) {
  const bool tls = o.use_tls || !o.tls_root_certs.empty() || !o.tls_client_cert.empty();
  if (!tls) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = o.tls_root_certs;
  ssl.pem_cert_chain = o.tls_client_cert;
  ssl.pem_private_key = o.tls_client_key;
  return grpc::SslCredentials(ssl);
}

}  // namespace

struct Client::Impl {
  std::string target;
  ClientOptions options;
  /// "Bearer <api_key>", or empty.
  std::string authorization;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Inference::Stub> stub;

  // One attempt of a call: runs it on `ctx` and sets `started` once the caller has seen output
  // (after which the call is not retried).
  using Attempt = absl::FunctionRef<grpc::Status(grpc::ClientContext& ctx, bool& started)>;

  // Runs `attempt` until it succeeds, fails with something other than UNAVAILABLE, has started,
  // runs out of attempts or would outlive the deadline, or the call is cancelled.
  absl::Status Run(const char* method, const CallOptions& call, Attempt attempt) const {
    std::shared_ptr<CallHandle> handle =
        call.handle != nullptr ? call.handle : std::make_shared<CallHandle>();
    const absl::Duration timeout = call.deadline.value_or(options.default_deadline);
    const absl::Time deadline =
        timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
    const absl::Status cancelled =
        absl::CancelledError(absl::StrCat(method, ": cancelled by the client"));
    absl::Duration backoff = options.initial_backoff;
    for (int32_t attempt_number = 1;; ++attempt_number) {
      grpc::ClientContext ctx;
      if (deadline != absl::InfiniteFuture()) ctx.set_deadline(absl::ToChronoTime(deadline));
      if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
      if (!CallHandleAccess::Attach(*handle, &ctx)) return cancelled;
      bool started = false;
      const grpc::Status status = attempt(ctx, started);
      CallHandleAccess::Detach(*handle);
      if (status.ok()) return absl::OkStatus();
      if (handle->cancelled()) return cancelled;
      const bool retry = status.error_code() == grpc::StatusCode::UNAVAILABLE && !started &&
                         attempt_number < options.max_attempts && absl::Now() + backoff < deadline;
      if (!retry) {
        absl::Status result = FromGrpc(status, ctx);
        if (attempt_number == 1) return result;
        absl::Status annotated(result.code(), absl::StrCat(result.message(), " (after ",
                                                           attempt_number, " attempts)"));
        result.ForEachPayload([&](absl::string_view type, const absl::Cord& payload) {
          annotated.SetPayload(type, payload);
        });
        return annotated;
      }
      if (!CallHandleAccess::WaitUnlessCancelled(*handle, backoff)) return cancelled;
      backoff = std::min(backoff * options.backoff_multiplier, options.max_backoff);
    }
  }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& target,
                                                        ClientOptions options) {
  if (absl::Status s = ValidateOptions(target, options); !s.ok()) return s;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  auto impl = std::make_unique<Impl>();
  impl->target = target;
  impl->options = options;
  if (!options.api_key.empty()) impl->authorization = absl::StrCat("Bearer ", options.api_key);
  if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  impl->channel = grpc::CreateCustomChannel(target, Credentials(options), args);
  if (impl->channel == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("target: cannot open a channel to '", target, "'"));
  }
  if (options.connect_timeout > absl::ZeroDuration() &&
      !impl->channel->WaitForConnected(absl::ToChronoTime(absl::Now() + options.connect_timeout))) {
    return absl::UnavailableError(absl::StrCat("cannot connect to ", target, " within ",
                                               absl::FormatDuration(options.connect_timeout)));
  }
  impl->stub = v1::Inference::NewStub(impl->channel);
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

absl::Status Client::Generate(const GenerateParams& params, const ChunkCallback& on_chunk,
                              const CallOptions& call) {
  v1::GenerateRequest request;
  if (absl::Status s = sdk_internal::ToProto(params, &request); !s.ok()) return s;
  return impl_->Run("Generate", call, [&](grpc::ClientContext& ctx, bool& started) {
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
        impl_->stub->Generate(&ctx, request);
    v1::GenerateResponse response;
    while (reader->Read(&response)) {
      started = true;
      if (on_chunk) on_chunk(sdk_internal::FromProto(response));
    }
    return reader->Finish();
  });
}

absl::StatusOr<Completion> Client::GenerateSync(const GenerateParams& params,
                                                const CallOptions& call) {
  Completion completion;
  absl::Status status = Generate(
      params,
      [&completion](const GenerateChunk& chunk) { sdk_internal::AppendChunk(chunk, &completion); },
      call);
  if (!status.ok()) return status;
  return completion;
}

absl::StatusOr<std::vector<ModelInfo>> Client::ListModels(const CallOptions& call) {
  v1::ListModelsResponse response;
  absl::Status status = impl_->Run("ListModels", call, [&](grpc::ClientContext& ctx, bool&) {
    response.Clear();
    return impl_->stub->ListModels(&ctx, v1::ListModelsRequest(), &response);
  });
  if (!status.ok()) return status;
  std::vector<ModelInfo> models;
  models.reserve(response.models_size());
  for (const v1::ModelCard& card : response.models()) {
    models.push_back({card.name(), card.max_model_len(), card.vocab_size()});
  }
  return models;
}

absl::StatusOr<std::vector<TokenId>> Client::Tokenize(const TokenizeParams& params,
                                                      const CallOptions& call) {
  v1::TokenizeRequest request;
  sdk_internal::ToProto(params, &request);
  v1::TokenizeResponse response;
  absl::Status status = impl_->Run("Tokenize", call, [&](grpc::ClientContext& ctx, bool&) {
    response.Clear();
    return impl_->stub->Tokenize(&ctx, request, &response);
  });
  if (!status.ok()) return status;
  return std::vector<TokenId>(response.token_ids().begin(), response.token_ids().end());
}

absl::StatusOr<std::string> Client::Detokenize(const DetokenizeParams& params,
                                               const CallOptions& call) {
  v1::DetokenizeRequest request;
  if (absl::Status s = sdk_internal::ToProto(params, &request); !s.ok()) return s;
  v1::DetokenizeResponse response;
  absl::Status status = impl_->Run("Detokenize", call, [&](grpc::ClientContext& ctx, bool&) {
    response.Clear();
    return impl_->stub->Detokenize(&ctx, request, &response);
  });
  if (!status.ok()) return status;
  return std::move(*response.mutable_text());
}

}  // namespace kvserve
