#include "router/dispatcher.h"

#include <algorithm>
#include <span>
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

// The routable workers one reservation may use. Every one of them can be pulled from, a full
// one included: handing a busy holder's requests to an idle worker is the point of a transfer.
// Only those with a free slot are candidates: to stream the tokens, and (in disaggregated
// serving) to compute the prompt first.
struct RoutableSet {
  std::vector<std::shared_ptr<WorkerHandle>> workers;
  /// Indices into `workers`.
  std::vector<size_t> candidates;
  std::vector<size_t> prefill_candidates;
  int capacity = 1;
  /// Per worker, from Match.
  std::vector<PrefixMatchCount> matched;
  size_t holder = 0;
  /// The longest run held by a worker other than the best holder: what the holder could pull.
  int runner_up_blocks = 0;

  void Match(const PrefixIndex& index, std::span<const BlockKey> keys) {
    std::vector<WorkerId> ids;
    ids.reserve(workers.size());
    for (const auto& worker : workers) ids.push_back(worker->id());
    matched = index.MatchedBlocks(ids, keys);
    holder = BestHolder(matched);
    for (size_t i = 0; i < workers.size(); ++i) {
      if (i != holder) runner_up_blocks = std::max(runner_up_blocks, matched[i].blocks);
    }
  }

  std::vector<WorkerView> ViewsOf(const std::vector<size_t>& indices) const {
    std::vector<WorkerView> views(indices.size());
    for (size_t c = 0; c < indices.size(); ++c) {
      const size_t i = indices[c];
      views[c].address = workers[i]->address();
      views[c].in_flight = workers[i]->in_flight();
      views[c].capacity = capacity;
      views[c].load = workers[i]->load();
      views[c].matched_blocks = matched[i].blocks;
      views[c].matched_device_blocks = matched[i].device_blocks;
      views[c].pullable_blocks = i == holder ? runner_up_blocks : matched[holder].blocks;
    }
    return views;
  }
};

// The prefill phase: reserves a prefill worker (picked by `policy` among the prefill
// candidates) when the chosen decode worker would otherwise compute some of the prompt's usable
// blocks: full ones, but not one holding the prompt's last token, which the decode worker
// computes anyway for its logits, and only when the blocks it lacks hold at least `min_tokens`
// tokens. When another worker already holds every usable block the ordinary hint covers them and
// no prefill is needed.
void PlanPrefill(const RoutingRequest& routing, const RoutableSet& set, size_t chosen,
                 int min_tokens, RoutingPolicy& policy, Reservation* reservation) {
  const int usable_blocks = std::max(0, (routing.prompt_tokens - 1) / routing.block_size);
  const int own_blocks = set.matched[chosen].blocks;
  if (own_blocks >= usable_blocks) return;
  if ((usable_blocks - own_blocks) * routing.block_size < min_tokens) return;
  if (reservation->kv_source.has_value() && reservation->kv_source->num_blocks >= usable_blocks) {
    return;
  }
  WorkerChoice choice = policy.Choose(routing, set.ViewsOf(set.prefill_candidates));
  if (choice.index >= set.prefill_candidates.size()) choice.index = 0;
  reservation->prefill_worker = set.workers[set.prefill_candidates[choice.index]];
  reservation->prefill_worker->AddInFlight(1);
  reservation->prefill_kv_source = KvTransferHint{.worker = reservation->prefill_worker->address(),
                                                  .first_block = own_blocks,
                                                  .num_blocks = usable_blocks};
}

}  // namespace

absl::StatusOr<DisaggregationMode> ParseDisaggregationMode(std::string_view name) {
  if (name == "auto") return DisaggregationMode::kAuto;
  if (name == "off") return DisaggregationMode::kOff;
  return absl::InvalidArgumentError(
      absl::StrCat("disaggregation: expected 'auto' or 'off', got '", std::string(name), "'"));
}

Dispatcher::Dispatcher(const DispatcherOptions& options, WorkerPool* pool, PrefixIndex* index,
                       RoutingPolicy* policy)
    : options_(options), pool_(pool), index_(index), policy_(policy) {}

Reservation Dispatcher::ReserveLocked(const PendingRequest& request, PrefillPhase phase) {
  RoutableSet set;
  set.capacity = options_.max_inflight_per_worker;
  std::vector<WorkerRole> roles;
  for (auto& worker : pool_->Workers()) {
    if (!worker->routable() || request.Excludes(worker->id())) continue;
    roles.push_back(options_.disaggregation == DisaggregationMode::kOff ? WorkerRole::kBoth
                                                                        : worker->role());
    set.workers.push_back(std::move(worker));
  }
  // Prefill workers serve token streams only when nothing else is routable, so that a cluster
  // of prefill workers alone still answers.
  const bool split = std::find(roles.begin(), roles.end(), WorkerRole::kPrefill) != roles.end() &&
                     std::any_of(roles.begin(), roles.end(),
                                 [](WorkerRole r) { return r != WorkerRole::kPrefill; });
  for (size_t i = 0; i < set.workers.size(); ++i) {
    if (set.workers[i]->in_flight() >= set.capacity) continue;
    (split && roles[i] == WorkerRole::kPrefill ? set.prefill_candidates : set.candidates)
        .push_back(i);
  }
  if (set.candidates.empty()) return {};
  RoutingRequest routing = request.routing_request();
  routing.block_size = options_.block_size;
  set.Match(*index_, routing.block_keys);
  WorkerChoice choice = policy_->Choose(routing, set.ViewsOf(set.candidates));
  if (choice.index >= set.candidates.size()) choice.index = 0;  // a broken policy must not crash us
  const size_t chosen = set.candidates[choice.index];
  Reservation reservation;
  reservation.worker = set.workers[chosen];
  reservation.worker->AddInFlight(1);
  // When the best holder is another worker, no worker holds more than it: it is the one to
  // pull from, and only if it holds more than the chosen worker.
  const PrefixMatchCount& held = set.matched[set.holder];
  if (policy_->wants_kv_transfer_hints() && set.holder != chosen &&
      held.blocks > set.matched[chosen].blocks) {
    reservation.kv_source = KvTransferHint{.worker = set.workers[set.holder]->address(),
                                           .first_block = set.matched[chosen].blocks,
                                           .num_blocks = held.blocks};
  }
  if (phase == PrefillPhase::kAllowed && !set.prefill_candidates.empty()) {
    PlanPrefill(routing, set, chosen, options_.disaggregation_min_tokens,
                prefill_policy_ != nullptr ? *prefill_policy_ : *policy_, &reservation);
  }
  if (metrics_ != nullptr) {
    metrics_->RecordRouting(set.matched[chosen].blocks * options_.block_size);
    if (reservation.kv_source.has_value()) metrics_->RecordKvTransferHint();
  }
  return reservation;
}

absl::Status Dispatcher::Submit(PendingRequest* request) {
  Reservation reservation;
  {
    absl::MutexLock lock(&mu_);
    // FIFO: a new request may not overtake queued ones.
    if (queue_.empty()) reservation = ReserveLocked(*request, PrefillPhase::kAllowed);
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
  return ReserveLocked(*request, PrefillPhase::kNever);
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
      Reservation reservation = ReserveLocked(*queue_.front(), PrefillPhase::kAllowed);
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
