#include "router/worker_pool.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/logging/logging.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/byte_buffer.h"

namespace kvserve {
namespace {

constexpr char kHealthCheckMethod[] = "/grpc.health.v1.Health/Check";

void Log(const std::string& message) {
  logging::Log(logging::LogLevel::kInfo, "router", message);
}

std::chrono::system_clock::time_point DeadlineAfter(absl::Duration timeout) {
  return absl::ToChronoTime(absl::Now() + timeout);
}

// grpc.health.v1.HealthCheckResponse is { ServingStatus status = 1; } with SERVING = 1. The
// request for the server's overall health is the empty message. Decoding the one varint field
// by hand keeps a copy of health.proto (which gRPC does not install) out of the build.
bool IsServing(const grpc::ByteBuffer& response) {
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return false;
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  int status = 0;
  size_t i = 0;
  while (i < bytes.size()) {
    const uint8_t tag = static_cast<uint8_t>(bytes[i++]);
    if (tag != 0x08) return false;  // only field 1 (varint) is expected
    uint64_t value = 0;
    int shift = 0;
    while (i < bytes.size() && shift < 64) {
      const uint8_t b = static_cast<uint8_t>(bytes[i++]);
      value |= static_cast<uint64_t>(b & 0x7f) << shift;
      shift += 7;
      if ((b & 0x80) == 0) break;
    }
    status = static_cast<int>(value);
  }
  return status == 1;
}

WorkerLoad ToWorkerLoad(const v1::LoadReport& report) {
  WorkerLoad load;
  load.running_requests = static_cast<int>(report.running_requests());
  load.waiting_requests = static_cast<int>(report.waiting_requests());
  load.total_blocks = static_cast<int>(report.total_blocks());
  load.free_blocks = static_cast<int>(report.free_blocks());
  // An unknown role (a newer worker's) is served as "both"; ProbeNow logs it.
  load.role = ParseWorkerRole(report.role()).value_or(WorkerRole::kBoth);
  return load;
}

// One worker's probe RPCs; lives on ProbeNow's stack until every callback has run.
struct Probe {
  std::shared_ptr<WorkerHandle> worker;
  grpc::ClientContext health_context;
  grpc::ByteBuffer health_request;
  grpc::ByteBuffer health_response;
  grpc::Status health_status;
  grpc::ClientContext load_context;
  v1::GetLoadRequest load_request;
  v1::LoadReport load_response;
  grpc::Status load_status;
  bool want_info = false;
  grpc::ClientContext info_context;
  v1::GetModelInfoRequest info_request;
  v1::ModelInfo info_response;
  grpc::Status info_status;
};

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseWorkerList(std::string_view list_view,
                                                         std::string_view field_view) {
  const std::string list(list_view);
  const std::string field(field_view);
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    const std::string address(absl::StripAsciiWhitespace(part));
    if (address.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": empty worker address in '", list, "'"));
    }
    if (!seen.insert(address).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": worker '", address, "' is listed twice"));
    }
    out.push_back(address);
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> ResolveWorkers(std::string_view target_view) {
  const std::string target(target_view);
  const size_t colon = target.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(absl::string_view(target.data() + colon + 1, target.size() - colon - 1),
                        &port) ||
      port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "workers-dns: expected NAME:PORT with a port in 1..65535, got '", target, "'"));
  }
  const std::string host(target.substr(0, colon));
  const std::string service = std::to_string(port);
  addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &result);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("workers-dns: cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  std::set<std::string> addresses;
  for (addrinfo* ai = result; ai != nullptr; ai = ai->ai_next) {
    char text[NI_MAXHOST];
    if (getnameinfo(ai->ai_addr, ai->ai_addrlen, text, sizeof(text), nullptr, 0, NI_NUMERICHOST) !=
        0) {
      continue;
    }
    addresses.insert(ai->ai_family == AF_INET6 ? absl::StrCat("[", text, "]:", port)
                                               : absl::StrCat(text, ":", port));
  }
  freeaddrinfo(result);
  return std::vector<std::string>(addresses.begin(), addresses.end());
}

WorkerHandle::WorkerHandle(WorkerId id, std::string address,
                           std::shared_ptr<grpc::ChannelCredentials> credentials,
                           const std::string& tls_server_name)
    : id_(id), address_(std::move(address)) {
  grpc::ChannelArguments args;
  // Come back quickly after a worker restarts; the default backoff grows to two minutes.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  if (!tls_server_name.empty()) args.SetSslTargetNameOverride(tls_server_name);
  channel_ = grpc::CreateCustomChannel(
      address_, credentials != nullptr ? credentials : grpc::InsecureChannelCredentials(), args);
  inference_ = v1::Inference::NewStub(channel_);
  control_ = v1::Worker::NewStub(channel_);
  generic_ = std::make_unique<grpc::GenericStub>(channel_);
}

