#include "worker/kv/kv_cache.h"

#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvserve {

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(const ModelConfig& config,
                                                          int64_t num_blocks, int64_t block_size,
                                                          KvCacheDType dtype) {
  if (num_blocks <= 0 || block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache needs positive num_blocks and block_size, got ", num_blocks,
                     " and ", block_size));
  }
  if (config.num_layers <= 0 || config.num_kv_heads <= 0 || config.head_dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV cache needs positive num_layers, num_kv_heads and head_dim, got ", config.num_layers,
        ", ", config.num_kv_heads, " and ", config.head_dim));
  }
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const int64_t elem_bytes = KvCacheDTypeElemBytes(dtype);
  const bool scaled = KvCacheDTypeHasScales(dtype);
  // Rows (token x kv head vectors) per block, then per buffer; every product is checked.
  const int64_t kv_heads = config.num_kv_heads;
  const int64_t head_dim = config.head_dim;
  if (block_size > kMax / kv_heads) return absl::ResourceExhaustedError("KV cache size overflows");
  const int64_t rows_per_block = kv_heads * block_size;
  if (num_blocks > kMax / rows_per_block / (head_dim * elem_bytes + 4) / 2) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache size overflows (", num_blocks,
                                                     " blocks of ", block_size, " tokens)"));
  }
  const int64_t rows = rows_per_block * num_blocks;
  const int64_t data_bytes = rows * head_dim * elem_bytes;

  std::unique_ptr<KvCache> cache(new KvCache());
  cache->layout_ = {kv_heads, head_dim, block_size, dtype};
  cache->num_blocks_ = num_blocks;
  for (int l = 0; l < config.num_layers; ++l) {
    for (std::vector<Buffer>* buffers : {&cache->k_, &cache->v_}) {
      Buffer b;
      b.data.reset(new (std::nothrow) uint8_t[data_bytes]());
      if (scaled) b.scales.reset(new (std::nothrow) float[rows]());
      if (b.data == nullptr || (scaled && b.scales == nullptr)) {
        return absl::ResourceExhaustedError(
            absl::StrCat("cannot allocate ", num_blocks, " KV blocks (",
                         data_bytes + (scaled ? rows * 4 : 0), " bytes per buffer, ",
                         std::string(KvCacheDTypeName(dtype)), ")"));
      }
      buffers->push_back(std::move(b));
    }
  }
  return cache;
}

void KvCache::CopyBlock(int64_t src, int64_t dst) {
  if (src == dst) return;
  const int64_t rows = layout_.num_kv_heads * layout_.block_size;
  const int64_t bytes = rows * layout_.head_dim * KvCacheDTypeElemBytes(layout_.dtype);
  for (std::vector<Buffer>* buffers : {&k_, &v_}) {
    for (Buffer& b : *buffers) {
      std::memcpy(b.data.get() + dst * bytes, b.data.get() + src * bytes,
                  static_cast<size_t>(bytes));
      if (b.scales != nullptr) {
        std::memcpy(b.scales.get() + dst * rows, b.scales.get() + src * rows,
                    static_cast<size_t>(rows) * sizeof(float));
      }
    }
  }
}

int64_t KvCache::BytesPerToken(const ModelConfig& config, KvCacheDType dtype) {
  return int64_t{2} * config.num_layers * config.num_kv_heads *
         KvCacheDTypeVectorBytes(dtype, config.head_dim);
}

}  // namespace kvserve
