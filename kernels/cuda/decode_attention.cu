#include <algorithm>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/launch.cuh"

namespace kvserve::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / kWarp;
constexpr int kTile = 64;  // keys per tile
// Key values each lane holds: 8 for head_dim <= 256, 18 for MLA's latent rows (<= 576).
constexpr int kDimsPerLaneSmall = 8;
constexpr int kDimsPerLaneLarge = 18;
// Shared memory one block may use: a group too large for it (MLA's many query heads on one
// latent row) is cut into several blocks of heads_per_block heads.
constexpr size_t kSharedBudget = 96 * 1024;

struct DecodeParams {
  cpu::PagedAttentionArgs a;
  int64_t group;            // query heads per kv head
  int64_t heads_per_block;  // of the group, per thread block (the last block may have fewer)
  int64_t head_chunks;      // blocks per kv head: ceil(group / heads_per_block)
  int32_t num_splits;
  int64_t split_len;   // keys per split (0: this sequence's keys / num_splits)
  float* partial_out;  // [num_seqs][num_heads][num_splits][head_dim]
  float* partial_lse;  // [num_seqs][num_heads][num_splits]
};

// Shared memory: q[G][D] | acc[G][D] | p[G][kTile] | m[G] | l[G] | alpha[G] | kscale, vscale
// [kTile] | rows[kTile] (int64).
template <KvCacheDType DT, int kMaxDimPerLane>
__global__ void DecodeKernel(DecodeParams p) {
  KVSERVE_DYNAMIC_SHARED(float, smem);
  const cpu::PagedAttentionArgs& a = p.a;
  const int64_t D = a.layout.head_dim;
  const int64_t kv_heads = a.layout.num_kv_heads;
  const int64_t bs = a.layout.block_size;
  const int64_t kvh = blockIdx.x / p.head_chunks;
  // This block's heads of the group: [g0, g0 + G).
  const int64_t g0 = (blockIdx.x % p.head_chunks) * p.heads_per_block;
  const int64_t G = min(p.heads_per_block, p.group - g0);
  const int64_t head0 = kvh * p.group + g0;
  const int64_t s = blockIdx.y;
  const int32_t split = blockIdx.z;
  float* q_s = smem;
  float* acc = q_s + G * D;
  float* prob = acc + G * D;
  float* m_s = prob + G * kTile;
  float* l_s = m_s + G;
  float* alpha_s = l_s + G;
  float* kscale = alpha_s + G;
  float* vscale = kscale + kTile;
  int64_t* rows =
      reinterpret_cast<int64_t*>((reinterpret_cast<uintptr_t>(vscale + kTile) + 7) & ~uintptr_t{7});

  const int64_t ctx = a.context_len[s];
  const int64_t start = a.sliding_window > 0 ? max(int64_t{0}, ctx - a.sliding_window) : 0;
  const int64_t chunk =
      p.split_len > 0 ? p.split_len : (ctx - start + p.num_splits - 1) / p.num_splits;
  const int64_t k0 = start + split * chunk;
  const int64_t k1 = min(ctx, k0 + chunk);
  const int64_t qrow = a.q_start[s];
  for (int64_t i = threadIdx.x; i < G * D; i += blockDim.x) {
    q_s[i] = a.q[qrow * a.q_stride + head0 * D + i];
    acc[i] = 0.0f;
  }
  for (int64_t g = threadIdx.x; g < G; g += blockDim.x) {
    m_s[g] = -INFINITY;
    l_s[g] = 0.0f;
  }
  __syncthreads();
  const int warp = threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  const int32_t* table = a.block_tables + s * a.block_table_stride;
  for (int64_t t0 = k0; t0 < k1; t0 += kTile) {
    const int64_t n = min(int64_t{kTile}, k1 - t0);
    // Scores: one warp per key; the key row is read once into registers for all G heads.
    for (int64_t j = warp; j < n; j += kWarps) {
      const int64_t pos = t0 + j;
      const int64_t row = (static_cast<int64_t>(table[pos / bs]) * kv_heads + kvh) * bs + pos % bs;
      float kr[kMaxDimPerLane];
#pragma unroll
      for (int e = 0; e < kMaxDimPerLane; ++e) {
        const int64_t d = lane + e * kWarp;
        kr[e] = d < D ? LoadKv<DT>(a.k_cache.data, row * D + d) : 0.0f;
      }
      const float ks = KvScale<DT>(a.k_cache.scales, row);
      for (int64_t g = 0; g < G; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < kMaxDimPerLane; ++e) {
          const int64_t d = lane + e * kWarp;
          if (d < D) dot += q_s[g * D + d] * kr[e];
        }
        dot = WarpSum(dot);
        if (lane == 0) prob[g * kTile + j] = dot * ks * a.scale;
      }
      if (lane == 0) {
        rows[j] = row;
        kscale[j] = ks;
        vscale[j] = KvScale<DT>(a.v_cache.scales, row);
      }
    }
    __syncthreads();
    // Online softmax, one thread per query head.
    for (int64_t g = threadIdx.x; g < G; g += blockDim.x) {
      float mt = m_s[g];
      for (int64_t j = 0; j < n; ++j) mt = fmaxf(mt, prob[g * kTile + j]);
      const float alpha = m_s[g] == -INFINITY ? 0.0f : expf(m_s[g] - mt);
      float sum = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        const float e = expf(prob[g * kTile + j] - mt);
        prob[g * kTile + j] = e;
        sum += e;
      }
      l_s[g] = l_s[g] * alpha + sum;
      m_s[g] = mt;
      alpha_s[g] = alpha;
    }
    __syncthreads();
    // Values: each thread owns dims d of every head in the group; a V element is read once.
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      for (int64_t g = 0; g < G; ++g) acc[g * D + d] *= alpha_s[g];
      for (int64_t j = 0; j < n; ++j) {
        const float v = LoadKv<DT>(a.v_cache.data, rows[j] * D + d);
        for (int64_t g = 0; g < G; ++g) acc[g * D + d] += (prob[g * kTile + j] * vscale[j]) * v;
      }
    }
    __syncthreads();
  }
  for (int64_t i = threadIdx.x; i < G * D; i += blockDim.x) {
    const int64_t g = i / D;
    const int64_t h = head0 + g;
    const float l = l_s[g];
    const float o = l > 0.0f ? acc[i] / l : 0.0f;
    if (p.num_splits == 1) {
      a.out[qrow * a.out_stride + h * D + i % D] = o;
    } else {
      const int64_t slot = (s * a.num_heads + h) * p.num_splits + split;
      p.partial_out[slot * D + i % D] = o;
      if (i % D == 0) p.partial_lse[slot] = l > 0.0f ? m_s[g] + logf(l) : -INFINITY;
    }
  }
}

