#ifndef KVSERVE_CLIENT_SDK_CLIENT_H_
#define KVSERVE_CLIENT_SDK_CLIENT_H_

// kvserve::Client: a C++ client of the kvserve.v1.Inference service, served by the router and by
// every worker. The types here are plain structs that mirror the protobuf messages of
// proto/kvserve/v1/inference.proto, so that callers include neither protobuf nor grpcpp.
//
// Retries: a call that fails with UNAVAILABLE is retried with exponential backoff — unary calls
// always, a Generate stream only when it failed before its first message (after that the
// output has been seen by the caller, and a retry would repeat it). Every attempt of a call
// shares the call's one deadline.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/token.h"

namespace kvserve {

/// How a Client connects and how it retries. Defaults are documented on each field.
struct ClientOptions {
  /// Deadline of each call unless the call sets its own; infinite means none. Default none.
  absl::Duration default_deadline = absl::InfiniteDuration();
  /// Attempts per call (the first one included) while the server answers UNAVAILABLE; 1
  /// disables retries. Default 4.
  int32_t max_attempts = 4;
  /// Wait before the second attempt; each later wait is `backoff_multiplier` times longer, up
  /// to `max_backoff`. Defaults 100 ms, 2, 2 s.
  absl::Duration initial_backoff = absl::Milliseconds(100);
  double backoff_multiplier = 2.0;
  absl::Duration max_backoff = absl::Seconds(2);
  /// Largest message sent or received, in bytes. Default 64 MiB.
  int32_t max_message_bytes = 64 << 20;
  /// When positive, Connect waits this long for the channel to be ready and fails with
  /// UNAVAILABLE otherwise; zero connects lazily on the first call. Default zero.
  absl::Duration connect_timeout = absl::ZeroDuration();

  /// Connect with TLS. Implied by any of the tls_* fields below. Default off (plaintext).
  bool use_tls = false;
  /// PEM roots that verify the server's certificate; empty: the system's roots.
  std::string tls_root_certs;
  /// PEM client certificate chain and its private key, for servers that require one (mutual
  /// TLS); both or neither.
  std::string tls_client_cert;
  std::string tls_client_key;
  /// Name to check the server's certificate against instead of the target's host.
  std::string tls_server_name;
  /// Sent as `authorization: Bearer <api_key>` metadata on every call; empty: none.
  std::string api_key;
};

/// The absl::Status payload type URL under which a RESOURCE_EXHAUSTED status carries the
/// server's retry hint (its `retry-after-ms` trailing metadata, as decimal milliseconds).
inline constexpr std::string_view kRetryAfterPayload = "type.kvserve.dev/retry-after-ms";

/// The server's retry hint on a RESOURCE_EXHAUSTED status, when it sent one.
std::optional<absl::Duration> RetryAfter(const absl::Status& status);

/// Cancels one in-flight call from any thread. Create it with std::make_shared, pass it in
/// CallOptions::handle, and call Cancel() while (or before) the call runs: the call then returns
/// CANCELLED, also when it is waiting to retry. One handle per call; cancelling is final.
class CallHandle {
 public:
  CallHandle();
  ~CallHandle();
  CallHandle(const CallHandle&) = delete;
  CallHandle& operator=(const CallHandle&) = delete;

  /// Cancels the call; safe from any thread, any number of times.
  void Cancel();
  /// Whether Cancel() was called.
  bool cancelled() const;

