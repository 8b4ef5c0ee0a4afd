#ifndef KVSERVE_ROUTER_HTTP_HTTP_SERVER_H_
#define KVSERVE_ROUTER_HTTP_HTTP_SERVER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "router/http/openai_request.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace kvserve {

class Tokenizer;

/// Settings of the OpenAI-compatible HTTP front.
struct HttpServerOptions {
  /// HOST:PORT; port 0 picks a free one (see HttpServer::port()).
  std::string listen = "0.0.0.0:8080";
  /// Connections served at once (each streaming response holds one thread).
  int threads = 64;
  /// Accepted connections that may wait for one of `threads`; past it a connection is answered
  /// 503 with Retry-After (its request read first), never dropped.
  int max_queued_connections = 1024;
  /// The listening socket's backlog: connections the kernel completes before the server accepts
  /// them (capped by net.core.somaxconn). cpp-httplib's own is 5, which a burst of new
  /// connections overflows; the kernel then resets some of them.
  int listen_backlog = 1024;
  /// Deadline of each Generate call (DEADLINE_EXCEEDED → 504).
  absl::Duration request_timeout = absl::Minutes(10);
  /// While a stream waits for its next token this long, an SSE comment line is sent: it keeps
  /// proxies from timing the connection out, and a client that has gone is noticed by the failed
  /// write (its request is then cancelled on the worker) instead of at the next token.
  absl::Duration stream_heartbeat = absl::Seconds(2);
  /// Largest request body; larger bodies get 413.
  size_t max_body_bytes = size_t{32} << 20;
  /// Front-door checks of n and logprobs.
  http::RequestLimits limits;
};

/// What the HTTP front calls; everything must outlive the server.
struct HttpServerDeps {
  /// A channel to a kvserve.v1.Inference service: the router's own, in-process
  /// (RouterServer::InProcessChannel), so HTTP requests take the same path as gRPC ones.
  std::shared_ptr<grpc::Channel> channel;
  /// The served model's tokenizer: chat template, BOS/EOS text, logprob token text.
  const Tokenizer* tokenizer = nullptr;
  /// The name /v1/models reports and requests may name.
  std::string model_name;
  /// Optional readiness for /health (e.g. "a worker is routable"); unset: always ready.
  std::function<bool()> ready;
};

/// OpenAI-compatible HTTP API in front of kvserve.v1.Inference (cpp-httplib):
///   POST /v1/completions, POST /v1/chat/completions (JSON, or server-sent events with
///   "stream": true: `data: {chunk}\n\n` ... `data: [DONE]\n\n`), GET /v1/models, GET /health.
///
/// Each request is translated (openai_request.h), sent as one Generate call over the channel,
/// and the response stream is turned into OpenAI JSON (openai_response.h). Errors are
/// {"error": {"message", "type", "param", "code"}} with the HTTP status mapped from the gRPC
/// code (see HttpStatusFor); a request naming another model gets 404. A stream that fails
/// after its first chunk ends with a `data: {"error": ...}` event and then [DONE].
///
/// Chat: the prompt is the tokenizer's chat template rendered over the messages (encoded
/// without adding special tokens: the template places BOS). The template is compiled at
/// Start; when the model has none, or it uses syntax outside the supported subset,
/// chat_template_status() says why and the chat endpoint answers 400 with that message while
/// completions keep working.
///
/// Authentication: the request's `Authorization` header is passed on as gRPC `authorization`
/// metadata, so the router's API key check applies to HTTP as it does to gRPC
/// (UNAUTHENTICATED → 401, a key at its concurrency limit → 429 with Retry-After). /health is
/// never authenticated. The HTTP front itself has no TLS: terminate TLS in front of it.
///
/// Threading: httplib accepts connections on one thread and serves each on one of `threads`
/// (http::AdmissionQueue), which blocks on its Generate stream; a client that disconnects
/// mid-stream cancels the call at its next chunk. Up to `max_queued_connections` accepted
/// connections wait for a thread; beyond that a connection is still read in full, then
/// answered 503 with `Retry-After: 1` and closed (no request is dropped and no connection
/// reset while the process has file descriptors to accept with).
class HttpServer {
 public:
  /// Binds and starts serving; UNAVAILABLE naming the address when it cannot bind.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                           HttpServerDeps deps);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  /// The port actually bound.
  int port() const;
  /// Connections served so far (admitted to a serving thread) and refused for overload (503).
  uint64_t connections_admitted() const;
  uint64_t connections_refused() const;
  /// OK when the chat template compiled; otherwise why chat completions are refused.
  const absl::Status& chat_template_status() const;
  /// Refuses new requests (503), lets running ones finish for up to `grace`, cancels the
  /// rest, and stops. Idempotent; the destructor calls it with no grace.
  void Shutdown(absl::Duration grace = absl::ZeroDuration());

 private:
  struct State;
  explicit HttpServer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace kvserve

#endif  // KVSERVE_ROUTER_HTTP_HTTP_SERVER_H_
