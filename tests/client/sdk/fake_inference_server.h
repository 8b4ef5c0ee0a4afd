#ifndef KVSERVE_TESTS_CLIENT_SDK_FAKE_INFERENCE_SERVER_H_
#define KVSERVE_TESTS_CLIENT_SDK_FAKE_INFERENCE_SERVER_H_

// A test-only kvserve.v1.Inference server on 127.0.0.1:<free port>, built on gRPC's callback
// API. It streams canned GenerateResponse messages and can be told to fail or hang, and it
// records what it was sent (requests, deadlines, cancellations) for the test to check.

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "kvserve/v1/inference.grpc.pb.h"

namespace kvserve::testing {

/// How a Generate stream ends after the canned chunks it writes.
enum class StreamEnding {
  /// Writes every chunk, then OK.
  kOk,
  /// Writes the first chunk, then fails with UNAVAILABLE (a worker lost mid-stream).
  kUnavailableAfterFirst,
  /// Writes the first chunk, then waits until the client cancels or the deadline passes.
  kHangAfterFirst,
};

/// The fake service. Configure it before the calls that should see the settings.
class FakeInferenceService final : public v1::Inference::CallbackService {
 public:
  /// The first `k` calls (of any method) fail with UNAVAILABLE before any message.
  void FailFirstCalls(int k);
  void SetChunks(std::vector<v1::GenerateResponse> chunks);
  void SetEnding(StreamEnding ending);

  /// Calls received, per method.
  int generate_calls() const;
  int unary_calls() const;
  /// The last Generate request and the deadline the server saw on the last call of any method.
  v1::GenerateRequest last_generate_request() const;
  std::chrono::system_clock::time_point last_deadline() const;
  /// Waits (bounded by `timeout`) until the server has seen `n` cancelled streams.
  bool WaitForCancellations(int n, std::chrono::milliseconds timeout);
  /// Waits (bounded by `timeout`) until `n` Generate calls have arrived.
  bool WaitForGenerateCalls(int n, std::chrono::milliseconds timeout);

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* ctx, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* ctx,
                                       const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;
  /// Token ids are the text's bytes (plus BOS = 1 unless add_special_tokens is false).
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  /// The inverse of Tokenize: each id is one byte; id 1 is dropped.
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* ctx,
                                       const v1::DetokenizeRequest* request,
                                       v1::DetokenizeResponse* response) override;

  /// Called by stream reactors when the client cancelled.
  void NoteCancelled();

 private:
  // Counts a call and returns true when it should fail with UNAVAILABLE.
  bool CountCallAndMaybeFail(grpc::CallbackServerContext* ctx);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  int failures_left_ = 0;
  std::vector<v1::GenerateResponse> chunks_;
  StreamEnding ending_ = StreamEnding::kOk;
  int generate_calls_ = 0;
  int unary_calls_ = 0;
  int cancellations_ = 0;
  v1::GenerateRequest last_request_;
  std::chrono::system_clock::time_point last_deadline_;
};

/// Runs a FakeInferenceService on 127.0.0.1 at a free port until destroyed.
class FakeInferenceServer {
 public:
  FakeInferenceServer();
  ~FakeInferenceServer();
  FakeInferenceService& service() { return service_; }
  /// "127.0.0.1:<port>".
  std::string address() const { return address_; }
  /// Stops serving (the port is then refused).
  void Shutdown();

 private:
  FakeInferenceService service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

}  // namespace kvserve::testing

#endif  // KVSERVE_TESTS_CLIENT_SDK_FAKE_INFERENCE_SERVER_H_
