#include "worker/kv/kv_manager.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

// Largest block_size accepted; keeps every slot count comfortably inside int32.
constexpr int32_t kMaxBlockSize = 1024;

// Caller bugs (unknown sequence, over-commit): continuing would corrupt the block tables that
// the attention kernels read, so stop loudly.
[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "KvManager: %s\n", message.c_str());
  std::abort();
}

}  // namespace

absl::StatusOr<KvManager> KvManager::Create(const KvManagerOptions& options) {
  if (options.num_blocks < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvManagerOptions.num_blocks must be >= 2 (block 0 is the reserved null "
                     "block), got ",
                     options.num_blocks));
  }
  if (options.block_size < 1 || options.block_size > kMaxBlockSize) {
    return absl::InvalidArgumentError(absl::StrCat("KvManagerOptions.block_size must be in [1, ",
                                                   kMaxBlockSize, "], got ", options.block_size));
  }
  if (options.sliding_window < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvManagerOptions.sliding_window must be >= 0 (0 = full attention), got ",
                     options.sliding_window));
  }
  return KvManager(options);
}

KvManager::KvManager(const KvManagerOptions& options)
    : options_(options), pool_(options.num_blocks) {}

KvManager::SeqState& KvManager::Get(SeqId seq, const char* op) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) Die(absl::StrCat(op, ": unknown sequence ", seq));
  return it->second;
}

const KvManager::SeqState& KvManager::Get(SeqId seq, const char* op) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) Die(absl::StrCat(op, ": unknown sequence ", seq));
  return it->second;
}

int32_t KvManager::NumBlocksNeeded(int32_t num_tokens) const {
  if (num_tokens <= 0) return 0;
  const int64_t bs = options_.block_size;
  return static_cast<int32_t>((static_cast<int64_t>(num_tokens) + bs - 1) / bs);
}

PrefixMatch KvManager::FindCachedPrefix(std::span<const TokenId> tokens,
                                        std::string_view cache_salt) {
  PrefixMatch match;
  if (!options_.enable_prefix_caching) return match;
  prefix_query_tokens_ += static_cast<int64_t>(tokens.size());
  const size_t bs = static_cast<size_t>(options_.block_size);
  // At least one token stays uncomputed, so the last prompt position's logits are produced.
  const size_t max_blocks = tokens.empty() ? 0 : (tokens.size() - 1) / bs;
  BlockKey parent = kRootBlockKey;
  size_t i = 0;
  for (; i < max_blocks; ++i) {
    const BlockKey key =
        HashBlock(parent, tokens.subspan(i * bs, bs), i == 0 ? cache_salt : std::string_view());
    const std::optional<BlockId> block = pool_.Lookup(key);
    if (!block) break;
    match.blocks.push_back(*block);
    parent = key;
  }
  if (source_ != nullptr && i < max_blocks) {
    // Hold the chain so far: the allocations below must not evict it.
    for (BlockId b : match.blocks) pool_.Ref(b);
    for (; i < max_blocks; ++i) {
      const BlockKey key =
          HashBlock(parent, tokens.subspan(i * bs, bs), i == 0 ? cache_salt : std::string_view());
      std::optional<BlockId> block = pool_.Lookup(key);
      if (block) {
        pool_.Ref(*block);
      } else {
        if (!source_->Contains(key)) break;
        block = pool_.Allocate();
        if (!block) break;
        if (!source_->Restore(key, *block)) {
          pool_.Unref(*block);
          break;
        }
        pool_.CacheBlock(*block, key);
        prefix_restored_tokens_ += static_cast<int64_t>(bs);
      }
      match.blocks.push_back(*block);
      parent = key;
    }
    // Tail first, like Free: the chain's tail is evicted before its head.
    for (auto b = match.blocks.rbegin(); b != match.blocks.rend(); ++b) pool_.Unref(*b);
  }
  match.num_tokens = static_cast<int32_t>(match.blocks.size() * bs);
  prefix_hit_tokens_ += match.num_tokens;
  return match;
}

