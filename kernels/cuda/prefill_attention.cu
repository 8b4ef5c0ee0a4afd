#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/prefill_attention.h"
#include "kernels/cuda/ptx.cuh"

namespace kvserve::cuda {
namespace {

// ---- Scalar kernel: f32 KV, and head dims the tensor-core kernel does not take ---------------

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
  const bool bf16 = a.act_dtype == DType::kBF16;  // q and out
  for (int64_t i = threadIdx.x; i < kQTile * D; i += blockDim.x) {
    const int64_t r = i / D;
    Qs[i] = r < nq ? LoadAct(a.q, (row0 + r) * a.q_stride + h * D + i % D, bf16) : 0.0f;
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
        const int64_t row = PagedRow(table, pos, bs, kv_heads, kvh);
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
    StoreAct(a.out, (row0 + r) * a.out_stride + h * D + i % D, l > 0.0f ? acc[i] / l : 0.0f, bf16);
  }
}

// ---- Tensor-core kernel (FlashAttention-2 style) -----------------------------------------------
//
// A block serves one sequence, one kv head and kRowTile rows of its query heads: row f is query
// token f / G of head kv_head * G + f % G (G = num_heads / num_kv_heads), so the group's heads
// share every K/V tile the block loads. Each of its 4 warps owns 16 rows and keeps their output
// (16 x D f32), running max and sum in registers; per key tile of kN keys it computes
// S = Q K^T (mma.m16n8k16 over Q and K fragments from ldmatrix), masks the tile only where the
// causal or sliding-window limit crosses it (tiles past the warp's last query, or before its
// first window, are skipped), updates the online softmax in log2 units (scale * log2 e is
// folded into Q, exp2), and adds P V (P rounded to the mma's type in registers, V fragments from
// ldmatrix.trans).
//
// Shared memory, b16 elements, rows padded by kRowPad so the 8 rows of an ldmatrix matrix fall
// in distinct banks: Q [kRowTile][D + 8] | K [2][kN][D + 8] | V [2][kN][D + 8], then for int8 /
// fp8 the row scales kscale [2][kN] | vscale [2][kN] (f32), then the stages' cache rows [2][kN]
// (int64). K/V are double-buffered: tile i + 1 is loaded while tile i is computed (cp.async for
// f16 / bf16; int8 / fp8 codes are converted to bf16 on the way, exact, their scales applied to S
// and P in f32).

constexpr int kMmaWarps = 4;
constexpr int kMmaThreads = kMmaWarps * kWarp;
constexpr int kRowsPerWarp = 16;
constexpr int kRowTile = kMmaWarps * kRowsPerWarp;
constexpr int kRowPad = 8;
constexpr float kLog2e = 1.4426950408889634f;

// Keys per K/V tile: 32 at D = 256 keeps it at 99 KiB of shared memory, two blocks an SM.
template <int D>
constexpr int kKeyTile = D == 256 ? 32 : 64;

template <KvCacheDType DT>
struct MmaKv {
  // f16 KV multiplies in f16 (Q and P rounded to f16); the others in bf16.
  static constexpr MmaType kType = DT == KvCacheDType::kF16 ? MmaType::kF16 : MmaType::kBf16;
  static constexpr bool kAsync = DT == KvCacheDType::kF16 || DT == KvCacheDType::kBF16;
  static constexpr bool kScaled = DT == KvCacheDType::kInt8 || DT == KvCacheDType::kFp8E4M3;
};

template <int D, KvCacheDType DT>
constexpr size_t MmaSharedBytes() {
  constexpr size_t kTileRows = kRowTile + 4 * kKeyTile<D>;  // Q, then K and V in two stages
  constexpr size_t kScaleBytes = MmaKv<DT>::kScaled ? sizeof(float) * 4 * kKeyTile<D> : 0;
  constexpr size_t kRowBytes = sizeof(int64_t) * 2 * kKeyTile<D>;  // the stages' cache rows
  return sizeof(uint16_t) * (D + kRowPad) * kTileRows + kScaleBytes + kRowBytes;
}

// The rows a block serves.
struct RowBlock {
  int64_t seq, kv_head, group;
  int64_t rows;   // q_len * group
  int64_t row0;   // the block's first row
  int64_t q_row;  // q_start: row of the sequence's first query token in q / out
  int64_t pos0;   // position of that token: context_len - q_len
};

// Q rows of the block, times scale * log2 e, rounded to the mma's type; zeros past the rows.
template <int D, MmaType T>
__device__ __forceinline__ void LoadQTile(const cpu::PagedAttentionArgs& a, const RowBlock& b,
                                          uint16_t* qs) {
  constexpr int kChunks = D / 8;
  const float q_scale = a.scale * kLog2e;
  const bool bf16 = a.act_dtype == DType::kBF16;
  for (int i = threadIdx.x; i < kRowTile * kChunks; i += kMmaThreads) {
    const int r = i / kChunks;
    const int c = i % kChunks;
    const int64_t f = b.row0 + r;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (f < b.rows) {
      const int64_t head = b.kv_head * b.group + f % b.group;
      const int64_t q0 = (b.q_row + f / b.group) * a.q_stride + head * D + c * 8;
      float q[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) q[e] = LoadAct(a.q, q0 + e, bf16);
      v.x = PackMmaPair<T>(q[0] * q_scale, q[1] * q_scale);
      v.y = PackMmaPair<T>(q[2] * q_scale, q[3] * q_scale);
      v.z = PackMmaPair<T>(q[4] * q_scale, q[5] * q_scale);
      v.w = PackMmaPair<T>(q[6] * q_scale, q[7] * q_scale);
    }
    *reinterpret_cast<uint4*>(qs + r * (D + kRowPad) + c * 8) = v;
  }
}

// Eight int8 / fp8 codes as bf16 (exact: codes have at most 8 significant bits).
template <KvCacheDType DT>
__device__ __forceinline__ uint4 CodesToBf16(const uint8_t* src) {
  const uint2 raw = *reinterpret_cast<const uint2*>(src);
  uint32_t out[4];
  for (int i = 0; i < 4; ++i) {
    const uint32_t word = i < 2 ? raw.x : raw.y;
    const uint32_t lo = (word >> (16 * (i % 2))) & 0xffu;
    const uint32_t hi = (word >> (16 * (i % 2) + 8)) & 0xffu;
    float flo, fhi;
    if constexpr (DT == KvCacheDType::kInt8) {
      flo = static_cast<float>(static_cast<int8_t>(lo));
      fhi = static_cast<float>(static_cast<int8_t>(hi));
    } else {
      flo = Fp8ToFloat(static_cast<uint8_t>(lo));
      fhi = Fp8ToFloat(static_cast<uint8_t>(hi));
    }
    out[i] = FloatToBf16Bits(flo) | (static_cast<uint32_t>(FloatToBf16Bits(fhi)) << 16);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// The cache row of the block's kv head at position pos (0 from key_end on: never read).
__device__ __forceinline__ int64_t KeyRow(const cpu::PagedAttentionArgs& a, const RowBlock& b,
                                          int64_t pos, int64_t key_end) {
  if (pos >= key_end) return 0;
  return PagedRow(a.block_tables + b.seq * a.block_table_stride, pos, a.layout.block_size,
                  a.layout.num_kv_heads, b.kv_head);
}

// Keys t0 .. t0 + kN - 1 of the block's kv head into one K/V stage, zeros from key_end on, from
// their cache rows `rows` (KeyRow, in shared memory: the copies wait on no global load).
template <int D, KvCacheDType DT>
__device__ __forceinline__ void LoadKvTile(const cpu::PagedAttentionArgs& a, const int64_t* rows,
                                           int64_t t0, int64_t key_end, uint16_t* ks, uint16_t* vs,
                                           float* kscale, float* vscale) {
  constexpr int kN = kKeyTile<D>;
  constexpr int kChunks = D / 8;
  for (int i = threadIdx.x; i < kN * kChunks; i += kMmaThreads) {
    const int j = i / kChunks;
    const int c = i % kChunks;
    const bool valid = t0 + j < key_end;
    const int64_t row = rows[j];
    uint16_t* kdst = ks + j * (D + kRowPad) + c * 8;
    uint16_t* vdst = vs + j * (D + kRowPad) + c * 8;
    if constexpr (MmaKv<DT>::kAsync) {
      CpAsync16(kdst, static_cast<const uint16_t*>(a.k_cache.data) + row * D + c * 8, valid);
      CpAsync16(vdst, static_cast<const uint16_t*>(a.v_cache.data) + row * D + c * 8, valid);
    } else {
      const uint4 zero = make_uint4(0, 0, 0, 0);
      const auto* k = static_cast<const uint8_t*>(a.k_cache.data) + row * D + c * 8;
      const auto* v = static_cast<const uint8_t*>(a.v_cache.data) + row * D + c * 8;
      *reinterpret_cast<uint4*>(kdst) = valid ? CodesToBf16<DT>(k) : zero;
      *reinterpret_cast<uint4*>(vdst) = valid ? CodesToBf16<DT>(v) : zero;
      if (c == 0) {
        kscale[j] = valid ? a.k_cache.scales[row] : 0.0f;
        vscale[j] = valid ? a.v_cache.scales[row] : 0.0f;
      }
    }
  }
}

// One warp's 16 rows, per thread rows g and g + 8 (g = lane / 4): output fragments (columns
// 8n + 2t, +1 of o[n][0..1] for row g, o[n][2..3] for row g + 8), running max (log2 units) and
// this thread's part of the running sum.
template <int D>
struct WarpRows {
  float o[D / 8][4];
  float m[2];
  float l[2];
};

// Where a warp's rows may see a key tile: the positions of its rows (-1: a row past the
// sequence's, which sees nothing), whether the tile needs masking, the window.
struct TileMask {
  int64_t t0;
  int64_t qpos[2];
  bool needed;
  int32_t window;
};

// S = Q K^T for the warp's rows and one key tile; the online softmax; O += P V.
template <int D, KvCacheDType DT>
__device__ __forceinline__ void AttendTile(const uint16_t* qs, const uint16_t* ks,
                                           const uint16_t* vs, const float* kscale,
                                           const float* vscale, const TileMask& mask,
                                           WarpRows<D>& w) {
  constexpr MmaType T = MmaKv<DT>::kType;
  constexpr int kN = kKeyTile<D>;
  constexpr int kS = D + kRowPad;
  const int lane = threadIdx.x % kWarp;
  const int t = lane % 4;
  float s[kN / 8][4];
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) {
    for (int e = 0; e < 4; ++e) s[j][e] = 0.0f;
  }
  // ldmatrix row addresses: Q rows lane % 16, dims (lane / 16) * 8; K keys (lane / 16) * 8 +
  // lane % 8, dims (lane / 8 % 2) * 8 (see the fragment layout in ptx.cuh).
  const uint16_t* qrow = qs + (threadIdx.x / kWarp * kRowsPerWarp + lane % 16) * kS + lane / 16 * 8;
  const uint16_t* krow = ks + (lane / 16 * 8 + lane % 8) * kS + lane / 8 % 2 * 8;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t qa[4];
    LdMatrixX4(qa, qrow + kk * 16);
#pragma unroll
    for (int nn = 0; nn < kN / 16; ++nn) {
      uint32_t kb[4];
      LdMatrixX4(kb, krow + nn * 16 * kS + kk * 16);
      Mma<T>(s[2 * nn], qa, kb[0], kb[1]);
      Mma<T>(s[2 * nn + 1], qa, kb[2], kb[3]);
    }
  }
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) {
    for (int e = 0; e < 4; ++e) {
      const int col = 8 * j + 2 * t + (e & 1);
      float x = s[j][e];
      if constexpr (MmaKv<DT>::kScaled) x *= kscale[col];
      if (mask.needed) {
        const int64_t kp = mask.t0 + col;
        const int64_t qp = mask.qpos[e / 2];
        if (kp > qp || (mask.window > 0 && kp <= qp - mask.window)) x = -INFINITY;
      }
      s[j][e] = x;
      tile_max[e / 2] = fmaxf(tile_max[e / 2], x);
    }
  }
  float base[2];
  float alpha[2];
  for (int h = 0; h < 2; ++h) {
    float mx = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(w.m[h], mx);
    base[h] = m_new == -INFINITY ? 0.0f : m_new;  // nothing visible yet: keep p and alpha 0
    alpha[h] = exp2f(w.m[h] - base[h]);
    w.m[h] = m_new;
  }
  float sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) {
    for (int e = 0; e < 4; ++e) {
      const float p = exp2f(s[j][e] - base[e / 2]);
      sum[e / 2] += p;
      s[j][e] = MmaKv<DT>::kScaled ? p * vscale[8 * j + 2 * t + (e & 1)] : p;
    }
  }
  for (int h = 0; h < 2; ++h) w.l[h] = w.l[h] * alpha[h] + sum[h];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    for (int e = 0; e < 4; ++e) w.o[n][e] *= alpha[e / 2];
  }
  // P's C fragments of key columns 16kk .. 16kk + 15 are the A fragment of that k-step.
  const uint16_t* vrow = vs + (lane / 8 % 2 * 8 + lane % 8) * kS + lane / 16 * 8;
