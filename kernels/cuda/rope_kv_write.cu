#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/rope_kv_write.h"

namespace kvserve::cuda {
namespace {

constexpr int kThreads = 128;

// Rotates pair i of the last `rotary` elements of every head of one token in place.
__device__ void RotateHeads(float* x, int64_t num_heads, int64_t head_dim, int64_t rotary,
                            float pos, const float* inv_freq, bool interleaved) {
  const int64_t half = rotary / 2;
  for (int64_t idx = threadIdx.x; idx < num_heads * half; idx += blockDim.x) {
    const int64_t h = idx / half;
    const int64_t i = idx % half;
    float* head = x + h * head_dim + (head_dim - rotary);
    float* pa = interleaved ? head + 2 * i : head + i;
    float* pb = interleaved ? head + 2 * i + 1 : head + i + half;
    const float angle = pos * inv_freq[i];
    const float c = cosf(angle);
    const float s = sinf(angle);
    const float a = *pa;
    const float b = *pb;
    *pa = a * c - b * s;
    *pb = a * s + b * c;
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
  // [2][num_kv_heads * head_dim]: rotated k, then v (MLA: k only)
  KVSERVE_DYNAMIC_SHARED(float, smem);
  const int64_t t = blockIdx.x;
  const int64_t head_dim = a.layout.head_dim;
  const int64_t kv_heads = a.layout.num_kv_heads;
  const int64_t kv_dim = kv_heads * head_dim;
  const float pos = static_cast<float>(a.positions[t]);
  const bool interleaved = a.rope_layout == cpu::RopeLayout::kInterleaved;
  const int64_t rotary = a.rotary_dim > 0 ? a.rotary_dim : head_dim;
  RotateHeads(a.q + t * a.q_stride, a.num_heads, head_dim, rotary, pos, a.inv_freq, interleaved);
  float* k = a.k + t * a.k_stride;
  RotateHeads(k, kv_heads, head_dim, rotary, pos, a.inv_freq, interleaved);
  __syncthreads();  // each thread rotated pairs that others read below
  const int64_t slot = a.slot_mapping[t];
  if (slot < 0) return;
  float* ks = smem;
  float* vs = smem + kv_dim;
  const float* v = a.v == nullptr ? nullptr : a.v + t * a.v_stride;
  for (int64_t i = threadIdx.x; i < kv_dim; i += blockDim.x) {
    ks[i] = k[i];
    if (v != nullptr) vs[i] = v[i];
  }
  __syncthreads();
  const int64_t block = slot / a.layout.block_size;
  const int64_t offset = slot % a.layout.block_size;
  for (int64_t h = threadIdx.x / kWarp; h < kv_heads; h += blockDim.x / kWarp) {
    const int64_t row = (block * kv_heads + h) * a.layout.block_size + offset;
    EncodeRow<D>(ks + h * head_dim, head_dim, row, a.k_cache);
    if (v != nullptr) EncodeRow<D>(vs + h * head_dim, head_dim, row, a.v_cache);
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
