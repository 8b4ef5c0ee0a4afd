// `kvserve bench`: load a router or worker over gRPC and report throughput and latency.

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/loadgen/load_generator.h"
#include "bench/loadgen/plot.h"
#include "client/cli/command.h"

namespace kvserve::cli {
namespace {

struct BenchFlags {
  bench::LoadOptions load;
  std::string mode = "closed";
  std::string workload = "chat";
  std::string workers;
  std::string sweep;
  bench::WorkloadOptions shape;
  int warmup = 1;
  bool json = false;
  std::string plot;
};

absl::StatusOr<std::vector<int>> ParseLevels(const std::string& list) {
  std::vector<int> levels;
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    int v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--sweep-concurrency: '", part, "' is not a positive integer (want e.g. 1,2,4,8)"));
    }
    levels.push_back(v);
  }
  if (levels.empty()) return absl::InvalidArgumentError("--sweep-concurrency is empty");
  return levels;
}

int RunBench(BenchFlags f) {
  absl::StatusOr<bench::LoadMode> mode = bench::ParseLoadMode(f.mode);
  if (!mode.ok()) return ReportError("bench", mode.status());
  f.load.mode = *mode;
  absl::StatusOr<bench::WorkloadKind> kind = bench::ParseWorkloadKind(f.workload);
  if (!kind.ok()) return ReportError("bench", kind.status());
  f.shape.kind = *kind;
  f.shape.seed = f.load.seed;
  for (absl::string_view w : absl::StrSplit(f.workers, ',', absl::SkipEmpty())) {
    f.load.workers.emplace_back(w);
  }
  if (absl::Status s = bench::ValidateLoadOptions(f.load); !s.ok()) return ReportError("bench", s);
  std::vector<int> levels = {f.load.concurrency};
  if (!f.sweep.empty()) {
    if (f.load.mode != bench::LoadMode::kClosed) {
      return ReportError("bench",
                         absl::InvalidArgumentError("--sweep-concurrency needs --mode closed"));
    }
    absl::StatusOr<std::vector<int>> parsed = ParseLevels(f.sweep);
    if (!parsed.ok()) return ReportError("bench", parsed.status());
    levels = *parsed;
  }
  absl::StatusOr<bench::EndpointModel> model = bench::QueryEndpointModel(f.load.endpoint, 30);
  if (!model.ok()) return ReportError("bench", model.status());
  f.shape.vocab_size = model->vocab_size;
  f.shape.max_model_len = model->max_model_len;
  absl::StatusOr<bench::Workload> workload = bench::Workload::Create(f.shape);
  if (!workload.ok()) return ReportError("bench", workload.status());
  if (f.warmup > 0) {
    // Unmeasured requests, retried while UNAVAILABLE, so the run does not time a cluster that
    // is still admitting its workers.
    bench::LoadOptions warm_load = f.load;
    warm_load.max_attempts = 4;
    warm_load.first_request_index = int64_t{1} << 40;
    warm_load.mode = bench::LoadMode::kClosed;
    warm_load.concurrency = 1;
    warm_load.duration_s = 0;
    warm_load.num_requests = f.warmup;
    warm_load.workers.clear();
    absl::StatusOr<bench::RunReport> r = bench::RunLoad(warm_load, *workload);
    if (!r.ok()) return ReportError("bench", r.status());
    if (r->failed > 0) {
      std::fprintf(stderr, "kvserve bench: warning: %lld of %lld warm-up requests failed (%s)\n",
                   static_cast<long long>(r->failed), static_cast<long long>(r->requests),
                   r->errors.begin()->first.c_str());
    }
  }
  std::vector<bench::RunReport> runs;
  for (size_t i = 0; i < levels.size(); ++i) {
    const int level = levels[i];
    bench::LoadOptions load = f.load;
    load.concurrency = level;
    load.first_request_index = static_cast<int64_t>(i) << 32;
    if (!f.json) {
      std::fprintf(stderr, "kvserve bench: %s loop, %s workload, %s on %s (%s)...\n",
                   f.mode.c_str(), f.workload.c_str(),
                   load.mode == bench::LoadMode::kClosed
                       ? absl::StrCat(level, " streams").c_str()
                       : absl::StrCat(load.rate, " requests/s").c_str(),
                   load.endpoint.c_str(), model->name.c_str());
    }
    absl::StatusOr<bench::RunReport> r = bench::RunLoad(load, *workload);
    if (!r.ok()) return ReportError("bench", r.status());
    runs.push_back(*std::move(r));
  }
  if (f.json) {
    std::printf("%s\n", bench::ReportJson(runs).c_str());
  } else {
    std::printf("%s", bench::ReportTable(runs).c_str());
  }
  if (!f.plot.empty()) {
    if (absl::Status s = bench::PlotRuns(runs, f.plot); !s.ok()) return ReportError("bench", s);
    if (!f.json) std::printf("kvserve bench: wrote %s\n", f.plot.c_str());
  }
  return 0;
}

}  // namespace

Command AddBenchCommand(CLI::App& app) {
  auto f = std::make_shared<BenchFlags>();
  CLI::App* sub = app.add_subcommand(
      "bench", "Load a kvserve router or worker and report throughput and latency percentiles.");
  sub->add_option("--endpoint", f->load.endpoint, "HOST:PORT of a router or worker")->required();
  sub->add_option("--mode", f->mode, "closed (fixed concurrency) or open (Poisson arrivals)")
      ->capture_default_str();
  sub->add_option("--concurrency", f->load.concurrency, "Streams of the closed loop")
      ->capture_default_str();
  sub->add_option("--rate", f->load.rate, "Requests/s of the open loop")->capture_default_str();
  sub->add_option("--max-inflight", f->load.max_inflight, "Most requests in flight (open loop)")
      ->capture_default_str();
  auto* duration = sub->add_option("--duration", f->load.duration_s, "Seconds to issue requests");
  auto* requests = sub->add_option("--requests", f->load.num_requests, "Requests to issue");
  duration->excludes(requests);
  sub->add_option("--workload", f->workload, "chat, shared-prefix or long-context")
      ->capture_default_str();
  sub->add_option("--prompt-len", f->shape.prompt_len,
                  "Median prompt (chat), user turn (shared-prefix) or exact prompt (long-context) "
                  "tokens; 0 = workload default");
  sub->add_option("--output-len", f->shape.output_len,
                  "Median (exact for long-context) generated tokens; 0 = workload default");
  sub->add_option("--prefix-len", f->shape.prefix_len,
                  "Shared system prompt tokens (shared-prefix); 0 = 256");
  sub->add_option("--seed", f->load.seed, "Seed of prompts and arrivals")->capture_default_str();
  sub->add_option("--timeout", f->load.request_timeout_s, "Deadline of each request, seconds")
      ->capture_default_str();
  sub->add_option("--workers", f->workers,
                  "Worker addresses A,B,... whose KV pools are polled (GetLoad) for peak usage");
  sub->add_option("--warmup", f->warmup, "Unmeasured requests sent first")->capture_default_str();
  sub->add_option("--sweep-concurrency", f->sweep, "Closed-loop levels to run in turn: 1,2,4,8");
  sub->add_flag("--json", f->json, "Print the report as JSON");
  sub->add_option("--plot", f->plot, "Draw latency vs load into this PNG (needs gnuplot)");
  return {sub, [f] { return RunBench(*f); }};
}

}  // namespace kvserve::cli
