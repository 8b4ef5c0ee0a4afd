#include "router/dispatcher.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "router/router_metrics.h"

namespace kvserve {

Dispatcher::Dispatcher(const DispatcherOptions& options, WorkerPool* pool, PrefixIndex* index,
                       RoutingPolicy* policy)
    : options_(options), pool_(pool), index_(index), policy_(policy) {}

std::shared_ptr<WorkerHandle> Dispatcher::ReserveLocked(const PendingRequest& request) {
  std::vector<std::shared_ptr<WorkerHandle>> candidates;
  for (auto& worker : pool_->Workers()) {
    if (!worker->routable() || request.Excludes(worker->id()) ||
        worker->in_flight() >= options_.max_inflight_per_worker) {
      continue;
    }
    candidates.push_back(std::move(worker));
  }
  if (candidates.empty()) return nullptr;
  RoutingRequest routing = request.routing_request();
  routing.block_size = options_.block_size;
  std::vector<WorkerId> ids;
  ids.reserve(candidates.size());
  for (const auto& worker : candidates) ids.push_back(worker->id());
  const std::vector<PrefixMatchCount> matched = index_->MatchedBlocks(ids, routing.block_keys);
  std::vector<WorkerView> views(candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) {
    views[i].address = candidates[i]->address();
    views[i].in_flight = candidates[i]->in_flight();
    views[i].capacity = options_.max_inflight_per_worker;
    views[i].load = candidates[i]->load();
    views[i].matched_blocks = matched[i].blocks;
    views[i].matched_device_blocks = matched[i].device_blocks;
  }
  WorkerChoice choice = policy_->Choose(routing, views);
  if (choice.index >= candidates.size()) choice.index = 0;  // a broken policy must not crash us
  std::shared_ptr<WorkerHandle> chosen = std::move(candidates[choice.index]);
  chosen->AddInFlight(1);
  if (metrics_ != nullptr)
    metrics_->RecordRouting(matched[choice.index].blocks * options_.block_size);
  return chosen;
}

absl::Status Dispatcher::Submit(PendingRequest* request) {
  std::shared_ptr<WorkerHandle> worker;
  {
    absl::MutexLock lock(&mu_);
    // FIFO: a new request may not overtake queued ones.
    if (queue_.empty()) worker = ReserveLocked(*request);
    if (worker == nullptr) {
      int routable = 0;
      for (const auto& w : pool_->Workers()) routable += w->routable() ? 1 : 0;
      if (routable == 0) {
        if (metrics_ != nullptr) metrics_->RecordRejection("no_worker");
        return absl::UnavailableError(absl::StrCat("no healthy worker to serve the request (",
                                                   pool_->Workers().size(), " known)"));
      }
      if (queue_.size() >= static_cast<size_t>(options_.max_queue)) {
        if (metrics_ != nullptr) metrics_->RecordRejection("overloaded");
        return absl::ResourceExhaustedError(absl::StrCat(
            "router overloaded: all ", routable, " healthy workers have ",
            options_.max_inflight_per_worker, " requests in flight and ", queue_.size(),
            " requests are queued (--max-queue ", options_.max_queue, "); retry after ",
            absl::ToInt64Milliseconds(options_.retry_after), " ms"));
      }
      queue_.push_back(request);
      return absl::OkStatus();
    }
  }
  request->Start(std::move(worker));
  return absl::OkStatus();
}

std::shared_ptr<WorkerHandle> Dispatcher::ReserveNow(PendingRequest* request) {
  absl::MutexLock lock(&mu_);
  return ReserveLocked(*request);
}

bool Dispatcher::Withdraw(PendingRequest* request) {
  absl::MutexLock lock(&mu_);
  auto it = std::find(queue_.begin(), queue_.end(), request);
  if (it == queue_.end()) return false;
  queue_.erase(it);
  return true;
}

void Dispatcher::Release(WorkerHandle& worker) {
  {
    absl::MutexLock lock(&mu_);
    worker.AddInFlight(-1);
  }
  Pump();
}

void Dispatcher::Pump() {
  std::vector<std::pair<PendingRequest*, std::shared_ptr<WorkerHandle>>> starts;
  std::vector<PendingRequest*> rejects;
  {
    absl::MutexLock lock(&mu_);
    while (!queue_.empty()) {
      std::shared_ptr<WorkerHandle> worker = ReserveLocked(*queue_.front());
      if (worker == nullptr) break;
      starts.emplace_back(queue_.front(), std::move(worker));
      queue_.pop_front();
    }
    if (!queue_.empty()) {
      bool any_routable = false;
      for (const auto& w : pool_->Workers()) any_routable = any_routable || w->routable();
      if (!any_routable) {
        rejects.assign(queue_.begin(), queue_.end());
        queue_.clear();
      }
    }
  }
  for (auto& [request, worker] : starts) request->Start(std::move(worker));
  for (PendingRequest* request : rejects) {
    if (metrics_ != nullptr) metrics_->RecordRejection("no_worker");
    request->Reject(absl::UnavailableError("no healthy worker left to serve the queued request"));
  }
}

size_t Dispatcher::queued() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

bool Dispatcher::WaitForQueued(size_t count, absl::Duration timeout) const {
  auto reached = [this, count]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.size() == count; };
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
}

}  // namespace kvserve
