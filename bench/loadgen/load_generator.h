#ifndef KVSERVE_BENCH_LOADGEN_LOAD_GENERATOR_H_
#define KVSERVE_BENCH_LOADGEN_LOAD_GENERATOR_H_

// Drives load against a kvserve endpoint (router or worker) through the C++ SDK, streaming every
// request so that time to first token and the gaps between tokens are measured.
//
// Closed loop: `concurrency` client threads each send a request, wait for its last token, and
// send the next, so the offered load adapts to the server (latency vs concurrency).
// Open loop: arrivals follow a Poisson process of `rate` requests/s (exponential gaps drawn from
// the seed) whatever the server does; up to `max_inflight` requests run at once, and each one's
// latency is measured from its scheduled arrival, so a server (or client) that falls behind shows
// the queueing delay instead of hiding it (no coordinated omission).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/loadgen/report.h"
#include "bench/loadgen/workload.h"

namespace kvserve::bench {

/// Fixed concurrency or Poisson arrivals.
enum class LoadMode { kClosed, kOpen };

/// Parses "closed" or "open".
absl::StatusOr<LoadMode> ParseLoadMode(const std::string& name);

/// How to load the endpoint. Exactly one of duration_s and num_requests is positive.
struct LoadOptions {
  /// HOST:PORT of a router or worker (kvserve.v1.Inference).
  std::string endpoint;
  LoadMode mode = LoadMode::kClosed;
  /// Client threads of the closed loop. Default 1.
  int concurrency = 1;
  /// Arrivals per second of the open loop.
  double rate = 1.0;
  /// Most requests in flight in the open loop. Default 256.
  int max_inflight = 256;
  /// Stop issuing requests after this many seconds (in-flight ones finish and count).
  double duration_s = 0.0;
  /// Or issue exactly this many requests.
  int64_t num_requests = 0;
  /// Attempts per request while the endpoint answers UNAVAILABLE before any output. Default 1:
  /// a failure is measured, not retried away.
  int max_attempts = 1;
  /// Deadline of each request, seconds. Default 120.
  double request_timeout_s = 120.0;
  /// Worker addresses whose KV pools are polled (kvserve.v1.Worker/GetLoad) during the run.
  std::vector<std::string> workers;
  /// Index of the run's first request in the workload: runs of one invocation use disjoint
  /// ranges so that a later run does not find an earlier run's prompts in the prefix cache.
  int64_t first_request_index = 0;
  /// Seed of the open loop's arrival times (the workload has its own).
  uint64_t seed = 1;
};

/// Checks the options; errors name the flag.
absl::Status ValidateLoadOptions(const LoadOptions& options);

/// The endpoint's model: its vocabulary and context, through ListModels.
struct EndpointModel {
  std::string name;
  int vocab_size = 0;
  int max_model_len = 0;
};

/// Asks `endpoint` for its (first) model, waiting up to `timeout_s` for it to answer.
absl::StatusOr<EndpointModel> QueryEndpointModel(const std::string& endpoint, double timeout_s);

/// Runs the load and reports it. Request failures are counted in the report, not returned;
/// the error is for a run that could not start (bad options, no connection).
absl::StatusOr<RunReport> RunLoad(const LoadOptions& options, const Workload& workload);

}  // namespace kvserve::bench

#endif  // KVSERVE_BENCH_LOADGEN_LOAD_GENERATOR_H_