#pragma unroll
  for (int kk = 0; kk < kN / 16; ++kk) {
    const uint32_t pa[4] = {PackMmaPair<T>(s[2 * kk][0], s[2 * kk][1]),
                            PackMmaPair<T>(s[2 * kk][2], s[2 * kk][3]),
                            PackMmaPair<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                            PackMmaPair<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
    for (int nn = 0; nn < D / 16; ++nn) {
      uint32_t vb[4];
      LdMatrixX4Trans(vb, vrow + kk * 16 * kS + nn * 16);
      Mma<T>(w.o[2 * nn], pa, vb[0], vb[1]);
      Mma<T>(w.o[2 * nn + 1], pa, vb[2], vb[3]);
    }
  }
}

template <KvCacheDType DT, int D>
__global__ void __launch_bounds__(kMmaThreads) PrefillMmaKernel(cpu::PagedAttentionArgs a) {
  KVSERVE_DYNAMIC_SHARED(uint4, tiles);  // uint4: 16-byte aligned for cp.async and ldmatrix
  constexpr int kN = kKeyTile<D>;
  constexpr int kS = D + kRowPad;
  RowBlock b;
  b.seq = blockIdx.z;
  b.kv_head = blockIdx.y;
  b.group = a.num_heads / a.layout.num_kv_heads;
  const int64_t q_len = a.q_len[b.seq];
  b.rows = q_len * b.group;
  b.row0 = int64_t{blockIdx.x} * kRowTile;
  if (b.row0 >= b.rows) return;
  b.q_row = a.q_start[b.seq];
  b.pos0 = a.context_len[b.seq] - q_len;
  const int32_t window = a.sliding_window;

  uint16_t* qs = reinterpret_cast<uint16_t*>(tiles);
  uint16_t* ks = qs + kRowTile * kS;
  uint16_t* vs = ks + 2 * kN * kS;
  float* kscale = reinterpret_cast<float*>(vs + 2 * kN * kS);
  float* vscale = kscale + 2 * kN;
  constexpr size_t kScaleBytes = MmaKv<DT>::kScaled ? sizeof(float) * 4 * kN : 0;
  int64_t* rows = reinterpret_cast<int64_t*>(reinterpret_cast<char*>(kscale) + kScaleBytes);

  // Keys the block needs: from the window start of its first row to its last row's position.
  const int64_t last_row = min(b.rows, b.row0 + kRowTile) - 1;
  const int64_t first_pos = b.pos0 + b.row0 / b.group;
  const int64_t key_begin = window > 0 ? max(int64_t{0}, first_pos - window + 1) : 0;
  const int64_t key_end = b.pos0 + last_row / b.group + 1;
  const int64_t num_tiles = (key_end - key_begin + kN - 1) / kN;

  // This warp's rows and the positions they span.
  const int lane = threadIdx.x % kWarp;
  const int64_t warp_row0 = b.row0 + threadIdx.x / kWarp * kRowsPerWarp;
  const bool warp_active = warp_row0 < b.rows;
  const int64_t warp_first = b.pos0 + warp_row0 / b.group;
  const int64_t warp_last = b.pos0 + (min(b.rows, warp_row0 + kRowsPerWarp) - 1) / b.group;
  TileMask mask;
  mask.window = window;
  for (int h = 0; h < 2; ++h) {
    const int64_t f = warp_row0 + lane / 4 + 8 * h;
    mask.qpos[h] = f < b.rows ? b.pos0 + f / b.group : -1;
  }
  WarpRows<D> w;
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    for (int e = 0; e < 4; ++e) w.o[n][e] = 0.0f;
  }
  for (int h = 0; h < 2; ++h) {
    w.m[h] = -INFINITY;
    w.l[h] = 0.0f;
  }

  LoadQTile<D, MmaKv<DT>::kType>(a, b, qs);
  // The cache rows of each stage's keys, [2][kN], one block-table read per key: those of tiles 0
  // and 1 now, those of tile it + 2 during iteration it.
  for (int j = threadIdx.x; j < 2 * kN; j += kMmaThreads) {
    rows[j] = KeyRow(a, b, key_begin + j, key_end);
  }
  __syncthreads();
  LoadKvTile<D, DT>(a, rows, key_begin, key_end, ks, vs, kscale, vscale);
  if constexpr (MmaKv<DT>::kAsync) CpAsyncCommit();
  for (int64_t it = 0; it < num_tiles; ++it) {
    const int stage = static_cast<int>(it % 2);
    const int64_t t0 = key_begin + it * kN;
    // Tile it + 2's row, read now and stored in tile it's slot after this tile's work, so that
    // the read's latency passes under it (a block-table read before every 16-byte copy stalled
    // each copy on a global load).
    const bool ahead = it + 2 < num_tiles && threadIdx.x < kN;
    const int64_t ahead_row = ahead ? KeyRow(a, b, t0 + 2 * kN + threadIdx.x, key_end) : 0;
    if (it + 1 < num_tiles) {  // the other stage was released by the last iteration's barrier
      const int next = 1 - stage;
      LoadKvTile<D, DT>(a, rows + next * kN, t0 + kN, key_end, ks + next * kN * kS,
                        vs + next * kN * kS, kscale + next * kN, vscale + next * kN);
    }
    if constexpr (MmaKv<DT>::kAsync) {
      CpAsyncCommit();  // possibly empty: the wait below always leaves exactly the next tile
      CpAsyncWait<1>();
    }
    __syncthreads();  // this tile (and Q) written by every thread
    if (warp_active && t0 <= warp_last && (window == 0 || t0 + kN - 1 > warp_first - window)) {
      mask.t0 = t0;
      mask.needed = t0 + kN - 1 > warp_first || (window > 0 && t0 <= warp_last - window);
      AttendTile<D, DT>(qs, ks + stage * kN * kS, vs + stage * kN * kS, kscale + stage * kN,
                        vscale + stage * kN, mask, w);
    }
    if (ahead) rows[stage * kN + threadIdx.x] = ahead_row;  // tile it's rows were used last round
    __syncthreads();  // this stage is free for the tile after next; tile it + 2's rows are written
  }

  const int t = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = w.l[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int64_t f = warp_row0 + lane / 4 + 8 * h;
    if (f >= b.rows) continue;
    const int64_t head = b.kv_head * b.group + f % b.group;
    const int64_t out0 = (b.q_row + f / b.group) * a.out_stride + head * D + 2 * t;
    const bool bf16 = a.act_dtype == DType::kBF16;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      StoreAct(a.out, out0 + 8 * n, l > 0.0f ? w.o[n][2 * h] / l : 0.0f, bf16);
      StoreAct(a.out, out0 + 8 * n + 1, l > 0.0f ? w.o[n][2 * h + 1] / l : 0.0f, bf16);
    }
  }
}

