#include "worker/kv/kv_cache.h"

#include <cstring>
#include <limits>
#include <new>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvserve {

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(const ModelConfig& config,
                                                          int64_t num_blocks, int64_t block_size) {
  if (num_blocks <= 0 || block_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache needs positive num_blocks and block_size, got ",
                                                   num_blocks, " and ", block_size));
  }
  const int64_t per_block = int64_t{config.num_kv_heads} * config.head_dim * block_size;
  if (per_block <= 0 || num_blocks > std::numeric_limits<int64_t>::max() / 8 / per_block) {
    return absl::ResourceExhaustedError("KV cache size overflows");
  }
  std::unique_ptr<KvCache> cache(new KvCache());
  cache->layout_ = {config.num_kv_heads, config.head_dim, block_size};
  cache->num_blocks_ = num_blocks;
  const int64_t elems = per_block * num_blocks;
  for (int l = 0; l < config.num_layers; ++l) {
    std::unique_ptr<float[]> k(new (std::nothrow) float[elems]());
    std::unique_ptr<float[]> v(new (std::nothrow) float[elems]());
    if (k == nullptr || v == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", num_blocks,
                                                       " KV blocks (", elems * 8, " bytes per layer)"));
    }
    cache->k_.push_back(std::move(k));
    cache->v_.push_back(std::move(v));
  }
  return cache;
}

void KvCache::CopyBlock(int64_t src, int64_t dst) {
  const int64_t elems = layout_.num_kv_heads * layout_.block_size * layout_.head_dim;
  for (size_t l = 0; l < k_.size(); ++l) {
    std::memcpy(k_[l].get() + dst * elems, k_[l].get() + src * elems, elems * sizeof(float));
    std::memcpy(v_[l].get() + dst * elems, v_[l].get() + src * elems, elems * sizeof(float));
  }
}

int64_t KvCache::BytesPerToken(const ModelConfig& config) {
  return int64_t{2} * config.num_layers * config.num_kv_heads * config.head_dim *
         static_cast<int64_t>(sizeof(float));
}

}  // namespace kvserve
