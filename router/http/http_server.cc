#include "router/http/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/chat_template/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "grpcpp/grpcpp.h"
#include "kvserve/v1/inference.grpc.pb.h"
#include "router/http/admission_queue.h"
#include "router/http/openai_response.h"

namespace kvserve {
namespace {

using nlohmann::json;

std::string Dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

void SendJson(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(Dump(body), "application/json");
}

/// Threads answering connections refused for overload (they only read requests and write 503s).
constexpr int kShedThreads = 2;

void SendError(httplib::Response& res, const http::ApiError& error) {
  // Overload, per-key limits, shutting down: tell the client when to come back (whole seconds).
  if (error.http_status == 429 || error.http_status == 503) res.set_header("Retry-After", "1");
  SendJson(res, error.http_status, error.body);
}

/// Passes the request's Authorization header on as gRPC `authorization` metadata, for the
/// router's API key check. A value gRPC cannot carry (bytes outside printable ASCII) is
/// replaced by one that fails the check, rather than dropped.
void ForwardAuthorization(const httplib::Request& req, grpc::ClientContext& context) {
  if (!req.has_header("Authorization")) return;
  std::string value = req.get_header_value("Authorization");
  for (char c : value) {
    if (c < 0x20 || c > 0x7e) {
      value = "invalid";
      break;
    }
  }
  context.AddMetadata("authorization", value);
}

absl::Status FromGrpc(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// httplib's server with a listen backlog of our choosing: httplib listens with
/// CPPHTTPLIB_LISTEN_BACKLOG (5), compiled into Debian's libcpp-httplib, so it cannot be set by
/// a macro here. Calling listen() again on the bound socket changes the backlog (Linux).
class BacklogServer : public httplib::Server {
 public:
  bool SetListenBacklog(int backlog) { return ::listen(svr_sock_, backlog) == 0; }
};

/// One Generate call in flight: the context (cancellable from Shutdown) and its reader.
struct Call {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader;
  bool finished = false;
};

// Reads the rest of a Generate stream on a thread of its own, so that the HTTP handler can wake
// while no token arrives (a request queued on a busy worker, a long prefill): it then writes an
// SSE comment, which fails once the client has gone, and cancels the call instead of holding its
// worker slot until the next token. At most kMaxQueued messages wait for the handler: a slow
// client slows the stream down (gRPC flow control reaches back to the worker) rather than piling
// its tokens up here. Destroying the pump joins the thread after the reader returned false:
// cancel first if the stream may still be open.
class StreamPump {
 public:
  enum class Next { kMessage, kEnd, kIdle };
  static constexpr size_t kMaxQueued = 64;

  explicit StreamPump(grpc::ClientReader<v1::GenerateResponse>* reader)
      : thread_([this, reader] {
          v1::GenerateResponse message;
          while (reader->Read(&message)) {
            absl::MutexLock lock(&mu_);
            queue_.push_back(std::move(message));
            mu_.Await(absl::Condition(this, &StreamPump::HasRoom));
          }
          absl::MutexLock lock(&mu_);
          done_ = true;
        }) {}
  StreamPump(const StreamPump&) = delete;
  StreamPump& operator=(const StreamPump&) = delete;
  ~StreamPump() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;  // the handler reads no more: let the thread read to the end
    }
    thread_.join();
  }

  // The next message (kMessage), the end of the stream (kEnd), or kIdle after `idle` without
  // either.
  Next Wait(absl::Duration idle, v1::GenerateResponse* out) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(this, &StreamPump::Ready), idle);
    if (!queue_.empty()) {
      *out = std::move(queue_.front());
      queue_.pop_front();
      return Next::kMessage;
    }
    return done_ ? Next::kEnd : Next::kIdle;
  }

 private:
  bool Ready() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty() || done_; }
  bool HasRoom() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.size() < kMaxQueued || stopping_;
  }

  absl::Mutex mu_;
  std::deque<v1::GenerateResponse> queue_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace

