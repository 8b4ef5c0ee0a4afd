#ifndef KVSERVE_WORKER_KV_KV_MANAGER_H_
#define KVSERVE_WORKER_KV_KV_MANAGER_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/block_hash/block_hash.h"
#include "common/token.h"
#include "worker/kv/block_pool.h"

namespace kvserve {

/// Shape and policy of the KV block bookkeeping.
struct KvManagerOptions {
  /// Physical blocks of the KV cache, including the reserved null block 0 (so num_blocks - 1 are
  /// usable). Must be >= 2.
  int32_t num_blocks = 0;
  /// Token slots per block. Must be in [1, 1024].
  int32_t block_size = 16;
  /// Share full blocks of identical prefixes between sequences (hash chain of block_hash.h).
  bool enable_prefix_caching = true;
  /// Sliding-window attention span in tokens; 0 = full attention. Must be >= 0.
  int32_t sliding_window = 0;
};

/// The engine's handle for one sequence's KV state.
using SeqId = int64_t;

/// Cached full blocks that a new sequence can start on.
struct PrefixMatch {
  std::vector<BlockId> blocks;
  /// blocks.size() * block_size.
  int32_t num_tokens = 0;
};

/// Copy-on-write work for the engine: copy every layer's K/V of block `src` into block `dst`
/// before the step that writes into `dst`.
struct BlockCopy {
  BlockId src = kNullBlock;
  BlockId dst = kNullBlock;

  friend bool operator==(const BlockCopy& a, const BlockCopy& b) {
    return a.src == b.src && a.dst == b.dst;
  }
};

/// A full block that the prefix cache registered (KvManager::TakeStoredBlocks): its K/V are in
/// the device pool and stay unchanged while the block keeps its key.
struct StoredBlock {
  BlockId block = kNullBlock;
  BlockKey key;
};

/// Cached blocks beyond the device pool (worker/kv/kv_offload.h: host memory and disk tiers).
/// FindCachedPrefix continues a prefix chain into it where the device pool's blocks end.
class KvBlockSource {
 public:
  virtual ~KvBlockSource() = default;
  /// Whether bytes cached under `key` can be restored.
  virtual bool Contains(const BlockKey& key) = 0;
  /// Writes the bytes cached under `key` into device block `dst`. False when they cannot be had
  /// (a corrupt file, say): the prefix then ends before this block.
  virtual bool Restore(const BlockKey& key, BlockId dst) = 0;
};

/// Per-sequence, append-only block tables over a BlockPool (vLLM v1 style). Decides which blocks
/// each sequence's token slots live in, shares full blocks of identical prefixes (prefix cache),
/// shares all blocks between forked samples with copy-on-write of the partial last block, and
/// drops blocks a sliding window can no longer see. Metadata only: the K/V bytes live in KvCache.
///
/// Slot s of a sequence is token position s: block table entry s / block_size, offset
/// s % block_size. A sequence holds exactly NumBlocksNeeded(num_tokens) blocks, so at most
/// block_size - 1 allocated slots are unused.
///
/// Sliding window: blocks are allocated for every token as with full attention; the caller drops
/// the ones no future query can see with ReleaseOutOfWindow after each step. A prefix hit still
/// needs the whole chain from the first block cached (conservative: a windowed model could reuse
/// just the last window's blocks).
///
/// Single-threaded and deterministic. Misuse (unknown or duplicate SeqId, negative counts,
/// committing more tokens than were allocated) is a bug in the caller and aborts with a message;
/// running out of blocks is not — it returns false and changes nothing.
class KvManager {
 public:
  /// Validates `options` (INVALID_ARGUMENT naming the field) and builds an empty manager.
  static absl::StatusOr<KvManager> Create(const KvManagerOptions& options);

  /// Longest chain of cached full blocks for a new sequence's tokens; never the whole prompt (at
  /// least one token is left to compute, so the last position's logits get computed). Takes no
  /// references: the match is valid until the next call that allocates. Counts a prefix-cache
  /// query of tokens.size() tokens and a hit of num_tokens in the stats (nothing when prefix
  /// caching is off; the match is then empty).
  ///
  /// With a block source (SetBlockSource), blocks of the chain that are not in the device pool
  /// but in the source are restored into free device blocks (evicting the least recently freed
  /// cached blocks, never one of this match) and cached there, unreferenced, as if they had
  /// never left; the chain ends at the first block found nowhere.
  PrefixMatch FindCachedPrefix(std::span<const TokenId> tokens, std::string_view cache_salt);

  /// Starts sequence `seq` on the matched blocks (refs them) plus enough new blocks for
  /// `num_new_tokens` more tokens. All or nothing: false (and no change) if the pool cannot
  /// supply them. Matched blocks that sit in the free queue are pulled out before new blocks are
  /// allocated, so the allocation never evicts them.
  bool AllocateNew(SeqId seq, const PrefixMatch& match, int32_t num_new_tokens,
                   std::string_view cache_salt);

  /// Grows a running sequence by `num_new_tokens` slots (decode: 1; next prefill chunk: the
  /// chunk). All or nothing. If the slot to write next lies in a block shared with another
  /// sequence (ref > 1, after Fork), that block is first replaced by a fresh copy (copy-on-write)
  /// and the copy is queued for TakeCopies().
  bool Append(SeqId seq, int32_t num_new_tokens);

