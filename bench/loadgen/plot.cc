#include "bench/loadgen/plot.h"

#include <sys/wait.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"

namespace kvserve::bench {

std::string GnuplotScript(const std::vector<RunReport>& runs, const std::string& png_path) {
  const bool open = !runs.empty() && runs.front().mode == "open";
  std::string s = "$data << EOD\n";
  for (const RunReport& r : runs) {
    absl::StrAppend(&s, absl::StrFormat("%g %g %g %g %g %g %g\n",
                                        open ? r.rate : static_cast<double>(r.concurrency),
                                        r.ttft.p50_ms, r.ttft.p99_ms, r.e2e.p50_ms, r.e2e.p99_ms,
                                        r.itl.p50_ms, r.output_tokens_per_s));
  }
  absl::StrAppend(&s, "EOD\n");
  absl::StrAppend(&s, "set terminal pngcairo size 960,600\n");
  absl::StrAppend(&s, "set output '", absl::StrReplaceAll(png_path, {{"'", "''"}}), "'\n");
  absl::StrAppend(&s, "set title 'kvserve bench: ", runs.empty() ? "" : runs.front().workload,
                  " workload, ", open ? "open loop" : "closed loop", "'\n");
  absl::StrAppend(&s, open ? "set xlabel 'offered rate (requests/s)'\n"
                           : "set xlabel 'concurrent streams'\nset logscale x 2\n");
  absl::StrAppend(&s,
                  "set ylabel 'latency (ms)'\nset logscale y\nset y2label 'output tokens/s'\n"
                  "set y2tics\nset ytics nomirror\nset key top left\nset grid\n"
                  "plot $data using 1:2 with linespoints title 'TTFT p50', \\\n"
                  "     $data using 1:3 with linespoints title 'TTFT p99', \\\n"
                  "     $data using 1:4 with linespoints title 'E2E p50', \\\n"
                  "     $data using 1:5 with linespoints title 'E2E p99', \\\n"
                  "     $data using 1:6 with linespoints title 'ITL p50', \\\n"
                  "     $data using 1:7 axes x1y2 with linespoints dt 2 title 'output tok/s'\n");
  return s;
}

absl::Status PlotRuns(const std::vector<RunReport>& runs, const std::string& png_path) {
  if (runs.empty()) return absl::InvalidArgumentError("--plot: no runs to plot");
  const std::string script = GnuplotScript(runs, png_path);
  FILE* pipe = popen("gnuplot 2>&1", "w");
  if (pipe == nullptr) return absl::UnavailableError("--plot: cannot start gnuplot");
  std::fwrite(script.data(), 1, script.size(), pipe);
  const int status = pclose(pipe);
  if (status == -1 || !WIFEXITED(status)) {
    return absl::InternalError("--plot: gnuplot did not exit normally");
  }
  if (WEXITSTATUS(status) == 127) {
    return absl::UnavailableError(
        "--plot: gnuplot not found (install the Debian package gnuplot-nox)");
  }
  if (WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat("--plot: gnuplot failed with exit code ",
                                            WEXITSTATUS(status), " writing ", png_path));
  }
  return absl::OkStatus();
}

}  // namespace kvserve::bench
