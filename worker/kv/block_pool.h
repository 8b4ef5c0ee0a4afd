#ifndef KVSERVE_WORKER_KV_BLOCK_POOL_H_
#define KVSERVE_WORKER_KV_BLOCK_POOL_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/block_hash/block_hash.h"

namespace kvserve {

/// Index of a physical KV block (see worker/kv/kv_cache.h for the memory it names).
using BlockId = int32_t;

/// Block 0 is reserved: never handed out, never ref-counted. Block tables use it for holes (blocks
/// a sliding window released), and the engine may point padding slots at it.
inline constexpr BlockId kNullBlock = 0;

/// A prefix-cache change the router mirrors to route requests to workers that hold their prefix.
struct KvEvent {
  enum class Type {
    /// A full block with this key is now cached on this worker.
    kStored,
    /// The block with this key was reused for other content; the key is gone.
    kEvicted,
  };
  Type type = Type::kStored;
  BlockKey key;
  /// Where the block is (kStored) or was (kEvicted): the device pool, or the host / disk tier.
  KvTier tier = KvTier::kDevice;

  friend bool operator==(const KvEvent& a, const KvEvent& b) {
    return a.type == b.type && a.key == b.key && a.tier == b.tier;
  }
};

/// Metadata-only pool of KV blocks 1 .. num_blocks-1: reference counts, an LRU free queue and the
/// key -> block map of the prefix cache. Holds no K/V bytes. Single-threaded (the engine loop owns
/// it); every operation except the debugging helpers is O(1).
///
/// Life of a block: Allocate() hands it out with one reference; Ref()/Unref() count sharers. At
/// zero references it is appended to the tail of the free queue but KEEPS its key, so a later
/// request with the same prefix can take it back (Ref() pulls it out of the middle of the queue in
/// O(1) — the queue is an intrusive doubly-linked list threaded through the block array).
/// Allocate() takes the queue's head, the least recently freed block, and only then evicts its
/// key. Callers that free a chain tail first therefore lose chain tails before the heads that
/// other prompts share.
class BlockPool {
 public:
  /// A pool of `num_blocks` physical blocks, block 0 included; capacity() is num_blocks - 1.
  /// Requires num_blocks >= 1 (KvManager::Create validates user input). The free queue starts as
  /// 1, 2, ..., num_blocks - 1.
  explicit BlockPool(int32_t num_blocks);

  /// Takes the least recently freed block (evicting its key, if any) with one reference; nullopt
  /// when no block is free.
  std::optional<BlockId> Allocate();
  /// Allocates `n` blocks and appends them to `out` in allocation order — all, or none (returns
  /// false and changes nothing) when fewer than `n` are free.
  bool AllocateMany(int32_t n, std::vector<BlockId>* out);

  /// Adds a reference. A block with no references (a cached-free prefix hit) leaves the free
  /// queue and so can no longer be evicted.
  void Ref(BlockId block);
  /// Drops a reference; at zero the block goes to the free queue's tail, keeping its key.
  void Unref(BlockId block);

  /// Registers a referenced, full block under `key` in the prefix cache and records a kStored
  /// event. No-op returning false when the key already names a block (the first one stays the
  /// cached copy; this block simply goes uncached) or the block already has a key.
  bool CacheBlock(BlockId block, const BlockKey& key);
  /// The block cached under `key` (referenced or cached-free), if any.
  std::optional<BlockId> Lookup(const BlockKey& key) const;
  /// Forgets every key (each with a kEvicted event): the bytes the keys describe are gone (a
  /// pipeline stage holding part of every block was lost). Referenced blocks keep their
  /// references; returns how many keys were dropped.
  int32_t ForgetAllKeys();

  /// References of `block` (0 for a free block).
  int32_t ref_count(BlockId block) const;
  /// The prefix-cache key of `block`, if it is registered.
  std::optional<BlockKey> key(BlockId block) const;

  /// Events recorded since the last call, oldest first.
  std::vector<KvEvent> TakeEvents();

  /// Usable blocks (all but the null block).
  int32_t capacity() const { return static_cast<int32_t>(blocks_.size()) - 1; }
  /// Blocks Allocate() can hand out: unreferenced ones, cached or not.
  int32_t num_free() const { return num_free_; }
  /// Unreferenced blocks that still hold a key (prefix-cache hits until evicted).
  int32_t num_cached_free() const { return num_cached_free_; }
  /// Blocks with at least one reference.
  int32_t num_used() const { return capacity() - num_free_; }
  /// Blocks holding a key, referenced or not.
  int32_t num_cached() const { return static_cast<int32_t>(cached_.size()); }

  /// The free queue from head (next to be allocated) to tail. O(capacity); for tests and debugging.
  std::vector<BlockId> FreeQueue() const;

  /// Checks the pool's own invariants: the free queue is a well-linked list holding exactly the
  /// unreferenced blocks, the counters match, the key map and the per-block keys agree, the null
  /// block is untouched. O(capacity); returns the first violation found.
  absl::Status CheckInvariants() const;

 private:
  static constexpr BlockId kNone = -1;

  struct Block {
    int32_t ref_count = 0;
    // Free-queue links (kNone at the ends / when not queued).
    BlockId prev = kNone;
    BlockId next = kNone;
    bool in_free_queue = false;
    bool has_key = false;
    BlockKey key;
  };

  void PushBack(BlockId block);
  void Remove(BlockId block);
  void CheckUsable(BlockId block, const char* op) const;

  std::vector<Block> blocks_;
  BlockId head_ = kNone;
  BlockId tail_ = kNone;
  int32_t num_free_ = 0;
  int32_t num_cached_free_ = 0;
  absl::flat_hash_map<BlockKey, BlockId> cached_;
  std::vector<KvEvent> events_;
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_KV_BLOCK_POOL_H_