bool KvManager::AllocateNew(SeqId seq, const PrefixMatch& match, int32_t num_new_tokens,
                            std::string_view cache_salt) {
  if (seqs_.contains(seq)) Die(absl::StrCat("AllocateNew: sequence ", seq, " already exists"));
  if (num_new_tokens < 0) {
    Die(absl::StrCat("AllocateNew: negative num_new_tokens ", num_new_tokens));
  }
  const int64_t num_matched = static_cast<int64_t>(match.blocks.size());
  if (match.num_tokens != num_matched * options_.block_size) {
    Die(absl::StrCat("AllocateNew: match of ", num_matched, " blocks claims ", match.num_tokens,
                     " tokens"));
  }
  int32_t matched_free = 0;
  for (BlockId b : match.blocks) {
    if (!pool_.key(b)) {
      Die(absl::StrCat("AllocateNew: matched block ", b,
                       " is no longer cached (stale PrefixMatch)"));
    }
    if (pool_.ref_count(b) == 0) ++matched_free;
  }
  const int64_t total = static_cast<int64_t>(match.num_tokens) + num_new_tokens;
  if (total > std::numeric_limits<int32_t>::max()) return false;
  const int32_t num_new_blocks =
      NumBlocksNeeded(static_cast<int32_t>(total)) - static_cast<int32_t>(num_matched);
  // Matched blocks waiting in the free queue are counted as free by the pool, but they are
  // about to be taken back, so they cannot also serve as new blocks.
  if (num_new_blocks > pool_.num_free() - matched_free) return false;

  SeqState state;
  state.table.reserve(num_matched + num_new_blocks);
  // Ref the matched blocks first: that pulls cached-free ones out of the free queue, so the
  // allocation below cannot evict them.
  for (BlockId b : match.blocks) {
    pool_.Ref(b);
    state.table.push_back(b);
  }
  if (!pool_.AllocateMany(num_new_blocks, &state.table)) {
    Die("AllocateNew: pool ran short after the free-block check");
  }
  state.num_tokens = static_cast<int32_t>(total);
  state.num_hashed = static_cast<int32_t>(num_matched);
  state.last_key = match.blocks.empty() ? kRootBlockKey : *pool_.key(match.blocks.back());
  state.cache_salt = std::string(cache_salt);
  seqs_.emplace(seq, std::move(state));
  return true;
}

bool KvManager::Append(SeqId seq, int32_t num_new_tokens) {
  SeqState& s = Get(seq, "Append");
  if (num_new_tokens < 0) Die(absl::StrCat("Append: negative num_new_tokens ", num_new_tokens));
  if (num_new_tokens == 0) return true;
  const int64_t total = static_cast<int64_t>(s.num_tokens) + num_new_tokens;
  if (total > std::numeric_limits<int32_t>::max()) return false;
  const int32_t num_new_blocks =
      NumBlocksNeeded(static_cast<int32_t>(total)) - static_cast<int32_t>(s.table.size());
  // The next slot lies in the current last block iff that block is partly filled.
  const bool copy_on_write = s.num_tokens % options_.block_size != 0 &&
                             s.table.back() != kNullBlock && pool_.ref_count(s.table.back()) > 1;
  if (num_new_blocks + (copy_on_write ? 1 : 0) > pool_.num_free()) return false;

  if (copy_on_write) {
    const BlockId src = s.table.back();
    const BlockId dst = *pool_.Allocate();
    pool_.Unref(src);  // Still referenced by the other sharers.
    s.table.back() = dst;
    copies_.push_back(BlockCopy{src, dst});
  }
  if (!pool_.AllocateMany(num_new_blocks, &s.table)) {
    Die("Append: pool ran short after the free-block check");
  }
  s.num_tokens = static_cast<int32_t>(total);
  return true;
}

void KvManager::Commit(SeqId seq, std::span<const TokenId> tokens, int32_t num_computed) {
  SeqState& s = Get(seq, "Commit");
  if (num_computed < 0 || num_computed > s.num_tokens ||
      static_cast<size_t>(num_computed) > tokens.size()) {
    Die(absl::StrCat("Commit: sequence ", seq, " num_computed ", num_computed,
                     " outside [0, min(allocated ", s.num_tokens, ", tokens ", tokens.size(),
                     ")]"));
  }
  if (!options_.enable_prefix_caching) return;
  const int32_t bs = options_.block_size;
  const int32_t num_full = num_computed / bs;
  for (int32_t i = s.num_hashed; i < num_full; ++i) {
    const BlockKey key = HashBlock(s.last_key, tokens.subspan(static_cast<size_t>(i) * bs, bs),
                                   i == 0 ? std::string_view(s.cache_salt) : std::string_view());
    // A block the sliding window already released cannot be cached, but the chain goes on.
    if (s.table[i] != kNullBlock && pool_.CacheBlock(s.table[i], key) && record_stored_) {
      stored_.push_back(StoredBlock{s.table[i], key});
    }
    s.last_key = key;
    s.num_hashed = i + 1;
  }
}

void KvManager::Fork(SeqId parent, SeqId child) {
  if (seqs_.contains(child)) Die(absl::StrCat("Fork: child sequence ", child, " already exists"));
  SeqState copy = Get(parent, "Fork");
  for (BlockId b : copy.table) {
    if (b != kNullBlock) pool_.Ref(b);
  }
  seqs_.emplace(child, std::move(copy));
}

void KvManager::Free(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) Die(absl::StrCat("Free: unknown sequence ", seq));
  const std::vector<BlockId>& table = it->second.table;
  for (auto b = table.rbegin(); b != table.rend(); ++b) {
    if (*b != kNullBlock) pool_.Unref(*b);
  }
  seqs_.erase(it);
}

