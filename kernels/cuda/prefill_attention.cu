#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/prefill_attention.h"

namespace kvserve::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kQTile = 16;
constexpr int kKTile = 32;

// Shared memory (floats): Q[kQTile][D] | K[kKTile][D + 1] (padded: no bank conflicts when
// threads walk different keys) | V[kKTile][D] | S[kQTile][kKTile] | acc[kQTile][D] |
// kscale, vscale [kKTile] | m, l, alpha [kQTile].
size_t SharedBytes(int64_t D) {
  return sizeof(float) * (kQTile * D + kKTile * (D + 1) + kKTile * D + kQTile * kKTile +
                          kQTile * D + 2 * kKTile + 3 * kQTile);
}

template <KvCacheDType DT>
__global__ void PrefillKernel(cpu::PagedAttentionArgs a) {
  KVSERVE_DYNAMIC_SHARED(float, smem);
  const int64_t D = a.layout.head_dim;
  const int64_t s = blockIdx.z;
  const int64_t h = blockIdx.y;
  const int64_t q_len = a.q_len[s];
  const int64_t q0 = int64_t{blockIdx.x} * kQTile;
  if (q0 >= q_len) return;
  const int64_t nq = min(int64_t{kQTile}, q_len - q0);
  const int64_t ctx = a.context_len[s];
  const int64_t first_pos = ctx - q_len + q0;  // position of the tile's first query
  const int64_t last_pos = first_pos + nq - 1;
  const int64_t kv_heads = a.layout.num_kv_heads;
  const int64_t kvh = h / (a.num_heads / kv_heads);
  const int64_t bs = a.layout.block_size;
  const int64_t window = a.sliding_window;

  float* Qs = smem;
  float* Ks = Qs + kQTile * D;
  float* Vs = Ks + kKTile * (D + 1);
  float* S = Vs + kKTile * D;
  float* acc = S + kQTile * kKTile;
  float* kscale = acc + kQTile * D;
  float* vscale = kscale + kKTile;
  float* m_s = vscale + kKTile;
  float* l_s = m_s + kQTile;
  float* alpha_s = l_s + kQTile;

  const int64_t row0 = a.q_start[s] + q0;
  for (int64_t i = threadIdx.x; i < kQTile * D; i += blockDim.x) {
    const int64_t r = i / D;
    Qs[i] = r < nq ? a.q[(row0 + r) * a.q_stride + h * D + i % D] : 0.0f;
    acc[i] = 0.0f;
  }
  for (int64_t r = threadIdx.x; r < kQTile; r += blockDim.x) {
    m_s[r] = -INFINITY;
    l_s[r] = 0.0f;
  }
  const int32_t* table = a.block_tables + s * a.block_table_stride;
  const int64_t kstart = window > 0 ? max(int64_t{0}, first_pos - window + 1) : 0;
  for (int64_t t0 = kstart; t0 <= last_pos; t0 += kKTile) {
    const int64_t nk = min(int64_t{kKTile}, last_pos + 1 - t0);
    __syncthreads();  // the previous tile is consumed
    for (int64_t i = threadIdx.x; i < kKTile * D; i += blockDim.x) {
      const int64_t j = i / D;
      const int64_t d = i % D;
      float kv = 0.0f;
      float vv = 0.0f;
      if (j < nk) {
        const int64_t pos = t0 + j;
        const int64_t row =
            (static_cast<int64_t>(table[pos / bs]) * kv_heads + kvh) * bs + pos % bs;
        kv = LoadKv<DT>(a.k_cache.data, row * D + d);
        vv = LoadKv<DT>(a.v_cache.data, row * D + d);
        if (d == 0) {
          kscale[j] = KvScale<DT>(a.k_cache.scales, row);
          vscale[j] = KvScale<DT>(a.v_cache.scales, row);
        }
      }
      Ks[j * (D + 1) + d] = kv;
      Vs[j * D + d] = vv;
    }
    __syncthreads();
    for (int64_t i = threadIdx.x; i < kQTile * kKTile; i += blockDim.x) {
      const int64_t r = i / kKTile;
      const int64_t j = i % kKTile;
      const int64_t qp = first_pos + r;
      const int64_t kp = t0 + j;
      float score = -INFINITY;
      if (r < nq && j < nk && kp <= qp && (window == 0 || kp > qp - window)) {
        float dot = 0.0f;
        for (int64_t d = 0; d < D; ++d) dot += Qs[r * D + d] * Ks[j * (D + 1) + d];
        score = dot * kscale[j] * a.scale;
      }
      S[i] = score;
    }
    __syncthreads();
    for (int64_t r = threadIdx.x; r < kQTile; r += blockDim.x) {
      float mt = m_s[r];
      for (int64_t j = 0; j < nk; ++j) mt = fmaxf(mt, S[r * kKTile + j]);
      float alpha = 1.0f;
      float sum = 0.0f;
      if (mt == -INFINITY) {  // nothing visible yet for this row
        for (int64_t j = 0; j < kKTile; ++j) S[r * kKTile + j] = 0.0f;
      } else {
        alpha = m_s[r] == -INFINITY ? 0.0f : expf(m_s[r] - mt);
        for (int64_t j = 0; j < kKTile; ++j) {
          const float e = j < nk ? expf(S[r * kKTile + j] - mt) : 0.0f;
          S[r * kKTile + j] = e;
          sum += e;
        }
      }
      l_s[r] = l_s[r] * alpha + sum;
      m_s[r] = mt;
      alpha_s[r] = alpha;
    }
    __syncthreads();
    for (int64_t i = threadIdx.x; i < kQTile * D; i += blockDim.x) {
      const int64_t r = i / D;
      const int64_t d = i % D;
      float o = acc[i] * alpha_s[r];
      for (int64_t j = 0; j < nk; ++j) o += (S[r * kKTile + j] * vscale[j]) * Vs[j * D + d];
      acc[i] = o;
    }
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < nq * D; i += blockDim.x) {
    const int64_t r = i / D;
    const float l = l_s[r];
    a.out[(row0 + r) * a.out_stride + h * D + i % D] = l > 0.0f ? acc[i] / l : 0.0f;
  }
}

}  // namespace

cudaError_t PrefillAttention(const cpu::PagedAttentionArgs& args, const AttentionPlan& plan,
                             cudaStream_t stream) {
  if (args.num_seqs <= 0 || plan.shape.max_q_len <= 0) return cudaSuccess;
  if (args.num_heads % args.layout.num_kv_heads != 0) return cudaErrorInvalidValue;
  const size_t smem = SharedBytes(args.layout.head_dim);
  const dim3 grid(static_cast<unsigned>(CeilDiv(plan.shape.max_q_len, kQTile)),
                  static_cast<unsigned>(args.num_heads), static_cast<unsigned>(args.num_seqs));
  cudaError_t err = cudaSuccess;
  DispatchKvDType(args.layout.dtype, [&](auto tag) {
    constexpr KvCacheDType DT = decltype(tag)::value;
    if (smem > 48 * 1024) {
      err = cudaFuncSetAttribute(PrefillKernel<DT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(smem));
      if (err != cudaSuccess) return;
    }
    KVSERVE_LAUNCH(PrefillKernel<DT>, grid, kThreads, smem, stream, args);
    err = cudaGetLastError();
  });
  return err;
}

}  // namespace kvserve::cuda
