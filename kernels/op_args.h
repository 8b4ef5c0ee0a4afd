#ifndef KVSERVE_KERNELS_OP_ARGS_H_
#define KVSERVE_KERNELS_OP_ARGS_H_

// Argument structs of the backend ops that have no CPU kernel struct of their own. Plain data,
// no framework headers: the CUDA kernels include this (kernels/backend.h adds the interface).

#include <cstdint>

#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/rope.h"
#include "kernels/dtype.h"
#include "kernels/kv_dtype.h"

namespace kvserve {

/// Embedding gather: out[i, :] = table[ids[i], :] in out_dtype (also a row gather of
/// activations: a kF32 or kBF16 table).
struct EmbeddingArgs {
  const void* table;  // [vocab, dim] in `dtype` (quantized: dim % 32 == 0)
  DType dtype;
  int64_t dim;
  const int32_t* ids;  // [n], each in [0, vocab) (validated by the caller)
  int64_t n;
  float* out;                     // [n, dim] contiguous, in out_dtype
  DType out_dtype = DType::kF32;  // kF32, or kBF16 on device backends (the CPU takes f32)
};

/// out[r, i] = silu(gate[r, i]) * up[r, i]; `out` may alias `gate` or `up` exactly.
struct SiluMulArgs {
  const float* gate;  // all three in `dtype` (pointers to 16-bit elements for kBF16)
  const float* up;
  float* out;
  int64_t rows, dim;
  int64_t gate_stride, up_stride, out_stride;  // elements
  DType dtype = DType::kF32;  // kF32, or kBF16 on device backends (computed in f32, rounded once)
};

/// RoPE on q and k (in place), then k and v written to the paged cache at slot_mapping
/// (converted / quantized to layout.dtype): cpu::ApplyRope twice and cpu::WriteKvCache, fused.
/// q heads are layout.head_dim wide, like the cache rows. MLA: rotary_dim is the rope part at
/// the end of each row, and v / v_cache are null (the cache holds K rows only).
///
/// Biases (Qwen2's q/k/v), when given, are added first, in f32: q and k become RoPE(q + bq) and
/// RoPE(k + bk) in place, and v + bv goes to the cache (v itself is not written). Fusing them
/// here spares the GEMM that made q/k/v a bias pass and, in bf16, a second rounding.
struct RopeKvWriteArgs {
  float* q;        // [num_tokens, q_stride]: num_heads heads of head_dim, in `dtype`
  float* k;        // [num_tokens, k_stride]: num_kv_heads heads of head_dim, in `dtype`
  const float* v;  // in `dtype`
  int64_t num_tokens, num_heads;
  int64_t q_stride, k_stride, v_stride;  // elements
  const int32_t* positions;              // [num_tokens]
  const float* inv_freq;                 // [head_dim / 2]
  cpu::RopeLayout rope_layout;
  const int64_t* slot_mapping;  // [num_tokens]; negative = padding, skipped
  cpu::PagedKvLayout layout;    // num_kv_heads and head_dim come from here
  cpu::KvCacheBuffer k_cache;
  cpu::KvCacheBuffer v_cache;
  int64_t rotary_dim = 0;  // elements rotated at the end of each head; 0: layout.head_dim
  DType dtype = DType::kF32;      // of q, k, v: kF32, or kBF16 on device backends
  const float* q_bias = nullptr;  // [num_heads * head_dim] f32, or null
  const float* k_bias = nullptr;  // [num_kv_heads * head_dim] f32, or null
  const float* v_bias = nullptr;  // [num_kv_heads * head_dim] f32, or null
};

/// Mixture-of-experts combine: out[t, :] = sum over j in [0, k) of weights[t * k + j] *
/// rows[slots[t * k + j], :], accumulated from 0 in j order (a negative slot adds nothing). The
/// caller orders each token's slots (ascending expert, then the shared experts), which fixes the
/// summation order whatever the batch. f32 on every backend: the rows are the experts' down
/// projections, which feed the f32 residual stream (Backend::activation_dtype).
struct MoeCombineArgs {
  const float* rows;     // [n, dim]: every expert's outputs, one row per (expert, token)
  const int32_t* slots;  // [tokens * k]
  const float* weights;  // [tokens * k]
  float* out;            // [tokens, dim]; must not alias rows
  int64_t tokens, k, dim;
};

/// What the attention planner needs to know of a batch, read on the host before the run.
struct AttentionShape {
  int64_t num_seqs = 0;
  int64_t num_heads = 0;
  int64_t max_q_len = 0;        // 1: every sequence decodes one token
  int64_t max_context_len = 0;  // the longest context (a capture plans for the largest it serves)
  cpu::PagedKvLayout layout;
  /// The longest context the caller will ever plan for (the model's max_position_embeddings; 0:
  /// max_context_len). A backend may size its work partition from it so that a sequence's
  /// result does not depend on max_context_len or num_seqs: a decode step replayed from a graph
  /// planned for the full context then gives the same bits as one planned for its real context.
  int64_t context_capacity = 0;
};

/// The work partition of one attention call, made on the host by PlanAttention. A run depends
/// only on the plan and on device memory, so it can be captured in a CUDA graph and replayed for
/// any batch of the same shape (context lengths up to max_context_len).
/// Which CUDA decode attention kernel a plan runs: the backend's choice, or (for benchmarks that
/// compare them) the CUDA-core kernel where it would pick the tensor-core one. Other backends
/// ignore it.
enum class DecodeKernel { kAuto, kCudaCores };

struct AttentionPlan {
  AttentionShape shape;
  bool decode = false;     // flash-decoding kernel (max_q_len == 1) instead of the prefill kernel
  int32_t num_splits = 1;  // decode: thread blocks per (sequence, kv head) along the context
  int64_t split_len = 0;   // decode: keys per split (fixed by the capacity; 0: context / splits)
  DecodeKernel decode_kernel = DecodeKernel::kAuto;
};

}  // namespace kvserve

#endif  // KVSERVE_KERNELS_OP_ARGS_H_
