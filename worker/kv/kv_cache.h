#ifndef KVSERVE_WORKER_KV_KV_CACHE_H_
#define KVSERVE_WORKER_KV_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/paged_attention.h"
#include "worker/model/model_config.h"

namespace kvserve {

/// The physical KV-cache memory of one worker shard: for every layer one K buffer and one V buffer,
/// each holding `num_blocks` blocks of `block_size` token slots.
///
/// Layout of each buffer (cpu::PagedKvLayout): [num_blocks][num_kv_heads][block_size][head_dim] f32,
/// so one kv head's keys of one block are a contiguous block_size x head_dim tile — the unit the
/// attention kernel streams. Slot `s` of the cache is block s / block_size, offset s % block_size.
/// Which blocks a sequence owns is decided elsewhere (the block pool); this class only holds bytes.
class KvCache {
 public:
  /// Allocates zeroed storage. Fails on non-positive sizes or if the allocation would overflow.
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(const ModelConfig& config, int64_t num_blocks,
                                                         int64_t block_size);

  float* k(int layer) { return k_[layer].get(); }
  float* v(int layer) { return v_[layer].get(); }
  const cpu::PagedKvLayout& layout() const { return layout_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return layout_.block_size; }
  int num_layers() const { return static_cast<int>(k_.size()); }

  /// Copies block `src` to block `dst` in every layer (copy-on-write of a shared block).
  void CopyBlock(int64_t src, int64_t dst);

  /// Bytes of K and V for one token across all layers.
  static int64_t BytesPerToken(const ModelConfig& config);

 private:
  KvCache() = default;

  cpu::PagedKvLayout layout_{};
  int64_t num_blocks_ = 0;
  std::vector<std::unique_ptr<float[]>> k_;
  std::vector<std::unique_ptr<float[]>> v_;
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_KV_KV_CACHE_H_