WorkerHandle::~WorkerHandle() {
  if (kv_thread_.joinable()) kv_thread_.join();
}

bool WorkerHandle::routable() const {
  absl::MutexLock lock(&mu_);
  return healthy_ && !draining_;
}

bool WorkerHandle::healthy() const {
  absl::MutexLock lock(&mu_);
  return healthy_;
}

bool WorkerHandle::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
}

WorkerLoad WorkerHandle::load() const {
  absl::MutexLock lock(&mu_);
  return load_;
}

WorkerRole WorkerHandle::role() const {
  absl::MutexLock lock(&mu_);
  return load_.role;
}

std::optional<v1::ModelInfo> WorkerHandle::model_info() const {
  absl::MutexLock lock(&mu_);
  return model_info_;
}

WorkerPool::WorkerPool(const WorkerPoolOptions& options, PrefixIndex* index)
    : options_(options), index_(index) {}

absl::StatusOr<std::unique_ptr<WorkerPool>> WorkerPool::Create(const WorkerPoolOptions& options,
                                                               PrefixIndex* index) {
  if (options.static_workers.empty() == options.dns_target.empty()) {
    return absl::InvalidArgumentError(
        "workers: give exactly one of a static worker list (--workers) and a DNS target "
        "(--workers-dns)");
  }
  if (options.failure_threshold < 1) {
    return absl::InvalidArgumentError("failure_threshold: must be at least 1");
  }
  if (options.probe_interval <= absl::ZeroDuration() ||
      options.probe_timeout <= absl::ZeroDuration() ||
      options.dns_interval <= absl::ZeroDuration() ||
      options.kv_backoff_min <= absl::ZeroDuration() ||
      options.kv_backoff_max < options.kv_backoff_min) {
    return absl::InvalidArgumentError(
        "probe/dns/backoff intervals: must be positive, kv_backoff_max >= kv_backoff_min");
  }
  std::vector<std::string> addresses = options.static_workers;
  if (!options.dns_target.empty()) {
    absl::StatusOr<std::vector<std::string>> resolved = ResolveWorkers(options.dns_target);
    if (absl::IsInvalidArgument(resolved.status())) return resolved.status();
    // Pods may not exist yet: start empty and keep resolving.
    if (!resolved.ok()) {
      Log(std::string(resolved.status().message()));
    } else {
      addresses = *std::move(resolved);
    }
  }
  std::unique_ptr<WorkerPool> pool(new WorkerPool(options, index));
  pool->SetMembers(addresses);
  pool->ProbeNow();
  if (options.background_probes) {
    pool->background_ = std::thread([p = pool.get()] { p->RunBackground(); });
  }
  return pool;
}

WorkerPool::~WorkerPool() { Shutdown(); }

void WorkerPool::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (background_.joinable()) background_.join();
  std::vector<std::shared_ptr<WorkerHandle>> workers;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    workers = workers_;
  }
  for (const auto& worker : workers) StopKvStream(*worker);
  calls_.WaitForNone();
}

std::vector<std::shared_ptr<WorkerHandle>> WorkerPool::Workers() const {
  absl::MutexLock lock(&mu_);
  return workers_;
}

std::shared_ptr<WorkerHandle> WorkerPool::Find(std::string_view address) const {
  absl::MutexLock lock(&mu_);
  for (const auto& worker : workers_) {
    if (worker->address() == address) return worker;
  }
  return nullptr;
}

void WorkerPool::SetChangeListener(std::function<void()> listener) {
  absl::MutexLock lock(&mu_);
  listener_ = std::move(listener);
}

void WorkerPool::NotifyChange() {
  std::function<void()> listener;
  {
    absl::MutexLock lock(&mu_);
    listener = listener_;
  }
  if (listener) listener();
}

void WorkerPool::SetMembers(const std::vector<std::string>& addresses) {
  std::vector<std::shared_ptr<WorkerHandle>> added;
  std::vector<std::shared_ptr<WorkerHandle>> removed;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    std::vector<std::shared_ptr<WorkerHandle>> next;
    for (const std::string& address : addresses) {
      auto it = std::find_if(workers_.begin(), workers_.end(),
                             [&](const auto& w) { return w->address() == address; });
      if (it != workers_.end()) {
        next.push_back(*it);
      } else {
        next.push_back(std::make_shared<WorkerHandle>(next_id_++, address, options_.credentials,
                                                     options_.tls_server_name));
        added.push_back(next.back());
      }
    }
    for (const auto& worker : workers_) {
      if (std::find(next.begin(), next.end(), worker) == next.end()) removed.push_back(worker);
    }
    workers_ = std::move(next);
  }
  for (const auto& worker : added) {
    Log(absl::StrCat("worker ", worker->address(), " joined the pool"));
    StartKvStream(worker);
  }
  for (const auto& worker : removed) {
    Log(absl::StrCat("worker ", worker->address(), " left the pool"));
    StopKvStream(*worker);
    index_->RemoveWorker(worker->id());
  }
}

