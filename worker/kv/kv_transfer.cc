#include "worker/kv/kv_transfer.h"

#include <algorithm>
#include <utility>

namespace kvserve {

bool KvTransferSource::Contains(const BlockKey& key) {
  return staged_.contains(key) || (tiers_ != nullptr && tiers_->Contains(key));
}

bool KvTransferSource::Restore(const BlockKey& key, BlockId dst) {
  auto it = staged_.find(key);
  if (it == staged_.end()) return tiers_ != nullptr && tiers_->Restore(key, dst);
  if (!access_.write(dst, reinterpret_cast<const uint8_t*>(it->second.bytes.data())).ok()) {
    return false;
  }
  copies_pending_ = true;
  ++stats_.restored_blocks;
  return true;
}

void KvTransferSource::Stage(int64_t owner, std::vector<KvBlockPayload> blocks) {
  std::vector<BlockKey>& keys = owners_[owner];
  for (KvBlockPayload& b : blocks) {
    if (static_cast<int64_t>(b.bytes.size()) != access_.block_bytes) continue;
    Staged& s = staged_[b.key];
    if (s.owners++ == 0) s.bytes = std::move(b.bytes);
    keys.push_back(b.key);
  }
  if (keys.empty()) owners_.erase(owner);
}

void KvTransferSource::Release(int64_t owner) {
  auto it = owners_.find(owner);
  if (it == owners_.end()) return;
  if (copies_pending_) {
    // The device may still be copying from these bytes.
    if (access_.finish) (void)access_.finish();
    copies_pending_ = false;
  }
  for (const BlockKey& key : it->second) {
    auto s = staged_.find(key);
    if (s != staged_.end() && --s->second.owners == 0) staged_.erase(s);
  }
  owners_.erase(it);
}

std::vector<KvBlockPayload> KvTransferSource::Export(const BlockPool& pool,
                                                     std::span<const BlockKey> keys, int32_t first,
                                                     int64_t max_bytes) {
  std::vector<KvBlockPayload> out;
  const size_t by_bytes = static_cast<size_t>(
      std::max<int64_t>(1, max_bytes / std::max<int64_t>(1, access_.block_bytes)));
  bool device_reads = false;
  for (size_t i = 0; i < std::min(keys.size(), by_bytes); ++i) {
    KvBlockPayload p;
    p.index = first + static_cast<int32_t>(i);
    p.key = keys[i];
    bool found = false;
    if (auto s = staged_.find(p.key); s != staged_.end()) {
      p.bytes = s->second.bytes;
      found = true;
    } else {
      p.bytes.resize(static_cast<size_t>(access_.block_bytes));
      auto* dst = reinterpret_cast<uint8_t*>(p.bytes.data());
      if (std::optional<BlockId> block = pool.Lookup(p.key)) {
        found = access_.read(*block, dst).ok();
        device_reads = device_reads || found;
      } else if (tiers_ != nullptr) {
        found = tiers_->ReadCached(p.key, dst);
      }
    }
    if (!found) break;
    out.push_back(std::move(p));
  }
  if (device_reads && access_.finish && !access_.finish().ok()) out.clear();
  stats_.exported_blocks += static_cast<int64_t>(out.size());
  return out;
}

KvTransferSource::Stats KvTransferSource::stats() const {
  Stats s = stats_;
  s.staged_blocks = static_cast<int64_t>(staged_.size());
  return s;
}

}  // namespace kvserve
