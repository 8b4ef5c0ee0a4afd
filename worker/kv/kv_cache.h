#ifndef KVSERVE_WORKER_KV_KV_CACHE_H_
#define KVSERVE_WORKER_KV_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/io/anonymous_memory.h"
#include "kernels/backend.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/kv_dtype.h"
#include "worker/model/model_config.h"

namespace kvserve {

/// The physical KV-cache memory of one worker shard: for every layer one K buffer and one V buffer,
/// each holding `num_blocks` blocks of `block_size` token slots, in one KvCacheDType. An MLA model
/// (ModelConfig::is_mla) has K buffers only, of one "kv head" whose rows are the latent vector
/// plus the rope key (kv_lora_rank + qk_rope_head_dim), shared by every attention head.
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
///
/// Memory: host memory by default, mapped without being touched, so RAM follows the blocks in
/// use and not the pool's size; with a device backend (Create's `backend`) every buffer is
/// device memory from that backend, zeroed with its Memset, and CopyBlock copies on the device.
class KvCache {
 public:
  /// Allocates zeroed storage (zero bytes decode to 0.0 in every dtype, with scale 0). Fails on
  /// non-positive sizes, a config without layers / kv heads / head_dim, or if the allocation
  /// would overflow or cannot be made.
  /// `backend` (null: host memory) must outlive the cache.
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(
      const ModelConfig& config, int64_t num_blocks, int64_t block_size,
      KvCacheDType dtype = KvCacheDType::kF32, Backend* backend = nullptr);

  /// Layer `layer`'s K storage (data + scales), for cpu::WriteKvCache / cpu::PagedAttention.
  cpu::KvCacheBuffer k(int layer) { return {k_[layer].data, k_[layer].scales}; }
  /// Layer `layer`'s V storage (data + scales); empty (null) for MLA, whose V is the latent part
  /// of the K row.
  cpu::KvCacheBuffer v(int layer) {
    return v_.empty() ? cpu::KvCacheBuffer() : cpu::KvCacheBuffer{v_[layer].data, v_[layer].scales};
  }
  /// Read-only K storage of `layer`.
  cpu::ConstKvCacheBuffer k(int layer) const { return {k_[layer].data, k_[layer].scales}; }
  /// Read-only V storage of `layer` (empty for MLA).
  cpu::ConstKvCacheBuffer v(int layer) const {
    return v_.empty() ? cpu::ConstKvCacheBuffer()
                      : cpu::ConstKvCacheBuffer{v_[layer].data, v_[layer].scales};
  }
  /// Whether the buffers are device memory of a backend (not host memory).
  bool on_device() const { return backend_ != nullptr; }
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

  /// Bytes of one block in every layer, scales included: the size ReadBlock writes. Layer by
  /// layer: K data, K scales, V data, V scales (absent parts skipped).
  int64_t BlockBytes() const;
  /// Copies block `block` (in [0, num_blocks)) into `dst` (BlockBytes() bytes), in BlockBytes'
  /// order. With a device backend the copy is queued after the work already queued, and the
  /// bytes are in `dst` after FinishCopies.
  absl::Status ReadBlock(int64_t block, uint8_t* dst) const;
  /// The inverse of ReadBlock: overwrites block `block` with `src` (BlockBytes() bytes). With a
  /// device backend the copy is queued: `src` must stay unchanged until FinishCopies.
  absl::Status WriteBlock(int64_t block, const uint8_t* src);
  /// Waits for the queued ReadBlock / WriteBlock copies (no-op in host memory).
  absl::Status FinishCopies() const;
  /// The device backend, or null for host memory.
  Backend* backend() const { return backend_; }

  /// Bytes of K and V for one token across all layers, scales included:
  /// 2 * num_layers * num_kv_heads * KvCacheDTypeVectorBytes(dtype, head_dim); MLA (one latent
  /// row, no V): num_layers * KvCacheDTypeVectorBytes(dtype, kv_lora_rank + qk_rope_head_dim).
  static int64_t BytesPerToken(const ModelConfig& config, KvCacheDType dtype = KvCacheDType::kF32);

 private:
  struct Buffer {
    uint8_t* data = nullptr;  // [num_blocks][num_kv_heads][block_size][head_dim] elements
    float* scales = nullptr;  // [num_blocks][num_kv_heads][block_size]; int8 / fp8 only
    // Owners: host mappings (committed as blocks are first written; on huge pages, which the
    // decode attention's scattered per-block reads need to avoid a TLB miss per run), or device
    // memory of backend_.
    AnonymousMemory host_data;
    AnonymousMemory host_scales;
    DeviceBuffer device_data;
    DeviceBuffer device_scales;
  };

  KvCache() = default;
  /// Calls fn(pointer, bytes) for each contiguous part of block `block`, in BlockBytes' order.
  template <typename Fn>
  void ForEachPart(int64_t block, Fn&& fn) const;
  /// Allocates and zeroes one device buffer (and its scales when scale_count > 0).
  absl::Status AllocDevice(Buffer* b, int64_t data_bytes, int64_t scale_count);

  Backend* backend_ = nullptr;  // device backend, or null for host memory
  cpu::PagedKvLayout layout_{};
  int64_t num_blocks_ = 0;
  std::vector<Buffer> k_;
  std::vector<Buffer> v_;
};

}  // namespace kvserve

#endif  // KVSERVE_WORKER_KV_KV_CACHE_H_
