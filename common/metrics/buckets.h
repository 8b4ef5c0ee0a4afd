#ifndef KVSERVE_COMMON_METRICS_BUCKETS_H_
#define KVSERVE_COMMON_METRICS_BUCKETS_H_

// Histogram bucket layouts shared by the worker and the router, so that dashboards can compare
// their histograms bucket by bucket.

#include <vector>

namespace kvserve::metrics {

/// `count` upper bounds start, start*factor, start*factor^2, ... (start > 0, factor > 1).
std::vector<double> ExponentialBuckets(double start, double factor, int count);
/// `count` upper bounds start, start+width, start+2*width, ... (width > 0).
std::vector<double> LinearBuckets(double start, double width, int count);

/// Time to first token, seconds: 1 ms .. 80 s (vLLM's TTFT layout extended down to 1 ms so
/// that the CPU test model is resolved too).
const std::vector<double>& TimeToFirstTokenBuckets();
/// Inter-token latency, seconds: 1 ms .. 80 s.
const std::vector<double>& InterTokenLatencyBuckets();
/// Whole-request phases (end-to-end, queue, prefill, decode), seconds: 1 ms .. 7680 s.
const std::vector<double>& RequestPhaseBuckets();
/// Token counts (tokens per engine step, matched prefix tokens): 1 .. 32768, powers of two.
const std::vector<double>& TokenCountBuckets();

}  // namespace kvserve::metrics

#endif  // KVSERVE_COMMON_METRICS_BUCKETS_H_
