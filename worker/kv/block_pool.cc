#include "worker/kv/block_pool.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

// A broken caller invariant (bad block id, double free): the bookkeeping would silently corrupt
// the KV cache, so stop loudly instead.
[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "BlockPool: %s\n", message.c_str());
  std::abort();
}

}  // namespace

BlockPool::BlockPool(int32_t num_blocks) {
  if (num_blocks < 1) Die(absl::StrCat("num_blocks must be >= 1, got ", num_blocks));
  blocks_.resize(num_blocks);
  for (BlockId b = 1; b < num_blocks; ++b) PushBack(b);
}

void BlockPool::CheckUsable(BlockId block, const char* op) const {
  if (block <= kNullBlock || block >= static_cast<BlockId>(blocks_.size())) {
    Die(absl::StrCat(op, ": block ", block, " is not a usable block id (1..", capacity(), ")"));
  }
}

void BlockPool::PushBack(BlockId block) {
  Block& b = blocks_[block];
  b.prev = tail_;
  b.next = kNone;
  b.in_free_queue = true;
  if (tail_ == kNone) {
    head_ = block;
  } else {
    blocks_[tail_].next = block;
  }
  tail_ = block;
  ++num_free_;
  if (b.has_key) ++num_cached_free_;
}

void BlockPool::Remove(BlockId block) {
  Block& b = blocks_[block];
  if (b.prev == kNone) {
    head_ = b.next;
  } else {
    blocks_[b.prev].next = b.next;
  }
  if (b.next == kNone) {
    tail_ = b.prev;
  } else {
    blocks_[b.next].prev = b.prev;
  }
  b.prev = b.next = kNone;
  b.in_free_queue = false;
  --num_free_;
  if (b.has_key) --num_cached_free_;
}

std::optional<BlockId> BlockPool::Allocate() {
  if (head_ == kNone) return std::nullopt;
  const BlockId id = head_;
  Remove(id);
  Block& b = blocks_[id];
  if (b.has_key) {
    cached_.erase(b.key);
    events_.push_back(KvEvent{KvEvent::Type::kEvicted, b.key});
    b.has_key = false;
    b.key = BlockKey{};
  }
  b.ref_count = 1;
  return id;
}

bool BlockPool::AllocateMany(int32_t n, std::vector<BlockId>* out) {
  if (n < 0) Die(absl::StrCat("AllocateMany: negative count ", n));
  if (n > num_free_) return false;
  for (int32_t i = 0; i < n; ++i) out->push_back(*Allocate());
  return true;
}

void BlockPool::Ref(BlockId block) {
  CheckUsable(block, "Ref");
  Block& b = blocks_[block];
  if (b.ref_count == 0) Remove(block);
  ++b.ref_count;
}

void BlockPool::Unref(BlockId block) {
  CheckUsable(block, "Unref");
  Block& b = blocks_[block];
  if (b.ref_count <= 0) Die(absl::StrCat("Unref: block ", block, " is already free"));
  if (--b.ref_count == 0) PushBack(block);
}

bool BlockPool::CacheBlock(BlockId block, const BlockKey& key) {
  CheckUsable(block, "CacheBlock");
  Block& b = blocks_[block];
  if (b.ref_count <= 0) Die(absl::StrCat("CacheBlock: block ", block, " is free"));
  if (b.has_key) return false;
  if (!cached_.emplace(key, block).second) return false;
  b.has_key = true;
  b.key = key;
  events_.push_back(KvEvent{KvEvent::Type::kStored, key});
  return true;
}

std::optional<BlockId> BlockPool::Lookup(const BlockKey& key) const {
  auto it = cached_.find(key);
  if (it == cached_.end()) return std::nullopt;
  return it->second;
}

