#ifndef KVSERVE_BENCH_LOADGEN_PLOT_H_
#define KVSERVE_BENCH_LOADGEN_PLOT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/loadgen/report.h"

namespace kvserve::bench {

/// The gnuplot script that draws latency (TTFT p50/p99, E2E p50/p99, ITL p50; left axis, ms)
/// and output tokens/s (right axis) against the load level of each run (concurrency for closed
/// loops, rate for open ones) as a PNG at `png_path`. The data is inline.
std::string GnuplotScript(const std::vector<RunReport>& runs, const std::string& png_path);

/// Runs `gnuplot` on GnuplotScript. Errors say when gnuplot is missing (Debian package
/// gnuplot-nox) or failed.
absl::Status PlotRuns(const std::vector<RunReport>& runs, const std::string& png_path);

}  // namespace kvserve::bench

#endif  // KVSERVE_BENCH_LOADGEN_PLOT_H_