  /// The sequence's tokens [0, num_computed) now have K/V in the cache: hashes its newly full
  /// blocks and registers them in the prefix cache (keys chained incrementally per sequence).
  /// `tokens` holds at least num_computed tokens; num_computed may not exceed the allocated
  /// tokens. No-op when prefix caching is off.
  void Commit(SeqId seq, std::span<const TokenId> tokens, int32_t num_computed);

  /// New sequence `child` shares every block of `parent`, including the partial last one
  /// (refs++), and continues parent's prefix-cache chain (n > 1 samples of one prompt).
  void Fork(SeqId parent, SeqId child);

  /// Releases the sequence's blocks, tail first (so chain tails are evicted before the heads other
  /// prompts share) and forgets the sequence.
  void Free(SeqId seq);

  /// Sliding window: unrefs blocks wholly outside the window of every future query (the next
  /// query is at position num_computed and sees keys [pos - window + 1, pos]) and replaces them by
  /// the null block 0 in the table. No-op for full attention.
  void ReleaseOutOfWindow(SeqId seq, int32_t num_computed);

  /// The sequence's block table (null entries are released sliding-window holes). Valid until the
  /// next call that changes this sequence.
  std::span<const BlockId> BlockTable(SeqId seq) const;
  /// Allocated token slots = table size * block_size.
  int32_t NumSlots(SeqId seq) const;
  /// Tokens the sequence has slots for (what AllocateNew and Append asked for, in total).
  int32_t NumTokens(SeqId seq) const;
  /// Whether `seq` currently holds a block table.
  bool HasSequence(SeqId seq) const { return seqs_.contains(seq); }

  /// Sets where FindCachedPrefix looks past the device pool (null: nowhere). Not owned; must
  /// outlive its use. With `record_stored`, Commit records the blocks it caches for
  /// TakeStoredBlocks.
  void SetBlockSource(KvBlockSource* source, bool record_stored = true) {
    source_ = source;
    record_stored_ = source != nullptr && record_stored;
  }

  /// Blocks that Commit registered in the prefix cache since the last call, in order (not those
  /// restored from the block source), recorded while a block source is set with record_stored:
  /// what to offload.
  std::vector<StoredBlock> TakeStoredBlocks() { return std::exchange(stored_, {}); }

  /// Copy-on-write copies queued since the last call, in order.
  std::vector<BlockCopy> TakeCopies();
  /// Prefix-cache events (stored / evicted keys) since the last call, oldest first.
  std::vector<KvEvent> TakeEvents() { return pool_.TakeEvents(); }
  /// Forgets every prefix-cache key (kEvicted events go out): their K/V is no longer whole (a
  /// pipeline stage was lost). Call with no sequence live. Returns the keys dropped.
  int32_t ResetPrefixCache() { return pool_.ForgetAllKeys(); }

  /// Blocks needed to hold `num_tokens` tokens (ceil division).
  int32_t NumBlocksNeeded(int32_t num_tokens) const;
  /// Whether `num_blocks` new blocks could be allocated now (cached-free blocks count as free).
  bool CanAllocate(int32_t num_blocks) const { return num_blocks <= pool_.num_free(); }

  /// A snapshot of the pool and the prefix cache.
  struct Stats {
    /// Usable blocks (the null block excluded).
    int32_t total_blocks = 0;
    /// Blocks referenced by at least one sequence.
    int32_t used_blocks = 0;
    /// Unreferenced blocks still holding a prefix-cache key.
    int32_t cached_free_blocks = 0;
    /// Allocatable blocks, cached-free included.
    int32_t free_blocks = 0;
    /// Tokens passed to FindCachedPrefix.
    int64_t prefix_query_tokens = 0;
    /// Tokens FindCachedPrefix found cached (restored ones included).
    int64_t prefix_hit_tokens = 0;
    /// Part of prefix_hit_tokens that was restored from the block source.
    int64_t prefix_restored_tokens = 0;
  };
  /// Current stats.
  Stats stats() const;

  /// Checks every invariant: the pool's own ones, reference counts equal the number of table
  /// entries pointing at each block, per-sequence counters agree with the tables, the null block
  /// appears only in sliding-window holes. Returns the first violation. O(total table size).
  absl::Status CheckInvariants() const;

  /// The underlying pool (read-only; for stats and tests).
  const BlockPool& pool() const { return pool_; }
  /// The options this manager was created with.
  const KvManagerOptions& options() const { return options_; }

 private:
  struct SeqState {
    std::vector<BlockId> table;
    /// Tokens the sequence has slots for.
    int32_t num_tokens = 0;
    /// Leading table entries released by the sliding window (all kNullBlock).
    int32_t num_released = 0;
    /// Leading full blocks whose keys are known (cached, or chained past).
    int32_t num_hashed = 0;
    /// Key of block num_hashed - 1, or kRootBlockKey.
    BlockKey last_key = kRootBlockKey;
    std::string cache_salt;
  };

  explicit KvManager(const KvManagerOptions& options);

  SeqState& Get(SeqId seq, const char* op);
  const SeqState& Get(SeqId seq, const char* op) const;

  KvManagerOptions options_;
  BlockPool pool_;
  absl::flat_hash_map<SeqId, SeqState> seqs_;
  std::vector<BlockCopy> copies_;
  std::vector<StoredBlock> stored_;
  KvBlockSource* source_ = nullptr;
  bool record_stored_ = false;
  int64_t prefix_query_tokens_ = 0;
  int64_t prefix_hit_tokens_ = 0;
  int64_t prefix_restored_tokens_ = 0;
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_KV_KV_MANAGER_H_