struct HttpServer::State {
  HttpServerOptions options;
  HttpServerDeps deps;
  std::unique_ptr<v1::Inference::Stub> stub;
  std::optional<ChatTemplate> chat_template;
  absl::Status chat_template_status;
  /// How the model's template teaches it to write tool calls.
  ToolCallFormat tool_format = ToolCallFormat::kNone;
  http::AdmissionCounters admission;
  BacklogServer server;
  std::thread listener;
  int port = 0;

  absl::Mutex mu;
  absl::flat_hash_set<Call*> calls ABSL_GUARDED_BY(mu);
  bool shutting_down ABSL_GUARDED_BY(mu) = false;
  bool shut_down ABSL_GUARDED_BY(mu) = false;
  std::atomic<bool> listen_returned{false};

  /// Registers a new call; nullptr once shutting down.
  std::shared_ptr<Call> NewCall() {
    absl::MutexLock lock(&mu);
    if (shutting_down) return nullptr;
    auto call = std::shared_ptr<Call>(new Call, [this](Call* c) {
      {
        absl::MutexLock l(&mu);
        calls.erase(c);
      }
      delete c;
    });
    calls.insert(call.get());
    call->context.set_deadline(absl::ToChronoTime(absl::Now() + options.request_timeout));
    return call;
  }

  /// The status a call ended with; a cancellation by Shutdown reads as UNAVAILABLE.
  absl::Status CallStatus(const grpc::Status& status) {
    if (status.error_code() == grpc::StatusCode::CANCELLED) {
      absl::MutexLock lock(&mu);
      if (shutting_down) return absl::UnavailableError("server shutting down");
    }
    return FromGrpc(status);
  }

  /// On a connection refused for overload (AdmissionQueue::Shedding): answers 503 with
  /// Retry-After and closes the connection; returns whether it did.
  bool RefuseIfShedding(httplib::Response& res) {
    if (!http::AdmissionQueue::Shedding()) return false;
    SendError(res, http::ErrorFromStatus(absl::UnavailableError(absl::StrCat(
                       "server overloaded: all ", options.threads, " connection threads busy and ",
                       options.max_queued_connections, " connections waiting; retry later"))));
    res.set_header("Connection", "close");
    return true;
  }

  void HandleGenerate(http::Endpoint endpoint, const httplib::Request& req, httplib::Response& res);
  void HandleModels(const httplib::Request& req, httplib::Response& res);
};