void KvManager::ReleaseOutOfWindow(SeqId seq, int32_t num_computed) {
  SeqState& s = Get(seq, "ReleaseOutOfWindow");
  if (num_computed < 0 || num_computed > s.num_tokens) {
    Die(absl::StrCat("ReleaseOutOfWindow: sequence ", seq, " num_computed ", num_computed,
                     " outside [0, ", s.num_tokens, "]"));
  }
  if (options_.sliding_window == 0) return;
  // The oldest key any future query can see; blocks ending before it are dead.
  const int64_t first_visible = static_cast<int64_t>(num_computed) - options_.sliding_window + 1;
  if (first_visible <= 0) return;
  const int32_t num_dead =
      static_cast<int32_t>(std::min<int64_t>(first_visible / options_.block_size, s.table.size()));
  // Tail first, like Free, so the older (more widely shared) blocks are evicted last.
  for (int32_t i = num_dead - 1; i >= s.num_released; --i) {
    if (s.table[i] != kNullBlock) pool_.Unref(s.table[i]);
    s.table[i] = kNullBlock;
  }
  s.num_released = std::max(s.num_released, num_dead);
}

std::span<const BlockId> KvManager::BlockTable(SeqId seq) const {
  return Get(seq, "BlockTable").table;
}

int32_t KvManager::NumSlots(SeqId seq) const {
  return static_cast<int32_t>(Get(seq, "NumSlots").table.size()) * options_.block_size;
}

int32_t KvManager::NumTokens(SeqId seq) const { return Get(seq, "NumTokens").num_tokens; }

std::vector<BlockCopy> KvManager::TakeCopies() { return std::exchange(copies_, {}); }

KvManager::Stats KvManager::stats() const {
  Stats s;
  s.total_blocks = pool_.capacity();
  s.used_blocks = pool_.num_used();
  s.cached_free_blocks = pool_.num_cached_free();
  s.free_blocks = pool_.num_free();
  s.prefix_query_tokens = prefix_query_tokens_;
  s.prefix_hit_tokens = prefix_hit_tokens_;
  s.prefix_restored_tokens = prefix_restored_tokens_;
  return s;
}

absl::Status KvManager::CheckInvariants() const {
  if (absl::Status pool_status = pool_.CheckInvariants(); !pool_status.ok()) return pool_status;
  const int32_t bs = options_.block_size;
  std::vector<int32_t> refs(static_cast<size_t>(options_.num_blocks), 0);
  for (const auto& [seq, s] : seqs_) {
    const std::string who = absl::StrCat("sequence ", seq, ": ");
    if (static_cast<int32_t>(s.table.size()) != NumBlocksNeeded(s.num_tokens)) {
      return absl::InternalError(absl::StrCat(who, s.table.size(), " blocks for ", s.num_tokens,
                                              " tokens (want ", NumBlocksNeeded(s.num_tokens),
                                              ")"));
    }
    if (s.num_released < 0 || s.num_released > static_cast<int32_t>(s.table.size())) {
      return absl::InternalError(absl::StrCat(who, "num_released ", s.num_released,
                                              " outside its table of ", s.table.size()));
    }
    if (s.num_released > 0 && options_.sliding_window == 0) {
      return absl::InternalError(absl::StrCat(who, "released blocks without a sliding window"));
    }
    if (s.num_hashed < 0 || s.num_hashed > s.num_tokens / bs ||
        (!options_.enable_prefix_caching && s.num_hashed != 0)) {
      return absl::InternalError(
          absl::StrCat(who, "num_hashed ", s.num_hashed, " for ", s.num_tokens, " tokens"));
    }
    for (int32_t i = 0; i < static_cast<int32_t>(s.table.size()); ++i) {
      const BlockId b = s.table[i];
      if (i < s.num_released) {
        if (b != kNullBlock) {
          return absl::InternalError(absl::StrCat(who, "released entry ", i, " holds block ", b));
        }
        continue;
      }
      if (b <= kNullBlock || b >= options_.num_blocks) {
        return absl::InternalError(absl::StrCat(who, "entry ", i, " holds invalid block ", b));
      }
      ++refs[b];
    }
    if (s.num_hashed > 0) {
      const BlockId last = s.table[s.num_hashed - 1];
      if (last != kNullBlock) {
        const std::optional<BlockKey> key = pool_.key(last);
        if (key && *key != s.last_key) {
          return absl::InternalError(absl::StrCat(who, "chain key ", s.last_key.ToString(),
                                                  " differs from block ", last, "'s key ",
                                                  key->ToString()));
        }
      }
    }
  }
  for (BlockId b = 1; b < options_.num_blocks; ++b) {
    if (refs[b] != pool_.ref_count(b)) {
      return absl::InternalError(absl::StrCat("block ", b, " has ref_count ", pool_.ref_count(b),
                                              " but ", refs[b], " table entries"));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvserve
