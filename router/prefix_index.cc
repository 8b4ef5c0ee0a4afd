#include "router/prefix_index.h"

#include <algorithm>

namespace kvserve {

void PrefixIndex::Apply(WorkerId worker, bool reset, std::span<const KvDelta> deltas) {
  absl::MutexLock lock(&mu_);
  if (reset) RemoveWorkerLocked(worker);
  for (const KvDelta& delta : deltas) {
    if (delta.type == KvDelta::Type::kStored) {
      StoreLocked(worker, delta.key);
    } else {
      EvictLocked(worker, delta.key);
    }
  }
}

void PrefixIndex::RemoveWorker(WorkerId worker) {
  absl::MutexLock lock(&mu_);
  RemoveWorkerLocked(worker);
}

void PrefixIndex::StoreLocked(WorkerId worker, const BlockKey& key) {
  if (!by_worker_[worker].insert(key).second) return;
  holders_[key].push_back(worker);
}

void PrefixIndex::EvictLocked(WorkerId worker, const BlockKey& key) {
  auto keys = by_worker_.find(worker);
  if (keys == by_worker_.end() || keys->second.erase(key) == 0) return;
  auto it = holders_.find(key);
  if (it == holders_.end()) return;
  auto& workers = it->second;
  workers.erase(std::remove(workers.begin(), workers.end(), worker), workers.end());
  if (workers.empty()) holders_.erase(it);
}

void PrefixIndex::RemoveWorkerLocked(WorkerId worker) {
  auto keys = by_worker_.find(worker);
  if (keys == by_worker_.end()) return;
  for (const BlockKey& key : keys->second) {
    auto it = holders_.find(key);
    if (it == holders_.end()) continue;
    auto& workers = it->second;
    workers.erase(std::remove(workers.begin(), workers.end(), worker), workers.end());
    if (workers.empty()) holders_.erase(it);
  }
  by_worker_.erase(keys);
}

int PrefixIndex::MatchedBlocks(WorkerId worker, std::span<const BlockKey> keys) const {
  const WorkerId workers[] = {worker};
  return MatchedBlocks(workers, keys)[0];
}

std::vector<int> PrefixIndex::MatchedBlocks(std::span<const WorkerId> workers,
                                            std::span<const BlockKey> keys) const {
  std::vector<int> matched(workers.size(), 0);
  // still[i]: workers[i] has held every key so far.
  std::vector<bool> still(workers.size(), true);
  size_t alive = workers.size();
  absl::MutexLock lock(&mu_);
  for (size_t k = 0; k < keys.size() && alive > 0; ++k) {
    auto it = holders_.find(keys[k]);
    for (size_t i = 0; i < workers.size(); ++i) {
      if (!still[i]) continue;
      const bool held = it != holders_.end() && std::find(it->second.begin(), it->second.end(),
                                                          workers[i]) != it->second.end();
      if (held) {
        ++matched[i];
      } else {
        still[i] = false;
        --alive;
      }
    }
  }
  return matched;
}

size_t PrefixIndex::NumBlocks(WorkerId worker) const {
  absl::MutexLock lock(&mu_);
  auto it = by_worker_.find(worker);
  return it == by_worker_.end() ? 0 : it->second.size();
}

size_t PrefixIndex::NumKeys() const {
  absl::MutexLock lock(&mu_);
  return holders_.size();
}

bool PrefixIndex::WaitForBlockCount(WorkerId worker, size_t count, absl::Duration timeout) const {
  auto reached = [this, worker, count]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = by_worker_.find(worker);
    return (it == by_worker_.end() ? 0 : it->second.size()) == count;
  };
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
}

}  // namespace kvserve
