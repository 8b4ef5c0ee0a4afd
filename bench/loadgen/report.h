#ifndef KVSERVE_BENCH_LOADGEN_REPORT_H_
#define KVSERVE_BENCH_LOADGEN_REPORT_H_

// What one load run measured, per request and summarised, and how it is printed (a table for
// people, JSON for scripts and CI).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kvserve::bench {

/// One request as the client saw it. Times are seconds; `start_s` is the request's scheduled
/// start (open loop: its Poisson arrival time, so client-side queueing counts as latency).
struct RequestRecord {
  /// "OK" or the gRPC/absl code name ("UNAVAILABLE", ...).
  std::string code = "OK";
  double start_s = 0.0;
  /// Start to first streamed token; negative when no token arrived.
  double ttft_s = -1.0;
  /// Start to the end of the stream.
  double e2e_s = 0.0;
  /// Gaps between successive streamed chunks after the first.
  std::vector<double> itl_s;
  int prompt_tokens = 0;
  int output_tokens = 0;
  /// usage.cached_prompt_tokens and usage.peak_kv_blocks of the last chunk.
  int cached_prompt_tokens = 0;
  int peak_kv_blocks = 0;
};

/// Distribution of one latency, in milliseconds (linear-interpolated percentiles).
struct LatencySummary {
  int64_t count = 0;
  double mean_ms = 0.0;
  double p50_ms = 0.0;
  double p90_ms = 0.0;
  double p99_ms = 0.0;
  double max_ms = 0.0;
};

/// Percentile `q` in [0, 100] of `values` (sorted in place), interpolating linearly between
/// closest ranks (numpy's default); 0 for an empty vector.
double Percentile(std::vector<double>& values, double q);

/// Summarises latencies given in seconds.
LatencySummary Summarize(std::vector<double> seconds);

/// Peak KV pool use of one worker seen by polling kvserve.v1.Worker/GetLoad.
struct WorkerKvPeak {
  std::string address;
  int64_t peak_used_blocks = 0;
  int64_t total_blocks = 0;
};

/// One run (one load level).
struct RunReport {
  /// "closed" or "open".
  std::string mode;
  int concurrency = 0;
  /// Requests per second asked for (open loop), 0 for closed.
  double rate = 0.0;
  std::string workload;
  double duration_s = 0.0;
  int64_t requests = 0;
  int64_t succeeded = 0;
  int64_t failed = 0;
  /// Failed requests by status code name.
  std::map<std::string, int64_t> errors;
  double requests_per_s = 0.0;
  double output_tokens_per_s = 0.0;
  double prompt_tokens_per_s = 0.0;
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  int64_t cached_prompt_tokens = 0;
  /// cached_prompt_tokens / prompt_tokens over successful requests.
  double prefix_hit_rate = 0.0;
  LatencySummary ttft;
  LatencySummary itl;
  LatencySummary e2e;
  /// Largest usage.peak_kv_blocks of one request.
  int64_t max_request_kv_blocks = 0;
  /// Filled when workers were polled.
  std::vector<WorkerKvPeak> worker_kv;
};

/// Aggregates the records of one run of `duration_s` seconds (first start to last finish).
RunReport BuildReport(const std::vector<RequestRecord>& records, double duration_s);

/// The runs as JSON: {"runs": [ {...}, ... ]}, fields named as in RunReport (latencies in ms).
std::string ReportJson(const std::vector<RunReport>& runs);

/// The runs as an aligned text table, one row per run, with an error summary below.
std::string ReportTable(const std::vector<RunReport>& runs);

}  // namespace kvserve::bench

#endif  // KVSERVE_BENCH_LOADGEN_REPORT_H_