void WorkerPool::ResolveNow() {
  if (options_.dns_target.empty()) return;
  absl::StatusOr<std::vector<std::string>> resolved = ResolveWorkers(options_.dns_target);
  if (!resolved.ok()) {
    // Keep the current members: a DNS hiccup must not empty the pool.
    Log(std::string(resolved.status().message()));
    return;
  }
  {
    absl::MutexLock lock(&probe_mu_);
    SetMembers(*resolved);
  }
  NotifyChange();
}

void WorkerPool::ProbeNow() {
  {
    absl::MutexLock probe_lock(&probe_mu_);
    std::vector<std::shared_ptr<WorkerHandle>> workers = Workers();
    std::vector<std::unique_ptr<Probe>> probes;
    // Shared with the callbacks so the last one may still be unlocking it when we return.
    struct Latch {
      absl::Mutex mu;
      int pending ABSL_GUARDED_BY(mu) = 0;
    };
    auto latch = std::make_shared<Latch>();
    auto done = [latch] {
      absl::MutexLock lock(&latch->mu);
      --latch->pending;
    };
    for (const auto& worker : workers) {
      auto probe = std::make_unique<Probe>();
      probe->worker = worker;
      probe->want_info = !worker->model_info().has_value();
      grpc::Slice empty("", 0);
      probe->health_request = grpc::ByteBuffer(&empty, 1);
      probe->health_context.set_deadline(DeadlineAfter(options_.probe_timeout));
      probe->load_context.set_deadline(DeadlineAfter(options_.probe_timeout));
      probe->info_context.set_deadline(DeadlineAfter(options_.probe_timeout));
      {
        absl::MutexLock lock(&latch->mu);
        latch->pending += probe->want_info ? 3 : 2;
      }
      Probe* p = probe.get();
      worker->generic_->UnaryCall(&p->health_context, kHealthCheckMethod, grpc::StubOptions(),
                                  &p->health_request, &p->health_response,
                                  [p, done](grpc::Status s) {
                                    p->health_status = std::move(s);
                                    done();
                                  });
      worker->control().async()->GetLoad(&p->load_context, &p->load_request, &p->load_response,
                                         [p, done](grpc::Status s) {
                                           p->load_status = std::move(s);
                                           done();
                                         });
      if (p->want_info) {
        worker->control().async()->GetModelInfo(&p->info_context, &p->info_request,
                                                &p->info_response, [p, done](grpc::Status s) {
                                                  p->info_status = std::move(s);
                                                  done();
                                                });
      }
      probes.push_back(std::move(probe));
    }
    {
      absl::MutexLock lock(&latch->mu);
      latch->mu.Await(absl::Condition(
          +[](Latch* l) ABSL_NO_THREAD_SAFETY_ANALYSIS { return l->pending == 0; }, latch.get()));
    }
    for (const auto& probe : probes) {
      WorkerHandle& worker = *probe->worker;
      // A worker without the health service is judged by GetLoad alone.
      const bool health_ok = probe->health_status.error_code() == grpc::StatusCode::UNIMPLEMENTED ||
                             (probe->health_status.ok() && IsServing(probe->health_response));
      const bool ok = health_ok && probe->load_status.ok();
      std::string change;
      std::string role_change;
      bool role_unknown = false;
      {
        absl::MutexLock lock(&worker.mu_);
        if (ok) {
          if (!worker.healthy_) change = "admitted (healthy)";
          worker.healthy_ = true;
          worker.consecutive_failures_ = 0;
          worker.load_ = ToWorkerLoad(probe->load_response);
          // Logged when it changes, not on every probe.
          const std::string& role = probe->load_response.role();
          if (role != worker.reported_role_) {
            worker.reported_role_ = role;
            role_unknown = !ParseWorkerRole(role).has_value();
            role_change =
                role_unknown
                    ? absl::StrCat("reports unknown role '", role, "': served as 'both'")
                    : absl::StrCat("role ", std::string(WorkerRoleName(worker.load_.role)));
          }
          if (probe->load_response.draining() && !worker.draining_) change = "draining";
          worker.draining_ = probe->load_response.draining();
          if (probe->want_info && probe->info_status.ok())
            worker.model_info_ = probe->info_response;
        } else {
          ++worker.consecutive_failures_;
          if (worker.healthy_ && worker.consecutive_failures_ >= options_.failure_threshold) {
            worker.healthy_ = false;
            change = absl::StrCat(
                "ejected: ",
                !health_ok
                    ? absl::StrCat("health check ", probe->health_status.ok()
                                                        ? std::string("not SERVING")
                                                        : probe->health_status.error_message())
                    : absl::StrCat("GetLoad ", probe->load_status.error_message()));
          }
        }
      }
      if (!change.empty()) Log(absl::StrCat("worker ", worker.address(), " ", change));
      if (!role_change.empty()) {
        logging::Log(role_unknown ? logging::LogLevel::kWarning : logging::LogLevel::kInfo,
                     "router", absl::StrCat("worker ", worker.address(), " ", role_change));
      }
    }
  }
  NotifyChange();
}