void HttpServer::State::HandleGenerate(http::Endpoint endpoint, const httplib::Request& req,
                                       httplib::Response& res) {
  if (RefuseIfShedding(res)) return;
  absl::StatusOr<http::OpenAiRequest> parsed =
      http::ParseOpenAiRequest(endpoint, req.body, options.limits);
  if (!parsed.ok()) return SendError(res, http::ErrorFromStatus(parsed.status()));
  http::OpenAiRequest& request = *parsed;
  if (!request.model.empty() && request.model != deps.model_name) {
    return SendError(res, http::ModelNotFound(request.model, deps.model_name));
  }
  if (endpoint == http::Endpoint::kChatCompletions) {
    if (!chat_template_status.ok()) {
      return SendError(res, http::ErrorFromStatus(chat_template_status));
    }
    ChatRenderOptions render;
    render.add_generation_prompt = request.add_generation_prompt;
    if (deps.tokenizer->bos_id() != kNoToken) {
      render.bos_token = std::string(deps.tokenizer->IdToPiece(deps.tokenizer->bos_id()));
    }
    if (deps.tokenizer->eos_id() != kNoToken) {
      render.eos_token = std::string(deps.tokenizer->IdToPiece(deps.tokenizer->eos_id()));
    }
    render.tools = request.tools;
    absl::StatusOr<std::string> prompt = chat_template->Render(request.messages, render);
    if (!prompt.ok()) {
      return SendError(res, http::ErrorFromStatus(absl::InvalidArgumentError(
                                absl::StrCat("messages: ", prompt.status().message()))));
    }
    if (prompt->empty()) {
      return SendError(res, http::ErrorFromStatus(absl::InvalidArgumentError(
                                "messages: the chat template rendered an empty prompt")));
    }
    request.generate.set_prompt(*std::move(prompt));
  }
  const ToolCallFormat tool_format = http::ToolCallFormatFor(request, this->tool_format);
  http::SetToolCallConstraint(tool_format, &request);
  if (req.has_header("X-Request-Id")) {
    request.generate.set_request_id(req.get_header_value("X-Request-Id"));
  }

  std::shared_ptr<Call> call = NewCall();
  if (call == nullptr) {
    return SendError(res, http::ErrorFromStatus(absl::UnavailableError("server shutting down")));
  }
  ForwardAuthorization(req, call->context);
  call->reader = stub->Generate(&call->context, request.generate);
  // The first message decides the HTTP status: errors before it (validation, admission,
  // routing) are answered as HTTP errors.
  v1::GenerateResponse first;
  if (!call->reader->Read(&first)) {
    call->finished = true;
    grpc::Status status = call->reader->Finish();
    if (status.ok()) status = grpc::Status(grpc::StatusCode::INTERNAL, "empty response stream");
    return SendError(res, http::ErrorFromStatus(CallStatus(status)));
  }
  const bool chat = endpoint == http::Endpoint::kChatCompletions;
  http::ResponseBuilder::Options builder_options;
  builder_options.endpoint = endpoint;
  builder_options.id = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", first.request_id());
  builder_options.model = request.model.empty() ? deps.model_name : request.model;
  builder_options.created = UnixSeconds();
  builder_options.n = request.generate.n() == 0 ? 1 : static_cast<int>(request.generate.n());
  builder_options.logprobs = request.logprobs;
  builder_options.tool_format = tool_format;
  builder_options.single_tool_call = !request.parallel_tool_calls;
  auto builder = std::make_shared<http::ResponseBuilder>(builder_options, deps.tokenizer);

  if (!request.stream) {
    builder->Add(first);
    v1::GenerateResponse message;
    while (call->reader->Read(&message)) builder->Add(message);
    call->finished = true;
    const grpc::Status status = call->reader->Finish();
    if (!status.ok()) return SendError(res, http::ErrorFromStatus(CallStatus(status)));
    return SendJson(res, 200, builder->Final());
  }

  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  const bool include_usage = request.include_usage;
  const int n = builder_options.n;
  const absl::Duration heartbeat = options.stream_heartbeat;
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, call, builder, first, chat, include_usage, n, heartbeat](
          size_t /*offset*/, httplib::DataSink& sink) mutable {
        auto send = [&sink](const json& event) {
          const std::string text = absl::StrCat("data: ", Dump(event), "\n\n");
          return sink.write(text.data(), text.size());
        };
        auto send_all = [&send](const std::vector<json>& events) {
          for (const json& event : events) {
            if (!send(event)) return false;
          }
          return true;
        };
        bool ok = true;
        if (chat) {
          for (int i = 0; i < n && ok; ++i) ok = send(builder->RoleChunk(i));
        }
        ok = ok && send_all(builder->Add(first));
        {
          StreamPump pump(call->reader.get());
          v1::GenerateResponse message;
          while (ok) {
            const StreamPump::Next next = pump.Wait(heartbeat, &message);
            if (next == StreamPump::Next::kEnd) break;
            if (next == StreamPump::Next::kIdle) {
              static constexpr char kHeartbeat[] = ": waiting\n\n";  // an SSE comment
              ok = sink.write(kHeartbeat, sizeof(kHeartbeat) - 1);
            } else {
              ok = send_all(builder->Add(message));
            }
          }
          // The client went away: cancel; the pump's thread then reads the stream to its end.
          if (!ok) call->context.TryCancel();
        }
        // The reader has returned false (the pump saw the end): Finish is all that is left, and
        // another Read would be a second read past the end of the stream.
        call->finished = true;
        const grpc::Status status = call->reader->Finish();
        if (!ok) return false;
        if (!status.ok()) {
          ok = send(http::ErrorFromStatus(CallStatus(status)).body);
        } else if (include_usage) {
          ok = send(builder->UsageChunk());
        }
        static constexpr char kDone[] = "data: [DONE]\n\n";
        ok = ok && sink.write(kDone, sizeof(kDone) - 1);
        if (ok) sink.done();
        return ok;
      },
      [call](bool /*success*/) {
        if (!call->finished) {
          // Never started or abandoned: cancel, then drain so the reader can be destroyed.
          call->context.TryCancel();
          v1::GenerateResponse discard;
          while (call->reader->Read(&discard)) {
          }
          call->reader->Finish();
          call->finished = true;
        }
      });
}

