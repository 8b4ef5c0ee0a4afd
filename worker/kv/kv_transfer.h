#ifndef KVSERVE_WORKER_KV_KV_TRANSFER_H_
#define KVSERVE_WORKER_KV_KV_TRANSFER_H_

// KV blocks moving between workers (kvserve.v1.Worker/FetchKvBlocks).
//
// The exporting worker reads the cached K/V of a prompt's leading full blocks from wherever it
// holds them (device pool, host tier, disk tier) between two steps. The importing worker stages
// the bytes it received with the request they belong to; the request's prefix lookup then
// restores them into free device blocks exactly as it restores blocks from the host tier
// (KvManager::FindCachedPrefix with a KvBlockSource), and whatever was not received is computed.
// Blocks are found by chain hash only, so a staged block can serve nothing but the tokens and
// cache salt it was computed for.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/block_hash/block_hash.h"
#include "common/token.h"
#include "worker/kv/kv_manager.h"
#include "worker/kv/kv_offload.h"

namespace kvserve {

/// One block's K/V as it travels: every layer and rank, KvBlockAccess::block_bytes long.
struct KvBlockPayload {
  /// The block's index in its prompt and its chain hash.
  int32_t index = 0;
  BlockKey key;
  std::string bytes;
};

/// The engine's KvBlockSource: blocks staged by requests that brought them from another worker,
/// then the tiers below the device pool (`next`, may be null). Also reads blocks out for export.
/// Single-threaded (the engine loop owns it).
class KvTransferSource final : public KvBlockSource {
 public:
  /// `access` reads and writes the device pool; `tiers` (may be null) is also the source asked
  /// after the staged blocks, and a place blocks are exported from. Not owned.
  KvTransferSource(KvBlockAccess access, KvOffloader* tiers)
      : access_(std::move(access)), tiers_(tiers) {}

  bool Contains(const BlockKey& key) override;
  bool Restore(const BlockKey& key, BlockId dst) override;

  /// Makes `blocks` restorable for as long as `owner` (a request) holds them. Blocks whose size
  /// is not block_bytes are dropped.
  void Stage(int64_t owner, std::vector<KvBlockPayload> blocks);
  /// Forgets what `owner` staged (blocks another owner staged too stay).
  void Release(int64_t owner);

  /// Reads the blocks with chain hashes `keys`, which are a prompt's blocks from index `first`
  /// on, stopping at the first one held nowhere and after `max_bytes` of blocks (at least one
  /// block). Looks in the staged blocks, the device pool `pool`, then the tiers. Must run
  /// between steps.
  std::vector<KvBlockPayload> Export(const BlockPool& pool, std::span<const BlockKey> keys,
                                     int32_t first, int64_t max_bytes);

  struct Stats {
    /// Blocks staged now.
    int64_t staged_blocks = 0;
    /// Staged blocks restored into the device pool.
    int64_t restored_blocks = 0;
    /// Blocks read out by Export.
    int64_t exported_blocks = 0;
  };
  Stats stats() const;
  int64_t block_bytes() const { return access_.block_bytes; }

 private:
  struct Staged {
    std::string bytes;
    int32_t owners = 0;
  };
  KvBlockAccess access_;
  KvOffloader* tiers_;
  absl::flat_hash_map<BlockKey, Staged> staged_;
  absl::flat_hash_map<int64_t, std::vector<BlockKey>> owners_;
  /// A write from a staged block may still be queued: wait before freeing one.
  bool copies_pending_ = false;
  Stats stats_;
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_KV_KV_TRANSFER_H_