// Combines the splits of one (sequence, head): weights exp(lse_s - max lse).
__global__ void MergeKernel(DecodeParams p) {
  const cpu::PagedAttentionArgs& a = p.a;
  const int64_t h = blockIdx.x;
  const int64_t s = blockIdx.y;
  const int64_t D = a.layout.head_dim;
  const int64_t base = (s * a.num_heads + h) * p.num_splits;
  float mx = -INFINITY;
  for (int32_t i = 0; i < p.num_splits; ++i) mx = fmaxf(mx, p.partial_lse[base + i]);
  float* out = a.out + static_cast<int64_t>(a.q_start[s]) * a.out_stride + h * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float num = 0.0f;
    float den = 0.0f;
    for (int32_t i = 0; i < p.num_splits; ++i) {
      const float lse = p.partial_lse[base + i];
      if (lse == -INFINITY) continue;
      const float w = expf(lse - mx);
      num += w * p.partial_out[(base + i) * D + d];
      den += w;
    }
    out[d] = den > 0.0f ? num / den : 0.0f;
  }
}

}  // namespace

DecodeSplits PlanDecodeSplits(const AttentionShape& shape, int num_sms) {
  constexpr int64_t kMaxSplits = 64;
  DecodeSplits d;
  const int64_t longest = std::max<int64_t>(1, shape.max_context_len);
  if (shape.context_capacity > 0) {
    int64_t len = std::max<int64_t>(256, CeilDiv(shape.context_capacity, kMaxSplits));
    len = CeilDiv(len, kTile) * kTile;
    const int64_t splits = CeilDiv(longest, len);
    if (splits <= kMaxSplits) {
      d.num_splits = static_cast<int32_t>(splits);
      d.split_len = len;
      return d;
    }
    // A context past the capacity: correct, but no longer cut where other plans cut it.
  }
  const int64_t blocks = std::max<int64_t>(1, shape.num_seqs * shape.layout.num_kv_heads);
  const int64_t want = CeilDiv(2 * int64_t{num_sms}, blocks);
  const int64_t by_len = std::max<int64_t>(1, CeilDiv(longest, 128));
  d.num_splits = static_cast<int32_t>(std::clamp<int64_t>(std::min(want, by_len), 1, kMaxSplits));
  return d;
}

