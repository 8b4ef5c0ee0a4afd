#ifndef KVSERVE_KERNELS_CPU_ROPE_H_
#define KVSERVE_KERNELS_CPU_ROPE_H_

#include <cstdint>

namespace kvserve::cpu {

/// Which elements of a head form a rotated pair.
enum class RopeLayout {
  kInterleaved,  // pairs (2i, 2i+1)        (GGUF/llama.cpp "normal" rope)
  kHalfSplit,    // pairs (i, i + head_dim/2) (HF "rotate_half" / NeoX)
};

/// Rotary position embedding, in place. Pair i of every head of token t rotates by
/// angle = float(positions[t]) * inv_freq[i] (fp32), with cos/sin in fp32:
///   (a, b) -> (a*cos - b*sin, a*sin + b*cos).
/// Only the last rotary_dim elements of each head rotate (MLA's rope part); the pairs are formed
/// inside that range by `layout`.
struct RopeArgs {
  float* x;  // token t, head h at x + t * token_stride + h * head_dim
  int64_t num_tokens, num_heads, head_dim, token_stride;
  const int32_t* positions;  // [num_tokens]
  const float* inv_freq;     // [rotary_dim / 2]
  RopeLayout layout;
  int64_t rotary_dim = 0;  // 0: head_dim (the whole head)
};

/// Applies RoPE in place (single-threaded: cheap next to the matmuls).
void ApplyRope(const RopeArgs& args);

}  // namespace kvserve::cpu

#endif  // KVSERVE_KERNELS_CPU_ROPE_H_
