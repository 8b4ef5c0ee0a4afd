#include "router/dispatcher.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "router/router_metrics.h"

namespace kvserve {
namespace {

// The worker holding the longest leading run of a request's blocks: most matched blocks, then
// most of them on the device, then the earliest. `matched` must not be empty.
size_t BestHolder(const std::vector<PrefixMatchCount>& matched) {
  size_t best = 0;
  for (size_t i = 1; i < matched.size(); ++i) {
    const PrefixMatchCount& a = matched[i];
    const PrefixMatchCount& b = matched[best];
    if (a.blocks > b.blocks || (a.blocks == b.blocks && a.device_blocks > b.device_blocks)) {
      best = i;
    }
  }
  return best;
}

}  // namespace

Dispatcher::Dispatcher(const DispatcherOptions& options, WorkerPool* pool, PrefixIndex* index,
                       RoutingPolicy* policy)
    : options_(options), pool_(pool), index_(index), policy_(policy) {}

Reservation Dispatcher::ReserveLocked(const PendingRequest& request) {
  // Every routable worker the request may go to can be pulled from, a full one included:
  // handing a busy holder's requests to an idle worker is the point of a transfer. Only those
  // with a free slot are candidates.
  std::vector<std::shared_ptr<WorkerHandle>> routable;
  std::vector<size_t> candidates;  // indices into `routable`
  for (auto& worker : pool_->Workers()) {
    if (!worker->routable() || request.Excludes(worker->id())) continue;
    if (worker->in_flight() < options_.max_inflight_per_worker) {
      candidates.push_back(routable.size());
    }
    routable.push_back(std::move(worker));
  }
  if (candidates.empty()) return {};
  RoutingRequest routing = request.routing_request();
  routing.block_size = options_.block_size;
  std::vector<WorkerId> ids;
  ids.reserve(routable.size());
  for (const auto& worker : routable) ids.push_back(worker->id());
  const std::vector<PrefixMatchCount> matched = index_->MatchedBlocks(ids, routing.block_keys);
  const size_t holder = BestHolder(matched);
  // The longest run held by a worker other than the best holder: what the best holder itself
  // could pull.
  int runner_up_blocks = 0;
  for (size_t i = 0; i < routable.size(); ++i) {
    if (i != holder) runner_up_blocks = std::max(runner_up_blocks, matched[i].blocks);
  }
  std::vector<WorkerView> views(candidates.size());
  for (size_t c = 0; c < candidates.size(); ++c) {
    const size_t i = candidates[c];
    views[c].address = routable[i]->address();
    views[c].in_flight = routable[i]->in_flight();
    views[c].capacity = options_.max_inflight_per_worker;
    views[c].load = routable[i]->load();
    views[c].matched_blocks = matched[i].blocks;
    views[c].matched_device_blocks = matched[i].device_blocks;
    views[c].pullable_blocks = i == holder ? runner_up_blocks : matched[holder].blocks;
  }
  WorkerChoice choice = policy_->Choose(routing, views);
  if (choice.index >= candidates.size()) choice.index = 0;  // a broken policy must not crash us
  const size_t chosen = candidates[choice.index];
  Reservation reservation;
  reservation.worker = routable[chosen];
  reservation.worker->AddInFlight(1);
  // When the best holder is another worker, no worker holds more than it: it is the one to
  // pull from, and only if it holds more than the chosen worker.
  if (policy_->wants_kv_transfer_hints() && holder != chosen &&
      matched[holder].blocks > matched[chosen].blocks) {
    reservation.kv_source = KvTransferHint{.worker = routable[holder]->address(),
                                           .first_block = matched[chosen].blocks,
                                           .num_blocks = matched[holder].blocks};
  }
  if (metrics_ != nullptr) {
    metrics_->RecordRouting(matched[chosen].blocks * options_.block_size);
    if (reservation.kv_source.has_value()) metrics_->RecordKvTransferHint();
  }
  return reservation;
}

absl::Status Dispatcher::Submit(PendingRequest* request) {
  Reservation reservation;
  {
    absl::MutexLock lock(&mu_);
    // FIFO: a new request may not overtake queued ones.
    if (queue_.empty()) reservation = ReserveLocked(*request);
    if (reservation.worker == nullptr) {
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
  request->Start(std::move(reservation));
  return absl::OkStatus();
}

Reservation Dispatcher::ReserveNow(PendingRequest* request) {
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
  std::vector<std::pair<PendingRequest*, Reservation>> starts;
  std::vector<PendingRequest*> rejects;
  {
    absl::MutexLock lock(&mu_);
    while (!queue_.empty()) {
      Reservation reservation = ReserveLocked(*queue_.front());
      if (reservation.worker == nullptr) break;
      starts.emplace_back(queue_.front(), std::move(reservation));
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
  for (auto& [request, reservation] : starts) request->Start(std::move(reservation));
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
