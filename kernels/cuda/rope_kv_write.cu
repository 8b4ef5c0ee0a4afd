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
                          float pos, const float* inv_freq, bool interleaved, const float* bias,
                          float* copy) {
  const int64_t half = rotary / 2;
  // Per head: the head_dim - rotary elements before the rope part (only with a bias or a copy),
  // then the rotated pairs.
  const int64_t plain = bias != nullptr || copy != nullptr ? head_dim - rotary : 0;
  const int64_t units = plain + half;
  for (int64_t idx = threadIdx.x; idx < num_heads * units; idx += blockDim.x) {
    const int64_t h = idx / units;
    const int64_t u = idx % units;
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
    const float angle = pos * inv_freq[i];
    const float c = cosf(angle);
    const float s = sinf(angle);
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
  // [2][num_kv_heads * head_dim] f32: rotated k, then v (MLA: k only), as the cache receives them
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
  // Element offsets of this token's rows; the pointers address f32 or bf16 elements.
  const int64_t elem = bf16 ? 2 : 4;
  auto row = [&](const float* base, int64_t stride) {
    return reinterpret_cast<float*>(const_cast<char*>(reinterpret_cast<const char*>(base)) +
                                    t * stride * elem);
  };
  RopeHeads(row(a.q, a.q_stride), bf16, a.num_heads, head_dim, rotary, pos, a.inv_freq,
            interleaved, a.q_bias, nullptr);
  RopeHeads(row(a.k, a.k_stride), bf16, kv_heads, head_dim, rotary, pos, a.inv_freq, interleaved,
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
  const size_t smem = (args.v == nullptr ? 1 : 2) * sizeof(float) * args.layout.num_kv_heads *
                      args.layout.head_dim;
  cudaError_t err = cudaSuccess;
  DispatchKvDType(args.layout.dtype, [&](auto tag) {
    constexpr KvCacheDType D = decltype(tag)::value;
    err = LaunchWithSharedMemory<RopeKvWriteKernel<D>>(static_cast<unsigned>(args.num_tokens),
                                                       kThreads, smem, stream, args);
  });
  return err;
}

}  // namespace kvserve::cuda
