#include "bench/loadgen/load_generator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/sdk/client.h"
#include "grpcpp/grpcpp.h"
#include "kvserve/v1/worker.grpc.pb.h"

namespace kvserve::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Polls each worker's GetLoad every 50 ms on its own thread until destroyed, keeping the peak
// of used blocks.
class KvPoller {
 public:
  explicit KvPoller(const std::vector<std::string>& workers) {
    for (const std::string& w : workers) {
      peaks_.push_back({w, 0, 0});
      stubs_.push_back(
          v1::Worker::NewStub(grpc::CreateChannel(w, grpc::InsecureChannelCredentials())));
    }
    if (workers.empty()) return;
    PollOnce();  // at least one sample, however short the run
    thread_ = std::thread([this] { Loop(); });
  }
  ~KvPoller() { Stop(); }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  std::vector<WorkerKvPeak> peaks() const { return peaks_; }

 private:
  void PollOnce() {
    for (size_t i = 0; i < stubs_.size(); ++i) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
      v1::LoadReport report;
      if (stubs_[i]->GetLoad(&ctx, v1::GetLoadRequest(), &report).ok()) {
        peaks_[i].peak_used_blocks =
            std::max<int64_t>(peaks_[i].peak_used_blocks, report.used_blocks());
        peaks_[i].total_blocks = report.total_blocks();
      }
    }
  }

  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(50), [this] { return stop_; })) {
      lock.unlock();
      PollOnce();
      lock.lock();
    }
  }

  std::vector<WorkerKvPeak> peaks_;  // written by the poll thread until Stop()
  std::vector<std::unique_ptr<v1::Worker::Stub>> stubs_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// Sends one request and times it from `scheduled`.
RequestRecord RunOne(Client& client, const BenchRequest& request, Clock::time_point scheduled,
                     Clock::time_point epoch, double timeout_s) {
  RequestRecord rec;
  rec.start_s = Seconds(scheduled - epoch);
  rec.prompt_tokens = static_cast<int>(request.prompt.size());
  GenerateParams params;
  params.prompt_token_ids = request.prompt;
  params.max_tokens = static_cast<uint32_t>(request.max_tokens);
  params.sampling.temperature = 0.0f;
  params.ignore_eos = true;
  CallOptions call;
  call.deadline = absl::Seconds(timeout_s);
  Clock::time_point last;
  bool first = true;
  const absl::Status status = client.Generate(
      params,
      [&](const GenerateChunk& chunk) {
        const Clock::time_point now = Clock::now();
        if (!chunk.token_ids.empty()) {
          if (first) {
            rec.ttft_s = Seconds(now - scheduled);
            first = false;
          } else {
            rec.itl_s.push_back(Seconds(now - last));
          }
          last = now;
          rec.output_tokens += static_cast<int>(chunk.token_ids.size());
        }
        if (chunk.usage.has_value()) {
          rec.prompt_tokens = static_cast<int>(chunk.usage->prompt_tokens);
          rec.cached_prompt_tokens = static_cast<int>(chunk.usage->cached_prompt_tokens);
          rec.peak_kv_blocks = static_cast<int>(chunk.usage->peak_kv_blocks);
        }
      },
      call);
  rec.e2e_s = Seconds(Clock::now() - scheduled);
  if (!status.ok()) rec.code = absl::StatusCodeToString(status.code());
  return rec;
}

// Exponential gaps at `rate` per second from `start`, until `duration_s` (if positive) or
// `count` arrivals (if positive).
std::vector<Clock::time_point> PoissonArrivals(const LoadOptions& o, Clock::time_point start) {
  std::mt19937_64 rng(o.seed);
  std::exponential_distribution<double> gap(o.rate);
  std::vector<Clock::time_point> out;
  double t = 0.0;
  while (true) {
    t += gap(rng);
    if (o.duration_s > 0 && t >= o.duration_s) break;
    if (o.num_requests > 0 && static_cast<int64_t>(out.size()) >= o.num_requests) break;
    out.push_back(start +
                  std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(t)));
  }
  return out;
}

}  // namespace

absl::StatusOr<LoadMode> ParseLoadMode(const std::string& name) {
  if (name == "closed") return LoadMode::kClosed;
  if (name == "open") return LoadMode::kOpen;
  return absl::InvalidArgumentError(absl::StrCat("--mode '", name, "' is not closed or open"));
}