template <KvCacheDType DT, int D>
cudaError_t LaunchPrefillMma(const cpu::PagedAttentionArgs& args, const AttentionPlan& plan,
                             cudaStream_t stream) {
  const int64_t group = args.num_heads / args.layout.num_kv_heads;
  const dim3 grid(static_cast<unsigned>(CeilDiv(plan.shape.max_q_len * group, kRowTile)),
                  static_cast<unsigned>(args.layout.num_kv_heads),
                  static_cast<unsigned>(args.num_seqs));
  return LaunchWithSharedMemory<PrefillMmaKernel<DT, D>>(grid, kMmaThreads,
                                                         MmaSharedBytes<D, DT>(), stream, args);
}

cudaError_t LaunchPrefillScalar(const cpu::PagedAttentionArgs& args, const AttentionPlan& plan,
                                cudaStream_t stream) {
  const size_t smem = SharedBytes(args.layout.head_dim);
  const dim3 grid(static_cast<unsigned>(CeilDiv(plan.shape.max_q_len, kQTile)),
                  static_cast<unsigned>(args.num_heads), static_cast<unsigned>(args.num_seqs));
  cudaError_t err = cudaSuccess;
  DispatchKvDType(args.layout.dtype, [&](auto tag) {
    constexpr KvCacheDType DT = decltype(tag)::value;
    err = LaunchWithSharedMemory<PrefillKernel<DT>>(grid, kThreads, smem, stream, args);
  });
  return err;
}

}  // namespace

cudaError_t PrefillAttention(const cpu::PagedAttentionArgs& args, const AttentionPlan& plan,
                             cudaStream_t stream) {
  if (args.num_seqs <= 0 || plan.shape.max_q_len <= 0) return cudaSuccess;
  if (args.num_heads % args.layout.num_kv_heads != 0) return cudaErrorInvalidValue;
  cudaError_t err = cudaSuccess;
  const bool tensor_cores =
      DispatchTensorCoreKv(args.layout.dtype, args.layout.head_dim, [&](auto tag, auto dim) {
        err = LaunchPrefillMma<decltype(tag)::value, decltype(dim)::value>(args, plan, stream);
      });
  return tensor_cores ? err : LaunchPrefillScalar(args, plan, stream);
}

}  // namespace kvserve::cuda