namespace {

// Shared bytes of a block of g query heads of width D (the layout DecodeKernel documents).
size_t DecodeSharedBytes(int64_t g, int64_t D) {
  return sizeof(float) * (2 * g * D + g * kTile + 3 * g + 2 * kTile) + sizeof(int64_t) * kTile +
         8;  // + 8: int64 alignment of rows
}

template <KvCacheDType DT, int kLanes>
cudaError_t LaunchDecode(const DecodeParams& p, dim3 grid, size_t smem, cudaStream_t stream) {
  constexpr auto kKernel = DecodeKernel<DT, kLanes>;
  if (smem > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(
        kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  KVSERVE_LAUNCH(kKernel, grid, kThreads, smem, stream, p);
  return cudaGetLastError();
}

}  // namespace

size_t DecodeWorkspaceBytes(const AttentionPlan& plan) {
  if (plan.num_splits <= 1) return 0;
  const int64_t slots = plan.shape.num_seqs * plan.shape.num_heads * plan.num_splits;
  return sizeof(float) * slots * (plan.shape.layout.head_dim + 1);
}

cudaError_t DecodeAttention(const cpu::PagedAttentionArgs& args, const AttentionPlan& plan,
                            void* workspace, cudaStream_t stream) {
  if (args.num_seqs <= 0) return cudaSuccess;
  const int64_t D = args.layout.head_dim;
  if (D > kDimsPerLaneLarge * kWarp || args.num_heads % args.layout.num_kv_heads != 0) {
    return cudaErrorInvalidValue;
  }
  const int64_t group = args.num_heads / args.layout.num_kv_heads;
  int64_t per_block = group;
  while (per_block > 1 && DecodeSharedBytes(per_block, D) > kSharedBudget) {
    per_block = CeilDiv(per_block, int64_t{2});
  }
  DecodeParams p{args,    group,   per_block, CeilDiv(group, per_block), plan.num_splits,
                 plan.split_len, nullptr, nullptr};
  if (plan.num_splits > 1) {
    const int64_t slots = args.num_seqs * args.num_heads * plan.num_splits;
    p.partial_out = static_cast<float*>(workspace);
    p.partial_lse = p.partial_out + slots * D;
  }
  const size_t smem = DecodeSharedBytes(per_block, D);
  const dim3 grid(static_cast<unsigned>(args.layout.num_kv_heads * p.head_chunks),
                  static_cast<unsigned>(args.num_seqs), static_cast<unsigned>(plan.num_splits));
  cudaError_t err = cudaSuccess;
  DispatchKvDType(args.layout.dtype, [&](auto tag) {
    constexpr KvCacheDType DT = decltype(tag)::value;
    err = D <= kDimsPerLaneSmall * kWarp
              ? LaunchDecode<DT, kDimsPerLaneSmall>(p, grid, smem, stream)
              : LaunchDecode<DT, kDimsPerLaneLarge>(p, grid, smem, stream);
  });
  if (err != cudaSuccess || plan.num_splits == 1) return err;
  const dim3 merge_grid(static_cast<unsigned>(args.num_heads),
                        static_cast<unsigned>(args.num_seqs));
  KVSERVE_LAUNCH(MergeKernel, merge_grid, 128, 0, stream, p);
  return cudaGetLastError();
}

}  // namespace kvserve::cuda