 private:
  friend struct CallHandleAccess;
  struct State;
  std::unique_ptr<State> state_;
};

/// Per-call settings.
struct CallOptions {
  /// Overrides ClientOptions::default_deadline for this call (relative to the call's start).
  std::optional<absl::Duration> deadline;
  /// Lets another thread cancel the call; may be null.
  std::shared_ptr<CallHandle> handle;
};

/// Mirrors kvserve.v1.SamplingParams; unset optionals take the server's defaults.
struct GenerateSampling {
  /// Divides the logits; 0 is greedy. Server default 1.
  std::optional<float> temperature;
  /// Nucleus mass in (0, 1]. Server default 1.
  std::optional<float> top_p;
  /// Keep the k most likely tokens; 0 disables.
  uint32_t top_k = 0;
  /// Drop tokens below min_p times the top probability, in [0, 1].
  float min_p = 0.0f;
  /// > 0; 1 disables. Server default 1.
  std::optional<float> repetition_penalty;
  /// In [-2, 2].
  float presence_penalty = 0.0f;
  /// In [-2, 2].
  float frequency_penalty = 0.0f;
  /// Reproducible sampling; unset draws a random seed.
  std::optional<uint64_t> seed;
};

/// What the output must match (constrained decoding); mirrors GenerateRequest's `constraint`
/// oneof. Empty `text` with kNone: unconstrained.
struct OutputConstraint {
  enum class Kind { kNone, kJsonSchema, kJsonObject, kRegex, kGrammar };
  Kind kind = Kind::kNone;
  /// kJsonSchema: the schema as JSON text; kRegex: the pattern; kGrammar: GBNF text.
  std::string text;
};

/// Mirrors kvserve.v1.GenerateRequest. Exactly one of `prompt` and `prompt_token_ids` is set.
struct GenerateParams {
  /// Model name; empty selects the endpoint's only model.
  std::string model;
  std::string prompt;
  std::vector<TokenId> prompt_token_ids;
  /// Most tokens per sample; 0 selects the server default.
  uint32_t max_tokens = 0;
  GenerateSampling sampling;
  std::vector<std::string> stop;
  std::vector<TokenId> stop_token_ids;
  bool ignore_eos = false;
  /// Samples of the prompt; 0 means 1.
  uint32_t n = 1;
  /// Report each token's log-probability and this many alternatives.
  std::optional<uint32_t> logprobs;
  std::string cache_salt;
  /// Echoed back; generated by the server when empty.
  std::string request_id;
  /// Add BOS/special tokens to a text prompt; unset means the server default (true).
  std::optional<bool> add_special_tokens;
  bool include_stop_str_in_output = false;
  OutputConstraint constraint;
};

/// Why a sample ended; mirrors kvserve.v1.FinishReason.
enum class CompletionFinishReason { kUnspecified, kStop, kLength, kAbort };

/// "stop", "length", "abort", or "" for kUnspecified.
std::string_view CompletionFinishReasonName(CompletionFinishReason reason);

/// Mirrors kvserve.v1.Usage.
struct CompletionUsage {
  uint32_t prompt_tokens = 0;
  uint32_t completion_tokens = 0;
  uint32_t cached_prompt_tokens = 0;
  uint32_t peak_kv_blocks = 0;
};

/// One candidate token; mirrors kvserve.v1.TokenLogprob.
struct CompletionTokenLogprob {
  TokenId token_id = 0;
  float logprob = 0.0f;
};

/// Log-probabilities of one generated token; mirrors kvserve.v1.Logprobs.
struct CompletionLogprobs {
  TokenId token_id = 0;
  float logprob = 0.0f;
  /// Most likely alternatives, logprob descending.
  std::vector<CompletionTokenLogprob> top;
};

/// One streamed message; mirrors kvserve.v1.GenerateResponse.
struct GenerateChunk {
  std::string request_id;
  /// Sample index in [0, n).
  uint32_t index = 0;
  /// Tokens since this sample's previous chunk.
  std::vector<TokenId> token_ids;
  /// Text released since this sample's previous chunk.
  std::string text;
  /// Parallel to token_ids when logprobs were requested.
  std::vector<CompletionLogprobs> logprobs;
  /// kUnspecified except on the sample's last chunk.
  CompletionFinishReason finish_reason = CompletionFinishReason::kUnspecified;
  std::string stop_reason;
  /// Set on the sample's last chunk.
  std::optional<CompletionUsage> usage;
  /// The worker that served the request.
  std::string worker;
};

/// One sample of a Completion: every chunk of it concatenated.
struct CompletionSample {
  uint32_t index = 0;
  std::vector<TokenId> token_ids;
  std::string text;
  std::vector<CompletionLogprobs> logprobs;
  CompletionFinishReason finish_reason = CompletionFinishReason::kUnspecified;
  std::string stop_reason;
  CompletionUsage usage;
};

/// A whole Generate call, gathered.
struct Completion {
  std::string request_id;
  std::string worker;
  /// Indexed by sample index.
  std::vector<CompletionSample> samples;
};

/// Mirrors kvserve.v1.ModelCard.
struct ModelInfo {
  std::string name;
  uint32_t max_model_len = 0;
  uint32_t vocab_size = 0;
};

/// Mirrors kvserve.v1.TokenizeRequest.
struct TokenizeParams {
  std::string model;
  std::string text;
  /// Unset means the server default (true).
  std::optional<bool> add_special_tokens;
};

/// Mirrors kvserve.v1.DetokenizeRequest.
struct DetokenizeParams {
  std::string model;
  std::vector<TokenId> token_ids;
  bool skip_special_tokens = false;
};

/// Called with each streamed chunk, on the calling thread, in order.
using ChunkCallback = std::function<void(const GenerateChunk&)>;

/// A connection to a kvserve router or worker. Thread-safe: calls may run concurrently.
class Client {
 public:
  /// Opens a channel to `target` ("host:port", or any gRPC target URI), with TLS when the
  /// options ask for it. INVALID_ARGUMENT for options that do not fit together.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& target,
                                                         ClientOptions options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  /// Streams a completion, calling `on_chunk` for each message. Returns the call's status:
  /// OK once every sample has finished, else the server's (or the deadline's, or CANCELLED).
  absl::Status Generate(const GenerateParams& params, const ChunkCallback& on_chunk,
                        const CallOptions& call = {});
  /// Generates and gathers every sample.
  absl::StatusOr<Completion> GenerateSync(const GenerateParams& params,
                                          const CallOptions& call = {});
  /// The models the endpoint serves.
  absl::StatusOr<std::vector<ModelInfo>> ListModels(const CallOptions& call = {});
  /// Encodes text with the model's tokenizer.
  absl::StatusOr<std::vector<TokenId>> Tokenize(const TokenizeParams& params,
                                                const CallOptions& call = {});
  /// Decodes token ids with the model's tokenizer.
  absl::StatusOr<std::string> Detokenize(const DetokenizeParams& params,
                                         const CallOptions& call = {});

 private:
  struct Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvserve

#endif  // KVSERVE_CLIENT_SDK_CLIENT_H_