int32_t BlockPool::ForgetAllKeys() {
  const int32_t dropped = static_cast<int32_t>(cached_.size());
  for (const auto& [key, id] : cached_) {
    Block& b = blocks_[id];
    if (b.in_free_queue) --num_cached_free_;
    b.has_key = false;
    b.key = BlockKey{};
    events_.push_back(KvEvent{KvEvent::Type::kEvicted, key});
  }
  cached_.clear();
  return dropped;
}

int32_t BlockPool::ref_count(BlockId block) const {
  CheckUsable(block, "ref_count");
  return blocks_[block].ref_count;
}

std::optional<BlockKey> BlockPool::key(BlockId block) const {
  CheckUsable(block, "key");
  const Block& b = blocks_[block];
  if (!b.has_key) return std::nullopt;
  return b.key;
}

std::vector<KvEvent> BlockPool::TakeEvents() { return std::exchange(events_, {}); }

std::vector<BlockId> BlockPool::FreeQueue() const {
  std::vector<BlockId> out;
  out.reserve(num_free_);
  for (BlockId b = head_; b != kNone && out.size() <= blocks_.size(); b = blocks_[b].next) {
    out.push_back(b);
  }
  return out;
}

absl::Status BlockPool::CheckInvariants() const {
  const Block& null_block = blocks_[kNullBlock];
  if (null_block.ref_count != 0 || null_block.in_free_queue || null_block.has_key) {
    return absl::InternalError("null block 0 was referenced, queued or cached");
  }
  // Walk the queue forwards, bounded so that a cycle cannot hang us.
  int32_t queued = 0;
  int32_t queued_cached = 0;
  BlockId prev = kNone;
  for (BlockId b = head_; b != kNone; b = blocks_[b].next) {
    if (b <= kNullBlock || b >= static_cast<BlockId>(blocks_.size())) {
      return absl::InternalError(absl::StrCat("free queue holds invalid block id ", b));
    }
    if (++queued > capacity()) return absl::InternalError("free queue has a cycle");
    const Block& blk = blocks_[b];
    if (!blk.in_free_queue) {
      return absl::InternalError(absl::StrCat("block ", b, " in free queue but not marked"));
    }
    if (blk.ref_count != 0) {
      return absl::InternalError(
          absl::StrCat("block ", b, " in free queue with ref_count ", blk.ref_count));
    }
    if (blk.prev != prev) {
      return absl::InternalError(absl::StrCat("block ", b, " has a broken prev link"));
    }
    if (blk.has_key) ++queued_cached;
    prev = b;
  }
  if (prev != tail_) return absl::InternalError("free queue tail does not match its last block");
  if (queued != num_free_) {
    return absl::InternalError(
        absl::StrCat("num_free ", num_free_, " but the free queue holds ", queued));
  }
  if (queued_cached != num_cached_free_) {
    return absl::InternalError(absl::StrCat("num_cached_free ", num_cached_free_,
                                            " but the free queue holds ", queued_cached));
  }
  int32_t keyed = 0;
  for (BlockId b = 1; b < static_cast<BlockId>(blocks_.size()); ++b) {
    const Block& blk = blocks_[b];
    if (blk.ref_count < 0) {
      return absl::InternalError(absl::StrCat("block ", b, " has negative ref_count"));
    }
    if ((blk.ref_count == 0) != blk.in_free_queue) {
      return absl::InternalError(absl::StrCat("block ", b, " has ref_count ", blk.ref_count,
                                              " but in_free_queue=", blk.in_free_queue));
    }
    if (blk.has_key) {
      ++keyed;
      auto it = cached_.find(blk.key);
      if (it == cached_.end() || it->second != b) {
        return absl::InternalError(absl::StrCat("block ", b, " has key ", blk.key.ToString(),
                                                " but the key map does not point at it"));
      }
    }
  }
  if (keyed != static_cast<int32_t>(cached_.size())) {
    return absl::InternalError(
        absl::StrCat("key map has ", cached_.size(), " entries but ", keyed, " blocks hold keys"));
  }
  return absl::OkStatus();
}

}  // namespace kvserve