void WorkerPool::ReportFailure(WorkerHandle& worker) {
  bool ejected = false;
  {
    absl::MutexLock lock(&worker.mu_);
    ++worker.consecutive_failures_;
    if (worker.healthy_ && worker.consecutive_failures_ >= options_.failure_threshold) {
      worker.healthy_ = false;
      ejected = true;
    }
  }
  if (ejected) Log(absl::StrCat("worker ", worker.address(), " ejected: requests failing"));
}

void WorkerPool::MarkDraining(WorkerHandle& worker) {
  bool changed = false;
  {
    absl::MutexLock lock(&worker.mu_);
    changed = !worker.draining_;
    worker.draining_ = true;
  }
  if (changed) Log(absl::StrCat("worker ", worker.address(), " draining (refused a request)"));
}

void WorkerPool::StartKvStream(const std::shared_ptr<WorkerHandle>& worker) {
  WorkerHandle* w = worker.get();
  w->kv_thread_ = std::thread([this, w] { RunKvStream(w); });
}

void WorkerPool::StopKvStream(WorkerHandle& worker) {
  {
    absl::MutexLock lock(&worker.mu_);
    worker.kv_stop_ = true;
    if (worker.kv_context_ != nullptr) worker.kv_context_->TryCancel();
  }
  if (worker.kv_thread_.joinable()) worker.kv_thread_.join();
}

void WorkerPool::RunKvStream(WorkerHandle* worker) {
  absl::Duration backoff = options_.kv_backoff_min;
  while (true) {
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&worker->mu_);
      if (worker->kv_stop_) return;
      worker->kv_context_ = &context;
    }
    v1::StreamKvEventsRequest request;
    std::unique_ptr<grpc::ClientReader<v1::KvEventBatch>> reader =
        worker->control().StreamKvEvents(&context, request);
    v1::KvEventBatch batch;
    bool received = false;
    std::vector<KvDelta> deltas;
    while (reader->Read(&batch)) {
      received = true;
      deltas.clear();
      deltas.reserve(batch.events_size());
      for (const v1::KvEvent& event : batch.events()) {
        if (event.type() != v1::KvEvent::TYPE_STORED && event.type() != v1::KvEvent::TYPE_EVICTED) {
          continue;  // unknown event types from a newer worker are skipped
        }
        if (event.tier() < v1::KvEvent::TIER_DEVICE || event.tier() > v1::KvEvent::TIER_DISK) {
          continue;  // a tier this router does not know
        }
        deltas.push_back({event.type() == v1::KvEvent::TYPE_STORED ? KvDelta::Type::kStored
                                                                   : KvDelta::Type::kEvicted,
                          BlockKey{event.key().hi(), event.key().lo()},
                          static_cast<KvTier>(event.tier())});
      }
      index_->Apply(worker->id(), batch.reset(), deltas);
    }
    reader->Finish();
    {
      absl::MutexLock lock(&worker->mu_);
      worker->kv_context_ = nullptr;
    }
    // What the worker caches while we are not listening is unknown: forget it until the next
    // snapshot rather than route on stale keys.
    index_->RemoveWorker(worker->id());
    if (received) backoff = options_.kv_backoff_min;
    {
      absl::MutexLock lock(&worker->mu_);
      if (worker->kv_stop_) return;
      worker->mu_.AwaitWithTimeout(absl::Condition(&worker->kv_stop_), backoff);
      if (worker->kv_stop_) return;
    }
    backoff = std::min(backoff * 2, options_.kv_backoff_max);
  }
}

void WorkerPool::RunBackground() {
  absl::Time next_probe = absl::Now() + options_.probe_interval;
  absl::Time next_dns = absl::Now() + options_.dns_interval;
  while (true) {
    const absl::Time wake =
        options_.dns_target.empty() ? next_probe : std::min(next_probe, next_dns);
    {
      std::unique_lock<std::mutex> lock(stop_mu_);
      if (stop_cv_.wait_until(lock, absl::ToChronoTime(wake), [this] { return stop_; })) return;
    }
    const absl::Time now = absl::Now();
    if (!options_.dns_target.empty() && now >= next_dns) {
      ResolveNow();
      next_dns = now + options_.dns_interval;
    }
    if (now >= next_probe) {
      ProbeNow();
      next_probe = now + options_.probe_interval;
    }
  }
}

}  // namespace kvserve
