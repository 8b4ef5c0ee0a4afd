#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/rope_kv_write.h"

namespace kvserve::cuda {
namespace {

constexpr int kThreads = 128;

// One token's heads of x (f32 or bf16, in place), each head_dim wide: the bias added (f32, may
// be null), then the last `rotary` elements of every head rotated; a bf16 x is rounded once.
// With `copy` (f32 shared memory, [num_heads * head_dim]) every element's final value also goes
// there; without a bias or a copy only the rotated pairs are touched.
__device__ void RopeHeads(float* x, bool bf16, int64_t num_heads, int64_t head_dim, int64_t rotary,
                          const float* cos_t, const float* sin_t, bool interleaved,
                          const float* bias, float* copy) {
  const int64_t half = rotary / 2;
  // Per head: the head_dim - rotary elements before the rope part (only with a bias or a copy),
  // then the rotated pairs. 32-bit index arithmetic: a token's heads are far below 2^31 elements.
  const int32_t plain =
      bias != nullptr || copy != nullptr ? static_cast<int32_t>(head_dim - rotary) : 0;
  const int32_t units = plain + static_cast<int32_t>(half);
  const int32_t total = static_cast<int32_t>(num_heads) * units;
  for (int32_t idx = threadIdx.x; idx < total; idx += blockDim.x) {
    const int64_t h = idx / units;
    const int32_t u = idx % units;
    const int64_t head = h * head_dim;
    if (u < plain) {
      float v = LoadAct(x, head + u, bf16);
      if (bias != nullptr) {
        v += bias[head + u];
        StoreAct(x, head + u, v, bf16);
      }
      if (copy != nullptr) copy[head + u] = bf16 ? LoadAct(x, head + u, true) : v;
      continue;
    }
    const int64_t i = u - plain;
    const int64_t rope0 = head + (head_dim - rotary);
    const int64_t ia = interleaved ? rope0 + 2 * i : rope0 + i;
    const int64_t ib = interleaved ? rope0 + 2 * i + 1 : rope0 + i + half;
    const float c = cos_t[i];
    const float s = sin_t[i];
    float a = LoadAct(x, ia, bf16);
    float b = LoadAct(x, ib, bf16);
    if (bias != nullptr) {
      a += bias[ia];
      b += bias[ib];
    }
    StoreAct(x, ia, a * c - b * s, bf16);
    StoreAct(x, ib, a * s + b * c, bf16);
    if (copy != nullptr) {
      copy[ia] = LoadAct(x, ia, bf16);
      copy[ib] = LoadAct(x, ib, bf16);
    }
  }
}

// One warp stores one (token, kv head) vector of head_dim floats as dtype D at row `row`.
template <KvCacheDType D>
__device__ void EncodeRow(const float* x, int64_t head_dim, int64_t row, cpu::KvCacheBuffer dst) {
  const int lane = threadIdx.x % kWarp;
  const int64_t base = row * head_dim;
  if constexpr (D == KvCacheDType::kF32) {
    for (int64_t d = lane; d < head_dim; d += kWarp) static_cast<float*>(dst.data)[base + d] = x[d];
  } else if constexpr (D == KvCacheDType::kF16) {
    for (int64_t d = lane; d < head_dim; d += kWarp) {
      static_cast<uint16_t*>(dst.data)[base + d] = __half_as_ushort(__float2half_rn(x[d]));
    }
  } else if constexpr (D == KvCacheDType::kBF16) {
    for (int64_t d = lane; d < head_dim; d += kWarp) {
      static_cast<uint16_t*>(dst.data)[base + d] = FloatToBf16Bits(x[d]);
    }
  } else {
    float amax = 0.0f;
    for (int64_t d = lane; d < head_dim; d += kWarp) amax = fmaxf(amax, fabsf(x[d]));
    amax = WarpMax(amax);
    const float s = amax / (D == KvCacheDType::kInt8 ? 127.0f : 448.0f);
    if (lane == 0) dst.scales[row] = s;
    for (int64_t d = lane; d < head_dim; d += kWarp) {
      if constexpr (D == KvCacheDType::kInt8) {
        float q = s == 0.0f ? 0.0f : rintf(x[d] / s);
        if (q != q) q = 0.0f;
        q = fminf(fmaxf(q, -127.0f), 127.0f);
        static_cast<int8_t*>(dst.data)[base + d] = static_cast<int8_t>(q);
      } else {
        static_cast<uint8_t*>(dst.data)[base + d] = s == 0.0f ? 0 : FloatToFp8(x[d] / s);
      }
    }
  }
}

template <KvCacheDType D>
__global__ void RopeKvWriteKernel(RopeKvWriteArgs a) {
  // [2][num_kv_heads * head_dim] f32: rotated k, then v (MLA: k only), as the cache receives
  // them; then cos and sin [rotary / 2] f32 of this token's angles.
  KVSERVE_DYNAMIC_SHARED(float, smem);
  const int64_t t = blockIdx.x;
  const bool bf16 = a.dtype == DType::kBF16;
  const int64_t head_dim = a.layout.head_dim;
  const int64_t kv_heads = a.layout.num_kv_heads;
  const int64_t kv_dim = kv_heads * head_dim;
  const float pos = static_cast<float>(a.positions[t]);
  const bool interleaved = a.rope_layout == cpu::RopeLayout::kInterleaved;
  const int64_t rotary = a.rotary_dim > 0 ? a.rotary_dim : head_dim;
  const int64_t slot = a.slot_mapping[t];
  float* ks = smem;
  float* vs = smem + kv_dim;
  float* cos_t = smem + (a.v != nullptr ? 2 : 1) * kv_dim;
  float* sin_t = cos_t + rotary / 2;
  // Each angle's cosine and sine once per token, not once per head of q and of k.
  for (int64_t i = threadIdx.x; i < rotary / 2; i += blockDim.x) {
    const float angle = pos * a.inv_freq[i];
    cos_t[i] = cosf(angle);
    sin_t[i] = sinf(angle);
  }
  __syncthreads();
  // Element offsets of this token's rows; the pointers address f32 or bf16 elements.
  const int64_t elem = bf16 ? 2 : 4;
  auto row = [&](const float* base, int64_t stride) {
    return reinterpret_cast<float*>(const_cast<char*>(reinterpret_cast<const char*>(base)) +
                                    t * stride * elem);
  };
  RopeHeads(row(a.q, a.q_stride), bf16, a.num_heads, head_dim, rotary, cos_t, sin_t, interleaved,
            a.q_bias, nullptr);
  RopeHeads(row(a.k, a.k_stride), bf16, kv_heads, head_dim, rotary, cos_t, sin_t, interleaved,
            a.k_bias, slot >= 0 ? ks : nullptr);
  if (slot < 0) return;
  if (a.v != nullptr) {
    const float* v = row(a.v, a.v_stride);
    for (int64_t i = threadIdx.x; i < kv_dim; i += blockDim.x) {
      vs[i] = LoadAct(v, i, bf16) + (a.v_bias != nullptr ? a.v_bias[i] : 0.0f);
    }
  }
  __syncthreads();  // each thread staged elements that others encode below
  const int64_t block = slot / a.layout.block_size;
  const int64_t offset = slot % a.layout.block_size;
  for (int64_t h = threadIdx.x / kWarp; h < kv_heads; h += blockDim.x / kWarp) {
    const int64_t cache_row = (block * kv_heads + h) * a.layout.block_size + offset;
    EncodeRow<D>(ks + h * head_dim, head_dim, cache_row, a.k_cache);
    if (a.v != nullptr) EncodeRow<D>(vs + h * head_dim, head_dim, cache_row, a.v_cache);
  }
}

}  // namespace

cudaError_t RopeKvWrite(const RopeKvWriteArgs& args, cudaStream_t stream) {
  if (args.num_tokens <= 0) return cudaSuccess;
  const int64_t rotary = args.rotary_dim > 0 ? args.rotary_dim : args.layout.head_dim;
  const size_t smem = sizeof(float) * ((args.v == nullptr ? 1 : 2) * args.layout.num_kv_heads *
                                           args.layout.head_dim +
                                       2 * (rotary / 2));
  cudaError_t err = cudaSuccess;
  DispatchKvDType(args.layout.dtype, [&](auto tag) {
    constexpr KvCacheDType D = decltype(tag)::value;
    err = LaunchWithSharedMemory<RopeKvWriteKernel<D>>(static_cast<unsigned>(args.num_tokens),
                                                       kThreads, smem, stream, args);
  });
  return err;
}

}  // namespace kvserve::cuda
