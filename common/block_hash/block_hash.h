#ifndef KVSERVE_COMMON_BLOCK_HASH_BLOCK_HASH_H_
#define KVSERVE_COMMON_BLOCK_HASH_BLOCK_HASH_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/token.h"

namespace kvserve {

/// The content key of one full KV block: identifies the block's tokens *and* everything before
/// them (the whole prefix), so equal keys mean the K/V of the block can be shared.
///
/// Keys form a hash chain, computed identically by workers and by the router; the format is
/// stable and versioned (a change must change kRootBlockKey's tag, see below):
///
///   key(block i) = XXH3-128(seed 0) over the bytes
///     offset 0        parent.hi                      u64 little-endian
///     offset 8        parent.lo                      u64 little-endian
///     offset 16       n = number of tokens           u32 little-endian
///     offset 20       token[0] .. token[n-1]         each i32 little-endian (4 * n bytes)
///     offset 20 + 4n  m = extra key length in bytes  u32 little-endian
///     offset 24 + 4n  extra key bytes                m raw bytes
///   key.hi = the high 64 bits of the XXH3-128 result, key.lo = the low 64 bits.
///
/// The parent of block 0 is kRootBlockKey; the parent of block i > 0 is key(block i - 1). The
/// extra key of block 0 is the tenant's cache salt (may be empty); later blocks use an empty
/// extra key — the chain carries the salt along. ToString() prints hi then lo as 32 lowercase hex
/// digits, which equals the canonical output of `xxhsum -H2` on the same bytes.
struct BlockKey {
  uint64_t hi = 0;
  uint64_t lo = 0;

  friend bool operator==(const BlockKey& a, const BlockKey& b) {
    return a.hi == b.hi && a.lo == b.lo;
  }
  friend bool operator!=(const BlockKey& a, const BlockKey& b) { return !(a == b); }

  template <typename H>
  friend H AbslHashValue(H h, const BlockKey& key) {
    return H::combine(std::move(h), key.hi, key.lo);
  }

  /// 32 lowercase hex digits: hi, then lo, each zero-padded to 16 digits.
  std::string ToString() const;
};

/// Where a worker holds a cached block: its device KV pool, or a tier below it
/// (worker/kv/kv_offload.h) from which a prefix hit restores the block instead of recomputing it.
enum class KvTier : uint8_t { kDevice = 0, kHost = 1, kDisk = 2 };

/// The parent of every chain's first block: XXH3-128 of the ASCII bytes "kvserve.block_hash.v1"
/// (a6cf8cf7ddd57a5c91cbfab443de011a). A new format version gets a new tag.
inline constexpr BlockKey kRootBlockKey{0xa6cf8cf7ddd57a5cULL, 0x91cbfab443de011aULL};

/// One link of the chain: the key of a block holding `tokens` whose prefix has key `parent`,
/// with `extra_key` mixed in (the cache salt for the first block, empty otherwise).
BlockKey HashBlock(const BlockKey& parent, std::span<const TokenId> tokens,
                   std::string_view extra_key);

/// Keys of every FULL block of `tokens` (a trailing partial block gets none), chained from
/// kRootBlockKey with `cache_salt` as the first block's extra key. Returns an empty vector when
/// block_size is not positive.
std::vector<BlockKey> HashFullBlocks(std::span<const TokenId> tokens, int block_size,
                                     std::string_view cache_salt);

}  // namespace kvserve

#endif  // KVSERVE_COMMON_BLOCK_HASH_BLOCK_HASH_H_
