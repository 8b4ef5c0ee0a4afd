#ifndef KVSERVE_WORKER_KV_KV_CACHE_H_
#define KVSERVE_WORKER_KV_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/kv_dtype.h"
#include "worker/model/model_config.h"

namespace kvserve {

/// The physical KV-cache memory of one worker shard: for every layer one K buffer and one V buffer,
/// each holding `num_blocks` blocks of `block_size` token slots, in one KvCacheDType.
///
/// Layout (cpu::PagedKvLayout), per layer and for K and V alike:
///   data:   [num_blocks][num_kv_heads][block_size][head_dim] elements of the dtype (4, 2 or 1
///           bytes), so one kv head's keys of one block are a contiguous block_size x head_dim
///           tile — the unit the attention kernel streams.
///   scales: int8 / fp8 only: [num_blocks][num_kv_heads][block_size] f32, one per token and kv
///           head (the "row" (block * num_kv_heads + head) * block_size + offset); element value
///           = scale * decoded code. Empty (null) for f32 / f16 / bf16.
/// Slot `s` of the cache is block s / block_size, offset s % block_size. Which blocks a sequence
/// owns is decided elsewhere (the block pool); this class only holds bytes.
class KvCache {
 public:
  /// Allocates zeroed storage (zero bytes decode to 0.0 in every dtype, with scale 0). Fails on
  /// non-positive sizes, a config without layers / kv heads / head_dim, or if the allocation
  /// would overflow or cannot be made.
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(
      const ModelConfig& config, int64_t num_blocks, int64_t block_size,
      KvCacheDType dtype = KvCacheDType::kF32);

  /// Layer `layer`'s K storage (data + scales), for cpu::WriteKvCache / cpu::PagedAttention.
  cpu::KvCacheBuffer k(int layer) { return {k_[layer].data.get(), k_[layer].scales.get()}; }
  /// Layer `layer`'s V storage (data + scales).
  cpu::KvCacheBuffer v(int layer) { return {v_[layer].data.get(), v_[layer].scales.get()}; }
  /// Read-only K storage of `layer`.
  cpu::ConstKvCacheBuffer k(int layer) const {
    return {k_[layer].data.get(), k_[layer].scales.get()};
  }
  /// Read-only V storage of `layer`.
  cpu::ConstKvCacheBuffer v(int layer) const {
    return {v_[layer].data.get(), v_[layer].scales.get()};
  }
  /// Shape and dtype of every buffer.
  const cpu::PagedKvLayout& layout() const { return layout_; }
  /// Element type of the cache.
  KvCacheDType dtype() const { return layout_.dtype; }
  /// Number of blocks per buffer.
  int64_t num_blocks() const { return num_blocks_; }
  /// Token slots per block.
  int64_t block_size() const { return layout_.block_size; }
  /// Number of layers (K/V buffer pairs).
  int num_layers() const { return static_cast<int>(k_.size()); }

  /// Copies block `src` to block `dst` (data and scales) in every layer (copy-on-write of a
  /// shared block). Both must be in [0, num_blocks).
  void CopyBlock(int64_t src, int64_t dst);

  /// Bytes of K and V for one token across all layers, scales included:
  /// 2 * num_layers * num_kv_heads * KvCacheDTypeVectorBytes(dtype, head_dim).
  static int64_t BytesPerToken(const ModelConfig& config, KvCacheDType dtype = KvCacheDType::kF32);

 private:
  struct Buffer {
    std::unique_ptr<uint8_t[]> data;  // [num_blocks][num_kv_heads][block_size][head_dim] elements
    std::unique_ptr<float[]> scales;  // [num_blocks][num_kv_heads][block_size]; int8 / fp8 only
  };

  KvCache() = default;

  cpu::PagedKvLayout layout_{};
  int64_t num_blocks_ = 0;
  std::vector<Buffer> k_;
  std::vector<Buffer> v_;
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_KV_KV_CACHE_H_