absl::Status ValidateLoadOptions(const LoadOptions& o) {
  if (o.endpoint.empty()) return absl::InvalidArgumentError("--endpoint is required");
  if ((o.duration_s > 0) == (o.num_requests > 0)) {
    return absl::InvalidArgumentError("give exactly one of --duration (> 0) and --requests (> 0)");
  }
  if (o.duration_s < 0 || o.num_requests < 0) {
    return absl::InvalidArgumentError("--duration and --requests must not be negative");
  }
  if (o.mode == LoadMode::kClosed && o.concurrency < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--concurrency must be at least 1, got ", o.concurrency));
  }
  if (o.mode == LoadMode::kOpen && !(o.rate > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("--rate must be positive, got ", o.rate));
  }
  if (o.max_attempts < 1) return absl::InvalidArgumentError("max_attempts must be at least 1");
  if (o.max_inflight < 1) return absl::InvalidArgumentError("--max-inflight must be at least 1");
  if (!(o.request_timeout_s > 0)) return absl::InvalidArgumentError("--timeout must be positive");
  return absl::OkStatus();
}

absl::StatusOr<EndpointModel> QueryEndpointModel(const std::string& endpoint, double timeout_s) {
  ClientOptions copts;
  copts.connect_timeout = absl::Seconds(timeout_s);
  copts.default_deadline = absl::Seconds(timeout_s);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(endpoint, copts);
  if (!client.ok()) return client.status();
  absl::StatusOr<std::vector<ModelInfo>> models = (*client)->ListModels();
  if (!models.ok()) {
    return absl::Status(models.status().code(),
                        absl::StrCat(endpoint, ": ListModels: ", models.status().message()));
  }
  if (models->empty()) return absl::UnavailableError(absl::StrCat(endpoint, " serves no model"));
  const ModelInfo& m = models->front();
  return EndpointModel{m.name, static_cast<int>(m.vocab_size), static_cast<int>(m.max_model_len)};
}

absl::StatusOr<RunReport> RunLoad(const LoadOptions& o, const Workload& workload) {
  if (absl::Status s = ValidateLoadOptions(o); !s.ok()) return s;
  ClientOptions copts;
  copts.max_attempts = o.max_attempts;
  copts.connect_timeout = absl::Seconds(10);
  absl::StatusOr<std::unique_ptr<Client>> connected = Client::Connect(o.endpoint, copts);
  if (!connected.ok()) return connected.status();
  Client& client = **connected;

  std::vector<RequestRecord> records;
  std::mutex records_mu;
  auto record = [&](RequestRecord r) {
    std::lock_guard<std::mutex> lock(records_mu);
    records.push_back(std::move(r));
  };
  KvPoller poller(o.workers);
  const Clock::time_point epoch = Clock::now();
  std::atomic<int64_t> next{0};
  // Everything the client threads read outlives them: they are joined at the end of this
  // function, after both branches.
  const Clock::time_point stop_at =
      epoch + std::chrono::duration_cast<Clock::duration>(
                  std::chrono::duration<double>(o.duration_s > 0 ? o.duration_s : 1e9));
  const std::vector<Clock::time_point> arrivals =
      o.mode == LoadMode::kOpen ? PoissonArrivals(o, epoch) : std::vector<Clock::time_point>{};
  std::vector<std::thread> threads;
  if (o.mode == LoadMode::kClosed) {
    for (int t = 0; t < o.concurrency; ++t) {
      threads.emplace_back([&] {
        while (true) {
          const int64_t i = next.fetch_add(1);
          if (o.num_requests > 0 && i >= o.num_requests) break;
          const Clock::time_point now = Clock::now();
          if (now >= stop_at) break;
          record(RunOne(client, workload.Make(o.first_request_index + i), now, epoch,
                        o.request_timeout_s));
        }
      });
    }
  } else {
    const int num_threads =
        static_cast<int>(std::min<int64_t>(o.max_inflight, std::max<size_t>(1, arrivals.size())));
    for (int t = 0; t < num_threads; ++t) {
      threads.emplace_back([&] {
        while (true) {
          const int64_t i = next.fetch_add(1);
          if (i >= static_cast<int64_t>(arrivals.size())) break;
          const Clock::time_point at = arrivals[i];
          std::this_thread::sleep_until(at);  // the arrival process, not synchronisation
          record(RunOne(client, workload.Make(o.first_request_index + i), at, epoch,
                        o.request_timeout_s));
        }
      });
    }
  }
  for (std::thread& t : threads) t.join();
  const double duration = Seconds(Clock::now() - epoch);
  poller.Stop();
  RunReport report = BuildReport(records, duration);
  report.mode = o.mode == LoadMode::kClosed ? "closed" : "open";
  report.concurrency = o.mode == LoadMode::kClosed ? o.concurrency : o.max_inflight;
  report.rate = o.mode == LoadMode::kOpen ? o.rate : 0.0;
  report.workload = WorkloadKindName(workload.options().kind);
  report.worker_kv = poller.peaks();
  return report;
}

}  // namespace kvserve::bench
