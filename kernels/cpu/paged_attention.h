#ifndef KVSERVE_KERNELS_CPU_PAGED_ATTENTION_H_
#define KVSERVE_KERNELS_CPU_PAGED_ATTENTION_H_

#include <cstdint>

#include "kernels/cpu/thread_pool.h"

namespace kvserve::cpu {

/// Paged KV layout (one buffer for K, one for V, per layer):
/// [num_blocks][num_kv_heads][block_size][head_dim] fp32, i.e. element (block b, kv head h,
/// slot s, dim d) at ((b * num_kv_heads + h) * block_size + s) * head_dim + d.
struct PagedKvLayout {
  int64_t num_kv_heads, head_dim, block_size;
};

/// Writes n tokens' K and V ([n, num_kv_heads * head_dim], row i at k + i * k_stride /
/// v + i * v_stride) to slots slot_mapping[i] = block * block_size + offset. A negative slot
/// (padding) is skipped.
void WriteKvCache(const float* k, const float* v, int64_t n, int64_t k_stride, int64_t v_stride,
                  const int64_t* slot_mapping, const PagedKvLayout& layout, float* k_cache,
                  float* v_cache);

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
  const float* k_cache;         // PagedKvLayout buffers
  const float* v_cache;
  PagedKvLayout layout;
  float scale;             // usually 1 / sqrt(head_dim)
  int32_t sliding_window;  // 0 = none
};

/// Runs attention on the ActiveCpuIsa() path, parallel over (query token, kv head) on `pool`
/// (nullptr = inline); the query heads sharing a kv head are done together so K/V rows are read
/// once per group. Each output row/head is computed by one thread in an order fixed by its own
/// context: the result for a query token does not depend on the rest of the batch, the thread
/// count, the block size/placement, or whether it is computed in a prefill, a chunked prefill or
/// a decode step.
void PagedAttention(const PagedAttentionArgs& args, ThreadPool* pool);

}  // namespace kvserve::cpu

#endif  // KVSERVE_KERNELS_CPU_PAGED_ATTENTION_H_
