#include "bench/loadgen/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace kvserve::bench {
namespace {

using ojson = nlohmann::ordered_json;

ojson LatencyJson(const LatencySummary& s) {
  return ojson{{"count", s.count}, {"mean", s.mean_ms}, {"p50", s.p50_ms},
               {"p90", s.p90_ms},  {"p99", s.p99_ms},   {"max", s.max_ms}};
}

ojson RunJson(const RunReport& r) {
  ojson errors = ojson::object();
  for (const auto& [code, n] : r.errors) errors[code] = n;
  ojson workers = ojson::array();
  for (const WorkerKvPeak& w : r.worker_kv) {
    workers.push_back({{"address", w.address},
                       {"peak_used_blocks", w.peak_used_blocks},
                       {"total_blocks", w.total_blocks}});
  }
  return ojson{{"mode", r.mode},
               {"concurrency", r.concurrency},
               {"rate", r.rate},
               {"workload", r.workload},
               {"duration_s", r.duration_s},
               {"requests", r.requests},
               {"succeeded", r.succeeded},
               {"failed", r.failed},
               {"errors", errors},
               {"requests_per_s", r.requests_per_s},
               {"output_tokens_per_s", r.output_tokens_per_s},
               {"prompt_tokens_per_s", r.prompt_tokens_per_s},
               {"prompt_tokens", r.prompt_tokens},
               {"output_tokens", r.output_tokens},
               {"cached_prompt_tokens", r.cached_prompt_tokens},
               {"prefix_hit_rate", r.prefix_hit_rate},
               {"ttft_ms", LatencyJson(r.ttft)},
               {"itl_ms", LatencyJson(r.itl)},
               {"e2e_ms", LatencyJson(r.e2e)},
               {"max_request_kv_blocks", r.max_request_kv_blocks},
               {"worker_kv", workers}};
}

}  // namespace

double Percentile(std::vector<double>& values, double q) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double rank = std::clamp(q, 0.0, 100.0) / 100.0 * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (values[hi] - values[lo]) * (rank - static_cast<double>(lo));
}

LatencySummary Summarize(std::vector<double> seconds) {
  LatencySummary s;
  s.count = static_cast<int64_t>(seconds.size());
  if (seconds.empty()) return s;
  s.mean_ms = 1e3 * std::accumulate(seconds.begin(), seconds.end(), 0.0) / seconds.size();
  s.p50_ms = 1e3 * Percentile(seconds, 50);
  s.p90_ms = 1e3 * Percentile(seconds, 90);
  s.p99_ms = 1e3 * Percentile(seconds, 99);
  s.max_ms = 1e3 * seconds.back();
  return s;
}

RunReport BuildReport(const std::vector<RequestRecord>& records, double duration_s) {
  RunReport r;
  r.duration_s = duration_s;
  r.requests = static_cast<int64_t>(records.size());
  std::vector<double> ttft, itl, e2e;
  for (const RequestRecord& rec : records) {
    if (rec.code != "OK") {
      ++r.failed;
      ++r.errors[rec.code];
      continue;
    }
    ++r.succeeded;
    r.prompt_tokens += rec.prompt_tokens;
    r.output_tokens += rec.output_tokens;
    r.cached_prompt_tokens += rec.cached_prompt_tokens;
    r.max_request_kv_blocks = std::max<int64_t>(r.max_request_kv_blocks, rec.peak_kv_blocks);
    if (rec.ttft_s >= 0) ttft.push_back(rec.ttft_s);
    itl.insert(itl.end(), rec.itl_s.begin(), rec.itl_s.end());
    e2e.push_back(rec.e2e_s);
  }
  if (duration_s > 0) {
    r.requests_per_s = r.succeeded / duration_s;
    r.output_tokens_per_s = r.output_tokens / duration_s;
    r.prompt_tokens_per_s = r.prompt_tokens / duration_s;
  }
  if (r.prompt_tokens > 0) {
    r.prefix_hit_rate = static_cast<double>(r.cached_prompt_tokens) / r.prompt_tokens;
  }
  r.ttft = Summarize(std::move(ttft));
  r.itl = Summarize(std::move(itl));
  r.e2e = Summarize(std::move(e2e));
  return r;
}

std::string ReportJson(const std::vector<RunReport>& runs) {
  ojson arr = ojson::array();
  for (const RunReport& r : runs) arr.push_back(RunJson(r));
  return ojson{{"runs", arr}}.dump(2);
}

std::string ReportTable(const std::vector<RunReport>& runs) {
  std::string out =
      absl::StrFormat("%-6s %5s %7s %7s %8s %9s | %-23s | %-23s | %-23s | %6s %8s\n", "mode",
                      "conc", "rate", "req/s", "ok/fail", "out tok/s", "TTFT ms p50/p90/p99",
                      "ITL ms p50/p90/p99", "E2E ms p50/p90/p99", "prefix", "kv peak");
  auto lat = [](const LatencySummary& s) {
    return absl::StrFormat("%7.1f/%7.1f/%7.1f", s.p50_ms, s.p90_ms, s.p99_ms);
  };
  for (const RunReport& r : runs) {
    int64_t kv_peak = r.max_request_kv_blocks;
    std::string kv = absl::StrCat(kv_peak);
    if (!r.worker_kv.empty()) {
      int64_t used = 0, total = 0;
      for (const WorkerKvPeak& w : r.worker_kv) {
        used += w.peak_used_blocks;
        total += w.total_blocks;
      }
      kv =
          absl::StrFormat("%lld/%lld", static_cast<long long>(used), static_cast<long long>(total));
    }
    absl::StrAppend(
        &out, absl::StrFormat(
                  "%-6s %5d %7s %7.2f %8s %9.1f | %s | %s | %s | %5.1f%% %8s\n", r.mode,
                  r.concurrency, r.mode == "open" ? absl::StrFormat("%.2f", r.rate) : "-",
                  r.requests_per_s, absl::StrCat(r.succeeded, "/", r.failed), r.output_tokens_per_s,
                  lat(r.ttft), lat(r.itl), lat(r.e2e), 100.0 * r.prefix_hit_rate, kv));
  }
  for (const RunReport& r : runs) {
    for (const auto& [code, n] : r.errors) {
      absl::StrAppend(&out, "  errors (", r.mode, " ", r.concurrency, "): ", code, " x ", n, "\n");
    }
  }
  absl::StrAppend(&out,
                  "kv peak: largest usage.peak_kv_blocks of one request, or (with --workers) the "
                  "sum over workers of peak used / total blocks\n");
  return out;
}

}  // namespace kvserve::bench
