#include "router/prefix_index.h"

#include <algorithm>

namespace kvserve {

void PrefixIndex::Apply(WorkerId worker, bool reset, std::span<const KvDelta> deltas) {
  absl::MutexLock lock(&mu_);
  if (reset) RemoveWorkerLocked(worker);
  for (const KvDelta& delta : deltas) {
    if (delta.type == KvDelta::Type::kStored) {
      StoreLocked(worker, delta.key, delta.tier);
    } else {
      EvictLocked(worker, delta.key, delta.tier);
    }
  }
}

void PrefixIndex::RemoveWorker(WorkerId worker) {
  absl::MutexLock lock(&mu_);
  RemoveWorkerLocked(worker);
}

void PrefixIndex::StoreLocked(WorkerId worker, const BlockKey& key, KvTier tier) {
  uint8_t& tiers = by_worker_[worker][key];
  const bool was_held = tiers != 0;
  tiers |= static_cast<uint8_t>(1u << static_cast<unsigned>(tier));
  if (!was_held) holders_[key].push_back(worker);
}

void PrefixIndex::EvictLocked(WorkerId worker, const BlockKey& key, KvTier tier) {
  auto keys = by_worker_.find(worker);
  if (keys == by_worker_.end()) return;
  auto entry = keys->second.find(key);
  if (entry == keys->second.end()) return;
  entry->second &= static_cast<uint8_t>(~(1u << static_cast<unsigned>(tier)));
  if (entry->second != 0) return;  // another tier still holds it
  keys->second.erase(entry);
  auto it = holders_.find(key);
  if (it == holders_.end()) return;
  auto& workers = it->second;
  workers.erase(std::remove(workers.begin(), workers.end(), worker), workers.end());
  if (workers.empty()) holders_.erase(it);
}

void PrefixIndex::RemoveWorkerLocked(WorkerId worker) {
  auto keys = by_worker_.find(worker);
  if (keys == by_worker_.end()) return;
  for (const auto& [key, tiers] : keys->second) {
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
  return MatchedBlocks(workers, keys)[0].blocks;
}

std::vector<PrefixMatchCount> PrefixIndex::MatchedBlocks(std::span<const WorkerId> workers,
                                                         std::span<const BlockKey> keys) const {
  std::vector<PrefixMatchCount> matched(workers.size());
  // still[i]: workers[i] has held every key so far.
  std::vector<bool> still(workers.size(), true);
  size_t alive = workers.size();
  absl::MutexLock lock(&mu_);
  // Each worker's key map, looked up once.
  std::vector<const absl::flat_hash_map<BlockKey, uint8_t>*> held_by(workers.size(), nullptr);
  for (size_t i = 0; i < workers.size(); ++i) {
    auto it = by_worker_.find(workers[i]);
    if (it != by_worker_.end()) held_by[i] = &it->second;
  }
  constexpr uint8_t kDeviceBit = 1u << static_cast<unsigned>(KvTier::kDevice);
  for (size_t k = 0; k < keys.size() && alive > 0; ++k) {
    if (!holders_.contains(keys[k])) {
      break;  // nobody holds it: every run ends here
    }
    for (size_t i = 0; i < workers.size(); ++i) {
      if (!still[i]) continue;
      uint8_t tiers = 0;
      if (held_by[i] != nullptr) {
        auto it = held_by[i]->find(keys[k]);
        if (it != held_by[i]->end()) tiers = it->second;
      }
      if (tiers != 0) {
        ++matched[i].blocks;
        if ((tiers & kDeviceBit) != 0) ++matched[i].device_blocks;
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