void HttpServer::State::HandleModels(const httplib::Request& req, httplib::Response& res) {
  if (RefuseIfShedding(res)) return;
  grpc::ClientContext context;
  ForwardAuthorization(req, context);
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::ListModelsResponse models;
  const grpc::Status status = stub->ListModels(&context, v1::ListModelsRequest(), &models);
  if (!status.ok()) return SendError(res, http::ErrorFromStatus(FromGrpc(status)));
  json data = json::array();
  const int64_t created = UnixSeconds();
  for (const v1::ModelCard& card : models.models()) {
    json entry = {
        {"id", card.name()}, {"object", "model"}, {"created", created}, {"owned_by", "kvserve"}};
    if (card.max_model_len() > 0) entry["max_model_len"] = card.max_model_len();
    data.push_back(std::move(entry));
  }
  SendJson(res, 200, {{"object", "list"}, {"data", std::move(data)}});
}

HttpServer::HttpServer(std::unique_ptr<State> state) : state_(std::move(state)) {}

HttpServer::~HttpServer() { Shutdown(); }

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                              HttpServerDeps deps) {
  if (deps.channel == nullptr || deps.tokenizer == nullptr) {
    return absl::InvalidArgumentError("http: a channel and a tokenizer are required");
  }
  if (options.threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("http-threads: must be positive, got ", options.threads));
  }
  if (options.max_queued_connections < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "http-max-queued-connections: must not be negative, got ", options.max_queued_connections));
  }
  if (options.listen_backlog < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("http-listen-backlog: must be positive, got ", options.listen_backlog));
  }
  if (options.stream_heartbeat <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("http stream heartbeat: must be positive, got ",
                                                   absl::FormatDuration(options.stream_heartbeat)));
  }
  const size_t colon = options.listen.rfind(':');
  int requested_port = -1;
  if (colon != std::string::npos && colon + 1 < options.listen.size()) {
    requested_port = std::atoi(options.listen.c_str() + colon + 1);
  }
  if (colon == std::string::npos || requested_port < 0 || requested_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("http-listen: expected HOST:PORT, got '", options.listen, "'"));
  }
  std::string host = options.listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }

  auto state = std::make_unique<State>();
  state->options = options;
  state->deps = std::move(deps);
  state->stub = v1::Inference::NewStub(state->deps.channel);
  const std::string& source = state->deps.tokenizer->chat_template();
  if (source.empty()) {
    state->chat_template_status = absl::InvalidArgumentError(absl::StrCat(
        "messages: model '", state->deps.model_name,
        "' has no chat template (tokenizer_config.json chat_template); use /v1/completions"));
  } else {
    absl::StatusOr<ChatTemplate> compiled = ChatTemplate::Parse(source);
    if (compiled.ok()) {
      state->chat_template = *std::move(compiled);
    } else {
      state->chat_template_status = absl::InvalidArgumentError(absl::StrCat(
          "messages: the model's chat template cannot be used: ", compiled.status().message()));
    }
    state->tool_format = DetectToolCallFormat(source);
  }

  State* s = state.get();
  BacklogServer& server = s->server;
  http::AdmissionOptions admission;
  admission.threads = options.threads;
  admission.max_queued = options.max_queued_connections;
  admission.shed_threads = kShedThreads;
  server.new_task_queue = [admission, s] {
    return new http::AdmissionQueue(admission, &s->admission);
  };
  server.set_payload_max_length(options.max_body_bytes);
  server.Post("/v1/completions", [s](const httplib::Request& req, httplib::Response& res) {
    s->HandleGenerate(http::Endpoint::kCompletions, req, res);
  });
  server.Post("/v1/chat/completions", [s](const httplib::Request& req, httplib::Response& res) {
    s->HandleGenerate(http::Endpoint::kChatCompletions, req, res);
  });
  server.Get("/v1/models",
             [s](const httplib::Request& req, httplib::Response& res) {
               s->HandleModels(req, res);
             });
  server.Get("/health", [s](const httplib::Request&, httplib::Response& res) {
    bool serving = true;
    {
      absl::MutexLock lock(&s->mu);
      serving = !s->shutting_down;
    }
    if (serving && s->deps.ready) serving = s->deps.ready();
    SendJson(res, serving ? 200 : 503, {{"status", serving ? "ok" : "unavailable"}});
  });
  server.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const absl::StatusCode code =
        res.status == 404 ? absl::StatusCode::kNotFound : absl::StatusCode::kInvalidArgument;
    http::ApiError error = http::ErrorFromStatus(
        absl::Status(code, absl::StrCat(req.method, " ", req.path, ": HTTP ", res.status)));
    const int status = res.status;
    SendJson(res, status, error.body);
  });
  server.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
        SendError(res, http::ErrorFromStatus(absl::InternalError("internal error")));
      });

  s->port = requested_port == 0 ? server.bind_to_any_port(host)
                                : (server.bind_to_port(host, requested_port) ? requested_port : -1);
  if (s->port <= 0) {
    return absl::UnavailableError(absl::StrCat("http-listen: cannot serve on '", options.listen,
                                               "' (address in use or invalid)"));
  }
  if (!server.SetListenBacklog(options.listen_backlog)) {
    return absl::InternalError(absl::StrCat("http-listen-backlog: listen(", options.listen_backlog,
                                            ") failed on '", options.listen, "'"));
  }
  s->listener = std::thread([s] {
    s->server.listen_after_bind();
    s->listen_returned = true;
  });
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(state)));
}

int HttpServer::port() const { return state_->port; }

uint64_t HttpServer::connections_admitted() const { return state_->admission.admitted.load(); }

uint64_t HttpServer::connections_refused() const { return state_->admission.shed.load(); }

const absl::Status& HttpServer::chat_template_status() const {
  return state_->chat_template_status;
}

void HttpServer::Shutdown(absl::Duration grace) {
  State& s = *state_;
  {
    absl::MutexLock lock(&s.mu);
    if (s.shut_down) return;
    s.shut_down = true;
    s.shutting_down = true;
    s.mu.AwaitWithTimeout(absl::Condition(
                              +[](State* st) { return st->calls.empty(); }, &s),
                          grace);
    for (Call* call : s.calls) call->context.TryCancel();
    // Cancelled calls end promptly; let their responses be written out before stop(), which
    // would cut a chunked response short.
    s.mu.Await(absl::Condition(
        +[](State* st) { return st->calls.empty(); }, &s));
  }
  // The listener may not have entered its accept loop yet (stop() is a no-op before); wait
  // for it to run or to have returned, then stop it.
  while (!s.server.is_running() && !s.listen_returned) std::this_thread::yield();
  s.server.stop();
  if (s.listener.joinable()) s.listener.join();
}

}  // namespace kvserve
