#ifndef KVSERVE_KERNELS_CPU_PAGED_ATTENTION_H_
#define KVSERVE_KERNELS_CPU_PAGED_ATTENTION_H_

#include <cstdint>

#include "kernels/cpu/thread_pool.h"
#include "kernels/dtype.h"
#include "kernels/kv_dtype.h"

namespace kvserve::cpu {

/// Paged KV layout (one buffer for K, one for V, per layer): elements of `dtype` in the order
/// [num_blocks][num_kv_heads][block_size][head_dim], i.e. element (block b, kv head h, slot s,
/// dim d) at index ((b * num_kv_heads + h) * block_size + s) * head_dim + d, byte offset that
/// times KvCacheDTypeElemBytes(dtype). Each (b, h, s) vector is a "row", numbered
/// (b * num_kv_heads + h) * block_size + s. For int8 / fp8 every buffer has a companion f32 scale
/// array [num_blocks][num_kv_heads][block_size] indexed by row: element value = scale[row] *
/// decoded code (kernels/cpu/kv_quant.h).
struct PagedKvLayout {
  int64_t num_kv_heads, head_dim, block_size;
  KvCacheDType dtype = KvCacheDType::kF32;
};

/// One layer's K or V cache storage: `data` holds the elements (PagedKvLayout order, in
/// layout.dtype); `scales` the per-row f32 scales for int8 / fp8 (unused, may be null, for the
/// other dtypes). Converts implicitly from a plain float* so f32 callers pass their buffer as is.
struct KvCacheBuffer {
  void* data = nullptr;
  float* scales = nullptr;

  KvCacheBuffer() = default;
  /// An f32 cache (no scales).
  KvCacheBuffer(float* f32_data) : data(f32_data) {}  // NOLINT(google-explicit-constructor)
  /// Any dtype: element bytes and (int8 / fp8) scales.
  KvCacheBuffer(void* bytes, float* row_scales) : data(bytes), scales(row_scales) {}
};

/// Read-only view of a KvCacheBuffer.
struct ConstKvCacheBuffer {
  const void* data = nullptr;
  const float* scales = nullptr;

  ConstKvCacheBuffer() = default;
  /// An f32 cache (no scales).
  ConstKvCacheBuffer(const float* f32_data)  // NOLINT(google-explicit-constructor)
      : data(f32_data) {}
  /// Any dtype: element bytes and (int8 / fp8) scales.
  ConstKvCacheBuffer(const void* bytes, const float* row_scales)
      : data(bytes), scales(row_scales) {}
  /// The same storage, read-only.
  ConstKvCacheBuffer(const KvCacheBuffer& b)  // NOLINT(google-explicit-constructor)
      : data(b.data), scales(b.scales) {}
};

/// Writes n tokens' K and V ([n, num_kv_heads * head_dim], row i at k + i * k_stride /
/// v + i * v_stride) to slots slot_mapping[i] = block * block_size + offset, converting each
/// (token, kv head) vector to layout.dtype with EncodeKvVector (kernels/cpu/kv_quant.h; int8 /
/// fp8 also write that row's scale). A negative slot (padding) is skipped. int8 / fp8 caches
/// must come with scale arrays. A null `v` writes K only (MLA, whose V is part of the K row).
void WriteKvCache(const float* k, const float* v, int64_t n, int64_t k_stride, int64_t v_stride,
                  const int64_t* slot_mapping, const PagedKvLayout& layout, KvCacheBuffer k_cache,
                  KvCacheBuffer v_cache);

/// Causal attention for a batch of sequences, each with q_len new query tokens at the END of a
/// context of context_len tokens: query j of sequence s sits at position
/// p = context_len[s] - q_len[s] + j and attends keys max(0, p - sliding_window + 1) .. p
/// (keys 0 .. p when sliding_window == 0). Decode is q_len = 1, prefill q_len = context_len,
/// chunked prefill anything between. GQA: query head h reads kv head
/// h / (num_heads / num_kv_heads). The new tokens' K/V must already be in the cache.
struct PagedAttentionArgs {
  const float* q;    // [num_tokens, num_heads * head_dim]; tokens of sequence s are rows
  int64_t q_stride;  //   q_start[s] .. q_start[s] + q_len[s]; element stride of rows
  float* out;        // same shape/rows as q
  int64_t out_stride;
  int64_t num_seqs, num_heads;
  const int32_t* q_start;       // [num_seqs]
  const int32_t* q_len;         // [num_seqs]
  const int32_t* context_len;   // [num_seqs], >= q_len
  const int32_t* block_tables;  // block_tables[s * block_table_stride + i] = physical block of
  int64_t block_table_stride;   //   the i-th block of sequence s
  ConstKvCacheBuffer k_cache;   // PagedKvLayout buffers (a float* converts for f32)
  ConstKvCacheBuffer v_cache;
  PagedKvLayout layout;
  float scale;             // usually 1 / sqrt(head_dim)
  int32_t sliding_window;  // 0 = none
  // Element type of q and out: kF32, or kBF16 on device backends (Backend::activation_dtype;
  // the pointers then address 16-bit elements). Scores and sums stay f32. The CPU takes f32.
  DType act_dtype = DType::kF32;
};

/// Runs attention on the ActiveCpuIsa() path, reading K/V in layout.dtype (dequantized in the
/// inner loops: score = dot(q, decoded k) * k_scale * scale, and v rows enter the weighted sum as
/// (p * v_scale) * decoded v), parallel over (query token, kv head) on `pool`
/// (nullptr = inline); the query heads sharing a kv head are done together so K/V rows are read
/// once per group. Each output row/head is computed by one thread in an order fixed by its own
/// context: the result for a query token does not depend on the rest of the batch, the thread
/// count, the block size/placement, or whether it is computed in a prefill, a chunked prefill or
/// a decode step.
void PagedAttention(const PagedAttentionArgs& args, ThreadPool* pool);

}  // namespace kvserve::cpu

#endif  // KVSERVE_KERNELS_CPU_PAGED_ATTENTION_H_
